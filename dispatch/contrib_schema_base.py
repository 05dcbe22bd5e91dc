"""The data types of onnxruntime's contrib schemas (issue 52), shared by
:mod:`dispatch.contrib_schemas` (the registry: activations, normalizations, FusedMatMul) and
:mod:`dispatch.contrib_schemas_attention` (attention, rotary embedding, quantized matmuls) and
:mod:`dispatch.contrib_schemas_quantized` (the quantizers' QOperator format, EmbedLayerNormalization),
which it imports. No onnx is imported here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dispatch.op_schema import ShapeFn, TensorInfo

#: onnxruntime's contrib domain
MS_DOMAIN = "com.microsoft"
#: what registered the schemas (shown in errors of their shape functions)
OWNER = "onnxruntime contrib schemas"

FLOATS = ("tensor(float16)", "tensor(float)", "tensor(double)", "tensor(bfloat16)")
Dim = int | str | None


@dataclass(frozen=True)
class Param:
    """One input or output of a contrib operator."""

    name: str
    type_str: str
    optional: bool = False
    #: a variadic input (the last), of values of different types (QLinearConcat's inputs)
    variadic: bool = False


@dataclass(frozen=True)
class NoDefault:
    """An attribute without a default value: its onnx type (``INT``, ``FLOAT``, ``INTS``,
    ``STRING``) and whether a node must set it."""

    type: str
    required: bool = False


#: an attribute's default: its type is the default's (float, int or str), or a NoDefault
Default = float | int | str | NoDefault


@dataclass(frozen=True)
class ContribSchema:
    """A contrib operator's schema as data (see :func:`dispatch.contrib_schemas.onnx_schema`)."""

    name: str
    domain: str
    doc: str
    inputs: tuple[Param, ...]
    outputs: tuple[Param, ...]
    #: (name, default): the attribute's type is its default's (float, int or str) or, without
    #: a default, the NoDefault's
    attributes: tuple[tuple[str, Default], ...]
    #: (type parameter, allowed type strings)
    types: tuple[tuple[str, tuple[str, ...]], ...]
    infer: ShapeFn
    since_version: int = 1


def known(d: Dim) -> bool:
    """Whether the dimension ``d`` is a known size."""
    return isinstance(d, int)


def arg(inputs: Sequence[TensorInfo | None], k: int) -> TensorInfo | None:
    """Input ``k`` of a shape function's ``inputs``, ``None`` when absent."""
    return inputs[k] if len(inputs) > k else None


def params(*names: str, optional: Sequence[str] = (), type_str: str = "T") -> tuple[Param, ...]:
    """Parameters of one type string, those named in ``optional`` optional."""
    return tuple(Param(n, type_str, n in optional) for n in names)
