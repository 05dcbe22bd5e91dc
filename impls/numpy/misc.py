"""numpy reference kernels: Identity, Dropout (inference), Constant, ConstantOfShape.

The module also holds the small helpers the other numpy modules of this family share: the
dtype sets ONNX type constraints use, :func:`check_dtypes` for ``supports()`` functions and
:func:`as_std` to hand back row-major contiguous arrays (never numpy scalars).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from dispatch.graph import Node
from dispatch.registry import Priority
from impls.numpy.table import impls

Kernel = Callable[..., Any]

FLOAT_TYPES = frozenset({"float16", "float32", "float64"})
SIGNED_TYPES = frozenset({"int8", "int16", "int32", "int64"})
UNSIGNED_TYPES = frozenset({"uint8", "uint16", "uint32", "uint64"})
INT_TYPES = SIGNED_TYPES | UNSIGNED_TYPES
NUMERIC_TYPES = FLOAT_TYPES | INT_TYPES
BOOL_TYPES = frozenset({"bool"})
#: Every plain numpy dtype ONNX tensors can hold (strings are object arrays).
PLAIN_TYPES = NUMERIC_TYPES | BOOL_TYPES
STRING_TYPES = frozenset({"object"})
#: ``None`` stands for "any dtype" (data-movement ops that never look at the values).
ANY_TYPE = None


def as_std(x: Any, dtype: np.dtype | None = None) -> np.ndarray:
    """``x`` as a row-major contiguous ndarray (0-d stays 0-d; no copy when it already is)."""
    return np.asarray(x, dtype=dtype, order="C")


def _type_list(allowed: Iterable[str]) -> str:
    return ", ".join(sorted(allowed))


def check_dtypes(
    node: Node,
    allowed: frozenset[str] | None,
    inputs: Iterable[int] = (0,),
    *,
    same: bool = False,
) -> str | None:
    """Reason why the dtypes of ``node``'s ``inputs`` are not handled, or ``None``.

    ``allowed`` holds numpy dtype names (``None``: any dtype). Absent inputs and unknown dtypes
    pass. ``same`` also requires the listed inputs to share one dtype (ONNX's ``T``).
    """
    seen: list[tuple[int, np.dtype]] = []
    for i in inputs:
        v = node.input(i)
        if v is None or v.dtype is None:
            continue
        dt = np.dtype(v.dtype)
        if allowed is not None and dt.name not in allowed:
            return (
                f"{node.op_type} input {i} ({v.name!r}) has dtype {dt.name}; this implementation "
                f"handles {_type_list(allowed)}"
            )
        seen.append((i, dt))
    if same and len({dt for _, dt in seen}) > 1:
        got = ", ".join(f"input {i}: {dt.name}" for i, dt in seen)
        return f"{node.op_type} requires inputs of one type; received {got}"
    return None


def first_reason(*reasons: str | None) -> str | None:
    """The first non-``None`` reason."""
    for r in reasons:
        if r is not None:
            return r
    return None


def int_list(x: Any) -> list[int]:
    """A 1-D integer tensor (or list) as a list of Python ints."""
    return [int(v) for v in np.asarray(x).reshape(-1)]


def normalize_axis(axis: int, rank: int, what: str = "axis") -> int:
    """``axis`` in ``[-rank, rank)`` as a non-negative axis; raises ``ValueError`` outside."""
    if not -rank <= axis < rank:
        raise ValueError(f"{what} {axis} is out of range for a tensor of rank {rank}")
    return axis + rank if axis < 0 else axis


def normalize_axes(axes: Iterable[int], rank: int, what: str = "axes") -> tuple[int, ...]:
    """Normalize ``axes`` against ``rank``; raises ``ValueError`` on repeats or out of range."""
    out = tuple(normalize_axis(int(a), rank, what) for a in axes)
    if len(set(out)) != len(out):
        raise ValueError(f"{what} {list(axes)} repeat an axis (rank {rank})")
    return out


# -- Identity --------------------------------------------------------------------------------


def _supports_identity(node: Node) -> str | None:
    v = node.input(0)
    if v is None:
        return "Identity of an omitted (optional) input is not supported"
    return None


@impls.register("Identity", "alias", priority=Priority.DEFAULT, supports=_supports_identity)
def identity_alias(node: Node) -> Kernel:
    """Identity: hands the input array on unchanged (no copy)."""

    def run(x: np.ndarray) -> np.ndarray:
        return as_std(x)

    return run


# -- Dropout ---------------------------------------------------------------------------------


def _const_scalar(node: Node, i: int) -> Any:
    """The constant scalar at input ``i`` (``None`` when absent or not constant)."""
    c = node.const_input(i)
    if c is None or np.asarray(c).size != 1:
        return None
    return np.asarray(c).reshape(()).item()


def _dropout_ratio(node: Node) -> float | None:
    """The drop ratio when it is known at build time (attribute, constant input or default)."""
    if node.opset < 12:
        return float(node.attr("ratio", 0.5))
    if node.input(1) is None:
        return 0.5
    r = _const_scalar(node, 1)
    return None if r is None else float(r)


def _supports_dropout(node: Node) -> str | None:
    reason = check_dtypes(node, FLOAT_TYPES)
    if reason:
        return reason
    if node.opset >= 12 and node.input(2) is not None:
        training = _const_scalar(node, 2)
        if training and _dropout_ratio(node) != 0.0:
            return (
                "Dropout with training_mode=True drops random elements; only inference "
                "(training_mode=False, or ratio 0) is supported"
            )
    return None


def _mask_dtype(node: Node, x_dtype: np.dtype) -> np.dtype:
    """Mask type: ``T`` (the data type) before opset 10, bool from 10."""
    if node.opset >= 10:
        return np.dtype(bool)
    out = node.outputs[1].dtype if len(node.outputs) > 1 else None
    return np.dtype(out) if out is not None else np.dtype(x_dtype)


@impls.register("Dropout", "inference", priority=Priority.DEFAULT, supports=_supports_dropout)
def dropout_inference(node: Node) -> Kernel:
    """Dropout in inference mode: output = input, mask all kept."""
    want_mask = len(node.outputs) > 1
    check_training = node.opset >= 12

    def run(
        x: np.ndarray, ratio: np.ndarray | None = None, training_mode: np.ndarray | None = None
    ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        if check_training and training_mode is not None and bool(np.asarray(training_mode)):
            r = 0.5 if ratio is None else float(np.asarray(ratio).reshape(()))
            if r != 0.0:
                raise ValueError(
                    f"Dropout {node.name!r} received training_mode=True with ratio {r}; only "
                    f"inference-mode dropout is supported"
                )
        y = as_std(x)
        if not want_mask:
            return y
        return y, np.ones(x.shape, dtype=_mask_dtype(node, x.dtype))

    return run


# -- Constant --------------------------------------------------------------------------------

_CONSTANT_ATTRS = ("value", "value_float", "value_floats", "value_int", "value_ints")
_STRING_ATTRS = ("value_string", "value_strings")


def _supports_constant(node: Node) -> str | None:
    if "sparse_value" in node.attrs:
        return "Constant with a sparse_value attribute is not supported (sparse tensors)"
    strings = [a for a in _STRING_ATTRS if a in node.attrs]
    if strings:
        return f"Constant with attribute {strings[0]} (string tensors) is not supported"
    present = [a for a in _CONSTANT_ATTRS if a in node.attrs]
    if len(present) != 1:
        return (
            f"Constant needs exactly one of {', '.join(_CONSTANT_ATTRS)}; received "
            f"{present or 'none'}"
        )
    return None


def _constant_value(node: Node) -> np.ndarray:
    a = node.attrs
    if "value" in a:
        return as_std(a["value"])
    if "value_float" in a:
        return np.array(a["value_float"], dtype=np.float32)
    if "value_floats" in a:
        return np.array(a["value_floats"], dtype=np.float32).reshape(-1)
    if "value_int" in a:
        return np.array(a["value_int"], dtype=np.int64)
    if "value_ints" in a:
        return np.array(a["value_ints"], dtype=np.int64).reshape(-1)
    raise ValueError(f"Constant {node.name!r} has no value attribute")


@impls.register("Constant", "attr", priority=Priority.DEFAULT, supports=_supports_constant)
def constant_attr(node: Node) -> Kernel:
    """Constant: the tensor from value / value_float(s) / value_int(s)."""
    value = _constant_value(node)

    def run() -> np.ndarray:
        return value.copy()  # a fresh array per run: callers may keep or modify outputs

    return run


# -- ConstantOfShape -------------------------------------------------------------------------


def _supports_constant_of_shape(node: Node) -> str | None:
    reason = check_dtypes(node, frozenset({"int64"}))
    if reason:
        return reason
    value = node.attr("value")
    if value is not None:
        v = np.asarray(value)
        if v.size != 1:
            return f"ConstantOfShape value must hold one element; received shape {v.shape}"
        if v.dtype.name not in PLAIN_TYPES:
            return f"ConstantOfShape value of dtype {v.dtype} is not supported"
    return None


@impls.register(
    "ConstantOfShape", "full", priority=Priority.DEFAULT, supports=_supports_constant_of_shape
)
def constant_of_shape_full(node: Node) -> Kernel:
    """ConstantOfShape: np.full of the requested shape with the value attribute."""
    value = node.attr("value")
    fill = np.zeros((), np.float32) if value is None else np.asarray(value).reshape(())

    def run(shape: np.ndarray) -> np.ndarray:
        dims = tuple(int_list(shape))
        if any(d < 0 for d in dims):
            raise ValueError(f"ConstantOfShape received a negative dimension in shape {dims}")
        return np.full(dims, fill, dtype=fill.dtype)

    return run
