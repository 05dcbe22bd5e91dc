"""The records the plan store hands out (:class:`StoredPlan`, :class:`StoredMeasurement`,
:class:`TuningRun`, :class:`PrunedPlan`), their decoding from table rows, and the small
encoders every table shares: timestamps (:func:`_now`, :func:`_parse_time`) and the JSON text
columns (:func:`_dump`, :func:`_json_dict`)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from dispatch.plan import Plan
from tuner.fingerprint import PlanKey
from tuner.store.errors import StoreError


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
        """The stored plan as a :class:`dispatch.plan.Plan`; a plan that is not the plan's
        JSON (too deep to read, numbers out of range) raises :class:`StoreError`."""
        try:
            return Plan.from_json(self.plan_json)
        except (RecursionError, OverflowError, ValueError, MemoryError) as exc:
            raise StoreError(f"the stored plan {self.id} is damaged: plan_json is not a plan "
                             f"({_why(exc)})") from None


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
    #: the process running it (pid, host, start), recorded while it is ``running``
    process: dict[str, Any] | None = None


#: The key of ``tuning_runs.stats_json`` that holds the process of a running run.
PROCESS_KEY = "_process"


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


def _why(exc: BaseException) -> str:
    """``exc`` in at most 100 characters (a recursion error's own text is long)."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 100 else text[:97] + "..."


def _json_dict(text: str | None, where: str = "a JSON column") -> dict[str, Any]:
    """The JSON object in a text column; a column that is not JSON raises
    :class:`StoreError` saying where (``where``: the row and column)."""
    if text is not None and not isinstance(text, str):
        raise StoreError(f"{where} holds {type(text).__name__} {_short(text)}, expected JSON text")
    try:
        data = json.loads(text) if text else {}
    except (ValueError, RecursionError, MemoryError) as exc:
        raise StoreError(f"{where} is not JSON data ({_short(text)}: {_why(exc)})") from None
    return data if isinstance(data, dict) else {"value": data}


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value) if not isinstance(value, str) else repr(value[:limit + 1])
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _column(row: Mapping[str, Any], name: str, kinds: tuple[type, ...], expected: str,
            where: str) -> Any:
    """``row[name]`` when it is of one of ``kinds`` (``None`` included when it is one),
    else :class:`StoreError` naming the row, the column and what it holds."""
    value = row[name]
    ok = isinstance(value, kinds) and not isinstance(value, bool)
    if ok and isinstance(value, float) and not math.isfinite(value):
        ok = False
    if not ok:
        raise StoreError(f"{where}: {name} holds {_short(value)}, expected {expected}")
    return value


def _dump(data: Mapping[str, Any] | None) -> str:
    return json.dumps(dict(data or {}), sort_keys=True, default=str)


def _plan_from_row(row: Mapping[str, Any]) -> StoredPlan:
    """The :class:`StoredPlan` of a ``plans`` row; a row holding what the store never writes
    (text in a number column, a JSON column that is not JSON: another program edited it)
    raises :class:`StoreError` naming the plan and the column."""
    where = f"the stored plan {row['id']} is damaged"
    text = (str,)
    key = PlanKey(
        model=_column(row, "model_fp", text, "text", where),
        inputs=_column(row, "inputs_sig", text, "text", where),
        hardware=_json_dict(row["hardware_json"], f"{where}: hardware_json"),
        software=_json_dict(row["software_json"], f"{where}: software_json"),
        objective=_column(row, "objective", text, "text", where),
        family=row.get("family") or "",
    )
    return StoredPlan(
        id=int(row["id"]), key=key, plan_json=_column(row, "plan_json", text, "JSON text", where),
        latency_ms=_column(row, "latency_ms", (int, float, type(None)),
                           "a finite number or NULL", where),
        peak_bytes=_column(row, "peak_bytes", (int, type(None)), "an integer or NULL", where),
        created_at=_column(row, "created_at", text, "an ISO timestamp", where),
        run_id=_column(row, "tuning_run_id", (int, type(None)), "an integer or NULL", where),
        notes=_json_dict(row["notes_json"], f"{where}: notes_json"),
    )


def _measurement_from_row(row: Mapping[str, Any]) -> StoredMeasurement:
    return StoredMeasurement(
        signature=row["signature"], candidate=row["candidate"],
        hardware_digest=row["hardware_digest"], software_digest=row["software_digest"],
        median_s=row["median_s"], spread_s=row["spread_s"], samples=int(row["samples"]),
        error=row["error"], created_at=row["created_at"],
    )


def _run_from_row(row: Mapping[str, Any]) -> TuningRun:
    stats = _json_dict(row["stats_json"], f"the tuning run {row['id']} is damaged: stats_json")
    process = stats.pop(PROCESS_KEY, None)
    return TuningRun(
        id=int(row["id"]), model_fp=row["model_fp"], started_at=row["started_at"],
        finished_at=row["finished_at"], status=row["status"], budget_s=row["budget_s"],
        objective=row["objective"], stats=stats,
        process=process if isinstance(process, dict) else None,
    )
