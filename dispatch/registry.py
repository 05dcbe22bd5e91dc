"""Operator implementations and the registry that holds them.

An :class:`Implementation` is one way to run one operator: a unique name such as
``Conv.numpy.im2col``, the backend it belongs to, the layouts it consumes and produces, a
priority, a ``supports(node)`` check that returns ``None`` or a human-readable reason, and a
``build(node)`` function that prepares a kernel once per plan (packing weights, choosing an
algorithm) and returns a callable run on every inference.

Backends declare their implementations in an :class:`ImplTable` with a decorator and hand
the table to the :class:`Registry` when they register; nothing is discovered by scanning
module globals.

A backend may also bring operators of an ONNX domain of its own (e.g. ``com.example``'s
``FastGelu``): it registers the operator's ``onnx.defs.OpSchema`` with
:meth:`Registry.add_op_schema` (so that models using it pass onnx's checker and shape
inference) and the operator's reference semantics as an implementation of the reference
backend (:data:`REFERENCE_BACKEND`, in an ``ImplTable(REFERENCE_BACKEND)`` of its own), so that
the tuner checks its other implementations against that reference like any other operator's.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dispatch.errors import RegistryError, known
from dispatch.graph import Node, op_key
from layouts.registry import CORE, STANDARD

if TYPE_CHECKING:
    from dispatch.backend import Backend, BackendStatus
    from dispatch.backend_manifest import DeferredBackend
    from dispatch.op_schema import ShapeFn
    from layouts.registry import LayoutRegistry

#: A prepared kernel: called with one array (or ``None`` for an omitted optional input) per
#: node input, in the layouts the implementation declared; returns one array or a tuple with
#: one array per node output.
Kernel = Callable[..., Any]
#: Prepares a kernel for one node, once per plan.
BuildFn = Callable[[Node], Kernel]
#: Returns ``None`` when the implementation can run the node, else the reason it cannot.
SupportsFn = Callable[[Node], "str | None"]
#: Layouts per input (or output): a tuple, or a function of the node for variadic ops.
LayoutSpec = "tuple[str, ...] | Callable[[Node], tuple[str, ...]]"


#: The backend whose implementations define every operator's semantics: the tuner checks every
#: candidate against it and validates whole plans against an all-reference plan. A backend that
#: brings a custom operator contributes its reference implementation under this backend name.
REFERENCE_BACKEND = "numpy"


class Priority(enum.IntEnum):
    """Named priority levels. Within a backend the highest priority that supports a node wins
    in an untuned plan; a tuned plan overrides priorities with measurements, and ties within
    the measured noise go to the higher priority."""

    FALLBACK = 10
    DEFAULT = 20
    PREFERRED = 30
    #: a kernel for a special case that a PREFERRED one also covers (1x1, depthwise), so the
    #: special case wins the untuned plan
    SPECIALISED = 35


def _all_standard(node: Node) -> tuple[str, ...]:
    return (STANDARD,) * len(node.inputs)


def _outputs_standard(node: Node) -> tuple[str, ...]:
    return (STANDARD,) * len(node.outputs)


@dataclass(frozen=True)
class Implementation:
    """One registered way to run one operator."""

    name: str
    op: str
    backend: str
    build: BuildFn
    priority: int = Priority.DEFAULT
    supports_fn: SupportsFn | None = None
    layouts_in: Any = _all_standard
    layouts_out: Any = _outputs_standard
    doc: str = ""
    #: op types of the chain a fused implementation covers (empty for single-node ones)
    pattern: tuple[str, ...] = ()
    #: a region implementation's proposer: ``propose(graph) -> [[node name, ...], ...]``,
    #: the convex node sets it offers to run as one step (see dispatch.fusion.region_node)
    propose: Callable[[Any], list[list[str]]] | None = None
    #: the library settings this implementation builds its kernels with (e.g. onnxruntime's
    #: graph optimisation level): variants of one library differ only here, and the tuner
    #: measures each like any other candidate; the plan records the implementation, so its
    #: settings, and a plan is refused when the library's version changes
    settings: Mapping[str, Any] = field(default_factory=dict)
    #: whether it runs nodes whose shapes are known only at run time (dynamic values:
    #: :mod:`dispatch.subgraph`); the reference backend's do, sizing outputs from the arrays
    dynamic_shapes: bool = False
    #: ``float32``, or a reduced precision (``bf16``, ``int8``) only accuracy tuning may choose;
    #: ``calibrate(region, input samples) -> JSON`` what its build needs of the data (ranges)
    precision: str = "float32"
    calibrate: Callable[[Any, list], Any] | None = None

    @property
    def is_region(self) -> bool:
        return self.propose is not None

    def supports(self, node: Node) -> str | None:
        """``None`` when this implementation can run ``node``, else the reason it cannot."""
        if self.supports_fn is None:
            return None
        try:
            return self.supports_fn(node)
        except Exception as exc:  # a faulty check must not take the planner down
            return f"supports() raised {type(exc).__name__}: {exc}"

    def input_layouts(self, node: Node) -> tuple[str, ...]:
        lay = self.layouts_in(node) if callable(self.layouts_in) else tuple(self.layouts_in)
        return _fit(lay, len(node.inputs))

    def output_layouts(self, node: Node) -> tuple[str, ...]:
        lay = self.layouts_out(node) if callable(self.layouts_out) else tuple(self.layouts_out)
        return _fit(lay, len(node.outputs))


def _fit(layouts: Sequence[str], n: int) -> tuple[str, ...]:
    """Extend a layout tuple to ``n`` entries with the standard layout (optional extras)."""
    lay = tuple(layouts)[:n]
    return lay + (STANDARD,) * (n - len(lay))


class ImplTable:
    """A backend's own table of implementations, filled with the :meth:`register` decorator."""

    def __init__(self, backend: str, *, dynamic_shapes: bool = False) -> None:
        """``dynamic_shapes``: see :attr:`Implementation.dynamic_shapes` (single-node ones)."""
        self.backend = backend
        self.dynamic_shapes = dynamic_shapes
        self._impls: list[Implementation] = []
        self._names: set[str] = set()

    def register(
        self,
        op: str,
        variant: str,
        *,
        priority: int = Priority.DEFAULT,
        supports: SupportsFn | None = None,
        layouts_in: Any = None,
        layouts_out: Any = None,
        domain: str = "",
    ) -> Callable[[BuildFn], BuildFn]:
        """Decorate a build function ``build(node) -> kernel`` as ``{op}.{backend}.{variant}``."""

        def deco(build: BuildFn) -> BuildFn:
            self.add(
                Implementation(
                    name=f"{op}.{self.backend}.{variant}",
                    op=op_key(domain, op),
                    backend=self.backend,
                    build=build,
                    priority=int(priority),
                    supports_fn=supports,
                    layouts_in=layouts_in if layouts_in is not None else _all_standard,
                    layouts_out=layouts_out if layouts_out is not None else _outputs_standard,
                    doc=(build.__doc__ or "").strip().split("\n")[0],
                    dynamic_shapes=self.dynamic_shapes,
                )
            )
            return build

        return deco

    def register_pattern(
        self,
        ops: Sequence[str],
        variant: str,
        *,
        priority: int = Priority.DEFAULT,
        supports: SupportsFn | None = None,
        layouts_in: Any = None,
        layouts_out: Any = None,
    ) -> Callable[[BuildFn], BuildFn]:
        """Decorate a fused implementation of the chain ``ops`` (e.g. ``("Conv", "Relu")``),
        named ``Conv+Relu.{backend}.{variant}``. Its ``supports``, layout functions and build
        function receive a :class:`dispatch.fusion.FusedNode`."""
        from dispatch.fusion import pattern_key

        ops = tuple(ops)
        if len(ops) < 2:
            raise RegistryError(f"a pattern covers at least two ops, received {ops}")
        key = pattern_key(ops)

        def deco(build: BuildFn) -> BuildFn:
            self.add(
                Implementation(
                    name=f"{key}.{self.backend}.{variant}",
                    op=key,
                    backend=self.backend,
                    build=build,
                    priority=int(priority),
                    supports_fn=supports,
                    layouts_in=layouts_in if layouts_in is not None else _all_standard,
                    layouts_out=layouts_out if layouts_out is not None else _outputs_standard,
                    doc=(build.__doc__ or "").strip().split("\n")[0],
                    pattern=ops,
                )
            )
            return build

        return deco

    def register_region(
        self,
        variant: str,
        *,
        propose: Callable[[Any], list[list[str]]],
        priority: int = Priority.DEFAULT,
        supports: SupportsFn | None = None,
        settings: Mapping[str, Any] | None = None,
        dynamic_shapes: bool = False, precision: str = "float32", calibrate: Callable | None = None,
        layouts_in: Any = None, layouts_out: Any = None) -> Callable[[BuildFn], BuildFn]:
        """Decorate the build function of a region implementation ``Region.{backend}.{variant}``:
        ``propose(graph)`` lists the convex node sets it offers (several granularities, so the
        tuner can mix it with other backends); ``supports`` and ``build`` receive the region's
        :class:`dispatch.fusion.FusedNode` (op type ``Region``). Regions read and write the
        standard layout unless ``layouts_in`` / ``layouts_out`` say otherwise (as for single
        ops; a reduced-precision region may hold its precision's: :mod:`layouts.precision`). ``settings`` names the library settings the build uses (shown in
        reports; a variant of the same library with other settings is another registration).
        ``dynamic_shapes``: its regions may hold values whose shapes are known only at run
        time (its ``supports`` still decides node by node). ``precision``, ``calibrate``: see :class:`Implementation`."""
        from dispatch.fusion import REGION_OP

        def deco(build: BuildFn) -> BuildFn:
            self.add(
                Implementation(
                    name=f"{REGION_OP}.{self.backend}.{variant}",
                    op=REGION_OP,
                    backend=self.backend,
                    build=build,
                    priority=int(priority),
                    supports_fn=supports,
                    doc=(build.__doc__ or "").strip().split("\n")[0],
                    propose=propose,
                    layouts_in=layouts_in or _all_standard, layouts_out=layouts_out or _outputs_standard,
                    settings=dict(settings or {}),
                    dynamic_shapes=dynamic_shapes, precision=precision, calibrate=calibrate,
                )
            )
            return build

        return deco

    def add(self, impl: Implementation) -> None:
        if impl.backend != self.backend:
            raise RegistryError(
                f"implementation {impl.name!r} declares backend {impl.backend!r} but was added "
                f"to the table of backend {self.backend!r}"
            )
        if impl.name in self._names:
            raise RegistryError(f"duplicate implementation name {impl.name!r}")
        self._impls.append(impl)
        self._names.add(impl.name)

    def __iter__(self):
        return iter(self._impls)

    def __len__(self) -> int:
        return len(self._impls)


