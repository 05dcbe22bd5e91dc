"""The registry of the implementations, backends and layouts known to this process.

Backends declare their operator implementations in an :class:`ImplTable`
(:mod:`dispatch.implementation`, whose names this module re-exports) and hand the table to the
:class:`Registry` when they register; nothing is discovered by scanning module globals. A
backend's registration may be deferred until something needs it
(:mod:`dispatch.deferred_backends`).

A backend may also bring operators of an ONNX domain of its own (e.g. ``com.example``'s
``FastGelu``): it registers the operator's ``onnx.defs.OpSchema`` with
:meth:`Registry.add_op_schema` (so that models using it pass onnx's checker and shape
inference) and the operator's reference semantics as an implementation of the reference
backend (:data:`REFERENCE_BACKEND`, in an ``ImplTable(REFERENCE_BACKEND)`` of its own), so that
the tuner checks its other implementations against that reference like any other operator's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from dispatch.deferred_backends import Deferrals, DeferredBackend
from dispatch.errors import RegistryError, known
from dispatch.graph import Node, op_key

# what backends declare, re-exported: ``from dispatch.registry import ImplTable, Priority``
from dispatch.implementation import REFERENCE_BACKEND as REFERENCE_BACKEND
from dispatch.implementation import BuildFn as BuildFn
from dispatch.implementation import Implementation as Implementation
from dispatch.implementation import ImplTable as ImplTable
from dispatch.implementation import Kernel as Kernel
from dispatch.implementation import Priority as Priority
from dispatch.implementation import SupportsFn as SupportsFn
from layouts.registry import CORE as CORE
from layouts.registry import STANDARD as STANDARD

if TYPE_CHECKING:
    from dispatch.backend_base import Backend, BackendStatus
    from dispatch.op_schema import ShapeFn
    from layouts.registry import Converter, Layout, LayoutRegistry


class RegistrySnapshot(NamedTuple):
    """What a registry held at one moment (:meth:`Registry.snapshot`): a backend's failed
    registration is undone back to it, a successful one is told apart from it."""

    impls: dict[str, Implementation]
    by_op: dict[str, list[Implementation]]
    layouts: dict[str, Layout]
    converters: dict[tuple[str, str], list[Converter]]
    custom_ops: dict[str, CustomOp]


@dataclass
class Registry:
    """Every implementation, backend and layout known to this process.

    A backend's registration may be deferred (a process that starts from a stored plan
    registers only the backends its plan runs; :mod:`dispatch.backend_manifest`): every
    accessor below completes the deferred backends it needs first, in the order a full
    registration would have run them (:mod:`dispatch.deferred_backends`), so that what it
    returns is what it would have returned had every backend registered at discovery.
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
    #: ``impl:NAME`` / ``layout:NAME`` / ``converter:NAME`` -> the backend whose
    #: registration added it (a backend may add implementations of another backend name,
    #: e.g. a custom operator's reference)
    _owner: dict[str, str] = field(default_factory=dict, repr=False)
    #: the backends whose registration is deferred (their lock, the thread completing them)
    _deferrals: Deferrals = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._deferrals = Deferrals(self._order, self._reorder)
        self.layouts._resolve = self._deferrals.resolve_layouts

    # -- deferred registration -------------------------------------------------------
    def defer(self, deferred: DeferredBackend,
              completer: Callable[[Registry, BackendStatus], Any]) -> None:
        """Record ``deferred`` as registered-to-be; ``completer(registry, status)`` runs its
        registration when it is needed (see :mod:`dispatch.backend_manifest`)."""
        self._deferrals.add(deferred, lambda status: completer(self, status))

    @property
    def deferred(self) -> list[str]:
        """The backends whose registration is still deferred, in registration order."""
        return list(self._deferrals.pending)

    def complete(self, backends: Iterable[str] | None = None) -> None:
        """Run the deferred registrations of ``backends`` (default: all), after those they
        need, in registration order."""
        self._deferrals.complete(backends)

    def _complete_if(self, pred: Callable[[DeferredBackend], bool]) -> None:
        self._deferrals.complete_if(pred)

    # -- registering a backend -------------------------------------------------------
    def snapshot(self) -> RegistrySnapshot:
        """What the registry holds now (containers copied), before a backend registers."""
        return RegistrySnapshot(
            dict(self._by_name),
            {k: list(v) for k, v in self._by_op.items()},
            dict(self.layouts._layouts),
            {k: list(v) for k, v in self.layouts._converters.items()},
            dict(self.custom_ops),
        )

    def restore(self, snap: RegistrySnapshot) -> None:
        """Undo a backend's partial registration back to ``snap``, so that a failing
        ``register()`` leaves no trace (a custom operator schema it gave onnx stays known to
        onnx's checker in this process)."""
        (self._by_name, self._by_op, self.layouts._layouts, self.layouts._converters,
         self.custom_ops) = snap
        self.layouts._paths.clear()

    def note_registration(
        self, backend: str, since: RegistrySnapshot
    ) -> tuple[int, list[str], list[str]]:
        """Record ``backend`` as registered (in registration order) and as the registrant of
        what was added since ``since``; returns how many implementations, which layouts and
        which custom operators (sorted) it added."""
        for name in self._by_name.keys() - since.impls.keys():
            self._owner[f"impl:{name}"] = backend
        for name in self.layouts._layouts.keys() - since.layouts.keys():
            self._owner[f"layout:{name}"] = backend
        had = {c.name for cs in since.converters.values() for c in cs}
        for convs in self.layouts._converters.values():
            for c in convs:
                if c.name not in had:
                    self._owner[f"converter:{c.name}"] = backend
        if backend not in self._order:
            self._order.append(backend)
        return (len(self._by_name) - len(since.impls),
                sorted(set(self.layouts._layouts) - set(since.layouts)),
                sorted(set(self.custom_ops) - set(since.custom_ops)))

    @property
    def registration_order(self) -> list[str]:
        """The backends registered or deferred, in registration order."""
        return list(self._order)

    def added_by(self, backend: str) -> tuple[dict[str, str], list[str]]:
        """What ``backend``'s registration added, without completing any deferred one: its
        implementations (name -> operator key; a backend may add another backend's, e.g. a
        custom operator's reference) and the names of its converters."""
        impls = {i.name: i.op for i in self._by_name.values()
                 if self._owner.get(f"impl:{i.name}", i.backend) == backend}
        converters = [c.name for cs in self.layouts._converters.values() for c in cs
                      if self._owner.get(f"converter:{c.name}", c.backend) == backend]
        return impls, converters

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

    def names_by_backend(self, backends: Iterable[str]) -> dict[str, list[str]]:
        """backend -> the names of its implementations and (``layout:NAME``) layouts, whether
        registered or deferred, without completing any."""
        names: dict[str, list[str]] = {b: [] for b in backends}
        pending = self._deferrals.pending
        live = {b for b in names if b not in pending}
        for impl in self._by_name.values():
            if impl.backend in live:
                names[impl.backend].append(impl.name)
        for lay in self.layouts._layouts.values():
            if getattr(lay, "backend", None) in live:
                names[lay.backend].append(f"layout:{lay.name}")
        for b in names.keys() - live:
            names[b] = list(pending[b].names)  # as recorded by a full registration
        return names

    def backend_of(self, kind: str, name: str) -> str | None:
        """The backend of implementation (``kind`` ``"impl"``) or converter (``"converter"``)
        ``name``, registered or deferred, without completing any; ``None`` when no backend
        has it."""
        if kind == "impl":
            found = self._by_name.get(name)
            if found is not None:
                return found.backend
            records = (d.status.name for d in self._deferrals.pending.values()
                       if name in d.impls)
        elif kind == "converter":
            conv = self.layouts.registered_converter(name)
            if conv is not None:
                return conv.backend
            records = (d.status.name for d in self._deferrals.pending.values()
                       if name in d.converters)
        else:
            raise ValueError(f"kind must be 'impl' or 'converter', received {kind!r}")
        return next(records, None)

    def op_backends(self, op: str) -> set[str]:
        """The backends with an implementation of ``op`` (registered or deferred), without
        completing any."""
        found = {i.backend for i in self._by_op.get(op, ())}
        found.update(b for b, d in self._deferrals.pending.items() if op in d.ops)
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

    def regions(
        self, backends: Sequence[str] | None = None,
        precisions: Sequence[str] | None = ("float32",),
    ) -> list[Implementation]:
        """Region implementations (subgraph backends), optionally of ``backends`` only, in
        that order; float32 ones unless ``precisions`` names others (``None``: all)."""
        self._complete_if(lambda d: backends is None or d.status.name in backends)
        found = [i for i in self._by_name.values() if i.is_region
                 and (backends is None or i.backend in backends)
                 and (precisions is None or i.precision in precisions)]
        if backends is None:
            return found
        rank = {b: k for k, b in enumerate(backends)}
        return sorted(found, key=lambda i: (rank[i.backend], -i.priority))

    def has_op(self, op: str) -> bool:
        return op in self._by_op or any(op in d.ops for d in self._deferrals.pending.values())

    def reference_impl(self, node: Node, exclude: Iterable[str] = ()) -> Implementation | None:
        """The reference implementation of ``node``: the first implementation of the
        reference backend (:data:`REFERENCE_BACKEND`) registered for its op that supports it,
        skipping the names in ``exclude``; ``None`` when there is none."""
        self._complete_if(lambda d: d.status.name == REFERENCE_BACKEND)
        skip = set(exclude)
        for impl in self._by_op.get(node.key_op, ()):
            if (impl.backend == REFERENCE_BACKEND and impl.name not in skip
                    and impl.supports(node) is None):
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


