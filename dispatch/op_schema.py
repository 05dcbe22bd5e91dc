"""Custom operators' schemas: registering them with onnx, and their shape functions.

A backend that implements an operator of its own domain (a plugin's ``com.example.FastGelu``)
registers its ``onnx.defs.OpSchema`` here (:meth:`dispatch.registry.Registry.add_op_schema`
calls :func:`register_op_schema`): onnx's checker then checks the operator's nodes against the
schema, and onnx's shape inference calls the backend's shape function, written on plain
:class:`TensorInfo` values rather than protobuf types.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

from dispatch.errors import ModelLoadError, RegistryError, ShapeInferenceError
from dispatch.graph import op_key
from dispatch.onnx_attrs import np_dtype

#: domains defined by ONNX itself, where a backend may not register schemas
ONNX_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training")


@dataclass(frozen=True)
class TensorInfo:
    """What shape inference knows of one tensor: its dtype and shape (``None`` when unknown;
    a dimension is an ``int``, the name of a symbolic dimension, or ``None``)."""

    dtype: np.dtype | None
    shape: tuple[int | str | None, ...] | None = None


#: A custom operator's shape function: ``infer(inputs, attrs) -> outputs``. ``inputs`` holds a
#: :class:`TensorInfo` per node input (``None`` for an omitted optional one), ``attrs`` the
#: node's attributes as Python values (schema defaults filled in); it returns a TensorInfo
#: (or ``None``: unknown) per output, and raises (any exception) with a message saying what
#: it received and expected when the inputs are invalid.
ShapeFn = Callable[[Sequence["TensorInfo | None"], Mapping[str, Any]], Sequence["TensorInfo | None"]]


class CustomShapeError(ShapeInferenceError):
    """A custom operator's shape function rejected a node (or failed)."""


#: schemas registered with onnx by this process: (domain, op_type, since_version) -> (owner,
#: schema); onnx's schema registry is process-wide
_REGISTERED: dict[tuple[str, str, int], tuple[str, Any]] = {}


def register_op_schema(schema: Any, *, infer: ShapeFn | None = None, owner: str = "") -> str:
    """Register a custom operator's ``onnx.defs.OpSchema`` (and shape function) with onnx.

    Returns how the operator's output shapes will be found at import. Registering the same
    (domain, operator, version) again replaces the earlier registration of this process (a
    plugin module loaded anew); redefining an operator that onnx itself defines raises
    :class:`~dispatch.errors.RegistryError`, and so does a schema in one of ONNX's domains.
    """
    if not isinstance(schema, onnx.defs.OpSchema):
        raise RegistryError(
            f"expected an onnx.defs.OpSchema, received {type(schema).__name__} "
            f"(from backend {owner!r})"
        )
    domain, name, version = schema.domain, schema.name, int(schema.since_version)
    if domain in ONNX_DOMAINS:
        raise RegistryError(
            f"backend {owner!r} registers operator {name!r} in ONNX's own domain {domain!r}; a "
            f"custom operator needs a domain of its own (e.g. 'com.example'), not one of "
            f"{', '.join(repr(d) for d in ONNX_DOMAINS)}"
        )
    how = "onnx schema"
    if infer is not None:
        if not callable(infer):
            raise RegistryError(
                f"the shape function of {op_key(domain, name)!r} (backend {owner!r}) must be "
                f"callable, received {type(infer).__name__}"
            )
        if hasattr(schema, "set_type_and_shape_inference_function"):
            schema.set_type_and_shape_inference_function(_inference_adapter(schema, infer, owner))
            how = "onnx schema with the backend's shape function"
        else:  # onnx < 1.16
            how = "onnx schema; shapes from its reference implementation"
    if not hasattr(onnx.defs, "register_schema"):
        return (f"not registered with onnx {onnx.__version__} (needs onnx >= 1.16): its output "
                f"shapes come from running its reference implementation")
    key = (domain, name, version)
    mine = _REGISTERED.get(key)
    if mine is not None and mine[1] is schema:
        return how
    if _defined(domain, name, version):
        if mine is None:
            raise RegistryError(
                f"operator {op_key(domain, name)!r} version {version} is already defined in this "
                f"process outside opdispatch (by onnx or another library); backend {owner!r} "
                f"cannot redefine it"
            )
        if not hasattr(onnx.defs, "deregister_schema"):
            return f"{how} (as first registered in this process: onnx cannot replace it)"
        onnx.defs.deregister_schema(name, version, domain)
    onnx.defs.register_schema(schema)
    _REGISTERED[key] = (owner, schema)
    return how


