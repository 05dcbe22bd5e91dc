"""ONNX model -> :class:`Graph`: reading, checking, static shapes and dtypes.

Shapes come from onnx's shape inference (with data propagation) after the graph inputs have
been fixed to static shapes; values it leaves unknown are filled by the simplification passes
(constant folding, then evaluation of the reference implementation on placeholders).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from dispatch.errors import ModelLoadError, ShapeInferenceError
from dispatch.graph import Graph, Node, Value, topological_order
from dispatch.onnx_attrs import attrs_from_proto, np_dtype

ModelLike = str | os.PathLike | bytes | onnx.ModelProto

MIN_OPSET = 7


def read_model(model: ModelLike) -> onnx.ModelProto:
    """Read a model from a path, serialized bytes or a ModelProto, with clear errors."""
    if isinstance(model, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
        return proto
    if isinstance(model, bytes | bytearray | memoryview):
        try:
            return onnx.load_from_string(bytes(model))
        except (DecodeError, ValueError, RuntimeError) as exc:
            raise ModelLoadError(
                f"the {len(model)} bytes received are not a valid serialized ONNX model "
                f"(protobuf decode failed: {exc})"
            ) from None
    if isinstance(model, str | os.PathLike):
        path = Path(model)
        if not path.exists():
            raise ModelLoadError(f"model file {str(path)!r} does not exist")
        if path.is_dir():
            raise ModelLoadError(f"expected an .onnx file, received the directory {str(path)!r}")
        try:
            return onnx.load(str(path))
        except (DecodeError, ValueError, RuntimeError, OSError) as exc:
            size = path.stat().st_size
            raise ModelLoadError(
                f"{str(path)!r} ({size} bytes) is not a valid ONNX model: it could not be decoded "
                f"as a ModelProto ({type(exc).__name__}: {exc}); is the file truncated or of "
                f"another format?"
            ) from None
    raise ModelLoadError(
        f"expected a path, bytes or onnx.ModelProto, received {type(model).__name__}"
    )


def default_opset(proto: onnx.ModelProto) -> int:
    for op in proto.opset_import:
        if op.domain in ("", "ai.onnx"):
            return int(op.version)
    raise ModelLoadError("the model imports no version of the default ONNX domain (opset_import)")


def _check(proto: onnx.ModelProto) -> None:
    if not proto.HasField("graph") or (not proto.graph.node and not proto.graph.output):
        raise ModelLoadError("the model has no graph (empty or not an ONNX ModelProto)")
    opset = default_opset(proto)
    newest = onnx.defs.onnx_opset_version()
    if opset < MIN_OPSET or opset > newest:
        raise ModelLoadError(
            f"the model uses default-domain opset {opset}; supported: {MIN_OPSET} to {newest}"
        )
    checked = proto
    shapeless = [o for o in proto.graph.output if o.type.HasField("tensor_type") and not o.type.tensor_type.HasField("shape")]
    if shapeless:
        # graph outputs of unknown rank are legal in practice (exporters omit them) but the
        # checker insists on a shape field: check a copy where they carry an empty one
        checked = onnx.ModelProto()
        checked.CopyFrom(proto)
        for o in checked.graph.output:
            if o.type.HasField("tensor_type") and not o.type.tensor_type.HasField("shape"):
                o.type.tensor_type.shape.SetInParent()
    try:
        onnx.checker.check_model(checked)
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"the model is not valid ONNX: {first}") from None


def _shape_of(tp: onnx.TypeProto) -> tuple[list[int | str | None], int] | None:
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


def _fix_inputs(
    proto: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]] | None
) -> None:
    init_names = {i.name for i in proto.graph.initializer}
    real_inputs = [i for i in proto.graph.input if i.name not in init_names]
    shapes = dict(input_shapes or {})
    unknown = set(shapes) - {i.name for i in real_inputs}
    if unknown:
        raise ShapeInferenceError(
            f"input_shapes names {sorted(unknown)}, which are not inputs of the model; its inputs "
            f"are {[i.name for i in real_inputs]}"
        )
    for vi in real_inputs:
        got = _shape_of(vi.type)
        if got is None:
            raise ModelLoadError(
                f"input {vi.name!r} is not a tensor (sequence, map and optional inputs are not supported)"
            )
        dims, _ = got
        declared_rank = vi.type.tensor_type.HasField("shape")
        if vi.name in shapes:
            new = [int(d) for d in shapes[vi.name]]
            if any(d < 0 for d in new):
                raise ShapeInferenceError(f"input_shapes[{vi.name!r}] = {new} has a negative dimension")
            if declared_rank and len(new) != len(dims):
                raise ShapeInferenceError(
                    f"input_shapes[{vi.name!r}] = {new} has rank {len(new)}, but the model declares "
                    f"input {vi.name!r} with rank {len(dims)}: {_fmt_dims(dims)}"
                )
            for k, (d, n) in enumerate(zip(dims, new)):
                if isinstance(d, int) and d != n:
                    raise ShapeInferenceError(
                        f"input_shapes[{vi.name!r}] = {new} conflicts with the model's declared "
                        f"dimension {k} = {d} ({_fmt_dims(dims)})"
                    )
        elif not declared_rank or any(not isinstance(d, int) for d in dims):
            raise ShapeInferenceError(
                f"input {vi.name!r} has no static shape ({_fmt_dims(dims) if declared_rank else 'unknown rank'}); "
                f"give it with input_shapes={{{vi.name!r}: [...]}} or --shape {vi.name}=1x3x224x224"
            )
        else:
            new = [int(d) for d in dims]  # type: ignore[arg-type]
        shape = vi.type.tensor_type.shape
        shape.ClearField("dim")
        for n in new:
            shape.dim.add().dim_value = n


def _fmt_dims(dims: Sequence[int | str | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _infer(proto: onnx.ModelProto) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=False, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError, RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ShapeInferenceError(f"ONNX shape inference failed: {first}") from None


def import_model(
    model: ModelLike, input_shapes: Mapping[str, Sequence[int]] | None = None
) -> Graph:
    """Read, check and convert an ONNX model into a :class:`Graph` with static input shapes.

    The returned graph is not yet simplified; see :func:`dispatch.passes.simplify`.
    """
    proto = read_model(model)
    _check(proto)
    if proto.functions:
        names = ", ".join(f.name for f in proto.functions)
        raise ModelLoadError(f"model-local functions are not supported (the model defines: {names})")
    _fix_inputs(proto, input_shapes)
    inferred = _infer(proto)
    return _to_graph(inferred)


def _to_graph(proto: onnx.ModelProto) -> Graph:
    g = proto.graph
    opsets = {(o.domain if o.domain != "ai.onnx" else ""): int(o.version) for o in proto.opset_import}
    values: dict[str, Value] = {}

    def typed(vi: onnx.ValueInfoProto) -> Value:
        got = _shape_of(vi.type)
        if got is None:
            raise ModelLoadError(f"value {vi.name!r} is not a tensor; only tensors are supported")
        dims, elem = got
        has_shape = vi.type.tensor_type.HasField("shape")
        shape = tuple(dims) if has_shape and all(isinstance(d, int) for d in dims) else None
        dtype = np_dtype(elem) if elem else None
        return Value(vi.name, shape, dtype)  # type: ignore[arg-type]

    for init in g.initializer:
        try:
            arr = numpy_helper.to_array(init)
        except Exception as exc:
            raise ModelLoadError(f"initializer {init.name!r} cannot be read: {exc}") from None
        values[init.name] = Value(init.name, tuple(arr.shape), arr.dtype, arr)
    for sp in g.sparse_initializer:
        raise ModelLoadError(f"sparse initializer {sp.values.name!r} is not supported")

    inputs: list[Value] = []
    for vi in g.input:
        if vi.name in values:
            continue  # an initializer listed as input (IR < 4): a constant
        v = typed(vi)
        values[vi.name] = v
        inputs.append(v)
    for vi in list(g.value_info) + list(g.output):
        if vi.name in values:
            continue
        if vi.type.HasField("tensor_type"):
            values[vi.name] = typed(vi)

    nodes: list[Node] = []
    used_names: set[str] = set()
    for k, np_ in enumerate(g.node):
        name = np_.name or f"{np_.op_type}_{k}"
        if name in used_names:
            name = f"{name}__{k}"
        used_names.add(name)
        ins: list[Value | None] = []
        for i in np_.input:
            if not i:
                ins.append(None)
                continue
            if i not in values:
                raise ModelLoadError(
                    f"node {name!r} ({np_.op_type}) reads {i!r}, which is neither a graph input, "
                    f"an initializer nor the output of an earlier node"
                )
            ins.append(values[i])
        outs: list[Value] = []
        for o in np_.output:
            if not o:
                o = f"{name}__unused_{len(outs)}"
            v = values.setdefault(o, Value(o, None, None))
            outs.append(v)
        domain = np_.domain if np_.domain != "ai.onnx" else ""
        nodes.append(
            Node(name, np_.op_type, ins, outs, attrs_from_proto(np_), domain, opsets.get(domain, 1))
        )

    available = {v.name for v in inputs} | {v.name for v in values.values() if v.is_const}
    nodes = topological_order(nodes, available)
    outputs = []
    for vi in g.output:
        if vi.name not in values:
            raise ModelLoadError(f"graph output {vi.name!r} is produced by no node")
        outputs.append(values[vi.name])
    return Graph(g.name or "model", nodes, values, inputs, outputs, opsets)


def as_dtype(x: np.ndarray | object) -> np.dtype:
    return np.asarray(x).dtype
