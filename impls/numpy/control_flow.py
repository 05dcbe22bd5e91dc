"""Control flow on the reference backend: If, Loop and Scan run their bodies as small plans of
their own.

A body (:class:`dispatch.subgraph.Subgraph`) is run by :class:`BodyRunner`: its nodes, in
order, each on the reference implementation of this backend that supports it (built on the
first run, from the element types seen then, with shapes left open: a loop's tensors may
change shape from one iteration to the next), or, for an operator this backend lacks, on
onnx's reference implementation of that one node. Nested control flow recurses. A body reads
its enclosing scopes' values by name (ONNX's outer-scope references): the node receives them
as its last inputs (:attr:`dispatch.graph.Node.captures`), and each body run starts from
them, its own inputs shadowing them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dispatch.graph import Node, Value
from dispatch.onnx_attrs import attrs_from_proto
from dispatch.registry import Priority
from dispatch.subgraph import Subgraph, node_captures, subgraphs_of
from impls.numpy.table import impls


@dataclass
class _BodyStep:
    """One node of a body, its kernel built on first use (for the dtypes it then reads)."""

    proto_name: str
    op_type: str
    domain: str
    opset: int
    attrs: dict
    input_names: list[str]
    output_names: list[str]
    captures: tuple[str, ...]
    kernel: Callable | None = None
    dtypes: tuple | None = None

    def run(self, env: Mapping[str, np.ndarray], consts: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        names = [*self.input_names, *self.captures]
        try:
            args = [None if not n else env[n] for n in names]
        except KeyError as exc:
            raise ValueError(f"body node {self.proto_name!r} ({self.op_type}) reads {exc.args[0]!r}, "
                             f"which neither the body nor an enclosing scope defines") from None
        dtypes = tuple(None if a is None else np.asarray(a).dtype for a in args)
        if self.kernel is None or dtypes != self.dtypes:
            self.kernel, self.dtypes = self._build(names, args, consts), dtypes
        out = self.kernel(*args)
        out = list(out) if isinstance(out, tuple | list) else [out]
        return [np.asarray(o) for o in out]

    def _build(self, names: list[str], args: list, consts: Mapping[str, np.ndarray]) -> Callable:
        ins = [None if not n else Value(n, None, np.asarray(a).dtype,
                                        consts.get(n)) for n, a in zip(names, args)]
        outs = [Value(o or f"{self.proto_name}__unused_{k}", None, None)
                for k, o in enumerate(self.output_names)]
        node = Node(self.proto_name, self.op_type, ins, outs, self.attrs, self.domain,
                    self.opset, self.captures)
        for impl in sorted((i for i in impls if i.op == node.key_op and not i.pattern),
                           key=lambda i: -i.priority):
            if impl.supports(node) is None:
                return impl.build(node)
        if self.domain != "":
            raise ValueError(f"no reference implementation runs body node {self.proto_name!r} "
                             f"({node.key_op})")
        from dispatch.shape_folding import onnx_reference_evaluate

        def by_onnx(*arrays: np.ndarray | None) -> list[np.ndarray]:
            return onnx_reference_evaluate(node, list(arrays[: len(self.input_names)]))

        return by_onnx


class BodyRunner:
    """Runs one body: ``runner(feeds)`` -> its outputs, ``feeds`` holding its inputs and the
    enclosing scopes' values it reads. Thread-safe: kernels are built under a lock."""

    def __init__(self, sub: Subgraph) -> None:
        from onnx import numpy_helper

        self.sub = sub
        g = sub.proto
        self.input_names = sub.input_names
        self.output_names = sub.output_names
        self.consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
        self.steps: list[_BodyStep] = []
        for k, n in enumerate(g.node):
            domain = n.domain if n.domain != "ai.onnx" else ""
            attrs = attrs_from_proto(n, sub.opsets)
            self.steps.append(_BodyStep(
                n.name or f"{n.op_type}_{k}", n.op_type, domain, sub.opsets.get(domain, 1), attrs,
                list(n.input), list(n.output), node_captures(subgraphs_of(attrs))))
        self._lock = threading.Lock()
        self._built = False
        #: the declared element type of each output (for empty scan outputs)
        self.output_dtypes = [_declared_dtype(o.type) for o in g.output]
        self.output_dims = [_declared_dims(o.type) for o in g.output]

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        env: dict[str, np.ndarray] = {**feeds, **self.consts}
        if not self._built:
            with self._lock:  # the first run builds the kernels
                out = self._run(env)
                self._built = True
                return out
        return self._run(env)

    def _run(self, env: dict[str, np.ndarray]) -> list[np.ndarray]:
        for step in self.steps:
            for name, arr in zip(step.output_names, step.run(env, self.consts)):
                if name:
                    env[name] = arr
        try:
            return [env[name] for name in self.output_names]
        except KeyError as exc:
            raise ValueError(f"a body output {exc.args[0]!r} is computed by none of its nodes") from None