def _defined(domain: str, name: str, version: int) -> bool:
    if not onnx.defs.has(name, domain):
        return False
    try:
        return int(onnx.defs.get_schema(name, version, domain).since_version) == version
    except onnx.defs.SchemaError:
        return False


def _tensor_info(tp: onnx.TypeProto | None) -> TensorInfo | None:
    if tp is None or not tp.HasField("tensor_type"):
        return None
    tt = tp.tensor_type
    dtype = None
    if tt.elem_type:
        try:
            dtype = np_dtype(tt.elem_type)
        except ModelLoadError:
            dtype = None
    got = shape_of(tp)
    shape = tuple(got[0]) if got is not None and tt.HasField("shape") else None
    return TensorInfo(dtype, shape)


def _type_proto(info: TensorInfo, what: str) -> onnx.TypeProto:
    if not isinstance(info, TensorInfo):
        raise TypeError(f"{what} must be a dispatch.onnx_import.TensorInfo or None, received "
                        f"{type(info).__name__}")
    elem = 0 if info.dtype is None else helper.np_dtype_to_tensor_dtype(np.dtype(info.dtype))
    shape = None if info.shape is None else list(info.shape)
    return helper.make_tensor_type_proto(elem, shape)


def _inference_adapter(schema: Any, infer: ShapeFn, owner: str) -> Callable[[Any], None]:
    """onnx's InferenceContext protocol around a plain :data:`ShapeFn`."""
    key = op_key(schema.domain, schema.name)
    defaults: dict[str, Any] = {}
    for name, attr in schema.attributes.items():
        proto = getattr(attr, "default_value", None)
        if proto is not None and proto.type != onnx.AttributeProto.UNDEFINED:
            defaults[name] = helper.get_attribute_value(proto)

    def run(ctx: Any) -> None:
        # onnx names the node "node OP[DOMAIN] (NAME)"
        shown = str(ctx.get_display_name()) if hasattr(ctx, "get_display_name") else ""
        found = re.fullmatch(r"node \S+ \((.*)\)", shown)
        node = f"node {found.group(1)!r}" if found and found.group(1) else f"a {schema.name} node"
        try:
            inputs = [
                _tensor_info(ctx.get_input_type(i)) if ctx.has_input(i) else None
                for i in range(ctx.get_num_inputs())
            ]
            attrs = dict(defaults)
            for name in schema.attributes:
                proto = ctx.get_attribute(name)
                if proto is not None:
                    attrs[name] = helper.get_attribute_value(proto)
            outs = list(infer(inputs, attrs))
            if len(outs) > ctx.get_num_outputs():
                raise ValueError(f"the shape function returned {len(outs)} outputs for a node "
                                 f"with {ctx.get_num_outputs()}")
            protos = [None if o is None else _type_proto(o, f"output {k}") for k, o in enumerate(outs)]
        except Exception as exc:
            raise CustomShapeError(
                f"{node} ({key}, registered by backend {owner!r}): {exc}"
            ) from None
        for k, proto in enumerate(protos):
            if proto is not None:
                ctx.set_output_type(k, proto)

    return run


def shape_of(tp: onnx.TypeProto) -> tuple[list[int | str | None], int] | None:
    if not tp.HasField("tensor_type"):
        return None
    tt = tp.tensor_type
    if not tt.HasField("shape"):
        return [], tt.elem_type  # unknown rank, handled by the caller
    dims: list[int | str | None] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param"):
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return dims, tt.elem_type
