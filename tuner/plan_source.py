"""The tuner's plan source: stored plans looked up in the SQLite plan store, and tuning into it.

:class:`StorePlanSource` implements :class:`dispatch.plan_source.PlanSource` for the Session,
which lives below the tuner and reaches it only through that interface (registered under the
``opdispatch.plan_sources`` entry point). A lookup opens the store read-only, migrates an older
schema once, moves a damaged store aside (the note says where) and never raises: whatever goes
wrong becomes the reason the untuned plan runs. Tuning turns the Session's settings into
:class:`tuner.tune.TuneOptions` and runs :func:`tuner.tune.tune` into the Session's store.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dispatch.config import Config
from dispatch.errors import ArgumentError
from dispatch.graph import Graph
from dispatch.objective import Objective
from dispatch.plan_source import StoredPlanLookup
from dispatch.registry import Registry
from tuner.fingerprint import PlanKey, plan_key
from tuner.plan_lookup import find_plan
from tuner.store import (
    PlanStore,
    StoreCorruptError,
    StoreError,
    StoreOutdatedError,
    StoreRecoveredWarning,
)

if TYPE_CHECKING:  # imported when a Session tunes, not at start-up (issue 13)
    from dispatch.onnx_import import ModelLike
    from tuner.tune_types import TuneOptions, TuneResult

#: ``TuneOptions`` fields a Session sets itself (from its objective and backends).
SESSION_TUNE_FIELDS = ("objective", "memory_cap_bytes", "backends", "budget_s", "allow_nonstrict_nan",
                       "concurrency", "max_latency_ms")


class StorePlanSource:
    """Plans from the SQLite plan store (:class:`tuner.store.PlanStore`), tuned by the tuner."""

    def store_path(self, store: Any, config: Config) -> str:
        """The path of ``store``: a ``PlanStore``, a path, or ``None`` for the configured one."""
        if isinstance(store, PlanStore):
            return str(store.path)
        if store is None:
            return str(Path(config.store_path).expanduser())
        if isinstance(store, str | os.PathLike):
            return str(Path(os.fspath(store)).expanduser())
        raise ArgumentError(
            f"store must be a path, a tuner.store.PlanStore, None or False, received "
            f"{type(store).__name__}"
        )

    def check_tune_options(self, tune_options: Any) -> None:
        """Raise ArgumentError unless ``tune_options`` is a :class:`tuner.tune.TuneOptions`."""
        from tuner.tune_types import TuneOptions

        if not isinstance(tune_options, TuneOptions):
            raise ArgumentError(
                f"tune_options must be a tuner.tune.TuneOptions, received "
                f"{type(tune_options).__name__}"
            )

    def lookup(
        self, store: Any, store_path: str, graph: Graph, registry: Registry,
        backends: Sequence[str], objective: Objective | str,
    ) -> StoredPlanLookup:
        """The stored plan for ``graph`` (see the module docstring); never raises."""
        if not isinstance(store, PlanStore) and _absent(store_path):
            return StoredPlanLookup(None, None, f"no plan store at {store_path}: running the "
                                    f"untuned plan", ["no plan store exists there"])
        opened: PlanStore | None = None
        key = None
        try:
            if isinstance(store, PlanStore):
                plans = store
            else:
                try:
                    plans = opened = PlanStore(store_path, readonly=True)
                except StoreCorruptError as exc:
                    reason = f"the plan store is corrupt ({exc.detail}); {_recover(store_path)}"
                    return StoredPlanLookup(None, None, f"{reason}: running the untuned plan",
                                            [reason])
                except StoreOutdatedError as exc:
                    try:
                        PlanStore(store_path).close()  # migrates it, under the store's write lock
                    except StoreError as err:
                        raise StoreError(f"{exc}; migrating it failed: {err}") from None
                    plans = opened = PlanStore(store_path, readonly=True)
            key = plan_key(graph, registry, backends, objective)
            found = find_plan(plans, key, registry)
            if found.stored is None:
                shapes = stored_shapes(plans, key)
                reasons = found.reasons or [
                    "no plan is stored for these input shapes" if shapes
                    else "this model was never tuned here"]
                return StoredPlanLookup(None, key, "no stored plan for this key: "
                                        + "; ".join(reasons), reasons, stored_shapes=shapes)
            plan = found.stored.plan()
        except Exception as exc:  # a broken store or plan must never stop the model from running
            reason = f"{type(exc).__name__}: {exc}"
            return StoredPlanLookup(None, key, f"stored plan not used: {reason}", [reason])
        finally:
            if opened is not None:
                opened.close()
        note = (f"plan {found.stored.id} ({key.digest()[:16]}) from the store {store_path} "
                f"(tuned {found.stored.created_at})" + (f"; {found.note}" if found.note else ""))
        return StoredPlanLookup(plan, key, note)

    def lookup_ranges(
        self, store: Any, store_path: str, graph: Graph, registry: Registry,
        backends: Sequence[str], objective: Objective | str,
    ) -> RangeLookup:
        """The range plans stored for ``graph``'s model structure (its family) on this machine
        with this software and ``objective``, newest first, and the ranges stored under other
        keys with what differs; never raises (a broken store gives none, with the reason)."""
        from tuner.fingerprint import RANGE_PREFIX, hardware_fingerprint, software_fingerprint

        found = RangeLookup()
        if not graph.family or (not isinstance(store, PlanStore) and _absent(store_path)):
            return found
        opened: PlanStore | None = None
        try:
            plans = store if isinstance(store, PlanStore) else None
            if plans is None:
                plans = opened = PlanStore(store_path, readonly=True)
            here = PlanKey(model=graph.family, inputs="", hardware=hardware_fingerprint(),
                           software=software_fingerprint(registry, backends),
                           objective=str(objective), family=graph.family)
            for stored in plans.plans_for_family(graph.family):
                k = stored.key
                if not k.inputs.startswith(RANGE_PREFIX):
                    continue
                text = k.inputs[len(RANGE_PREFIX):]
                plan = stored.plan()
                used, missing = _way_backends(plan, registry, backends)
                differs = missing + _only(k, used).explain_difference(
                    _only(replace(here, inputs=k.inputs), used))
                if differs:
                    found.elsewhere.append(f"{text} ({'; '.join(differs)})")
                    continue
                found.plans.append((stored.id, plan))
                found.ranges.append(text)
        except Exception as exc:  # a broken store must never stop the model from running
            found.error = f"{type(exc).__name__}: {exc}"
        finally:
            if opened is not None:
                opened.close()
        return found

    def lookup_generation(self, store: Any, store_path: str, model_path: str, registry: Registry,
                          objective: Objective | str = "latency") -> tuple[Any, str]:
        """The generation plan stored for the decoder at ``model_path`` on this machine with
        these libraries and ``objective`` (:mod:`tuner.generation.tune_generate`), and a note:
        where it came from or why there is none; never raises (a broken store gives none, with
        the reason)."""
        from tuner.generation.tune_generate import stored_generation_plan

        if not isinstance(store, PlanStore) and _absent(store_path):
            return None, f"no generation plan stored (no plan store at {store_path})"
        opened: PlanStore | None = None
        try:
            plans = store if isinstance(store, PlanStore) else None
            if plans is None:
                plans = opened = PlanStore(store_path, readonly=True)
            return stored_generation_plan(model_path, plans, registry, str(objective))
        except Exception as exc:  # a broken store must never stop the model from generating
            return None, f"the plan store could not be read ({type(exc).__name__}: {exc})"
        finally:
            if opened is not None:
                opened.close()

    def tune_range(
        self, model: ModelLike, *, store: Any, store_path: str, shapes: Mapping[str, Any],
        registry: Registry, config: Config, objective: Objective | str,
        backends: Sequence[str], budget_s: float | None, requests: Sequence[Any] = (),
    ) -> Any:
        """Tune the shape range ``shapes`` of ``model`` into the store
        (:func:`tuner.shapes.tune_range.tune_range`)."""
        from tuner.shapes.tune_range import tune_range

        opened: PlanStore | None = None
        if not isinstance(store, PlanStore) or store.readonly:
            store = opened = PlanStore(store_path)
        try:
            return tune_range(model, shapes, store=store, objective=objective, backends=backends,
                              budget_s=budget_s if budget_s is not None else config.tune_budget_s,
                              requests=requests, config=config, registry=registry)
        finally:
            if opened is not None:
                opened.close()

    def tune(
        self, model: ModelLike, *, store: Any, store_path: str, graph: Graph,
        registry: Registry, config: Config, input_shapes: Mapping[str, Sequence[int]] | None,
        objective: Objective | str, backends: Sequence[str], budget_s: float | None,
        base_options: TuneOptions | None, options: Mapping[str, Any],
    ) -> TuneResult:
        """Tune ``model`` into the store with the Session's objective and backends."""
        from tuner.tune import tune  # the tuner is imported when a Session tunes, not at start-up

        opts = _tune_settings(config, objective, backends, budget_s, base_options, options)
        opened: PlanStore | None = None
        if not isinstance(store, PlanStore) or store.readonly:
            store = opened = PlanStore(store_path)
        try:
            return tune(model, store=store, options=opts, input_shapes=input_shapes,
                        registry=registry, config=config)
        finally:
            if opened is not None:
                opened.close()


