"""Measurement of candidates and converters on this machine.

A candidate is built once (as in a plan: constant inputs converted to its layouts first), run
on seeded random inputs in its layouts, and its outputs — converted back to the standard
layout — are checked against the numpy reference (for each node it covers, the first numpy
implementation registered for the op that supports the node; that implementation itself is
the reference and is not checked) with a per-op tolerance before it may win. A wrong or failing
candidate gets a :class:`Measurement` with its ``error`` and is never chosen.

Timing: ``warmup`` untimed runs, then timed runs until the 95% confidence interval of the
median is within ``ci_target`` of it (the notch estimate 1.57 * IQR / sqrt(n) of McGill et al.)
or ``time_cap_s`` is spent or ``max_repeats`` is reached; the median and the IQR are recorded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dispatch.executor import reference_kernels, run_reference
from dispatch.fusion import FusedNode
from dispatch.graph import Graph, Node, Value
from dispatch.registry import STANDARD, Implementation, Registry
from layouts.registry import Converter
from tuner.candidates import Candidate

#: (rtol, atol relative to max(1, max |reference|)) per op; the default covers exact ops.
TOLERANCE: dict[str, tuple[float, float]] = {
    "Conv": (1e-3, 1e-4),
    "Gemm": (1e-3, 1e-4),
    "MatMul": (1e-3, 1e-4),
    "BatchNormalization": (1e-4, 1e-5),
    "LRN": (1e-4, 1e-5),
    "AveragePool": (1e-4, 1e-5),
    "GlobalAveragePool": (1e-4, 1e-5),
    "Softmax": (1e-4, 1e-6),
    "LogSoftmax": (1e-4, 1e-5),
    "LayerNormalization": (1e-3, 1e-4),
    "ReduceMean": (1e-4, 1e-5),
    "ReduceSum": (1e-4, 1e-5),
}
DEFAULT_TOLERANCE = (1e-5, 1e-6)


@dataclass(frozen=True)
class Measurement:
    """The measured cost of one candidate or converter (seconds), or why it failed."""

    median_s: float
    spread_s: float
    samples: int
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def tolerance(nodes: Sequence[Node]) -> tuple[float, float]:
    """The loosest tolerance among the ops of ``nodes`` (errors add up along a chain)."""
    tols = [TOLERANCE.get(n.key_op, DEFAULT_TOLERANCE) for n in nodes] or [DEFAULT_TOLERANCE]
    return max(t[0] for t in tols), max(t[1] for t in tols)


def random_input(v: Value, rng: np.random.Generator) -> np.ndarray:
    """A seeded random array for a non-constant value (standard layout)."""
    assert v.shape is not None and v.dtype is not None
    dt = np.dtype(v.dtype)
    if dt.kind == "f":
        return rng.standard_normal(v.shape).astype(dt)
    if dt.kind in "iu":
        return rng.integers(0, 4, size=v.shape).astype(dt)
    if dt.kind == "b":
        return rng.integers(0, 2, size=v.shape).astype(bool)
    return np.zeros(v.shape, dt)


def _convert(registry: Registry, arr: np.ndarray, v: Value, src: str, dst: str) -> np.ndarray:
    if src == dst:
        return arr
    assert v.shape is not None
    for conv in registry.layouts.path(src, dst, v.shape, v.dtype):
        arr = conv(arr, v.shape)
    return arr


def reference_impl(registry: Registry, node: Node) -> Implementation | None:
    """The reference implementation of ``node``: the first numpy implementation registered
    for its op that supports it (:meth:`Registry.reference_impl`)."""
    return registry.reference_impl(node)


def reference_overrides(graph: Graph, registry: Registry) -> dict[str, str]:
    """Node name -> the name of its reference implementation, for a whole-graph reference
    plan (``heuristic_plan(..., overrides=...)``) that priorities cannot change."""
    out = {}
    for node in graph.nodes:
        impl = reference_impl(registry, node)
        if impl is None:
            raise LookupError(f"no numpy reference implementation supports node {node.name!r} ({node.key_op})")
        out[node.name] = impl.name
    return out


def _reference(registry: Registry, cand: Candidate, std_inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    nodes = cand.node.nodes if isinstance(cand.node, FusedNode) else [cand.node]
    env = {v.name: arr for v, arr in zip(cand.node.inputs, std_inputs) if v is not None}
    run_reference(reference_kernels(registry, nodes), env)
    return [env[v.name] for v in cand.node.outputs]


#: whole-model tolerance of the end-to-end validation (errors accumulate over many layers)
MODEL_TOLERANCE = (1e-3, 1e-4)


def check_outputs(
    outs: Sequence[np.ndarray],
    refs: Sequence[np.ndarray],
    nodes: Sequence[Node],
    tol: tuple[float, float] | None = None,
) -> str | None:
    """``None`` when every output matches its reference within the ops' tolerance (or
    ``tol``: rtol, and atol relative to max(1, max |reference|))."""
    rtol, atol = tol or tolerance(nodes)
    for k, (o, r) in enumerate(zip(outs, refs)):
        o, r = np.asarray(o), np.asarray(r)
        if o.shape != r.shape or o.dtype != r.dtype:
            return f"output {k}: {o.dtype}{list(o.shape)} where the reference gives {r.dtype}{list(r.shape)}"
        if r.dtype.kind not in "fc":
            if not np.array_equal(o, r):
                return f"output {k}: differs from the reference"
            continue
        finite = np.abs(r[np.isfinite(r)]) if r.size else np.zeros(1)
        scale = max(1.0, float(finite.max())) if finite.size else 1.0
        if not np.allclose(o, r, rtol=rtol, atol=atol * scale, equal_nan=True):
            err = np.nanmax(np.abs(o.astype(np.float64) - r)) if o.size else 0.0
            return f"output {k}: max abs error {err:.3g} exceeds rtol {rtol:g} / atol {atol * scale:.3g}"
    return None


def time_calls(
    fn: Callable[[], object],
    *,
    warmup: int = 2,
    min_repeats: int = 5,
    max_repeats: int = 200,
    ci_target: float = 0.05,
    time_cap_s: float = 1.0,
) -> Measurement:
    """Median and IQR of ``fn()``'s wall time (see the module docstring)."""
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
        n = len(samples)
        if n >= max_repeats:
            break
        if n >= min_repeats:
            q1, med, q3 = np.percentile(samples, [25, 50, 75])
            half_width = 1.57 * (q3 - q1) / np.sqrt(n)
            if med > 0 and half_width / med <= ci_target:
                break
            if time.perf_counter() - start >= time_cap_s:
                break
    q1, med, q3 = np.percentile(samples, [25, 50, 75])
    return Measurement(float(med), float(q3 - q1), len(samples))


