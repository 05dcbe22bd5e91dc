"""Hostile feeds: NaN and Inf, zero-size dimensions, wrong dtypes and containers, unusual
memory layouts, missing and extra names.

- NaN / Inf propagate as in the numpy reference, in every plan (numpy only, the default
  native-first order, oneDNN first, onnxruntime first), except where a backend legitimately
  differs; those differences are listed in :data:`KNOWN_DIFFERENCES`, and checked to be
  exactly that (never hidden by a loose comparison).
- A zero-size dimension (batch 0) either runs and gives empty outputs of the reference's
  shapes, or is refused with an ``OpDispatchError`` when the session is created: checked in
  a subprocess, so that a crash in a kernel shows as a failure, not a dead test run.
- Wrong dtypes, containers and names raise :class:`~dispatch.errors.FeedError` saying what
  was received and what was expected; arrays of any memory layout give the same outputs as
  contiguous ones and are never written to.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest

from dispatch.backend import load_registry
from dispatch.errors import FeedError, OpDispatchError
from dispatch.registry import Registry
from dispatch.session import Session
from tests.builders import ModelBuilder

REPO = Path(__file__).resolve().parents[2]
BATCH = 2


def _weights(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def conv_relu() -> onnx.ModelProto:
    b = ModelBuilder(name="conv_relu")
    x = b.input("x", ["N", 8, 9, 9])
    c = b.op("Conv", [x, b.const(_weights(16, 8, 3, 3)), b.const(_weights(16, seed=1))],
             pads=[1, 1, 1, 1])
    b.output(b.op("Relu", [c]))
    return b.build()


def conv() -> onnx.ModelProto:
    b = ModelBuilder(name="conv")
    x = b.input("x", ["N", 8, 7, 7])
    b.output(b.op("Conv", [x, b.const(_weights(8, 8, 3, 3))], strides=[2, 2]))
    return b.build()


def relu() -> onnx.ModelProto:
    b = ModelBuilder(name="relu")
    x = b.input("x", ["N", 8, 4, 4])
    b.output(b.op("Relu", [x]))
    return b.build()


def gemm() -> onnx.ModelProto:
    b = ModelBuilder(name="gemm")
    x = b.input("x", ["N", 32])
    b.output(b.op("Gemm", [x, b.const(_weights(16, 32)), b.const(_weights(16, seed=1))],
                  transB=1))
    return b.build()


def maxpool() -> onnx.ModelProto:
    b = ModelBuilder(name="maxpool")
    x = b.input("x", ["N", 8, 8, 8])
    b.output(b.op("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2]))
    return b.build()


def avgpool() -> onnx.ModelProto:
    b = ModelBuilder(name="avgpool")
    x = b.input("x", ["N", 8, 8, 8])
    a = b.op("AveragePool", [x], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
    b.output(b.op("GlobalAveragePool", [a]))
    return b.build()


def softmax() -> onnx.ModelProto:
    b = ModelBuilder(name="softmax")
    x = b.input("x", ["N", 10])
    b.output(b.op("Softmax", [x], axis=1))
    return b.build()


MODELS: dict[str, Callable[[], onnx.ModelProto]] = {
    f.__name__: f for f in (conv_relu, conv, relu, gemm, maxpool, avgpool, softmax)}
#: plan name -> Session(backends=...)
PLANS: dict[str, list[str] | None] = {
    "numpy": ["numpy"], "default": None, "native": ["native", "numpy"],
    "onednn": ["onednn", "numpy"], "onnxruntime": ["onnxruntime", "numpy"],
    "openvino": ["openvino", "numpy"],
}
SPECIALS = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf, "mixed": None}

#: Where a backend's NaN handling legitimately differs from the numpy reference:
#: (operator, backend) -> what it does. These are the libraries' semantics, not bugs of
#: opdispatch (the native kernels propagate NaN like numpy since e777e06):
#: - Relu on oneDNN is ``max(x, 0)``, which returns 0 for NaN (numpy's ``np.maximum``,
#:   native and onnxruntime propagate NaN); a Conv+Relu whose Conv produced NaN (from a NaN
#:   input, or Inf - Inf) therefore gives 0 there.
#: - MaxPool on oneDNN and onnxruntime keeps a running ``max(m, x)`` that does not propagate
#:   NaN: a window holding a NaN gives NaN or the maximum over part of its other elements
#:   (those the kernel visits after the NaN), never more than the maximum over all of them
#:   (numpy's ``max`` and native propagate NaN). Windows without NaN agree exactly.
#: - OpenVINO (built on oneDNN) does the same for Relu and MaxPool, and its Softmax's row
#:   maximum skips NaN: a row with a NaN keeps finite probabilities beside it.
KNOWN_DIFFERENCES: dict[tuple[str, str], str] = {
    ("Relu", "onednn"): "Relu(NaN) = 0",
    ("MaxPool", "onednn"): "MaxPool drops NaN",
    ("MaxPool", "onnxruntime"): "MaxPool drops NaN",
    ("Relu", "openvino"): "Relu(NaN) = 0",
    ("MaxPool", "openvino"): "MaxPool drops NaN",
    ("Softmax", "openvino"): "Softmax drops NaN",
}


@pytest.fixture(scope="module")
def registry() -> Registry:
    return load_registry()


def _session(registry: Registry, model: str, plan: str, batch: int = BATCH) -> Session:
    backends = PLANS[plan]
    if backends is not None and not (registry.backends.get(backends[0]) and
                                     registry.backends[backends[0]].available):
        pytest.skip(f"backend {backends[0]} is not available here")
    return Session(MODELS[model](), registry=registry, store=False, backends=backends,
                   input_shapes={"x": [batch, *_dims(model)]})


def _dims(model: str) -> list[int]:
    shape = MODELS[model]().graph.input[0].type.tensor_type.shape.dim
    return [d.dim_value for d in shape[1:]]


def _differences(session: Session) -> set[str]:
    """The :data:`KNOWN_DIFFERENCES` that apply to ``session``'s plan."""
    found = set()
    for step in session.plan.steps:
        for name in step.nodes:
            op = session.graph.node(name).op_type if any(
                n.name == name for n in session.graph.nodes) else step.op
            for part in op.split("+"):
                if (part, step.backend) in KNOWN_DIFFERENCES:
                    found.add(KNOWN_DIFFERENCES[(part, step.backend)])
    return found


