"""onnxruntime's whole-model ways (:mod:`dispatch.model_ways`): the model file in one
InferenceSession with its symbolic dimensions left to onnxruntime, which keeps its own per-shape
caches. Two thread settings are offered, since which wins depends on the shape: every usable
core (onnxruntime's default set-up), and one thread, whose runs skip the pool's hand-offs and
win on small shapes (short sentences) on a machine of few cores."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from dispatch.model_ways import ModelWay, WayRunner
from impls.onnxruntime.settings import SETTINGS
from impls.regions import usable_cores


def _builder(threads: int | None):
    def build(model_path: str) -> WayRunner:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3
        so.intra_op_num_threads = threads or SETTINGS["intra_op_threads"] or usable_cores()
        so.inter_op_num_threads = 1
        session = ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])

        def run(feeds: Mapping[str, np.ndarray]) -> Sequence[np.ndarray]:
            return session.run(None, dict(feeds))

        return run

    return build


def ways() -> list[ModelWay]:
    """The ways this backend offers."""
    return [
        ModelWay("onnxruntime", "onnxruntime",
                 "onnxruntime InferenceSession, graph optimisation all, intra-op threads = "
                 "usable cores, dynamic dimensions", _builder(None),
                 {"graph_optimization_level": "all", "intra_op_threads": "usable cores"}),
        ModelWay("onnxruntime-1thread", "onnxruntime",
                 "onnxruntime InferenceSession, graph optimisation all, one intra-op thread, "
                 "dynamic dimensions", _builder(1),
                 {"graph_optimization_level": "all", "intra_op_threads": 1}),
    ]
