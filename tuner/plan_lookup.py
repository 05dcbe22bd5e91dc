"""Finding the stored plan a process may run, and saying why there is none.

A plan is stored under the exact key it was tuned for (:class:`tuner.fingerprint.PlanKey`:
model, inputs, hardware, software, objective) and an exact match is what a session looks
up first. Backends come and go between tuning and production (a plugin uninstalled, a
library missing from the production image), and the software part of the key changes with
them. Two cases are told apart:

* the plan **uses** a backend that is gone: the plan is invalid; the reason names the
  backend, how many steps ran on it and why it is unavailable here (not installed, or the
  error its discovery reported);
* the plan does **not** use the backends that are gone, and everything it does use is at
  the same version with the same registered implementations: the plan is still the best
  one the tuner found among what is left (it was measured against the vanished backend's
  candidates and did not pick them), so it is used, with a note saying so. A backend that
  was *added* since tuning is not ignored this way: it might win, so that is a re-tune.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dispatch.errors import OpDispatchError
from dispatch.objective import Objective
from dispatch.plan_check import backends_of
from dispatch.registry import Registry

if TYPE_CHECKING:
    from tuner.fingerprint import PlanKey
    from tuner.store import PlanStore, StoredPlan


@dataclass
class PlanLookup:
    """What :func:`find_plan` found.

    Attributes:
        stored: the usable stored plan, or ``None``.
        note: set when ``stored`` matched only after setting aside backends that are gone
            and that the plan does not use (the sentence names them).
        reasons: why no stored plan is usable (empty when ``stored`` is set): one line per
            stored plan of the model, naming what differs or which backend it needs.
    """

    stored: StoredPlan | None
    note: str | None = None
    reasons: list[str] = field(default_factory=list)


def unavailable_reason(registry: Registry, backend: str) -> str:
    """Why ``backend`` cannot run in this process (for messages)."""
    status = registry.backends.get(backend)
    if status is None:
        return "not installed (no entry point or plugin folder module provides it)"
    if not status.available:
        return status.reason or "unavailable"
    return "available"


def find_plan(store: PlanStore, key: PlanKey, registry: Registry) -> PlanLookup:
    """The stored plan for ``key`` (see the module docstring for the one tolerated
    difference), else the reasons there is none."""
    found = store.get_plan(key)
    if found is not None:
        return PlanLookup(found)
    available = set(registry.available_backends())
    reasons: list[str] = []
    reusable: list[tuple[StoredPlan, list[str]]] = []
    for stored in store.plans_for_model(key.model):
        if stored.key.inputs != key.inputs or stored.key.objective != key.objective:
            continue
        try:
            used = backends_of(stored.plan(), registry)
        except (OpDispatchError, ValueError, TypeError) as exc:
            reasons.append(f"plan {stored.id}: unreadable ({type(exc).__name__}: {exc})")
            continue
        gone = sorted(b for b in used if b not in available)
        if gone:
            reasons.append(
                f"plan {stored.id} ({stored.key.objective}, stored {stored.created_at}) runs on "
                + "; ".join(f"backend {b!r} ({used[b]} step(s) or conversion(s)), which is "
                            f"{unavailable_reason(registry, b)}" for b in gone)
            )
            continue
        dropped = _only_unused_backends_dropped(stored.key, key, used)
        if dropped:
            reusable.append((stored, dropped))
    if reusable:
        stored, dropped = reusable[0]
        names = ", ".join(repr(b) for b in dropped)
        why = "; ".join(f"{b}: {unavailable_reason(registry, b)}" for b in dropped)
        return PlanLookup(stored, note=(
            f"plan {stored.id} was tuned while backend(s) {names} were also available; they "
            f"are gone ({why}), and the plan runs nothing on them, so it is used as tuned"
        ))
    return PlanLookup(None, reasons=store.why_not(key) + reasons)


def _only_unused_backends_dropped(old: PlanKey, new: PlanKey, used: dict[str, int]) -> list[str]:
    """The backends ``old`` had and ``new`` lacks, when that is the key's only difference
    and the plan uses none of them; else ``[]``."""
    if old.model != new.model or old.inputs != new.inputs or old.objective != new.objective:
        return []
    if old.hardware != new.hardware:
        return []
    a, b = dict(old.software), dict(new.software)
    a_be, b_be = dict(a.pop("backends", {}) or {}), dict(b.pop("backends", {}) or {})
    a_im, b_im = dict(a.pop("implementations", {}) or {}), dict(b.pop("implementations", {}) or {})
    if a != b or set(b_be) - set(a_be):
        return []
    dropped = sorted(set(a_be) - set(b_be))
    if not dropped or any(d in used for d in dropped):
        return []
    for name in b_be:
        if a_be[name] != b_be[name] or a_im.get(name) != b_im.get(name):
            return []
    return dropped


def usable_here(stored: StoredPlan, registry: Registry,
                hardware: dict | None = None) -> tuple[bool, str]:
    """Whether ``stored`` could run in this process as tuned, and why not (or a note), with
    the rules :func:`find_plan` applies: a vanished backend the plan uses makes it unusable
    (named, with the reason it is unavailable); one the plan does not use does not."""
    from tuner.store import key_here

    try:
        used = backends_of(stored.plan(), registry)
    except (OpDispatchError, ValueError, TypeError) as exc:
        return False, f"unreadable plan ({type(exc).__name__}: {exc})"
    available = set(registry.available_backends())
    gone = sorted(b for b in used if b not in available)
    if gone:
        return False, "; ".join(f"runs on backend {b!r} ({used[b]} step(s) or conversion(s)), "
                                f"which is {unavailable_reason(registry, b)}" for b in gone)
    here = key_here(stored.key, registry, hardware)
    differences = stored.key.explain_difference(here)
    if not differences:
        return True, ""
    dropped = _only_unused_backends_dropped(stored.key, here, used)
    if dropped:
        return True, f"backend(s) {', '.join(dropped)} gone, unused by the plan"
    return False, "; ".join(differences)


# ------------------------------------------------------------------------------------------
# the plan a report, explanation or profile is about (``opdispatch report/explain/profile``)
# ------------------------------------------------------------------------------------------

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from dispatch.graph import Graph
    from dispatch.plan import Plan


class ReportError(OpDispatchError):
    """A report, diff, explanation or trace could not be made from what was given.

    Defined here because :func:`locate_plan` raises it and this module must not import
    :mod:`tuner.report` (which re-exports both); reports, diffs and traces raise it too."""


@dataclass
class LocatedPlan:
    """A model's graph and the plan a report, explanation or profile is about."""

    graph: Graph
    registry: Registry
    plan: Plan
    key: PlanKey
    stored: StoredPlan | None
    backends: list[str]
    note: str