@dataclass
class Registry:
    """Every implementation, backend and layout known to this process.

    A backend's registration may be deferred (a process that starts from a stored plan
    registers only the backends its plan runs; :mod:`dispatch.backend_manifest`): every
    accessor below completes the deferred backends it needs first, in the order a full
    registration would have run them, so that what it returns is what it would have
    returned had every backend registered at discovery.
    """

    layouts: LayoutRegistry
    _by_op: dict[str, list[Implementation]] = field(default_factory=dict)
    _by_name: dict[str, Implementation] = field(default_factory=dict)
    backends: dict[str, BackendStatus] = field(default_factory=dict)
    #: operators of non-default ONNX domains brought by backends, by registry key
    #: (``domain::op_type``)
    custom_ops: dict[str, CustomOp] = field(default_factory=dict)
    #: backends registered or deferred, in registration order
    _order: list[str] = field(default_factory=list)
    _deferred: dict[str, DeferredBackend] = field(default_factory=dict)
    #: ``impl:NAME`` / ``layout:NAME`` / ``converter:NAME`` -> the backend whose
    #: registration added it (a backend may add implementations of another backend name,
    #: e.g. a custom operator's reference)
    _owner: dict[str, str] = field(default_factory=dict, repr=False)
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)
    #: runs a deferred backend's registration (dispatch.backend.complete_registration)
    _completer: Callable[[Registry, BackendStatus], Any] | None = field(default=None, repr=False, compare=False)
    #: the thread running deferred registrations (0: none)
    _completing: int = 0

    def __post_init__(self) -> None:
        self.layouts._resolve = self._resolve_layouts

    # -- deferred registration -------------------------------------------------------
    def defer(self, deferred: DeferredBackend, completer: Callable[[Registry, BackendStatus], Any]) -> None:
        """Record ``deferred`` as registered-to-be; ``completer(registry, status)`` runs its
        registration when it is needed (see :mod:`dispatch.backend_manifest`)."""
        self._completer = completer
        self._deferred[deferred.status.name] = deferred
        self._order.append(deferred.status.name)

    @property
    def deferred(self) -> list[str]:
        """The backends whose registration is still deferred, in registration order."""
        return list(self._deferred)

    def complete(self, backends: Iterable[str] | None = None) -> None:
        """Run the deferred registrations of ``backends`` (default: all), after those they
        need, in registration order."""
        me = threading.get_ident()
        if not self._deferred or self._completing == me:
            return  # a registration running now sees the registry as it is
        with self._lock:  # another thread's lookups wait for the registrations they need
            wanted = list(self._deferred) if backends is None else [
                b for b in backends if b in self._deferred]
            if not wanted:
                return
            todo: set[str] = set()
            stack = list(wanted)
            while stack:
                name = stack.pop()
                if name in todo or name not in self._deferred:
                    continue
                todo.add(name)
                needs = self._deferred[name].needs
                if needs is None:
                    needs = tuple(self._order[:self._order.index(name)])
                stack.extend(needs)
            assert self._completer is not None
            self._completing = me
            try:
                for name in [b for b in self._order if b in todo]:
                    self._completer(self, self._deferred.pop(name).status)
                self._reorder()
            finally:
                self._completing = 0

    def _complete_if(self, pred: Callable[[DeferredBackend], bool]) -> None:
        if self._completing != threading.get_ident() and (self._deferred or self._completing):
            with self._lock:  # waits for a registration another thread runs (popped from _deferred)
                self.complete([n for n, d in list(self._deferred.items()) if pred(d)])

    def _note_owner(self, backend: str, before: tuple) -> None:
        """Record ``backend`` as the registrant of what it added since snapshot ``before``
        (:func:`dispatch.backend._snapshot`)."""
        for name in self._by_name.keys() - before[0].keys():
            self._owner[f"impl:{name}"] = backend
        for name in self.layouts._layouts.keys() - before[2].keys():
            self._owner[f"layout:{name}"] = backend
        had = {c.name for cs in before[3].values() for c in cs}
        for convs in self.layouts._converters.values():
            for c in convs:
                if c.name not in had:
                    self._owner[f"converter:{c.name}"] = backend

    def _reorder(self) -> None:
        """Put implementations, layouts and converters in registration order, as a full
        registration would have left them (a backend completed late appended its own)."""
        rank = {b: k for k, b in enumerate(self._order)}

        def key(kind: str, name: str, backend: str) -> int:
            owner = self._owner.get(f"{kind}:{name}", backend)
            return -1 if owner == CORE else rank.get(owner, len(rank))  # the core's first

        # new containers, each assigned at once: a reader in another thread sees the old or
        # the new one, never a list being sorted
        self._by_name = dict(sorted(self._by_name.items(),
                                    key=lambda kv: key("impl", kv[0], kv[1].backend)))
        self._by_op = {op: sorted(impls, key=lambda i: key("impl", i.name, i.backend))
                       for op, impls in self._by_op.items()}
        lay = self.layouts
        lay._layouts = dict(sorted(lay._layouts.items(), key=lambda kv: (
            kv[0] != STANDARD, key("layout", kv[0], kv[1].backend))))
        lay._converters = {k: sorted(convs, key=lambda c: key("converter", c.name, c.backend))
                           for k, convs in lay._converters.items()}
        lay._paths.clear()

    def _resolve_layouts(self, kind: str, name: str = "") -> None:
        """The layout registry's hook: complete the deferred backend that brings layout or
        converter ``name`` (``kind`` ``"layout"`` or ``"converter"``), or every deferred one
        (``"all"``)."""
        if kind == "all":
            self._complete_if(lambda d: True)
        elif kind == "layout":
            self._complete_if(lambda d: name in d.layouts)
        else:
            self._complete_if(lambda d: name in d.converters)

    def names_by_backend(self, backends: Iterable[str]) -> dict[str, list[str]]:
        """backend -> the names of its implementations and (``layout:NAME``) layouts, whether
        registered or deferred, without completing any."""
        names: dict[str, list[str]] = {b: [] for b in backends}
        live = {b for b in names if b not in self._deferred}
        for impl in self._by_name.values():
            if impl.backend in live:
                names[impl.backend].append(impl.name)
        for lay in self.layouts._layouts.values():
            if getattr(lay, "backend", None) in live:
                names[lay.backend].append(f"layout:{lay.name}")
        for b in names.keys() - live:
            names[b] = list(self._deferred[b].names)  # as recorded by a full registration
        return names

    def backend_of(self, kind: str, name: str) -> str | None:
        """The backend of implementation (``kind`` ``"impl"``) or converter (``"converter"``)
        ``name``, registered or deferred, without completing any; ``None`` when no backend
        has it."""
        if kind == "impl":
            found = self._by_name.get(name)
            if found is not None:
                return found.backend
            records = (d.status.name for d in self._deferred.values() if name in d.impls)
        elif kind == "converter":
            conv = self.layouts.registered_converter(name)
            if conv is not None:
                return conv.backend
            records = (d.status.name for d in self._deferred.values() if name in d.converters)
        else:
            raise ValueError(f"kind must be 'impl' or 'converter', received {kind!r}")
        return next(records, None)

    def op_backends(self, op: str) -> set[str]:
        """The backends with an implementation of ``op`` (registered or deferred), without
        completing any."""
        found = {i.backend for i in self._by_op.get(op, ())}
        found.update(b for b, d in self._deferred.items() if op in d.ops)
        return found

    # -- implementations -------------------------------------------------------------
    def add_impl(self, impl: Implementation) -> None:
        """Register one implementation; a duplicate name raises :class:`RegistryError`."""
        if impl.name in self._by_name:
            other = self._by_name[impl.name]
            raise RegistryError(
                f"duplicate implementation name {impl.name!r}: already registered by backend "
                f"{other.backend!r}, received again from backend {impl.backend!r}"
            )
        self._by_name[impl.name] = impl
        self._by_op.setdefault(impl.op, []).append(impl)

    def add_table(self, table: Iterable[Implementation]) -> None:
        for impl in table:
            self.add_impl(impl)

    def impls_for(self, op: str, backends: Sequence[str] | None = None) -> list[Implementation]:
        """Implementations of ``op`` (optionally restricted to ``backends``, kept in that
        order, then by descending priority). Unknown ops raise, listing the known ops."""
        self._complete_if(lambda d: op in d.ops and (
            backends is None or d.status.name in backends))
        if op not in self._by_op:
            self._complete_if(lambda d: True)  # the error lists every known operator
        if op not in self._by_op:
            raise RegistryError(
                f"no implementation is registered for operator {op!r}; known operators: "
                f"{known(self._by_op)}"
            )
        impls = self._by_op[op]
        if backends is None:
            return sorted(impls, key=lambda i: -i.priority)
        rank = {b: k for k, b in enumerate(backends)}
        chosen = [i for i in impls if i.backend in rank]
        return sorted(chosen, key=lambda i: (rank[i.backend], -i.priority))

    def patterns(self, backends: Sequence[str] | None = None) -> list[Implementation]:
        """Fused (multi-node) implementations, optionally of ``backends`` only."""
        self._complete_if(lambda d: backends is None or d.status.name in backends)
        return [
            i for i in self._by_name.values()
            if i.pattern and (backends is None or i.backend in backends)
        ]

    def regions(self, backends: Sequence[str] | None = None, precisions: Sequence[str] | None = ("float32",)) -> list[Implementation]:
        """Region implementations (subgraph backends), optionally of ``backends`` only, in
        that order; float32 ones unless ``precisions`` names others (``None``: all)."""
        self._complete_if(lambda d: backends is None or d.status.name in backends)
        found = [i for i in self._by_name.values() if i.is_region and (backends is None or i.backend in backends) and (precisions is None or i.precision in precisions)]
        rank = {b: k for k, b in enumerate(backends or ())}
        return sorted(found, key=lambda i: (rank[i.backend], -i.priority)) if backends is not None else found

    def has_op(self, op: str) -> bool:
        return op in self._by_op or any(op in d.ops for d in self._deferred.values())

    def reference_impl(self, node: Node, exclude: Iterable[str] = ()) -> Implementation | None:
        """The reference implementation of ``node``: the first implementation of the
        reference backend (:data:`REFERENCE_BACKEND`) registered for its op that supports it,
        skipping the names in ``exclude``; ``None`` when there is none."""
        self._complete_if(lambda d: d.status.name == REFERENCE_BACKEND)
        skip = set(exclude)
        for impl in self._by_op.get(node.key_op, ()):
            if impl.backend == REFERENCE_BACKEND and impl.name not in skip and impl.supports(node) is None:
                return impl
        return None

    def impl(self, name: str) -> Implementation:
        if name not in self._by_name:
            self._complete_if(lambda d: name in d.impls)
        try:
            return self._by_name[name]
        except KeyError:
            self._complete_if(lambda d: True)  # the error lists every known name
            raise RegistryError(
                f"unknown implementation {name!r}; known: {known(self._by_name, limit=40)}"
            ) from None

    @property
    def ops(self) -> list[str]:
        self._complete_if(lambda d: True)
        return sorted(self._by_op)

    @property
    def implementations(self) -> list[Implementation]:
        self._complete_if(lambda d: True)
        return list(self._by_name.values())

    # -- custom operators ------------------------------------------------------------
    def add_op_schema(
        self, schema: Any, *, backend: str, infer: ShapeFn | None = None
    ) -> CustomOp:
        """Register the schema of an operator of a backend's own ONNX domain.

        ``schema`` is an ``onnx.defs.OpSchema`` (its domain must not be one of ONNX's own);
        ``infer`` (optional) computes its outputs' dtypes and shapes from its inputs' (see
        :func:`dispatch.op_schema.register_op_schema`). The schema is registered with onnx
        for this process, so that models using the operator pass onnx's checker and shape
        inference; with an onnx too old to register schemas the operator still imports, its
        output shapes then come from running its reference implementation.
        """
        from dispatch.op_schema import register_op_schema

        name = getattr(schema, "name", None)
        domain = getattr(schema, "domain", None)
        if not isinstance(name, str) or not isinstance(domain, str):
            raise RegistryError(
                f"add_op_schema expects an onnx.defs.OpSchema, received {type(schema).__name__} "
                f"from backend {backend!r}"
            )
        key = op_key(domain, name)
        if key in self.custom_ops:
            other = self.custom_ops[key]
            raise RegistryError(
                f"duplicate custom operator {key!r}: already registered by backend "
                f"{other.backend!r}, received again from backend {backend!r}"
            )
        note = register_op_schema(schema, infer=infer, owner=backend)
        op = CustomOp(domain=domain, op_type=name, since_version=int(schema.since_version),
                      backend=backend, schema=schema, shape_inference=note,
                      doc=(getattr(schema, "doc", "") or "").strip().split("\n")[0])
        self.custom_ops[key] = op
        return op

    # -- backends --------------------------------------------------------------------
    def available_backends(self) -> list[str]:
        return [n for n, s in self.backends.items() if s.available]

    def backend(self, name: str) -> Backend:
        st = self.backends.get(name)
        if st is None or st.backend is None:
            raise RegistryError(f"unknown backend {name!r}; known: {known(self.backends)}")
        return st.backend


@dataclass(frozen=True)
class CustomOp:
    """An operator of a non-default ONNX domain that a backend brings (see
    :meth:`Registry.add_op_schema`)."""

    domain: str
    op_type: str
    since_version: int
    #: the backend that registered it
    backend: str
    #: the ``onnx.defs.OpSchema``
    schema: Any = field(repr=False, compare=False)
    #: how its output shapes are found at import ("onnx schema with a shape function", ...)
    shape_inference: str = ""
    doc: str = ""

    @property
    def key(self) -> str:
        """The operator's registry key, ``domain::op_type``."""
        return op_key(self.domain, self.op_type)