def _declared_dtype(tp) -> np.dtype | None:
    from onnx import helper

    if not tp.HasField("tensor_type") or not tp.tensor_type.elem_type:
        return None
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(tp.tensor_type.elem_type))
    except (KeyError, TypeError, ValueError):
        return None


def _declared_dims(tp) -> tuple[int, ...] | None:
    if not tp.HasField("tensor_type") or not tp.tensor_type.HasField("shape"):
        return None
    dims = tp.tensor_type.shape.dim
    if not all(d.HasField("dim_value") for d in dims):
        return None
    return tuple(int(d.dim_value) for d in dims)


def _outer(node: Node, captured: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    return dict(zip(node.captures, captured))


def _bodies_reason(node: Node, *names: str) -> str | None:
    for name in names:
        if not isinstance(node.attr(name), Subgraph):
            return f"{node.op_type} needs its body attribute {name!r}"
    return None


def _supports_if(node: Node) -> str | None:
    return _bodies_reason(node, "then_branch", "else_branch")


@impls.register("If", "subgraphs", priority=Priority.DEFAULT, supports=_supports_if)
def build_if(node: Node) -> Callable:
    """If: the branch the condition picks, run as a plan of its own."""
    then_run, else_run = BodyRunner(node.attr("then_branch")), BodyRunner(node.attr("else_branch"))

    def run(cond: np.ndarray, *captured: np.ndarray) -> tuple[np.ndarray, ...]:
        c = np.asarray(cond)
        if c.size != 1:
            raise ValueError(f"If's condition must hold one element, received shape {c.shape}")
        body = then_run if bool(c.reshape(-1)[0]) else else_run
        return tuple(body(_outer(node, captured)))

    return run


def _supports_loop(node: Node) -> str | None:
    return _bodies_reason(node, "body")


@impls.register("Loop", "subgraphs", priority=Priority.DEFAULT, supports=_supports_loop)
def build_loop(node: Node) -> Callable:
    """Loop: the body run per iteration until the trip count or its condition ends it;
    loop-carried values passed on, scan outputs stacked on a new first axis."""
    body = BodyRunner(node.attr("body"))
    n_carried = len(node.explicit_inputs) - 2
    n_scan = len(node.outputs) - n_carried
    it_name, cond_name, *carried_names = body.input_names
    scan_types = [(node.outputs[n_carried + k].dtype or body.output_dtypes[1 + n_carried + k],
                   body.output_dims[1 + n_carried + k]) for k in range(n_scan)]

    def run(trip: np.ndarray | None, cond: np.ndarray | None, *rest: np.ndarray) -> tuple:
        carried, captured = list(rest[:n_carried]), rest[n_carried:]
        outer = _outer(node, captured)
        max_trip = None if trip is None else int(np.asarray(trip).reshape(-1)[0])
        go = True if cond is None else bool(np.asarray(cond).reshape(-1)[0])
        scans: list[list[np.ndarray]] = [[] for _ in range(n_scan)]
        i = 0
        while go and (max_trip is None or i < max_trip):
            feeds = {**outer, it_name: np.array(i, np.int64), cond_name: np.array(go)}
            feeds.update(zip(carried_names, carried))
            outs = body(feeds)
            go = bool(np.asarray(outs[0]).reshape(-1)[0])
            carried = outs[1:1 + n_carried]
            for k in range(n_scan):
                scans[k].append(outs[1 + n_carried + k])
            i += 1
        stacked = []
        for k, parts in enumerate(scans):
            if parts:
                stacked.append(np.stack(parts))
            else:
                dtype, dims = scan_types[k]
                stacked.append(np.empty((0, *(dims or ())), dtype or np.float32))
        return (*carried, *stacked)

    return run


def _supports_scan(node: Node) -> str | None:
    return _bodies_reason(node, "body")


@impls.register("Scan", "subgraphs", priority=Priority.DEFAULT, supports=_supports_scan)
def build_scan(node: Node) -> Callable:
    """Scan: the body run once per slice of the scan inputs along their axes, states passed
    on, per-slice outputs stacked along the output axes (directions honoured). Opset 8's
    form (a batch axis first, an optional ``sequence_lens``) runs each batch entry alone."""
    if node.opset < 9:
        return _scan8(node)
    return _scan9(node, len(node.explicit_inputs))


def _scan8(node: Node) -> Callable:
    n_explicit = len(node.explicit_inputs) - 1  # without sequence_lens
    inner = _scan9(node, n_explicit)
    n_state = n_explicit - int(node.attr("num_scan_inputs"))

    def run(seq_lens: np.ndarray | None, *args: np.ndarray) -> tuple:
        data, captured = args[:n_explicit], args[n_explicit:]
        batch = np.asarray(data[0]).shape[0]
        full = np.asarray(data[n_state]).shape[1] if n_explicit > n_state else 0
        if seq_lens is not None and np.any(np.asarray(seq_lens) != full):
            raise ValueError(f"Scan (opset 8) with sequence_lens {np.asarray(seq_lens).tolist()} "
                             f"shorter than the inputs' length {full} is not supported")
        per = [inner(*[np.asarray(a)[b] for a in data], *captured) for b in range(batch)]
        return tuple(np.stack([p[k] for p in per]) for k in range(len(per[0]))) if per else ()

    return run


def _scan9(node: Node, n_explicit: int) -> Callable:
    body = BodyRunner(node.attr("body"))
    m = int(node.attr("num_scan_inputs"))
    n_state = n_explicit - m
    n_out = len(node.outputs) - n_state
    in_axes = list(node.attr("scan_input_axes") or [0] * m)
    in_dirs = list(node.attr("scan_input_directions") or [0] * m)
    out_axes = list(node.attr("scan_output_axes") or [0] * n_out)
    out_dirs = list(node.attr("scan_output_directions") or [0] * n_out)
    names = body.input_names

    def run(*args: np.ndarray) -> tuple:
        states = list(args[:n_state])
        scan_ins = [np.asarray(a) for a in args[n_state:n_state + m]]
        outer = _outer(node, args[n_state + m:])
        axes = [ax % x.ndim for ax, x in zip(in_axes, scan_ins)]
        lengths = {x.shape[ax] for ax, x in zip(axes, scan_ins)}
        if len(lengths) > 1:
            raise ValueError(f"Scan's inputs have different lengths along their scan axes: "
                             f"{sorted(lengths)}")
        length = lengths.pop() if lengths else 0
        parts: list[list[np.ndarray]] = [[] for _ in range(n_out)]
        for t in range(length):
            feeds = dict(outer)
            feeds.update(zip(names[:n_state], states))
            for name, x, ax, d in zip(names[n_state:], scan_ins, axes, in_dirs):
                feeds[name] = np.take(x, length - 1 - t if d else t, axis=ax)
            outs = body(feeds)
            states = outs[:n_state]
            for k in range(n_out):
                parts[k].append(outs[n_state + k])
        results = []
        for k in range(n_out):
            seq = parts[k][::-1] if out_dirs[k] else parts[k]
            if not seq:
                dtype = node.outputs[n_state + k].dtype or np.float32
                results.append(np.empty((0,), dtype))
                continue
            arr = np.stack(seq)
            results.append(np.moveaxis(arr, 0, out_axes[k] % arr.ndim))
        return (*states, *results)

    return run