def _special_input(shape: tuple[int, ...], special: str, seed: int = 3) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    if special == "mixed":
        x.flat[::7] = np.nan
        x.flat[3::11] = np.inf
        x.flat[5::13] = -np.inf
    else:
        x.flat[::5] = SPECIALS[special]
    return x


def _run(session: Session, x: np.ndarray) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy's invalid-value warnings
        return session.run(None, {"x": x})[0]


def _maxpool_without_nan(registry: Registry, x: np.ndarray) -> np.ndarray:
    """The reference MaxPool of ``x`` with NaN skipped (NaN -> -inf; all-NaN windows NaN):
    the largest value a window with NaN may give."""
    ref = _session(registry, "maxpool", "numpy", x.shape[0])
    out = _run(ref, np.where(np.isnan(x), -np.inf, x).astype(np.float32))
    every_nan = _run(ref, np.where(np.isnan(x), np.float32(1), np.float32(0)))
    return np.where(np.isneginf(out) & (every_nan == 1), np.nan, out)


@pytest.mark.parametrize("special", list(SPECIALS))
@pytest.mark.parametrize("plan", [p for p in PLANS if p != "numpy"])
@pytest.mark.parametrize("model", list(MODELS))
def test_nan_and_inf_propagate_like_the_reference(registry, model, plan, special):
    session = _session(registry, model, plan)
    reference = _session(registry, model, "numpy")
    x = _special_input(tuple(session.graph.inputs[0].shape), special)
    want, got = _run(reference, x), _run(session, x)
    assert got.shape == want.shape and got.dtype == want.dtype
    differences = _differences(session)
    if "Relu(NaN) = 0" in differences:
        # where the reference gives NaN this backend gives 0 (or NaN); elsewhere the same
        where = np.isnan(want)
        assert np.all(np.isnan(got[where]) | (got[where] == 0)), (
            f"{plan} {model}: expected 0 or NaN where the reference is NaN, got "
            f"{np.unique(got[where])[:8]}")
        np.testing.assert_allclose(got[~where], want[~where], rtol=1e-4, atol=1e-4)
    elif "Softmax drops NaN" in differences:
        # OpenVINO's row maximum skips NaN: a row holding a NaN gives NaN there and
        # probabilities in [0, 1] elsewhere, where the reference gives NaN for the whole row
        where = np.isnan(want)
        assert np.all(np.isnan(got[where]) | ((got[where] >= 0) & (got[where] <= 1))), (
            f"{plan} {model}: {np.unique(got[where])[:8]}")
        np.testing.assert_allclose(got[~where], want[~where], rtol=1e-4, atol=1e-4)
    elif "MaxPool drops NaN" in differences:
        # a window with a NaN gives NaN or the maximum over part of its other elements (the
        # kernel's max(m, x) restarts after a NaN): never more than the max over all of them
        skipped = _maxpool_without_nan(registry, x)
        where = np.isnan(want) & ~np.isnan(got)
        assert np.all(got[where] <= skipped[where]), (got[where], skipped[where])
        # the windows without NaN agree with the propagating reference exactly
        np.testing.assert_allclose(got[~np.isnan(want)], want[~np.isnan(want)], rtol=1e-6)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, equal_nan=True,
                                   err_msg=f"{plan} plan {[s.impl for s in session.plan.steps]}")
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want))


