"""The base class of every backend and the record of what became of one during discovery.

:class:`Backend` is what a backend (built-in or plugin) subclasses; :class:`BackendStatus` is
what :mod:`dispatch.backend`'s discovery records of it in ``registry.backends``. Both are
re-exported by :mod:`dispatch.backend` (import them from there). They live in this leaf
module, which imports nothing of opdispatch, so that the registry that stores them
(:mod:`dispatch.registry`) does not import the discovery, which imports the registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class Backend:
    """Base class of every backend.

    Subclasses set :attr:`name` (and :attr:`device`, :attr:`conflicts`) and override
    :meth:`availability`, :meth:`version` and :meth:`register`.
    """

    name: str = ""
    device: str = "cpu"
    #: names of backends that must never be active together with this one (symmetric: see
    #: :mod:`dispatch.backend` for which one wins)
    conflicts: tuple[str, ...] = ()
    #: the backends whose registration this one's ``register()`` reads (their layouts, their
    #: status), which must therefore register first when registrations are deferred
    #: (:mod:`dispatch.backend_manifest`); ``None``: every backend registered before it
    registration_needs: tuple[str, ...] | None = None
    #: whether its kernels run on the process's BLAS or OpenMP thread pools, whose thread
    #: counts a plan holds while it runs (:mod:`dispatch.blas`); a library with a pool of its
    #: own says ``False``, and a plan that runs only on such backends sets no thread counts
    #: (and looks no library up)
    process_pools: bool = True

    def availability(self) -> str | None:
        """``None`` when the backend can run here, else why it cannot."""
        return None

    def version(self) -> str:
        """Version of the library or build behind this backend (part of plan keys)."""
        return "unknown"

    def register(self, registry: Any) -> None:
        """Add this backend's layouts, converters, implementations and custom operator
        schemas to ``registry`` (a :class:`dispatch.registry.Registry`; typed ``Any`` here
        because the registry stores backends: a subclass may annotate it as ``Registry``)."""
        raise NotImplementedError

    def region_refusals(self) -> dict[str, str]:
        """For a backend that runs regions of the graph: the operators it never accepts in
        a region, with the reason (after :meth:`register`); others may still be refused
        node by node for their attributes or dtypes. Empty for per-op backends."""
        return {}

    def model_ways(self) -> list[Any]:
        """The ways it runs a whole model at any input shape (``dispatch.model_ways.ModelWay``:
        the candidates of range plans); empty for a backend that runs nodes or regions only."""
        return []


@dataclass
class BackendStatus:
    """What became of one backend during discovery."""

    name: str
    origin: str
    backend: Backend | None = None
    available: bool = False
    reason: str | None = None
    version: str = ""
    layouts: list[str] = field(default_factory=list)
    implementations: int = 0
    #: the backend that won a conflict against this one (``None``: it lost no conflict)
    lost_to: str | None = None
    #: custom operators (``domain::op_type``) this backend registered
    custom_ops: list[str] = field(default_factory=list)
