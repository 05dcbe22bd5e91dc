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