def test_the_known_differences_are_real(registry):
    """The documented differences exist (if a backend changes, this says so, and the list
    above and docs/RELIABILITY.md must change with it)."""
    x = _special_input((BATCH, *_dims("relu")), "nan")
    seen = {}
    for plan in ("default", "native", "onednn", "onnxruntime", "openvino"):
        session = _session(registry, "relu", plan)
        out = _run(session, x)
        if "Relu(NaN) = 0" in _differences(session):
            seen[plan] = bool(np.all(out[np.isnan(x)] == 0))
        else:  # the plans not listed propagate NaN exactly like the reference
            assert np.all(np.isnan(out[np.isnan(x)])), plan
    assert seen and all(seen.values()), seen
    x = _special_input((BATCH, *_dims("maxpool")), "nan")
    reference = np.isnan(_run(_session(registry, "maxpool", "numpy"), x)).sum()
    for plan in ("default", "native", "onednn", "onnxruntime", "openvino"):
        session = _session(registry, "maxpool", plan)
        out = _run(session, x)
        if "MaxPool drops NaN" in _differences(session):
            assert np.isnan(out).sum() < reference, plan
        else:  # the plans not listed propagate NaN exactly like the reference
            assert np.isnan(out).sum() == reference, plan


# -- zero-size dimensions (in a subprocess: a crash must not kill the test run) ----------


def zero_size_report() -> dict[str, str]:
    """Every model x plan with batch 0: ``"ran"`` (empty outputs of the reference's shape),
    ``"refused: ..."`` (an OpDispatchError), or ``"BAD: ..."``. Run by the test below in a
    subprocess."""
    registry = load_registry()
    results = {}
    for model in MODELS:
        for plan, backends in PLANS.items():
            key = f"{model}/{plan}"
            if backends is not None and not (registry.backends.get(backends[0]) and
                                             registry.backends[backends[0]].available):
                continue
            try:
                session = Session(MODELS[model](), registry=registry, store=False,
                                  backends=backends, input_shapes={"x": [0, *_dims(model)]})
            except OpDispatchError as exc:
                results[key] = f"refused at creation: {type(exc).__name__}: {exc}"
                continue
            except Exception as exc:
                results[key] = f"BAD at creation: {type(exc).__name__}: {exc}"
                continue
            try:
                x = np.zeros(tuple(session.graph.inputs[0].shape), np.float32)
                out = session.run(None, {"x": x})
                want = [tuple(v.shape) for v in session.graph.outputs]
                got = [o.shape for o in out]
                results[key] = "ran" if got == want and all(o.size == 0 for o in out) else (
                    f"BAD: outputs {got}, expected {want}, empty")
            except Exception as exc:
                results[key] = f"BAD at run: {type(exc).__name__}: {exc}"
    return results


def test_zero_size_batch_runs_or_is_refused_at_creation():
    code = ("import json; from tests.reliability.test_hostile_feeds import zero_size_report; "
            "print('RESULT ' + json.dumps(zero_size_report()))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, (
        f"the zero-size subprocess died with exit status {proc.returncode} (a crash): "
        f"{proc.stderr[-2000:]}")
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    results = json.loads(line[len("RESULT "):])
    assert len(results) >= len(MODELS) * 2
    bad = {k: v for k, v in results.items() if v.startswith("BAD")}
    assert not bad, bad
    # the numpy reference runs every one of these models on an empty batch
    assert all(results[f"{m}/numpy"] == "ran" for m in MODELS), results


# -- wrong dtypes, containers and names -------------------------------------------------


@pytest.fixture(scope="module")
def gemm_session(registry) -> Session:
    return _session(registry, "gemm", "default")


def _ok(shape=(BATCH, 32)) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("value, pattern", [
    (np.ones((BATCH, 32)),
     r"received dtype float64, expected float32 .*np.asarray\(value, dtype=np.float32\)"),
    (np.ones((BATCH, 32), np.int32), "received dtype int32, expected float32"),
    (np.ones((BATCH, 32), ">f4"), "received dtype >f4, expected float32"),
    (np.ones((BATCH, 32), np.float16), "received dtype float16, expected float32"),
    (np.ones((BATCH, 32), object), "received dtype object, expected float32"),
    ([[1.0] * 32] * BATCH, r"received dtype float64 \(converted from a list\), expected float32"),
    ([[1.0, 2.0], [3.0]], r"received a list that is not an array of numbers .*expected a numpy "
                          r"array of dtype float32 and shape \[N, 32\]"),
    ("pixels", r"received dtype <U6 \(converted from a str\), expected float32"),
    (None, r"received dtype object \(converted from a NoneType\)"),
    ({"a": 1}, r"received dtype object \(converted from a dict\)"),
    (np.float32(1.0), r"received shape \[\], expected \[N, 32\] \(rank 0, but the model declares rank 2\)"),
    (np.ones((BATCH, 32, 1), np.float32), r"received shape \[2, 32, 1\], expected \[N, 32\] \(rank 3"),
    (np.ma.masked_array(np.ones((BATCH, 32), np.float32)), "masked array; its mask would be ignored"),
])
def test_wrong_feeds_raise_feed_error(gemm_session, value, pattern):
    with pytest.raises(FeedError, match=pattern):
        gemm_session.run(None, {"x": value})


