"""A model's graph as the tuner, its reports and its plan lookup see it: imported and
simplified exactly as a Session does.

A leaf of the tuner: the plan lookup (:mod:`tuner.plan_lookup`) and the reports on it key a
model's plans with :func:`load_graph` and :func:`tuner.fingerprint.plan_key` without importing
the tuning run (:mod:`tuner.tune`, which re-exports both).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from dispatch import graph_cache
from dispatch.config import Config

if TYPE_CHECKING:
    from dispatch.graph import Graph
    from dispatch.onnx_import import ModelLike
    from dispatch.registry import Registry


def load_graph(model: ModelLike, registry: Registry, backends: Sequence[str],
               input_shapes: Mapping[str, Sequence[int]] | None = None) -> Graph:
    """Import and simplify a model exactly as a Session does (through the graph cache,
    :mod:`dispatch.graph_cache`, when the model is a file and the cache is on)."""
    return graph_cache.load_graph(model, input_shapes, registry, backends,
                                  Config.load().graph_cache).graph
