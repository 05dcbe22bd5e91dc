"""Which backends a plan may use, written once.

The backends a plan may use are the ones asked for, else the configured order first (it orders
the untuned plan) followed by every other available backend. The Session, the tuner and the
report's plan lookup all ask this module, so that they compute the same key for the same model.
What a plan is tuned for is :class:`dispatch.objective.Objective`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dispatch.registry import Registry


def plan_backends(
    registry: Registry, configured: Sequence[str], requested: Sequence[str] | None = None,
) -> list[str]:
    """The backends a plan may use, in priority order: the ``requested`` ones that are
    available, else the ``configured`` order's available backends followed by every other
    available backend (in the registry's order)."""
    available = registry.available_backends()
    if requested:
        return [b for b in requested if b in available]
    order = [b for b in configured if b in available]
    return order + [b for b in available if b not in order]


def unavailable_backends(registry: Registry, requested: Sequence[str]) -> list[str]:
    """The ``requested`` backends that are not available here (unknown or unavailable)."""
    available = registry.available_backends()
    return [b for b in requested if b not in available]


# -- transitional: the string helpers of the last release, kept while the tuner moves to ----------
# -- Objective values (issue 50); each one delegates to dispatch.objective ----------------------

from dispatch.objective import (  # noqa: E402
    ACCURACY_METRICS,
    MAX_CONCURRENCY,
    AccuracyTarget,
    Objective,
    parse_accuracy,
)
from dispatch.objective import NAMES as OBJECTIVES  # noqa: E402

NONSTRICT_NAN_SUFFIX = "+nonstrict-nan"
ACCURACY_MARK = "+accuracy="
__all__ = ["ACCURACY_METRICS", "MAX_CONCURRENCY", "OBJECTIVES", "parse_accuracy"]


def split_accuracy(objective: str):  # noqa: ANN201
    o = Objective.parse(objective)
    a = o.accuracy
    return str(o.float32), (None if a is None else (a.metric, a.budget, a.data))


def accuracy_target(objective: str):  # noqa: ANN201
    return split_accuracy(objective)[1]


def accuracy_string(metric: str, budget: float, data_digest: str) -> str:
    return ACCURACY_MARK + str(AccuracyTarget(metric, budget, data_digest))[len("accuracy="):]


def parse_objective(objective: str) -> tuple[str, int | None]:
    o = Objective.parse(objective)
    return o.name, o.memory_cap


def throughput_target(objective: str) -> tuple[int, float | None] | None:
    o = Objective.parse(objective).resolved()
    return (o.concurrency, o.p99_ms) if o.is_throughput else None  # type: ignore[return-value]


def canonical_objective(objective: str) -> str:
    return str(Objective.parse(objective).resolved())


def objective_string(objective: str, memory_cap_bytes: int | None = None,
                     nonstrict_nan: bool = False, *, concurrency: int | None = None,
                     max_latency_ms: float | None = None,
                     accuracy: tuple[str, float, str] | None = None) -> str:
    from dispatch.errors import ArgumentError

    if objective == "throughput" and concurrency is None:
        raise ArgumentError("a throughput objective needs its concurrency (requests in flight)")
    return str(Objective(objective, memory_cap=memory_cap_bytes, concurrency=concurrency,
                         p99_ms=max_latency_ms,
                         accuracy=None if accuracy is None else AccuracyTarget(*accuracy),
                         nonstrict_nan=nonstrict_nan))


def tune_flags(objective: str) -> str:
    return Objective.parse(objective).resolved().tune_flags()


def nonstrict_nan(objective: str) -> bool:
    return isinstance(objective, str) and Objective.parse(objective).nonstrict_nan
