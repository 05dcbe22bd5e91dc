"""onnxruntime's contrib operators (domain ``com.microsoft``) known to the import (issue 52).

Models written by onnxruntime's own tools (the transformers optimizer, the quantizers, the
generative-model builders) use operators that onnx does not define: ``com.microsoft``'s
``FastGelu``, ``SkipLayerNormalization``, ``FusedMatMul``... and ``SimplifiedLayerNormalization``,
which onnxruntime registers in ONNX's *default* domain (since version 1). Their schemas are
written out here as data, as onnxruntime 1.32 registers them (inputs, optional ones,
attributes with their defaults, type constraints; ``tests/numpy/test_contrib_schemas.py``
compares them with ``onnxruntime.capi.onnxruntime_pybind11_state.get_all_operator_schema()``),
with a shape function each: no onnxruntime is imported. They are registered with onnx for
this process the first time a model that uses one of these domains is imported
(:func:`register_for`), so that onnx's checker checks the nodes (input counts, attributes,
types) and its shape inference gives their outputs' dtypes and shapes.

A node keeps its domain and its domain's opset version apart (``Node.domain``,
``Node.opset``): a contrib kernel registers under ``com.microsoft::FastGelu``, distinct from
another domain's ``FastGelu``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from dispatch.contrib_schema_base import FLOATS, MS_DOMAIN, OWNER, ContribSchema, Dim, NoDefault, Param
from dispatch.contrib_schema_base import arg as _arg
from dispatch.contrib_schema_base import known as _known
from dispatch.contrib_schema_base import params as _t
from dispatch.contrib_schemas_attention import ATTENTION_SCHEMAS
from dispatch.contrib_schemas_quantized import QUANTIZED_SCHEMAS
from dispatch.op_schema import ShapeFn, TensorInfo

__all__ = ["FLOATS", "MS_DOMAIN", "OWNER", "SCHEMAS", "ContribSchema", "NoDefault", "Param", "register_all",
           "register_for", "register_for_ops", "uses_contrib"]

# -- shape functions ----------------------------------------------------------------------


def _last_dim_vector(x: TensorInfo, v: TensorInfo | None, what: str) -> None:
    """Raise unless ``v`` (when given and known) is 1-D of ``x``'s last dimension."""
    if v is None or v.shape is None:
        return
    if len(v.shape) != 1:
        raise ValueError(f"{what} must be 1-D, received shape {list(v.shape)}")
    if x.shape is not None:
        if not x.shape:
            raise ValueError(f"the input is a scalar; {what} needs it to have a last dimension")
        last, size = x.shape[-1], v.shape[0]
        if _known(last) and _known(size) and last != size:
            raise ValueError(f"{what} has {size} elements, expected {last} (the input's last "
                             f"dimension; the input has shape {list(x.shape)})")


def same_as_input(inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]) -> list[TensorInfo | None]:
    """Y has X's dtype and shape."""
    x = _arg(inputs, 0)
    return [None if x is None else TensorInfo(x.dtype, x.shape)]


def bias_activation(inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]) -> list[TensorInfo | None]:
    """Y has X's dtype and shape; the bias (input 1) is 1-D of X's last dimension."""
    x = _arg(inputs, 0)
    if x is None:
        return [None]
    _last_dim_vector(x, _arg(inputs, 1), "bias")
    return [TensorInfo(x.dtype, x.shape)]


