"""Where a Session gets the plans it does not build itself: the interface and its discovery.

The core builds and runs plans (the untuned heuristic plan, a given one); plans tuned on this
machine live above it, in a plan store that the tuner fills. A :class:`PlanSource` is what the
core asks for them: look up the stored plan of a model's key, and tune a model into the store.
The tuner implements it (``tuner.plan_source.StorePlanSource``) and registers it under the
entry-point group ``opdispatch.plan_sources``, the same way backends are found, so that the core
never imports the tuner: without one (a core-only install, or the tuner failing to import),
Sessions run given and untuned plans and say why no stored plan is looked up.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from dispatch.entry_points import entry_points

if TYPE_CHECKING:
    from dispatch.config import Config
    from dispatch.graph import Graph
    from dispatch.onnx_import import ModelLike
    from dispatch.plan import Plan
    from dispatch.registry import Registry

#: The entry-point group plan sources register under.
ENTRY_POINT_GROUP = "opdispatch.plan_sources"


@dataclass
class StoredPlanLookup:
    """What :meth:`PlanSource.lookup` found.

    Attributes:
        plan: the stored plan to run, or ``None``.
        key: the key the model was looked up under (the source's own type; ``None`` when
            the lookup stopped before computing it).
        note: where ``plan`` came from, or why no stored plan is used (one sentence).
        reasons: why no stored plan matched, one line each (empty on a hit).
        stored_shapes: the input shapes plans of the same model (its structure with the
            input shapes left open: :attr:`dispatch.graph.Graph.family`) are stored for,
            written like ``input_ids[1,128], attention_mask[1,128]`` (filled on a miss).
    """

    plan: Plan | None
    key: Any = None
    note: str = ""
    reasons: list[str] = field(default_factory=list)
    stored_shapes: list[str] = field(default_factory=list)


@runtime_checkable
class PlanSource(Protocol):
    """The stored and tuned plans a Session can use (implemented by the tuner)."""

    def store_path(self, store: Any, config: Config) -> str:
        """The path of the plan store ``store`` names (a path, ``None`` for the configured
        one, or the source's own store object); raises ArgumentError for anything else."""
        ...

    def check_tune_options(self, tune_options: Any) -> None:
        """Raise ArgumentError unless ``tune_options`` is the source's tuning-options type."""
        ...

    def lookup(
        self, store: Any, store_path: str, graph: Graph, registry: Registry,
        backends: Sequence[str], objective: str,
    ) -> StoredPlanLookup:
        """The stored plan of ``graph`` for this machine, software, ``backends`` and
        ``objective``, or why there is none. Never raises for a broken or damaged store: the
        reason goes into the result."""
        ...

    def tune(
        self, model: ModelLike, *, store: Any, store_path: str, graph: Graph,
        registry: Registry, config: Config, input_shapes: Mapping[str, Sequence[int]] | None,
        objective: str, backends: Sequence[str], budget_s: float | None,
        base_options: Any, options: Mapping[str, Any],
    ) -> Any:
        """Tune ``model`` into the store and return the result: an object with ``plan``,
        ``key``, ``plan_id`` (``None`` when it could not be stored) and ``store_error``."""
        ...


@dataclass(frozen=True)
class SourceDiscovery:
    """The plan source found for this process, or why there is none."""

    source: PlanSource | None
    reason: str = ""


@functools.cache
def default_plan_source() -> SourceDiscovery:
    """The first plan source registered under :data:`ENTRY_POINT_GROUP` that loads, or why
    none did (the reasons of each failure). Looked up once per process."""
    failures = []
    for ep in sorted(entry_points(ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            factory = ep.load()
            source = factory()
        except Exception as exc:  # a broken plugin must not stop the core from running models
            failures.append(f"{ep.name} ({ep.value}): {type(exc).__name__}: {exc}")
            continue
        if not isinstance(source, PlanSource):
            failures.append(f"{ep.name} ({ep.value}): {type(source).__name__} is not a PlanSource")
            continue
        return SourceDiscovery(source)
    if failures:
        return SourceDiscovery(None, "no plan source loaded: " + "; ".join(failures))
    return SourceDiscovery(
        None, f"no plan source is installed (entry-point group {ENTRY_POINT_GROUP}; the tuner "
              f"provides one)")
