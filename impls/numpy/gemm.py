"""numpy Gemm and MatMul kernels.

Gemm: ``Y = alpha * A' @ B' + beta * C`` (``A'`` / ``B'`` optionally transposed, ``C``
broadcast unidirectionally to Y, optional from opset 11). Two algorithms: ``matmul`` (BLAS
through ``np.matmul`` over a pre-transposed contiguous B) and ``einsum`` (``np.einsum`` with a
contraction path).

MatMul: numpy ``matmul`` semantics (batch broadcasting, 1-D operands promoted and squeezed).
Three algorithms: ``matmul``, ``einsum`` and ``tensordot`` (A flattened into one 2-D GEMM when
B has rank <= 2).

float16 runs in float32 and is rounded back; integer products stay integer (wrapping like
ONNX Runtime), and an integer Gemm with a non-unit alpha or beta scales in float64 and
truncates back, like onnx's reference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dispatch.graph import Node
from dispatch.registry import Priority
from impls.numpy.misc import FLOAT_TYPES, check_dtypes, first_reason
from impls.numpy.table import impls

Kernel = Callable[..., Any]

#: Integer types of Gemm / MatMul from opset 9.
MATMUL_INT_TYPES = frozenset({"int32", "int64", "uint32", "uint64"})


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if np.dtype(dtype) == np.float16 else np.dtype(dtype)


def _allowed_types(node: Node) -> frozenset[str]:
    return FLOAT_TYPES | MATMUL_INT_TYPES if node.opset >= 9 else FLOAT_TYPES


# -- Gemm ------------------------------------------------------------------------------------


def _supports_gemm(node: Node) -> str | None:
    if node.input(0) is None or node.input(1) is None:
        return "Gemm needs inputs A and B"
    reason = check_dtypes(node, _allowed_types(node), (0, 1, 2), same=True)
    if reason:
        return reason
    a, b = node.input(0).shape, node.input(1).shape
    for name, shape in (("A", a), ("B", b)):
        if shape is not None and len(shape) != 2:
            return f"Gemm needs a 2-D {name}; received shape {shape}"
    if a is not None and b is not None:
        k_a = a[0] if node.attr("transA", 0) else a[1]
        k_b = b[1] if node.attr("transB", 0) else b[0]
        if k_a != k_b:
            return f"Gemm inner dimensions differ: A' has K={k_a}, B' has K={k_b}"
    c = node.input(2)
    if c is not None and c.shape is not None and len(c.shape) > 2:
        return f"Gemm C must have rank <= 2; received shape {c.shape}"
    return None


class _GemmEpilogue:
    """``alpha * P + beta * C`` in place on the product ``P``, in the ONNX output dtype."""

    def __init__(self, node: Node) -> None:
        self.alpha = float(node.attr("alpha", 1.0))
        self.beta = float(node.attr("beta", 1.0))
        c = node.const_input(2)
        self.c_const = None
        if c is not None and self.beta != 0.0 and np.dtype(c.dtype).kind == "f":
            ct = _compute_dtype(c.dtype)
            self.c_const = (c.astype(np.float64) * self.beta).astype(ct)

    def __call__(self, p: np.ndarray, c: np.ndarray | None, dtype: np.dtype) -> np.ndarray:
        if np.dtype(dtype).kind in "iu" and (self.alpha != 1.0 or self.beta != 1.0):
            return self._integer(p, c, dtype)
        if self.alpha != 1.0:
            p *= self.alpha
        if c is not None and self.beta != 0.0:
            if self.c_const is not None:
                p += self.c_const
            elif self.beta == 1.0:
                p += c.astype(p.dtype, copy=False)
            else:
                p += c.astype(p.dtype, copy=False) * self.beta
        return np.asarray(p, dtype=dtype, order="C")

    def _integer(self, p: np.ndarray, c: np.ndarray | None, dtype: np.dtype) -> np.ndarray:
        y = p.astype(np.float64) * self.alpha
        if c is not None and self.beta != 0.0:
            y += c.astype(np.float64) * self.beta
        return np.asarray(y.astype(dtype), order="C")


def _packed_b(node: Node) -> np.ndarray | None:
    """Constant B, transposed as needed into a contiguous (K, N) array, or ``None``."""
    b = node.const_input(1)
    if b is None:
        return None
    b = b.T if node.attr("transB", 0) else b
    return np.ascontiguousarray(b, dtype=_compute_dtype(b.dtype))


@impls.register("Gemm", "matmul", priority=Priority.PREFERRED, supports=_supports_gemm)
def gemm_matmul(node: Node) -> Kernel:
    """Gemm via np.matmul (BLAS) over a pre-transposed contiguous constant B."""
    trans_a, trans_b = bool(node.attr("transA", 0)), bool(node.attr("transB", 0))
    b_packed = _packed_b(node)
    epilogue = _GemmEpilogue(node)

    def run(a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
        ct = _compute_dtype(a.dtype)
        a2 = a.astype(ct, copy=False)
        a2 = a2.T if trans_a else a2
        if b_packed is not None:
            b2 = b_packed
        else:
            b2 = b.astype(ct, copy=False)
            b2 = b2.T if trans_b else b2
        return epilogue(np.matmul(a2, b2), c, a.dtype)

    return run


@impls.register("Gemm", "einsum", priority=Priority.DEFAULT, supports=_supports_gemm)
def gemm_einsum(node: Node) -> Kernel:
    """Gemm via np.einsum with an optimised contraction path (BLAS tensordot when it can)."""
    trans_a, trans_b = bool(node.attr("transA", 0)), bool(node.attr("transB", 0))
    spec = f"{'ki' if trans_a else 'ik'},{'jk' if trans_b else 'kj'}->ij"
    epilogue = _GemmEpilogue(node)
    b_const = node.const_input(1)
    b_cast = None if b_const is None else b_const.astype(_compute_dtype(b_const.dtype))

    def run(a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
        ct = _compute_dtype(a.dtype)
        b2 = b_cast if b_cast is not None else b.astype(ct, copy=False)
        p = np.einsum(spec, a.astype(ct, copy=False), b2, optimize=True)
        return epilogue(np.asarray(p, dtype=ct), c, a.dtype)

    return run


# -- MatMul ----------------------------------------------------------------------------------


def _matmul_shape_reason(a: tuple[int, ...] | None, b: tuple[int, ...] | None) -> str | None:
    if (a is not None and len(a) == 0) or (b is not None and len(b) == 0):
        return "MatMul does not accept scalars (rank-0 inputs)"
    if a is None or b is None:
        return None
    k_a, k_b = a[-1], b[0] if len(b) == 1 else b[-2]
    if k_a != k_b:
        return f"MatMul inner dimensions differ: A {a} has K={k_a}, B {b} has K={k_b}"
    batch_a, batch_b = a[:-2], b[:-2]
    for x, y in zip(reversed(batch_a), reversed(batch_b)):
        if x != y and 1 not in (x, y):
            return f"MatMul batch dimensions of A {a} and B {b} do not broadcast"
    return None


def _supports_matmul(node: Node) -> str | None:
    if node.input(0) is None or node.input(1) is None:
        return "MatMul needs inputs A and B"
    return first_reason(
        check_dtypes(node, _allowed_types(node), (0, 1), same=True),
        _matmul_shape_reason(node.input(0).shape, node.input(1).shape),
    )


def _const_b(node: Node) -> np.ndarray | None:
    b = node.const_input(1)
    return None if b is None else np.ascontiguousarray(b, dtype=_compute_dtype(b.dtype))


@impls.register("MatMul", "matmul", priority=Priority.PREFERRED, supports=_supports_matmul)
def matmul_numpy(node: Node) -> Kernel:
    """MatMul via np.matmul (BLAS per batch matrix, numpy broadcasting)."""
    b_const = _const_b(node)

    def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        ct = _compute_dtype(a.dtype)
        b2 = b_const if b_const is not None else b.astype(ct, copy=False)
        y = np.matmul(a.astype(ct, copy=False), b2)
        return np.asarray(y, dtype=a.dtype, order="C")

    return run


@impls.register("MatMul", "einsum", priority=Priority.DEFAULT, supports=_supports_matmul)
def matmul_einsum(node: Node) -> Kernel:
    """MatMul via np.einsum over broadcast batch axes (1-D operands promoted and squeezed)."""
    b_const = _const_b(node)

    def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        ct = _compute_dtype(a.dtype)
        b2 = b_const if b_const is not None else b.astype(ct, copy=False)
        a2 = a.astype(ct, copy=False)
        a2 = a2[None, :] if a.ndim == 1 else a2
        b2 = b2[:, None] if b.ndim == 1 else b2
        y = np.einsum("...ik,...kj->...ij", a2, b2, optimize=a2.ndim == 2 and b2.ndim == 2)
        if b.ndim == 1:
            y = y[..., 0]
        if a.ndim == 1:
            y = y[..., 0, :] if b.ndim > 1 else y[..., 0]
        return np.asarray(y, dtype=a.dtype, order="C")

    return run


def _supports_tensordot(node: Node) -> str | None:
    reason = _supports_matmul(node)
    if reason:
        return reason
    b = node.input(1).shape
    if b is None:
        return "MatMul.numpy.tensordot needs the static rank of B (it handles a B of rank <= 2)"
    if len(b) > 2:
        return f"MatMul.numpy.tensordot handles a B of rank <= 2; received B of shape {b}"
    return None


@impls.register("MatMul", "tensordot", priority=Priority.DEFAULT, supports=_supports_tensordot)
def matmul_tensordot(node: Node) -> Kernel:
    """MatMul with a 1-D/2-D B as one GEMM over A flattened to 2-D (np.tensordot)."""
    b_const = _const_b(node)

    def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        ct = _compute_dtype(a.dtype)
        b2 = b_const if b_const is not None else b.astype(ct, copy=False)
        y = np.tensordot(a.astype(ct, copy=False), b2, axes=([a.ndim - 1], [0]))
        return np.asarray(y, dtype=a.dtype, order="C")

    return run