def _absent(path: str) -> bool:
    """Whether no file is at ``path`` (a path that cannot be reached is not absent: opening
    it says why)."""
    try:
        os.stat(path) if path else None
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False
    return not path


def _recover(path: str) -> str:
    """Move the damaged store at ``path`` aside (a fresh one replaces it); says where it went."""
    try:
        with warnings.catch_warnings():  # said in the session's plan note instead
            warnings.simplefilter("ignore", StoreRecoveredWarning)
            with PlanStore(path) as fresh:
                recovery = fresh.recovery
        return (f"moved aside to {recovery.moved_to} and replaced by a fresh store"
                if recovery is not None and recovery.moved_to else
                "already replaced by a fresh store by another process")
    except StoreError as err:
        why = err.move_error if isinstance(err, StoreCorruptError) else None
        return f"it could not be moved aside ({why or err})"


def _tune_settings(
    config: Config, objective: Objective | str, backends: Sequence[str], budget_s: float | None,
    base_options: TuneOptions | None, options: Mapping[str, Any],
) -> TuneOptions:
    """The Session's tuning options: ``options`` over ``base_options`` (else the configured
    defaults), with the Session's objective, backends and budget."""
    from tuner.tune_types import TuneOptions

    known = {f.name for f in fields(TuneOptions)} - set(SESSION_TUNE_FIELDS)
    fixed = sorted(set(options) & set(SESSION_TUNE_FIELDS))
    if fixed:
        raise ArgumentError(
            f"Session.tune: {', '.join(fixed)} come(s) from the session (objective "
            f"{str(objective)!r}, backends {list(backends)}) or the budget_s "
            f"argument; create a Session with another objective or backends instead"
        )
    unknown = sorted(set(options) - known)
    if unknown:
        raise ArgumentError(
            f"Session.tune: unknown option(s) {unknown}; known: {', '.join(sorted(known))}"
        )
    base = base_options or TuneOptions(
        budget_s=config.tune_budget_s, top_k=config.tune_top_k, progress=False)
    target = Objective.parse(objective).resolved()
    return replace(base, **options,
                   budget_s=float(budget_s if budget_s is not None else base.budget_s),
                   objective=target.name, memory_cap_bytes=target.memory_cap,
                   backends=list(backends), allow_nonstrict_nan=target.nonstrict_nan,
                   concurrency=target.concurrency, max_latency_ms=target.p99_ms)