def bias_split_gelu_shapes(
    inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]
) -> list[TensorInfo | None]:
    """X (N, S, D) and bias (D,) give Y (N, S, D / 2)."""
    x = _arg(inputs, 0)
    if x is None:
        return [None]
    _last_dim_vector(x, _arg(inputs, 1), "bias")
    if x.shape is None:
        return [TensorInfo(x.dtype, None)]
    if len(x.shape) != 3:
        raise ValueError(f"X must be 3-D (batch, sequence, hidden), received shape {list(x.shape)}")
    d = x.shape[2]
    if _known(d) and d % 2:  # type: ignore[operator]
        raise ValueError(f"X's last dimension ({d}) must be even: it is split in two halves")
    return [TensorInfo(x.dtype, (*x.shape[:2], d // 2 if _known(d) else None))]  # type: ignore[operator]


def skip_layer_norm_shapes(
    inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]
) -> list[TensorInfo | None]:
    """output and input_skip_bias_sum have the input's dtype and shape; mean and inv_std_var
    are float32 of the input's shape with a last dimension of 1. gamma, beta and bias are 1-D
    of the hidden size; skip is 2-D or 3-D, of the input's size or broadcast over the batch."""
    x = _arg(inputs, 0)
    if x is None:
        return [None] * 4
    if x.shape is not None and len(x.shape) not in (2, 3):
        raise ValueError(f"input must be 2-D or 3-D, received shape {list(x.shape)}")
    for k, what in ((2, "gamma"), (3, "beta or bias"), (4, "bias")):
        _last_dim_vector(x, _arg(inputs, k), what)
    stats = None if x.shape is None else (*x.shape[:-1], 1)
    f32 = np.dtype(np.float32)
    return [TensorInfo(x.dtype, x.shape), TensorInfo(f32, stats), TensorInfo(f32, stats),
            TensorInfo(x.dtype, x.shape)]


def simplified_layer_norm_shapes(
    inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]
) -> list[TensorInfo | None]:
    """Y has X's shape and scale's dtype; inv_std_var has X's shape with the normalized axes
    (``axis`` to the last) of size 1, in float32 (``stash_type`` 1) or float64."""
    x, scale = _arg(inputs, 0), _arg(inputs, 1)
    if x is None:
        return [None, None]
    dtype = scale.dtype if scale is not None and scale.dtype is not None else x.dtype
    stash = np.dtype(np.float64) if int(attrs.get("stash_type", 1)) == 11 else np.dtype(np.float32)
    if x.shape is None:
        return [TensorInfo(dtype, None), TensorInfo(stash, None)]
    rank = len(x.shape)
    axis = int(attrs.get("axis", -1))
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} is out of range for X of rank {rank}")
    axis %= rank
    return [TensorInfo(dtype, x.shape), TensorInfo(stash, (*x.shape[:axis], *([1] * (rank - axis))))]


def _broadcast(a: Sequence[Dim], b: Sequence[Dim]) -> tuple[Dim, ...]:
    out: list[Dim] = []
    for k in range(max(len(a), len(b))):
        x = a[len(a) - 1 - k] if k < len(a) else 1
        y = b[len(b) - 1 - k] if k < len(b) else 1
        if x == 1:
            out.append(y)
        elif y == 1 or x == y:
            out.append(x)
        elif _known(x) and _known(y):
            raise ValueError(f"batch dimensions {list(a)} and {list(b)} do not broadcast")
        else:
            out.append(None)
    return tuple(reversed(out))


def fused_matmul_operand(shape: Sequence[Dim], trans: bool, trans_batch: bool) -> tuple[Dim, ...]:
    """An operand's shape as FusedMatMul multiplies it: with ``trans_batch`` (rank >= 3) its
    first dimension moves just before the last ((d0, d1, .., dn-2, dn-1) -> (d1, .., dn-2, d0,
    dn-1)); with ``trans`` its last two dimensions swap."""
    dims = tuple(shape)
    if trans_batch and len(dims) >= 3:
        dims = (*dims[1:-1], dims[0], dims[-1])
    if trans and len(dims) >= 2:
        dims = (*dims[:-2], dims[-1], dims[-2])
    return dims


def fused_matmul_shapes(
    inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]
) -> list[TensorInfo | None]:
    """MatMul's shape rule on the operands as transposed (:func:`fused_matmul_operand`)."""
    a, b = _arg(inputs, 0), _arg(inputs, 1)
    if a is None or b is None:
        return [None]
    if a.shape is None or b.shape is None:
        return [TensorInfo(a.dtype, None)]
    sa = fused_matmul_operand(a.shape, bool(attrs.get("transA", 0)), bool(attrs.get("transBatchA", 0)))
    sb = fused_matmul_operand(b.shape, bool(attrs.get("transB", 0)), bool(attrs.get("transBatchB", 0)))
    if not sa or not sb:
        raise ValueError(f"A and B must have rank >= 1, received shapes {list(a.shape)} and {list(b.shape)}")
    ka = sa[-1]
    kb = sb[-2] if len(sb) >= 2 else sb[0]
    if _known(ka) and _known(kb) and ka != kb:
        raise ValueError(f"A as multiplied {list(sa)} and B as multiplied {list(sb)} disagree on "
                         f"the inner dimension ({ka} against {kb})")
    rows = sa[:-1] if len(sa) >= 2 else ()
    cols = sb[-1:] if len(sb) >= 2 else ()
    batch = _broadcast(sa[:-2], sb[:-2])
    return [TensorInfo(a.dtype, (*batch, *rows[-1:], *cols))]


# -- the schemas ---------------------------------------------------------------------------


_SKIP_OUTPUTS = (Param("output", "T"), Param("mean", "U", True), Param("inv_std_var", "U", True),
                 Param("input_skip_bias_sum", "T", True))
