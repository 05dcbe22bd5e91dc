"""The records the plan store hands out (:class:`StoredPlan`, :class:`StoredMeasurement`,
:class:`TuningRun`, :class:`PrunedPlan`), their decoding from table rows, and the small
encoders every table shares: timestamps (:func:`_now`, :func:`_parse_time`) and the JSON text
columns (:func:`_dump`, :func:`_json_dict`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from dispatch.plan import Plan
from tuner.fingerprint import PlanKey


@dataclass(frozen=True)
class StoredPlan:
    """A plan row: its key, the plan as JSON and what the tuner measured for it."""

    id: int
    key: PlanKey
    plan_json: str
    latency_ms: float | None
    peak_bytes: int | None
    created_at: str
    run_id: int | None
    notes: dict[str, Any] = field(default_factory=dict)

    def plan(self) -> Plan:
        """The stored plan as a :class:`dispatch.plan.Plan`."""
        return Plan.from_json(self.plan_json)


@dataclass(frozen=True)
class StoredMeasurement:
    """One candidate measured for one signature on one hardware/software combination."""

    signature: str
    candidate: str
    hardware_digest: str
    software_digest: str
    median_s: float | None
    spread_s: float | None
    samples: int
    error: str | None
    created_at: str

    @property
    def ok(self) -> bool:
        """True when the candidate ran and matched the reference."""
        return self.error is None and self.median_s is not None


@dataclass(frozen=True)
class TuningRun:
    """One tuning run: when, how it ended, its budget, objective and statistics."""

    id: int
    model_fp: str
    started_at: str
    finished_at: str | None
    status: str
    budget_s: float | None
    objective: str
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PrunedPlan:
    """A plan :meth:`PlanStore.prune_plans` removed (or would remove), and why."""

    plan: StoredPlan
    reasons: list[str]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _parse_time(text: str) -> datetime:
    """An ISO timestamp as an aware datetime (naive ones are taken as UTC)."""
    when = datetime.fromisoformat(text)
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def _json_dict(text: str | None) -> dict[str, Any]:
    data = json.loads(text) if text else {}
    return data if isinstance(data, dict) else {"value": data}


def _dump(data: Mapping[str, Any] | None) -> str:
    return json.dumps(dict(data or {}), sort_keys=True, default=str)


def _plan_from_row(row: Mapping[str, Any]) -> StoredPlan:
    key = PlanKey(
        model=row["model_fp"],
        inputs=row["inputs_sig"],
        hardware=_json_dict(row["hardware_json"]),
        software=_json_dict(row["software_json"]),
        objective=row["objective"],
        family=row.get("family") or "",
    )
    return StoredPlan(
        id=int(row["id"]), key=key, plan_json=row["plan_json"], latency_ms=row["latency_ms"],
        peak_bytes=row["peak_bytes"], created_at=row["created_at"], run_id=row["tuning_run_id"],
        notes=_json_dict(row["notes_json"]),
    )


def _measurement_from_row(row: Mapping[str, Any]) -> StoredMeasurement:
    return StoredMeasurement(
        signature=row["signature"], candidate=row["candidate"],
        hardware_digest=row["hardware_digest"], software_digest=row["software_digest"],
        median_s=row["median_s"], spread_s=row["spread_s"], samples=int(row["samples"]),
        error=row["error"], created_at=row["created_at"],
    )


def _run_from_row(row: Mapping[str, Any]) -> TuningRun:
    return TuningRun(
        id=int(row["id"]), model_fp=row["model_fp"], started_at=row["started_at"],
        finished_at=row["finished_at"], status=row["status"], budget_s=row["budget_s"],
        objective=row["objective"], stats=_json_dict(row["stats_json"]),
    )
