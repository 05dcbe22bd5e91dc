"""Plans in the store: storing one under its :class:`~tuner.fingerprint.PlanKey`, looking plans
up (by key, id or model), explaining why none matches a key (:meth:`PlanQueries.why_not`),
deleting and pruning them; and what a plan's key would be on this machine
(:func:`key_here`, :func:`stale_reasons`)."""

from __future__ import annotations

import contextlib
import math
import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from dispatch.plan import Plan
from tuner.fingerprint import (
    PlanKey,
    hardware_digest,
    hardware_fingerprint,
    software_digest,
    software_fingerprint,
)
from tuner.store.connection import StoreConnection
from tuner.store.errors import StoreError
from tuner.store.rows import PrunedPlan, StoredPlan, _dump, _now, _parse_time, _plan_from_row

if TYPE_CHECKING:
    from dispatch.registry import Registry

#: Lines :meth:`PlanStore.why_not` gives at most about plans of other models.
MAX_OTHER_MODEL_LINES = 3


class PlanQueries(StoreConnection):
    """The ``plans`` table of a :class:`~tuner.store.PlanStore`."""

    def put_plan(
        self,
        key: PlanKey,
        plan_json: str | Plan,
        *,
        latency_ms: float | None = None,
        peak_bytes: int | None = None,
        run_id: int | None = None,
        notes: Mapping[str, Any] | None = None,
    ) -> int:
        """Store ``plan_json`` under ``key``, replacing a plan stored under the same key;
        returns the plan's id (kept when replacing). The JSON is checked to be a valid plan."""
        if not isinstance(key, PlanKey):
            raise StoreError(f"put_plan expects a PlanKey, received {type(key).__name__}")
        text = plan_json.to_json() if isinstance(plan_json, Plan) else plan_json
        if not isinstance(text, str):
            raise StoreError(
                f"put_plan expects the plan as JSON text or a Plan, received {type(text).__name__}"
            )
        Plan.from_json(text)  # raises PlanError on a malformed plan: never store one
        latency = None if latency_ms is None else float(latency_ms)
        if latency is not None and not math.isfinite(latency):
            raise StoreError(f"put_plan: latency_ms must be a finite number or None, received "
                             f"{latency_ms!r}")
        peak = None if peak_bytes is None else int(peak_bytes)
        with self._write("put_plan"), self._run_must_exist("put_plan", run_id):
            return self._upsert_plan(key, text, latency_ms=latency, peak_bytes=peak,
                                     created_at=_now(), run_id=run_id, notes=notes)

    def _upsert_plan(
        self, key: PlanKey, plan_json: str, *, latency_ms: float | None,
        peak_bytes: int | None, created_at: str, run_id: int | None,
        notes: Mapping[str, Any] | None,
    ) -> int:
        """Insert the plan row of ``key`` or replace the plan stored under it (inside a
        :meth:`_write` transaction); returns its id."""
        digest = key.digest()
        self._conn.execute(
            """INSERT INTO plans (key_digest, model_fp, inputs_sig, hardware_digest,
                   hardware_json, software_digest, software_json, objective, plan_json,
                   latency_ms, peak_bytes, created_at, tuning_run_id, notes_json, family)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
               ON CONFLICT (key_digest) DO UPDATE SET
                   plan_json = excluded.plan_json, latency_ms = excluded.latency_ms,
                   peak_bytes = excluded.peak_bytes, created_at = excluded.created_at,
                   tuning_run_id = excluded.tuning_run_id, notes_json = excluded.notes_json,
                   family = CASE WHEN excluded.family != '' THEN excluded.family
                                 ELSE plans.family END""",
            [digest, key.model, key.inputs, hardware_digest(key.hardware), _dump(key.hardware),
             software_digest(key.software), _dump(key.software), key.objective, plan_json,
             latency_ms, peak_bytes, created_at, run_id, _dump(notes), key.family],
        )
        found = self._conn.execute(
            "SELECT id FROM plans WHERE key_digest = ?", [digest]).fetchone()
        return int(found[0])

    @contextlib.contextmanager
    def _run_must_exist(self, operation: str, run_id: int | None) -> Iterator[None]:
        try:
            yield
        except sqlite3.IntegrityError as exc:
            if run_id is None or "FOREIGN KEY" not in str(exc):
                raise
            raise StoreError(
                f"{operation}: run_id {run_id} is not a tuning run in {str(self.path)!r} "
                f"(expected an id returned by start_run)"
            ) from None

    def get_plan(self, key: PlanKey) -> StoredPlan | None:
        """The plan stored under exactly ``key``, or ``None`` (see :meth:`why_not`)."""
        rows = list(self._query("SELECT * FROM plans WHERE key_digest = ?", [key.digest()]))
        if not rows:
            return None
        stored = _plan_from_row(rows[0])
        return stored if stored.key == key else None

    def plan_by_id(self, plan_id: int) -> StoredPlan:
        """The plan with id ``plan_id``; raises :class:`StoreError` listing the ids that exist."""
        rows = list(self._query("SELECT * FROM plans WHERE id = ?", [int(plan_id)]))
        if not rows:
            ids = [r["id"] for r in self._query("SELECT id FROM plans ORDER BY id")]
            raise StoreError(f"no plan with id {plan_id} in {str(self.path)!r}; stored ids: "
                             f"{', '.join(map(str, ids[:50])) or '(none)'}")
        return _plan_from_row(rows[0])

    def plans_for_model(self, model_fp: str) -> list[StoredPlan]:
        """Every plan stored for the model fingerprint ``model_fp``, newest first."""
        return [_plan_from_row(r) for r in self._query(
            "SELECT * FROM plans WHERE model_fp = ? ORDER BY created_at DESC, id DESC", [model_fp])]

    def plans_for_family(self, family: str) -> list[StoredPlan]:
        """Every plan stored for a model of structure ``family`` (whatever its input shapes:
        :attr:`dispatch.graph.Graph.family`), newest first; none for an empty family."""
        if not family:
            return []
        return [_plan_from_row(r) for r in self._query(
            "SELECT * FROM plans WHERE family = ? ORDER BY created_at DESC, id DESC", [family])]

    def all_plans(self) -> list[StoredPlan]:
        """Every stored plan, newest first."""
        return [_plan_from_row(r) for r in self._query(
            "SELECT * FROM plans ORDER BY created_at DESC, id DESC")]

    def delete_plan(self, plan_id: int) -> bool:
        """Delete the plan with id ``plan_id``; False when there was none."""
        with self._write("delete_plan"):
            cur = self._conn.execute("DELETE FROM plans WHERE id = ?", [int(plan_id)])
        return cur.rowcount > 0

    def why_not(self, key: PlanKey) -> list[str]:
        """Why no stored plan matches ``key``: one line per stored plan of the same model
        naming what differs (``plan 3 (latency, 2024-...): native: build 1a2b -> build 3c4d``).
        Empty when a plan matches, or when no plan of this model (nor of a model with the same
        inputs) was ever stored."""
        if self.get_plan(key) is not None:
            return []
        same_model = self.plans_for_model(key.model)
        if same_model:
            return [self._difference_line(p, key) for p in same_model]
        others = [_plan_from_row(r) for r in self._query(
            "SELECT * FROM plans WHERE inputs_sig = ? ORDER BY created_at DESC, id DESC LIMIT ?",
            [key.inputs, MAX_OTHER_MODEL_LINES])]
        return [self._difference_line(p, key) for p in others]

    @staticmethod
    def _difference_line(stored: StoredPlan, key: PlanKey) -> str:
        changes = stored.key.explain_difference(key) or ["identical key (digest mismatch)"]
        return (f"plan {stored.id} ({stored.key.objective}, stored {stored.created_at}): "
                + ", ".join(changes))

    def prune_plans(
        self,
        *,
        older_than_days: float | None = None,
        stale: Callable[[StoredPlan], Sequence[str]] | None = None,
        dry_run: bool = False,
        now: datetime | None = None,
    ) -> list[PrunedPlan]:
        """Delete the plans created more than ``older_than_days`` days ago, and those for
        which ``stale(plan)`` returns reasons (e.g. :func:`stale_reasons`: the plan's hardware
        or software fingerprint does not match this machine); returns what was removed, oldest
        first. ``dry_run`` removes nothing. Selection and deletion happen in one write
        transaction, so a plan re-tuned meanwhile by another process is never removed by
        mistake."""
        if older_than_days is None and stale is None:
            raise StoreError("prune_plans: expected older_than_days and/or stale, received neither")
        if older_than_days is not None and (
            isinstance(older_than_days, bool) or not isinstance(older_than_days, int | float)
            or older_than_days < 0
        ):
            raise StoreError(
                f"prune_plans: older_than_days must be a number >= 0, received {older_than_days!r}")
        now = now or datetime.now(timezone.utc)
        cutoff = None
        if older_than_days is not None:
            cutoff = now - timedelta(days=float(older_than_days))
        removed: list[PrunedPlan] = []
        context = contextlib.nullcontext() if dry_run else self._write("prune_plans")
        with context:
            rows = list(self._query("SELECT * FROM plans ORDER BY created_at, id"))
            for row in rows:
                plan = _plan_from_row(row)
                reasons: list[str] = []
                if cutoff is not None:
                    try:
                        created = _parse_time(plan.created_at)
                    except ValueError:
                        reasons.append(f"unreadable creation time {plan.created_at!r}")
                    else:
                        if created < cutoff:
                            days = (now - created).total_seconds() / 86400
                            reasons.append(f"{days:.1f} days old (older than {older_than_days:g})")
                if stale is not None:
                    if row["key_digest"] != plan.key.digest():
                        reasons.append("fingerprint format changed")
                    reasons.extend(stale(plan))
                if not reasons:
                    continue
                removed.append(PrunedPlan(plan, reasons))
                if not dry_run:
                    self._conn.execute("DELETE FROM plans WHERE id = ?", [plan.id])
        return removed


def key_here(
    key: PlanKey, registry: Registry, hardware: Mapping[str, Any] | None = None,
) -> PlanKey:
    """``key`` with this machine's hardware fingerprint (or ``hardware``) and the software
    fingerprint of ``registry`` for the backends ``key`` names: the key a plan of the same
    model, inputs and objective would have if it were tuned here now."""
    backends = list((key.software.get("backends") or {}).keys())
    return PlanKey(
        model=key.model, inputs=key.inputs,
        hardware=dict(hardware) if hardware is not None else hardware_fingerprint(),
        software=software_fingerprint(registry, backends), objective=key.objective,
    )


def stale_reasons(
    stored: StoredPlan, registry: Registry, hardware: Mapping[str, Any] | None = None,
) -> list[str]:
    """Why the hardware or software fingerprint of ``stored`` does not match this machine
    (``["hardware: threads 2 -> 4", "native: build 1a2b -> build 3c4d"]``); empty when the
    plan could be used here."""
    return stored.key.explain_difference(key_here(stored.key, registry, hardware))
