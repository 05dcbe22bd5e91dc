"""Helpers for testing oneDNN implementations against the numpy/ONNX reference (the layout
conversions of :func:`tests.native.support.run_in_layouts`, over a registry with every
built-in backend)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from dispatch.registry import Implementation
from tests.native.support import case, registry, run_in_layouts


def onednn_impls(op: str) -> list[Implementation]:
    """Every oneDNN implementation registered for ``op`` (a pattern key such as
    ``Conv+Relu`` for fused ones)."""
    return [i for i in registry().implementations if i.backend == "onednn" and i.op == op]


#: how oneDNN implementations refuse a case for which oneDNN has only its reference kernel
ONLY_REFERENCE = "oneDNN has only its reference implementation"


def supporting(op: str, node) -> list[Implementation]:
    """The oneDNN implementations of ``op`` that support ``node``."""
    return [i for i in onednn_impls(op) if i.supports(node) is None]


def conv_tol(x: np.ndarray, w: np.ndarray) -> float:
    """An absolute tolerance for a conv's float32 sums (grows with the reduction length)."""
    k = math.prod(w.shape[1:])
    return 3e-6 * math.sqrt(k) * float(np.abs(x).max(initial=1)) * float(np.abs(w).max(initial=1)) + 1e-5


def check_all(op: str, node, inputs: Sequence[np.ndarray | None], ref: Sequence[np.ndarray], *,
              rtol: float = 1e-4, atol: float = 1e-5, expect: int = 1) -> list[str]:
    """Run every supporting oneDNN implementation of ``op`` on ``node`` against ``ref``;
    at least ``expect`` must support it. Returns the names that ran."""
    impls = supporting(op, node)
    reasons = {i.name: i.supports(node) for i in onednn_impls(op)}
    # on a CPU without AVX-512 oneDNN has only reference kernels for the nchw16c format, and
    # those implementations refuse with that reason: not a failure of this machine's oneDNN
    no_isa = [n for n, r in reasons.items() if r and ONLY_REFERENCE in r]
    assert len(impls) >= expect - len(no_isa), (
        f"too few oneDNN {op} implementations support the case: {reasons}")
    for impl in impls:
        outs = run_in_layouts(impl, node, inputs)
        for got, want in zip(outs, ref):
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=impl.name)
    return [i.name for i in impls]


__all__ = ["case", "check_all", "conv_tol", "onednn_impls", "registry", "run_in_layouts", "supporting"]