def _way_backends(plan: Any, registry: Registry, backends: Sequence[str]
                  ) -> tuple[set[str], list[str]]:
    """The backends whose ways a range plan's buckets run on, and the ways no available
    backend offers here."""
    from dispatch.model_ways import model_ways
    from dispatch.range_padding import split_name

    ways = model_ways(registry, backends)
    names = list(dict.fromkeys(split_name(w)[0] for w in plan.range_plan().ways_used()))
    return ({ways[w].backend for w in names if w in ways},
            [f"way {w} is not offered here (no available backend of {list(backends)} has it)"
             for w in names if w not in ways])


def _only(key: PlanKey, backends: set[str]) -> PlanKey:
    """``key`` with its software restricted to ``backends``: a range plan depends on the
    versions of the libraries its ways run, not on the other backends present when it was
    tuned (one tuned with ``backends=["onnxruntime"]`` serves a process that has more)."""
    sw = dict(key.software)
    for part in ("backends", "implementations"):
        sw[part] = {b: v for b, v in (sw.get(part) or {}).items() if b in backends}
    return replace(key, software=sw)


@dataclass
class RangeLookup:
    """What :meth:`StorePlanSource.lookup_ranges` found: usable range plans (id, plan) and
    their ranges, ranges stored under other keys (with what differs), or the store's error."""

    plans: list[tuple[int, Any]] = field(default_factory=list)
    ranges: list[str] = field(default_factory=list)
    elsewhere: list[str] = field(default_factory=list)
    error: str = ""


def stored_shapes(plans: PlanStore, key: PlanKey) -> list[str]:
    """The input shapes (``input_ids[1,128], attention_mask[1,128]``) that plans of
    ``key``'s model family are stored for on this machine with this software and objective,
    in the order they were stored."""
    seen: list[str] = []
    for stored in reversed(plans.plans_for_family(key.family)):
        k = stored.key
        if (k.objective, k.hardware, k.software) != (key.objective, key.hardware, key.software):
            continue
        text = signature_shapes(k.inputs)
        if text not in seen:
            seen.append(text)
    return seen


def signature_shapes(inputs_sig: str) -> str:
    """An input signature (``x:float32[1,3,224,224];y:int64[2]``) as shapes only
    (``x[1,3,224,224], y[2]``)."""
    from tuner.fingerprint import RANGE_PREFIX

    if inputs_sig.startswith(RANGE_PREFIX):
        return inputs_sig
    parts = []
    for item in inputs_sig.split(";"):
        name, _, rest = item.partition(":")
        dims = rest[rest.find("["):] if "[" in rest else "[?]"
        parts.append(f"{name}{dims}")
    return ", ".join(p for p in parts if p)
