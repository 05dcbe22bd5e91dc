"""Deferred backend registration: the backends of a registry that register when first needed.

A process that starts from a stored plan registers only the backends its plan runs
(:mod:`dispatch.backend_manifest`); every other backend is *deferred*: what its last full
registration recorded (:class:`DeferredBackend`) stands in for it until a lookup of the
:class:`dispatch.registry.Registry` needs it, and :class:`Deferrals` then runs its
``register()``, after those it needs, in the order a full registration would have run them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dispatch.backend_base import BackendStatus


@dataclass
class DeferredBackend:
    """A backend whose ``register()`` has not run yet: what its last full registration
    recorded (:mod:`dispatch.backend_manifest`), enough to key plans and to find which
    backend a name belongs to. :meth:`Deferrals.complete` runs the registration."""

    status: BackendStatus
    #: implementation name -> operator key
    impls: dict[str, str]
    layouts: tuple[str, ...] = ()
    converters: tuple[str, ...] = ()
    #: what keys its plans: its implementations' and (``layout:NAME``) layouts' names
    names: tuple[str, ...] = ()
    #: the backends whose registration must come first (``None``: every backend registered
    #: before this one; see :attr:`dispatch.backend.Backend.registration_needs`)
    needs: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        #: the operators it implements (asked once per graph node at start-up)
        self.ops: frozenset[str] = frozenset(self.impls.values())


class Deferrals:
    """The deferred registrations of one registry.

    ``order`` is the registry's list of backends registered or deferred, in registration
    order (shared, not copied); ``settle()`` runs after each batch of completed registrations,
    inside the lock (the registry puts what they added in registration order). Lookups from
    other threads wait for the registrations they need; a registration running now sees the
    registry as it is.
    """

    def __init__(self, order: list[str], settle: Callable[[], None]) -> None:
        self._order = order
        self._settle = settle
        self._pending: dict[str, DeferredBackend] = {}
        self._lock = threading.RLock()
        #: runs one deferred backend's registration (dispatch.backend.complete_registration)
        self._run: Callable[[BackendStatus], Any] | None = None
        #: the thread running deferred registrations (0: none)
        self._completing = 0

    def add(self, deferred: DeferredBackend, run: Callable[[BackendStatus], Any]) -> None:
        """Record ``deferred`` as registered-to-be; ``run(status)`` runs its registration."""
        self._run = run
        self._pending[deferred.status.name] = deferred
        self._order.append(deferred.status.name)

    @property
    def pending(self) -> Mapping[str, DeferredBackend]:
        """The deferred backends by name, in registration order (read without waiting)."""
        return self._pending

    def complete(self, backends: Iterable[str] | None = None) -> None:
        """Run the deferred registrations of ``backends`` (default: all), after those they
        need, in registration order."""
        me = threading.get_ident()
        if not self._pending or self._completing == me:
            return  # a registration running now sees the registry as it is
        with self._lock:  # another thread's lookups wait for the registrations they need
            wanted = list(self._pending) if backends is None else [
                b for b in backends if b in self._pending]
            if not wanted:
                return
            todo: set[str] = set()
            stack = list(wanted)
            while stack:
                name = stack.pop()
                if name in todo or name not in self._pending:
                    continue
                todo.add(name)
                needs = self._pending[name].needs
                if needs is None:
                    needs = tuple(self._order[:self._order.index(name)])
                stack.extend(needs)
            assert self._run is not None
            self._completing = me
            try:
                for name in [b for b in self._order if b in todo]:
                    self._run(self._pending.pop(name).status)
                self._settle()
            finally:
                self._completing = 0

    def complete_if(self, pred: Callable[[DeferredBackend], bool]) -> None:
        """Complete the deferred backends for which ``pred`` holds (and those they need)."""
        if self._completing != threading.get_ident() and (self._pending or self._completing):
            with self._lock:  # waits for a registration another thread runs (popped already)
                self.complete([n for n, d in list(self._pending.items()) if pred(d)])

    def resolve_layouts(self, kind: str, name: str = "") -> None:
        """The layout registry's hook: complete the deferred backend that brings layout or
        converter ``name`` (``kind`` ``"layout"`` or ``"converter"``), or every deferred one
        (``"all"``)."""
        if kind == "all":
            self.complete_if(lambda d: True)
        elif kind == "layout":
            self.complete_if(lambda d: name in d.layouts)
        else:
            self.complete_if(lambda d: name in d.converters)
