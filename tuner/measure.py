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
Candidates and converters are checked and timed under the BLAS and OpenMP thread settings plans
run with (:func:`dispatch.blas.in_force`: the tuner's, else the defaults), never the caller's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dispatch import blas
from dispatch.compare import (  # noqa: F401  (re-exported: the tuner's names for them)
    DEFAULT_TOLERANCE,
    MODEL_TOLERANCE,
    TOLERANCE,
    check_outputs,
    model_tolerance,
    tolerance,
)
from dispatch.executor import (  # noqa: F401
    reference_kernels,
    reference_overrides,
    run_reference,
)
from dispatch.fusion import FusedNode
from dispatch.graph import Graph, Node, Value
from dispatch.reference_fallback import FALLBACK_BACKEND
from dispatch.registry import STANDARD, Implementation, Registry
from dispatch.subgraph import CONTROL_FLOW_OPS
from layouts.registry import Converter
from tuner.candidates import Candidate
from tuner.index_bounds import DEFAULT_HIGH, index_bounds


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


def random_input(v: Value, rng: np.random.Generator, high: int | None = None) -> np.ndarray:
    """A seeded random array for a non-constant value (standard layout); integers in
    ``[0, high)`` (default :data:`~tuner.index_bounds.DEFAULT_HIGH`; see
    :func:`tuner.index_bounds.index_bounds` for values used as indices)."""
    assert v.shape is not None and v.dtype is not None
    dt = np.dtype(v.dtype)
    if dt.kind == "f":
        return rng.standard_normal(v.shape).astype(dt)
    if dt.kind in "iu":
        return rng.integers(0, max(1, min(high or DEFAULT_HIGH, DEFAULT_HIGH)), size=v.shape).astype(dt)
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


def _reference(registry: Registry, cand: Candidate, std_inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    nodes = cand.node.nodes if isinstance(cand.node, FusedNode) else [cand.node]
    env = {v.name: arr for v, arr in zip(cand.node.inputs, std_inputs) if v is not None}
    run_reference(reference_kernels(registry, nodes, fallback=True), env)
    return [env[v.name] for v in cand.node.outputs]


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


def capture_values(graph: Graph, registry: Registry,
                   feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every value of ``graph`` computed by the reference implementations from ``feeds``:
    what a candidate over dynamic values (shapes the data decides) is measured on, since
    random arrays of unknown shapes cannot stand in for them."""
    env = {k: np.asarray(v) for k, v in feeds.items()}
    run_reference(reference_kernels(registry, graph.nodes, fallback=True), env)
    return env


def measure_candidate(
    registry: Registry,
    cand: Candidate,
    *,
    seed: int = 0,
    check: bool = True,
    captured: Mapping[str, np.ndarray] | None = None,
    **timing,
) -> Measurement:
    """Check ``cand`` against the numpy reference, then time its kernel (inputs already in
    its layouts; conversions are priced separately), under the plans' thread settings.
    A candidate over dynamic values runs on the values ``captured`` holds
    (:func:`capture_values`) instead of random inputs."""
    with blas.in_force():
        return _measure_candidate(registry, cand, seed=seed, check=check, captured=captured,
                                  **timing)


def _measure_candidate(registry: Registry, cand: Candidate, *, seed: int, check: bool,
                       captured: Mapping[str, np.ndarray] | None = None,
                       **timing) -> Measurement:
    rng = np.random.default_rng(seed)
    node = cand.node
    # over dynamic values, or with control flow (the branch taken follows the data): the
    # values of the tuning inputs, not random ones
    parts = node.nodes if isinstance(node, FusedNode) else [node]
    dynamic = (any(v is not None and v.shape is None for v in [*node.inputs, *node.outputs])
               or any(n.op_type in CONTROL_FLOW_OPS and n.domain == "" for n in parts))
    try:
        if dynamic and captured is None:
            raise ValueError("its shapes are known only at run time, and no values were "
                             "captured from the tuning inputs to run it on")
        bounds = index_bounds(node.nodes if isinstance(node, FusedNode) else [node])
        std_inputs = [
            None if v is None else (np.asarray(v.const) if v.is_const
                                    else captured[v.name] if dynamic and captured is not None
                                    else random_input(v, rng, bounds.get(v.name)))
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
    # the reference itself is not checked against itself; nor is onnxruntime running a node
    # whose only reference is onnxruntime's result (dispatch.reference_fallback)
    self_ref = cand.impl.backend == FALLBACK_BACKEND and any(
        registry.reference_impl(n) is None for n in parts)
    if check and not self_ref and not (not cand.fused and reference_impl(registry, node) is cand.impl):
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
    """Time a chain of converters on a tensor of ``shape`` (its first layout's physical array),
    under the plans' thread settings."""
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
        with blas.in_force():
            return time_calls(run, **timing)
    except Exception as exc:
        return Measurement(float("inf"), 0.0, 0, f"failed: {type(exc).__name__}: {exc}")