def test_an_empty_batch_fits_a_symbolic_batch_dimension(gemm_session):
    """The model declares x: [N, 32]: a batch of 0 is a shape like any other (planned on its
    first run), and gives an empty output."""
    (y,) = gemm_session.run(None, {"x": np.ones((0, 32), np.float32)})
    assert y.shape[0] == 0 and y.dtype == np.float32


def test_wrong_names_and_containers(gemm_session):
    with pytest.raises(FeedError,
                       match=r"missing input\(s\) \['x'\]; the model expects x: float32 \[N, 32\]"):
        gemm_session.run(None, {})
    with pytest.raises(FeedError, match=r"unknown input name\(s\) \['y'\]"):
        gemm_session.run(None, {"x": _ok(), "y": _ok()})
    with pytest.raises(FeedError, match=r"unknown input name\(s\) \['X'\]; missing input\(s\) \['x'\]"):
        gemm_session.run(None, {"X": _ok()})
    with pytest.raises(FeedError, match="feeds must be a dict of input name -> array, received list"):
        gemm_session.run(None, [_ok()])  # type: ignore[arg-type]
    with pytest.raises(FeedError, match=r"unknown output name\(s\) \['nope'\]"):
        gemm_session.run(["nope"], {"x": _ok()})


def _layouts(base: np.ndarray) -> dict[str, np.ndarray]:
    """``base``'s values in memory layouts a caller may pass."""
    fortran = np.asfortranarray(base)
    big = np.zeros(tuple(2 * d for d in base.shape), base.dtype)
    view = tuple(slice(None, None, 2) for _ in base.shape)
    big[view] = base
    readonly = base.copy()
    readonly.flags.writeable = False
    raw = np.zeros(base.nbytes + 1, np.uint8)
    unaligned = np.frombuffer(raw.data, np.float32, base.size, offset=1).reshape(base.shape)
    unaligned[...] = base
    return {"fortran": fortran, "strided": big[view], "readonly": readonly,
            "unaligned": unaligned, "matrix-like subclass": base.view(_Sub)}


class _Sub(np.ndarray):
    """An ndarray subclass (like np.matrix, its operators could mean something else)."""

    def __mul__(self, other):  # type: ignore[override]
        raise AssertionError("a kernel used the subclass's operator")


@pytest.mark.parametrize("plan", list(PLANS))
@pytest.mark.parametrize("model", ["conv_relu", "gemm", "maxpool", "softmax"])
def test_any_memory_layout_gives_the_same_outputs_and_is_not_written(registry, model, plan):
    session = _session(registry, model, plan)
    base = _ok(tuple(session.graph.inputs[0].shape))
    want = _run(session, base)
    for name, arr in _layouts(base).items():
        before = np.array(arr, copy=True)
        got = _run(session, arr)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=name)
        np.testing.assert_array_equal(np.asarray(arr), before, err_msg=f"{name} was written to")
        assert type(got) is np.ndarray


def _scalar_model() -> onnx.ModelProto:
    b = ModelBuilder(name="scalar")
    x = b.input("x", [])
    b.output(b.op("Mul", [x, b.const(np.array(3.0, np.float32))]))
    return b.build()


def test_zero_d_scalar_input(registry):
    session = Session(_scalar_model(), registry=registry, store=False, backends=["numpy"])
    assert session.run(None, {"x": np.float32(2.0)})[0] == np.float32(6.0)
    assert session.run(None, {"x": np.array(2.0, np.float32)})[0].shape == ()
    with pytest.raises(FeedError, match=r"received dtype float64 \(converted from a float\)"):
        session.run(None, {"x": 2.0})


@pytest.mark.parametrize("plan", ["default", "onednn", "onnxruntime"])
def test_zero_d_scalar_input_other_plans(registry, plan):
    if not registry.backends[PLANS[plan][0] if PLANS[plan] else "native"].available:
        pytest.skip(f"{plan} is not available here")
    session = Session(_scalar_model(), registry=registry, store=False, backends=PLANS[plan])
    assert session.run(None, {"x": np.float32(2.0)})[0] == np.float32(6.0)