_SKIP_TYPES = (("T", ("tensor(float)", "tensor(float16)", "tensor(bfloat16)")), ("U", ("tensor(float)",)))
#: onnxruntime's default epsilon of the skip normalizations (1e-12 as a float32)
SKIP_EPSILON = float(np.float32(1e-12))

SCHEMAS: tuple[ContribSchema, ...] = (
    ContribSchema("Gelu", MS_DOMAIN, "Gaussian Error Linear Unit: Y = 0.5 * X * (1 + erf(X / sqrt(2))).",
                  _t("X"), _t("Y"), (), (("T", FLOATS),), same_as_input),
    ContribSchema("FastGelu", MS_DOMAIN,
                  "GELU, tanh approximation, of X + bias (bias optional, 1-D of X's last dimension).",
                  _t("X", "bias", optional=("bias",)), _t("Y"), (),
                  (("T", ("tensor(float)", "tensor(double)", "tensor(float16)", "tensor(bfloat16)")),),
                  bias_activation),
    ContribSchema("BiasGelu", MS_DOMAIN, "Gelu (erf) of A + B, B 1-D of A's last dimension.",
                  _t("A", "B"), _t("C"), (), (("T", FLOATS),), bias_activation),
    ContribSchema("QuickGelu", MS_DOMAIN, "Y = X * sigmoid(alpha * X), alpha 1.702 by default.",
                  _t("X"), _t("Y"), (("alpha", float(np.float32(1.702))),), (("T", FLOATS),),
                  same_as_input),
    ContribSchema("BiasSplitGelu", MS_DOMAIN,
                  "Z = X + bias split in two halves of the last dimension: Y = left * Gelu(right).",
                  _t("X", "bias"), _t("Y"), (), (("T", ("tensor(float16)", "tensor(float)")),),
                  bias_split_gelu_shapes),
    ContribSchema("SkipLayerNormalization", MS_DOMAIN,
                  "LayerNormalization of input + skip (+ bias) over the last dimension, times gamma "
                  "plus beta.",
                  _t("input", "skip", "gamma", "beta", "bias", optional=("beta", "bias")), _SKIP_OUTPUTS,
                  (("epsilon", SKIP_EPSILON),), _SKIP_TYPES, skip_layer_norm_shapes),
    ContribSchema("SkipSimplifiedLayerNormalization", MS_DOMAIN,
                  "RMS normalization of input + skip (+ bias) over the last dimension, times gamma.",
                  _t("input", "skip", "gamma", "bias", optional=("bias",)), _SKIP_OUTPUTS,
                  (("epsilon", SKIP_EPSILON),), _SKIP_TYPES, skip_layer_norm_shapes),
    ContribSchema("FusedMatMul", MS_DOMAIN,
                  "alpha * MatMul(A, B) with A and B optionally transposed (last two dimensions) "
                  "and batch-transposed (first dimension moved before the last).",
                  _t("A", "B"), _t("Y"),
                  (("alpha", 1.0), ("transA", 0), ("transB", 0), ("transBatchA", 0), ("transBatchB", 0)),
                  (("T", FLOATS),), fused_matmul_shapes),
    # onnxruntime registers it in ONNX's default domain (the generative-model builders emit it
    # there), not in com.microsoft
    ContribSchema("SimplifiedLayerNormalization", "",
                  "RMS normalization over the axes from axis to the last: Y = X / sqrt(mean(X^2) + "
                  "epsilon) * scale.",
                  (Param("X", "T"), Param("scale", "V")), (Param("Y", "V"), Param("inv_std_var", "U", True)),
                  (("axis", -1), ("epsilon", float(np.float32(1e-5))), ("stash_type", 1)),
                  (("T", FLOATS), ("U", ("tensor(float)", "tensor(double)")), ("V", FLOATS)),
                  simplified_layer_norm_shapes),
    # attention, rotary embedding and quantized matmuls: their own module (size)
    *ATTENTION_SCHEMAS,
    # the quantizers' QOperator format and EmbedLayerNormalization: their own module (size)
    *QUANTIZED_SCHEMAS,
)

#: the contrib operators of ONNX's default domain, which onnx itself does not define
DEFAULT_DOMAIN_OPS = frozenset(s.name for s in SCHEMAS if s.domain == "")

_registered: dict[tuple[str, str], str] = {}
_lock = threading.Lock()  # sessions may import models from several threads


