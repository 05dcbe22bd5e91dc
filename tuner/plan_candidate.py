"""One whole plan validated end to end, :class:`PlanCandidate`: what validation fills in and
every stage of tuning chooses among (a leaf module, so that the stages that only name the type
import nothing else of the tuner)."""

from __future__ import annotations

from dataclasses import dataclass

from dispatch.plan import Plan


@dataclass
class PlanCandidate:
    """One whole plan validated end to end."""

    label: str
    plan: Plan
    predicted_s: float | None  # None: not from the optimiser (the untuned plan)
    latency_ms: float | None = None
    spread_ms: float | None = None
    peak_bytes: int | None = None
    error: str | None = None
    #: what ``peak_bytes`` is made of (:meth:`tuner.plan_memory.PlanMemory.to_dict`)
    memory: dict | None = None
    #: timed runs behind ``latency_ms``
    samples: int = 0
    #: one of the single-backend plans (the untuned plan, each backend first, numpy only),
    #: which a plan the optimiser made must beat by more than the measured spread
    baseline: bool = False
