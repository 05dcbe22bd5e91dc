"""Whole models: the tuned plan puts NaN and Inf where the numpy reference does.

squeezenet is tuned with every available backend, and with OpenVINO first (whose regions give
``Relu(NaN) = 0``: without the check its plan wins and outputs 0 NaN of 1,000 where the
reference outputs 1,000); the stored plan is then run on five kinds of feed (sparse NaN, +Inf,
-Inf, a NaN channel, all NaN). resnet50 and a transformer export run on demand:
``OPDISPATCH_NONFINITE_MODELS=1`` (the transformer: ``OPDISPATCH_NONFINITE_TRANSFORMER=PATH``
to an exported ``.onnx`` with one float input, e.g. ``bench/models/export.py vit``).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from dispatch.backend import load_registry
from dispatch.executor import Executor
from dispatch.session import Session
from dispatch.zoo import light_model
from tuner.tune import TuneOptions, load_graph, tune

pytestmark = pytest.mark.slow
ON_DEMAND = bool(os.environ.get("OPDISPATCH_NONFINITE_MODELS"))
KINDS = ("nan", "+inf", "-inf", "nan channel", "all nan")


def _feeds(shape: list[int], kind: str, seed: int = 5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    where = rng.choice(flat.size, 5, replace=False)
    if kind == "nan channel":
        x[:, 0] = np.nan
    elif kind == "all nan":
        x[:] = np.nan
    else:
        flat[where] = {"nan": np.nan, "+inf": np.inf, "-inf": -np.inf}[kind]
    return x


def _check(model, tmp_path: Path, budget_s: float, backends: list[str] | None = None,
           nonstrict: bool = False, tuned_out: list | None = None) -> list[str]:
    """Tune ``model``; the feed kinds on which the stored plan's NaN/Inf positions differ
    from the reference's (the tuning result and the stored plan's executor, after those
    runs, appended to ``tuned_out``). Finite feeds must give the fast plan's outputs."""
    reg = load_registry()
    if backends is not None:
        backends = [b for b in backends if reg.backends.get(b) and reg.backends[b].available]
    store = tmp_path / ("lenient.sqlite" if nonstrict else "plans.sqlite")
    result = tune(model, store=store, registry=reg,
                  options=TuneOptions(budget_s=budget_s, progress=False, backends=backends,
                                      allow_nonstrict_nan=nonstrict))
    assert result.key.objective == ("latency+nonstrict-nan" if nonstrict else "latency")
    graph = load_graph(model, reg, reg.available_backends())
    stored = Session(model, registry=reg, store=store, backends=backends,
                     objective=result.key.objective)
    assert stored.plan_source == "store" and stored.plan == result.plan, stored.plan_note
    tuned = stored.executor
    ref = Session(model, registry=reg, store=False, backends=["numpy"])
    (inp,) = [i for i in ref.get_inputs()]
    shape = [d if isinstance(d, int) else 1 for d in inp.shape]
    finite = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    fast = Executor(graph, replace(result.plan, nonfinite_fallback=None), reg)
    assert np.array_equal(tuned.run({inp.name: finite})[0], fast.run({inp.name: finite})[0])
    assert tuned.guard is None or not tuned.guard.built  # finite feeds: the fast plan only
    differ = []
    with np.errstate(all="ignore"):
        for kind in KINDS:
            x = _feeds(shape, kind)
            a = ref.run(None, {inp.name: x})[0]
            b = tuned.run({inp.name: x})[0]
            if not all(np.array_equal(f(a), f(b)) for f in (np.isnan, np.isposinf, np.isneginf)):
                differ.append(kind)
    if tuned_out is not None:
        tuned_out += [result, tuned]
    return differ


def test_squeezenet_tuned_with_every_backend_keeps_nan_and_inf(tmp_path):
    assert _check(light_model("squeezenet"), tmp_path, 15.0) == []


def test_squeezenet_tuned_with_openvino_first_keeps_nan_and_inf(tmp_path):
    """OpenVINO's regions give Relu(NaN) = 0: when an OpenVINO plan is fastest it is stored
    guarded (NaN/Inf requests run a plan that agrees), so the stored plan keeps the
    reference's NaN and Inf on all five feed kinds while finite feeds run OpenVINO."""
    reg = load_registry()
    if not (reg.backends.get("openvino") and reg.backends["openvino"].available):
        pytest.skip("OpenVINO is not installed here")
    backends = ["openvino", "native", "numpy"]
    out: list = []
    assert _check(light_model("squeezenet"), tmp_path, 15.0, backends, tuned_out=out) == []
    result, tuned = out
    print("\n" + result.summary())
    if "openvino" in result.plan.backends_used():
        # an OpenVINO plan won: it must be guarded, and its fallback must not use OpenVINO
        fb = result.plan.nonfinite_fallback
        assert fb is not None, result.summary()
        assert ", guarded: NaN/Inf inputs run " in result.summary()
        assert tuned.guard is not None and tuned.guard.fallback_runs == len(KINDS)
    # the control: allowed to differ, the OpenVINO plan wins unguarded and drops the NaN
    assert _check(light_model("squeezenet"), tmp_path, 15.0, backends, nonstrict=True) == list(KINDS)


@pytest.mark.skipif(not ON_DEMAND, reason="on demand: OPDISPATCH_NONFINITE_MODELS=1")
def test_resnet50_keeps_nan_and_inf(tmp_path):
    assert _check(light_model("resnet50"), tmp_path, 240.0) == []


@pytest.mark.skipif(not (ON_DEMAND and os.environ.get("OPDISPATCH_NONFINITE_TRANSFORMER")),
                    reason="on demand: OPDISPATCH_NONFINITE_TRANSFORMER=PATH.onnx")
def test_a_transformer_export_keeps_nan_and_inf(tmp_path):
    assert _check(os.environ["OPDISPATCH_NONFINITE_TRANSFORMER"], tmp_path, 240.0) == []