def onnx_schema(spec: ContribSchema) -> Any:
    """``spec`` as an ``onnx.defs.OpSchema``."""
    from onnx import helper
    from onnx.defs import OpSchema

    def param(p: Param) -> Any:
        if p.variadic:
            return OpSchema.FormalParameter(p.name, p.type_str, "",
                                            param_option=OpSchema.FormalParameterOption.Variadic,
                                            is_homogeneous=False)
        option = (OpSchema.FormalParameterOption.Optional if p.optional
                  else OpSchema.FormalParameterOption.Single)
        return OpSchema.FormalParameter(p.name, p.type_str, "", param_option=option)

    return OpSchema(
        spec.name, spec.domain, spec.since_version, spec.doc,
        inputs=[param(p) for p in spec.inputs],
        outputs=[param(p) for p in spec.outputs],
        type_constraints=[(t, list(allowed), "") for t, allowed in spec.types],
        attributes=[_attribute(OpSchema, helper, n, d) for n, d in spec.attributes],
    )


def _attribute(op_schema: Any, helper: Any, name: str, default: float | int | str | NoDefault) -> Any:
    """One ``OpSchema.Attribute``: with its default, or typed and maybe required without."""
    if isinstance(default, NoDefault):
        return op_schema.Attribute(name, getattr(op_schema.AttrType, default.type), "",
                                   required=default.required)
    return op_schema.Attribute(name, helper.make_attribute(name, default), "")


def uses_contrib(proto: Any) -> bool:
    """Whether the ``onnx.ModelProto`` ``proto`` imports the ``com.microsoft`` domain or uses
    a default-domain contrib operator (:data:`DEFAULT_DOMAIN_OPS`) in its main graph."""
    if any(o.domain == MS_DOMAIN for o in proto.opset_import):
        return True
    return any(n.op_type in DEFAULT_DOMAIN_OPS and n.domain in ("", "ai.onnx") for n in proto.graph.node)


def register_for(proto: Any) -> None:
    """Register the contrib schemas with onnx when ``proto`` needs them (:func:`uses_contrib`);
    once per process."""
    if uses_contrib(proto):
        register_all()


def register_for_ops(ops: Iterable[tuple[str, str]]) -> None:
    """Register the contrib schemas with onnx when one of the (domain, op_type) ``ops`` is a
    contrib operator (a region of a graph read from the graph cache); once per process."""
    for domain, op in ops:
        if domain == MS_DOMAIN or (domain in ("", "ai.onnx") and op in DEFAULT_DOMAIN_OPS):
            register_all()
            return


def register_all() -> dict[tuple[str, str], str]:
    """Register every contrib schema with onnx (once per process); returns how each
    operator's output shapes are found, by (domain, name). A default-domain operator that
    this onnx defines itself is left to onnx."""
    with _lock:
        return _register_all()


def _register_all() -> dict[tuple[str, str], str]:
    """:func:`register_all` under its lock."""
    if _registered:
        return dict(_registered)
    import onnx

    # onnx's reference evaluator builds its table of schemas when first imported and fails on
    # two operators of one name in different domains (com.microsoft::Gelu beside ONNX's Gelu,
    # RotaryEmbedding, Attention): imported before the contrib schemas join onnx's registry
    import onnx.reference.op_run

    from dispatch.errors import RegistryError
    from dispatch.op_schema import register_op_schema

    how = "onnx schema with onnxruntime's contrib shape function"
    for spec in SCHEMAS:
        schema = onnx_schema(spec)
        key = (spec.domain, spec.name)
        if not hasattr(onnx.defs, "register_schema"):
            _registered[key] = f"not registered with onnx {onnx.__version__} (needs onnx >= 1.16)"
            continue
        if spec.domain == "" and onnx.defs.has(spec.name, spec.domain):
            _registered[key] = "defined by onnx"
            continue
        schema.set_type_and_shape_inference_function(_adapter(schema, spec.infer))
        if spec.domain == MS_DOMAIN:
            try:
                register_op_schema(schema, owner=OWNER)
            except RegistryError:  # another library registered it in this process: kept
                _registered[key] = "defined in this process outside opdispatch"
                continue
        else:  # ONNX's domain: register_op_schema refuses it for plugins, on purpose
            onnx.defs.register_schema(schema)
        _registered[key] = how
    return dict(_registered)


def _adapter(schema: Any, infer: ShapeFn) -> Callable[[Any], None]:
    """onnx's inference function for ``schema``: ``infer``'s outputs, as many as the node has
    (a node may omit its optional trailing outputs)."""
    from dispatch.op_schema import _inference_adapter

    local = threading.local()

    def trimmed(inputs: Sequence[TensorInfo | None], attrs: Mapping[str, Any]) -> list[TensorInfo | None]:
        return list(infer(inputs, attrs))[: local.outputs]

    inner = _inference_adapter(schema, trimmed, OWNER)

    def run(ctx: Any) -> None:
        local.outputs = int(ctx.get_num_outputs())
        inner(ctx)

    return run