def measure_candidate(
    registry: Registry,
    cand: Candidate,
    *,
    seed: int = 0,
    check: bool = True,
    **timing,
) -> Measurement:
    """Check ``cand`` against the numpy reference, then time its kernel (inputs already in
    its layouts; conversions are priced separately)."""
    rng = np.random.default_rng(seed)
    node = cand.node
    try:
        std_inputs = [
            None if v is None else (np.asarray(v.const) if v.is_const else random_input(v, rng))
            for v in node.inputs
        ]
        ins = [
            None if arr is None else _convert(registry, arr, v, STANDARD, lay)
            for v, arr, lay in zip(node.inputs, std_inputs, cand.layouts_in)
        ]
        kernel = cand.impl.build(node)
        out = kernel(*ins)
    except Exception as exc:  # a candidate that cannot even run loses, with its error
        return Measurement(float("inf"), 0.0, 0, f"failed: {type(exc).__name__}: {exc}")
    if check and not (not cand.fused and reference_impl(registry, node) is cand.impl):
        outs = list(out) if isinstance(out, tuple | list) else [out]
        try:
            std_outs = [
                _convert(registry, np.asarray(o), v, lay, STANDARD)
                for v, o, lay in zip(node.outputs, outs, cand.layouts_out)
            ]
            refs = _reference(registry, cand, std_inputs)
        except Exception as exc:
            return Measurement(float("inf"), 0.0, 0, f"failed: {type(exc).__name__}: {exc}")
        nodes = node.nodes if isinstance(node, FusedNode) else [node]
        wrong = check_outputs(std_outs, refs, nodes)
        if wrong:
            return Measurement(float("inf"), 0.0, 0, f"wrong result: {wrong}")
    return time_calls(lambda: kernel(*ins), **timing)


def measure_conversion(
    registry: Registry,
    chain: Sequence[Converter],
    shape: tuple[int, ...],
    dtype: np.dtype,
    *,
    seed: int = 0,
    **timing,
) -> Measurement:
    """Time a chain of converters on a tensor of ``shape`` (its first layout's physical array)."""
    if not chain:
        return Measurement(0.0, 0.0, 0)
    rng = np.random.default_rng(seed)
    v = Value("x", tuple(shape), np.dtype(dtype))
    arr = _convert(registry, random_input(v, rng), v, STANDARD, chain[0].src)

    def run() -> None:
        a = arr
        for conv in chain:
            a = conv(a, tuple(shape))

    try:
        return time_calls(run, **timing)
    except Exception as exc:
        return Measurement(float("inf"), 0.0, 0, f"failed: {type(exc).__name__}: {exc}")