def locate_plan(
    model: Any,
    store: PlanStore | None,
    *,
    objective: str | Objective = "latency",
    backends: Sequence[str] | None = None,
    plan_id: int | None = None,
    untuned: bool = False,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    registry: Registry | None = None,
) -> LocatedPlan:
    """The plan of ``model`` in ``store``: the one stored under the key a Session on this
    machine would look up (``objective``, ``backends`` as for ``opdispatch tune``), or plan
    ``plan_id`` (which must be a plan of this model), or with ``untuned`` the heuristic plan
    (its measurements are looked up under this machine's key). A miss raises
    :class:`ReportError` saying why no stored plan matched."""
    from dispatch.backend import load_registry
    from dispatch.config import Config
    from dispatch.heuristic import heuristic_plan
    from dispatch.plan_policy import plan_backends, unavailable_backends
    from tuner.fingerprint import model_fingerprint, plan_key
    from tuner.model_graph import load_graph

    objective = Objective.parse(objective).resolved()
    config = Config.load()
    registry = registry or load_registry(config.plugin_path or None)
    unknown = unavailable_backends(registry, backends or [])
    if unknown:
        raise ReportError(f"backends {unknown} are not available here; available: "
                          f"{registry.available_backends()}")
    allowed = plan_backends(registry, config.backend_order, backends)  # as Session and tune
    if plan_id is not None and untuned:
        raise ReportError("give a plan id or --untuned, not both")
    graph = load_graph(model, registry, allowed, input_shapes)
    key = plan_key(graph, registry, allowed, objective)
    if untuned:
        plan = heuristic_plan(graph, registry, allowed)
        return LocatedPlan(graph, registry, plan, key, None, allowed,
                           f"the untuned (heuristic) plan over {allowed}")
    if store is None:
        raise ReportError("a plan store is needed to find the tuned plan (or use --untuned)")
    if plan_id is not None:
        stored = store.plan_by_id(plan_id)
        fp = model_fingerprint(graph)
        if stored.key.model != fp:
            raise ReportError(
                f"plan {plan_id} in {store.path} is for another model (model fingerprint "
                f"{stored.key.model[:12]}, this model's is {fp[:12]}); "
                f"`opdispatch plans list --model MODEL` lists this model's plans")
        note = f"plan {plan_id} from {store.path}"
        reasons = stored.key.explain_difference(key)
        if reasons:
            note += f" (not usable here as is: {'; '.join(reasons)})"
        return LocatedPlan(graph, registry, stored.plan(), stored.key, stored,
                           list((stored.key.software.get("backends") or {}).keys()), note)
    found = find_plan(store, key, registry)  # the plan a Session here would run
    stored = found.stored
    if stored is None:
        reasons = found.reasons or ["this model was never tuned with this store"]
        raise ReportError(
            f"no plan in {store.path} for this model, machine, software, backends {allowed} and "
            f"objective {objective}: {'; '.join(' '.join(r.split()) for r in reasons)}; tune it "
            f"with `opdispatch tune MODEL --store {store.path}`, or pick a stored plan with --plan "
            f"ID (see `opdispatch plans list`), or report the untuned plan with --untuned")
    return LocatedPlan(graph, registry, stored.plan(), stored.key, stored, allowed,
                       f"plan {stored.id} from {store.path}"
                       + (f" ({found.note})" if found.note else ""))
