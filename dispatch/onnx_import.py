"""ONNX model -> :class:`Graph`: reading, checking, static shapes and dtypes.

Shapes come from onnx's shape inference (with data propagation) after the graph inputs have
been fixed to static shapes; values it leaves unknown are filled by the simplification passes
(constant folding, then evaluation of the reference implementation on placeholders).

Operators of other domains than ONNX's own (a plugin's ``com.example.FastGelu``) import when a
backend registered their schema (:meth:`dispatch.registry.Registry.add_op_schema`, which calls
:func:`register_op_schema`): onnx's checker then checks their nodes against the schema and
onnx's shape inference calls their shape function, written on plain :class:`TensorInfo`
values. A custom domain's opset must be listed in the model's ``opset_import``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx import helper

from dispatch.contrib_schemas import register_for
from dispatch.errors import (
    ModelLoadError,
    OpDispatchError,
    ShapeInferenceError,
    SymbolicShapeError,
    TensorTooLargeError,
)
from dispatch.graph import (
    Graph,
    Node,
    Value,
    check_tensor_sizes,
    hoist_input_readers,
    topological_order,
)
from dispatch.input_shapes import bind, declared_inputs
from dispatch.onnx_attrs import attrs_from_proto, np_dtype
from dispatch.onnx_weights import read_initializers, split_weights
from dispatch.op_schema import (
    CustomShapeError,
    ShapeFn,
    TensorInfo,
    register_op_schema,
    shape_of,
)
from dispatch.producer_quirks import open_unknown_dims
from dispatch.subgraph import DATA_DEPENDENT_OPS, node_captures, subgraphs_of

__all__ = [  # the custom-operator names are re-exported: plugins import them from here
    "MIN_OPSET", "CustomShapeError", "ModelLike", "ShapeFn", "TensorInfo", "import_model",
    "read_model", "register_op_schema",
]

ModelLike = str | os.PathLike | bytes | onnx.ModelProto

MIN_OPSET = 7

#: onnx's shape inference with data propagation materialises the values of tensors computed
#: from constants (a ``Range`` or ``ConstantOfShape`` feeding ``Cast``/``Add``): a model that
#: computes a constant of more elements than this is inferred without data propagation, so
#: that a hostile ``Range(0, 2**40)`` cannot exhaust the memory inside onnx
DATA_PROP_MAX_ELEMENTS = 1 << 20

def read_model(model: ModelLike) -> onnx.ModelProto:
    """Read a model from a path, serialized bytes or a ModelProto, with clear errors."""
    if isinstance(model, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
        return proto
    if isinstance(model, bytes | bytearray | memoryview):
        try:
            return onnx.load_from_string(bytes(model))
        except (DecodeError, ValueError, RuntimeError, TypeError, RecursionError,
                MemoryError) as exc:
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
        if not path.is_file():  # a FIFO would block the read until another process writes
            raise ModelLoadError(f"expected an .onnx file, received {str(path)!r}, which is "
                                 f"not a regular file (a FIFO, socket or device)")
        try:
            return onnx.load(str(path))
        except onnx.checker.ValidationError as exc:  # external data outside the model's folder
            raise ModelLoadError(f"{str(path)!r}: its external data cannot be loaded: "
                                 f"{exc}") from None
        except (DecodeError, ValueError, RuntimeError, OSError, TypeError, RecursionError,
                MemoryError) as exc:
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
    if not proto.graph.output:
        raise ModelLoadError(
            f"the model's graph has {len(proto.graph.node)} node(s) but declares no graph "
            f"outputs; expected at least one output (a model without outputs computes nothing)"
        )
    _check_text(proto)
    opset = default_opset(proto)
    newest = onnx.defs.onnx_opset_version()
    if opset < MIN_OPSET or opset > newest:
        raise ModelLoadError(
            f"the model uses default-domain opset {opset}; supported: {MIN_OPSET} to {newest}"
        )
    imported = {o.domain if o.domain != "ai.onnx" else "" for o in proto.opset_import}
    for k, node in enumerate(proto.graph.node):
        domain = node.domain if node.domain != "ai.onnx" else ""
        if domain not in imported:
            raise ModelLoadError(
                f"node {node.name or f'{node.op_type}_{k}'!r} ({node.op_type}) is of domain "
                f"{domain!r}, which the model's opset_import does not list (it lists "
                f"{sorted(imported)}); add onnx.helper.make_opsetid({domain!r}, VERSION)"
            )
    register_for(proto)  # onnxruntime's contrib operators (com.microsoft), when used
    checked = proto
    shapeless = [o for o in proto.graph.output if o.type.HasField("tensor_type")
                 and not o.type.tensor_type.HasField("shape")]
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
    except (onnx.checker.ValidationError, ValueError, RuntimeError, TypeError,
            RecursionError, MemoryError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        why = _order_problem(proto.graph) if "topologically sorted" in first else ""
        raise ModelLoadError(f"the model is not valid ONNX: {first}{why}") from None


def _check_text(proto: onnx.ModelProto) -> None:
    """Raise when a name of the graph is not valid UTF-8 (protobuf then hands out ``bytes``
    where every other part of opdispatch expects ``str``)."""
    g = proto.graph

    def bad(what: str, value: object) -> None:
        if not isinstance(value, str):
            raise ModelLoadError(
                f"{what} is not valid UTF-8 text: received {value!r}; names, operator types "
                f"and domains must be UTF-8 strings"
            )

    for k, node in enumerate(g.node):
        where = f"node {k} ({node.op_type!r})"
        bad(f"the name of {where}", node.name)
        bad(f"the operator type of node {k}", node.op_type)
        bad(f"the domain of {where}", node.domain)
        for i in list(node.input) + list(node.output):
            bad(f"a value name of {where}", i)
        for a in node.attribute:
            bad(f"an attribute name of {where}", a.name)
    for what, items in (("graph input", g.input), ("graph output", g.output),
                        ("value_info", g.value_info), ("initializer", g.initializer)):
        for item in items:
            bad(f"the name of a {what}", item.name)
    for o in proto.opset_import:
        bad("an opset_import domain", o.domain)


def _order_problem(graph: onnx.GraphProto) -> str:
    """Why ``graph``'s nodes cannot run in order: inputs that nothing defines (a missing
    initializer or graph input), or a cycle; ``""`` when merely unsorted."""
    defined = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    nodes = [(n.name or f"{n.op_type}_{k}", list(n.input), list(n.output))
             for k, n in enumerate(graph.node)]
    produced = {o for _, _, outs in nodes for o in outs if o}
    missing = sorted({i for _, ins, _ in nodes for i in ins if i and i not in defined | produced})
    if missing:
        readers = [name for name, ins, _ in nodes if any(i in missing for i in ins)]
        return (f"; {', '.join(map(repr, missing[:10]))} (read by {', '.join(readers[:10])}) "
                f"is neither a graph input, an initializer nor a node output: a missing "
                f"initializer or input?")
    ready, pending = set(defined), nodes
    while pending:
        rest = [n for n in pending if not all(not i or i in ready for i in n[1])]
        if len(rest) == len(pending):
            names = ", ".join(name for name, _, _ in rest[:10])
            return f"; the graph has a cycle: nodes {names} each wait for another's output"
        for n in pending:
            if n not in rest:
                ready.update(n[2])
        pending = rest
    return ""


def _fix_inputs(
    proto: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]] | None
) -> None:
    init_names = {i.name for i in proto.graph.initializer}
    real_inputs = [i for i in proto.graph.input if i.name not in init_names]
    # the inputs not given take their shapes from the symbols the given ones bind
    shapes = bind(declared_inputs(proto), input_shapes)
    unknown = set(shapes) - {i.name for i in real_inputs}
    if unknown:
        raise ShapeInferenceError(
            f"input_shapes names {sorted(unknown)}, which are not inputs of the model; its inputs "
            f"are {[i.name for i in real_inputs]}"
        )
    for vi in real_inputs:
        got = shape_of(vi.type)
        if got is None:
            raise ModelLoadError(
                f"input {vi.name!r} is not a tensor (sequence, map and optional inputs are not supported)"
            )
        dims, elem = got
        if not elem:
            raise ModelLoadError(
                f"input {vi.name!r} declares no element type; expected a tensor type such as "
                f"tensor(float)"
            )
        try:
            dtype = np_dtype(elem)
        except ModelLoadError as exc:
            raise ModelLoadError(f"input {vi.name!r}: {exc}") from None
        if any(isinstance(d, int) and d < 0 for d in dims):
            raise ShapeInferenceError(
                f"input {vi.name!r} declares shape {_fmt_dims(dims)}, with a negative dimension; "
                f"expected dimensions >= 0"
            )
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
            raise SymbolicShapeError(
                f"input {vi.name!r} has no static shape "
                f"({_fmt_dims(dims) if declared_rank else 'unknown rank'}); give it with "
                f"input_shapes={{{vi.name!r}: [...]}} or --shape {vi.name}=1x3x224x224",
                declared_inputs(proto),
            )
        else:
            new = [int(d) for d in dims]  # type: ignore[arg-type]
        check_tensor_sizes([Value(vi.name, tuple(new), dtype)], " (a graph input)")
        shape = vi.type.tensor_type.shape
        shape.ClearField("dim")
        for n in new:
            shape.dim.add().dim_value = n


def _fmt_dims(dims: Sequence[int | str | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _infer_once(proto: onnx.ModelProto, data_prop: bool) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(
            proto, check_type=True, strict_mode=False, data_prop=data_prop)
    except CustomShapeError as exc:
        raise CustomShapeError(f"shape inference of a custom operator failed: {exc}") from None
    except MemoryError:
        raise TensorTooLargeError(
            "ONNX shape inference ran out of memory: the model computes a tensor too large "
            "for this machine"
        ) from None
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError, RuntimeError,
            ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ShapeInferenceError(f"ONNX shape inference failed: {first}") from None


def _constant_values(proto: onnx.ModelProto) -> set[str]:
    """Names of the values computed from constants alone (initializers, ``Constant`` nodes
    and the outputs of nodes all of whose inputs are such values)."""
    const = {i.name for i in proto.graph.initializer}
    for node in proto.graph.node:  # checked: in topological order
        if all(not i or i in const for i in node.input):
            const.update(o for o in node.output if o)
    return const


def _safe_for_data_prop(inferred: onnx.ModelProto) -> bool:
    """Whether every constant-computed value of ``inferred`` (a model inferred without data
    propagation) is known to be small enough for onnx to materialise."""
    const = _constant_values(inferred)
    init_names = {i.name for i in inferred.graph.initializer}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        if vi.name not in const or vi.name in init_names:
            continue
        got = shape_of(vi.type)
        if got is None or not vi.type.tensor_type.HasField("shape"):
            return False
        dims = got[0]
        if not all(isinstance(d, int) and d >= 0 for d in dims):
            return False
        if math.prod(dims) > DATA_PROP_MAX_ELEMENTS:  # type: ignore[arg-type]
            return False
    return True


def _infer(proto: onnx.ModelProto) -> onnx.ModelProto:
    """onnx's shape inference; with data propagation when it is safe (see
    :data:`DATA_PROP_MAX_ELEMENTS`). The graph outputs' declared types are not trusted: they
    are inferred, compared with the declaration (a conflict raises) and kept only where the
    inference knows nothing."""
    declared = {o.name: onnx.TypeProto.FromString(o.type.SerializeToString())
                for o in proto.graph.output}
    work = onnx.ModelProto()
    work.CopyFrom(proto)
    for o in work.graph.output:
        if o.type.HasField("tensor_type"):
            o.type.Clear()
    # in a model with data-dependent or control-flow nodes, an output's declared size that
    # the inference leaves open is the exporter's example, not a fact: it stays open
    dynamic = any(n.op_type in DATA_DEPENDENT_OPS for n in proto.graph.node)
    plain = _infer_once(work, data_prop=False)
    inferred = _infer_once(work, data_prop=True) if _safe_for_data_prop(plain) else plain
    for o in inferred.graph.output:
        want = declared.get(o.name)
        if want is None or not want.HasField("tensor_type"):
            continue
        if not o.type.HasField("tensor_type"):
            o.type.CopyFrom(want)  # nothing inferred (e.g. an unknown custom operator)
            continue
        _check_declared_output(o.name, want, o.type, fill_dims=not dynamic)
    return inferred


def _check_declared_output(name: str, want: onnx.TypeProto, got: onnx.TypeProto,
                           fill_dims: bool = True) -> None:
    """Raise when graph output ``name``'s declared type ``want`` conflicts with the inferred
    ``got``; fill what the inference left unknown from the declaration (the dimensions only
    with ``fill_dims``)."""
    wt, gt = want.tensor_type, got.tensor_type
    if wt.elem_type and gt.elem_type and wt.elem_type != gt.elem_type:
        raise ShapeInferenceError(
            f"graph output {name!r} is declared {_type_name(wt.elem_type)}, but the model "
            f"computes {_type_name(gt.elem_type)} there"
        )
    if not gt.elem_type and wt.elem_type:
        gt.elem_type = wt.elem_type
    if not wt.HasField("shape"):
        return
    wdims = shape_of(want)[0]  # type: ignore[index]
    if not gt.HasField("shape"):
        if fill_dims:
            gt.shape.CopyFrom(wt.shape)
        return
    gdims = shape_of(got)[0]  # type: ignore[index]
    if len(wdims) != len(gdims) or any(
        isinstance(w, int) and isinstance(g, int) and w != g for w, g in zip(wdims, gdims)
    ):
        raise ShapeInferenceError(
            f"graph output {name!r} is declared with shape {_fmt_dims(wdims)}, but the model "
            f"computes shape {_fmt_dims(gdims)} there"
        )
    for dim, w in zip(gt.shape.dim, wdims):  # what the inference left unknown
        if fill_dims and isinstance(w, int) and not dim.HasField("dim_value"):
            dim.dim_value = w


def _type_name(elem: int) -> str:
    try:
        return f"tensor({helper.tensor_dtype_to_string(elem).split('.')[-1].lower()})"
    except (KeyError, ValueError, TypeError):
        return f"element type {elem}"


def import_model(
    model: ModelLike, input_shapes: Mapping[str, Sequence[int]] | None = None
) -> Graph:
    """Read, check and convert an ONNX model into a :class:`Graph` with static input shapes.

    The returned graph is not yet simplified; see :func:`dispatch.passes.simplify`.
    """
    proto = read_model(model)
    try:
        _check(split_weights(proto)[0])
    except ModelLoadError as exc:
        if isinstance(model, str | os.PathLike):  # say which file: the CLI may load several
            raise ModelLoadError(f"{os.fspath(model)}: {exc}") from None
        raise
    if proto.functions:
        names = ", ".join(f.name for f in proto.functions)
        raise ModelLoadError(
            f"model-local functions are not supported (the model defines: {names})")
    quirks = open_unknown_dims(proto)
    declared = declared_inputs(proto)
    _fix_inputs(proto, input_shapes)
    # checked above; _fix_inputs leaves them
    light, weights = split_weights(proto, check=False)
    inferred = _infer(light)
    graph = _to_graph(inferred, weights)
    graph.declared = declared
    graph.quirks = quirks
    return graph


def _to_graph(proto: onnx.ModelProto, weights: Sequence[onnx.TensorProto] = ()) -> Graph:
    g = proto.graph
    opsets = {(o.domain if o.domain != "ai.onnx" else ""): int(o.version)
              for o in proto.opset_import}
    values: dict[str, Value] = {}

    def typed(vi: onnx.ValueInfoProto) -> Value:
        got = shape_of(vi.type)
        if got is None:
            raise ModelLoadError(f"value {vi.name!r} is not a tensor; only tensors are supported")
        dims, elem = got
        has_shape = vi.type.tensor_type.HasField("shape")
        shape = tuple(dims) if has_shape and all(isinstance(d, int) for d in dims) else None
        try:
            dtype = np_dtype(elem) if elem else None
        except ModelLoadError as exc:
            raise ModelLoadError(f"value {vi.name!r}: {exc}") from None
        return Value(vi.name, shape, dtype)  # type: ignore[arg-type]

    for name, arr in read_initializers(g, weights).items():
        values[name] = Value(name, tuple(arr.shape), arr.dtype, arr)

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
        try:
            attrs = attrs_from_proto(np_, opsets)
        except OpDispatchError:
            raise
        except Exception as exc:  # a malformed tensor attribute
            raise ModelLoadError(
                f"node {name!r} ({np_.op_type}): an attribute cannot be read "
                f"({type(exc).__name__}: {exc})"
            ) from None
        for o in outs:
            if o.shape is not None and any(d < 0 for d in o.shape):
                raise ShapeInferenceError(
                    f"node {name!r} ({np_.op_type}) would produce {o.name!r} with shape "
                    f"{list(o.shape)}: a negative dimension (inputs: "
                    f"{', '.join(f'{v.name} {list(v.shape or ())}' for v in ins if v is not None)}); "
                    f"expected dimensions >= 0 (is a kernel or pad larger than its input?)"
                )
        captures = node_captures(subgraphs_of(attrs))
        for c in captures:  # a body's outer-scope reads: implicit inputs of the node
            if c not in values:
                raise ModelLoadError(
                    f"node {name!r} ({np_.op_type}): a subgraph reads {c!r}, which is neither "
                    f"a graph input, an initializer nor the output of an earlier node")
            ins.append(values[c])
        nodes.append(Node(name, np_.op_type, ins, outs, attrs, domain, opsets.get(domain, 1),
                          captures))

    check_tensor_sizes(values.values())
    available = {v.name for v in inputs} | {v.name for v in values.values() if v.is_const}
    try:
        nodes = hoist_input_readers(topological_order(nodes, available),
                                    {v.name for v in inputs}, available)
    except OpDispatchError as exc:
        raise ModelLoadError(str(exc)) from None
    outputs = []
    for vi in g.output:
        if vi.name not in values:
            raise ModelLoadError(f"graph output {vi.name!r} is produced by no node")
        outputs.append(values[vi.name])
    return Graph(g.name or "model", nodes, values, inputs, outputs, opsets)
