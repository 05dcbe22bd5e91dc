"""The two policies a plan key depends on, written once: objectives and which backends a plan uses.

An objective names what tuning minimises (``latency`` or ``memory``), optionally under a memory
cap (``latency@cap=BYTES``) and optionally letting NaN/Inf outputs differ from the reference
(``latency+nonstrict-nan``); the spelled-out form is part of every plan key. The backends a plan
may use are the ones asked for, else the configured order first (it orders the untuned plan)
followed by every other available backend. The Session, the tuner and the report's plan lookup
all ask this module, so that they compute the same key for the same model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from dispatch.errors import ArgumentError

if TYPE_CHECKING:
    from dispatch.registry import Registry

#: The objectives tuning can minimise.
OBJECTIVES = ("latency", "memory")
#: How an objective ends when its plan may differ from the reference on NaN/Inf inputs
#: (tuned with ``allow_nonstrict_nan``: :mod:`tuner.nonfinite`), e.g. ``latency+nonstrict-nan``.
NONSTRICT_NAN_SUFFIX = "+nonstrict-nan"


def parse_objective(objective: str) -> tuple[str, int | None]:
    """Split an objective as it appears in plan keys into ``(objective, memory_cap_bytes)``:
    ``"latency"`` -> ``("latency", None)``, ``"latency@cap=1000000"`` -> ``("latency", 1000000)``
    (a :data:`NONSTRICT_NAN_SUFFIX` is accepted and left to :func:`nonstrict_nan`). Raises :class:`~dispatch.errors.ArgumentError` naming the known objectives."""
    if not isinstance(objective, str):
        raise ArgumentError(f"objective must be a string, received {type(objective).__name__}")
    strict = objective.removesuffix(NONSTRICT_NAN_SUFFIX)
    name, sep, rest = strict.partition("@")
    cap: int | None = None
    if sep:
        text = rest[len("cap="):] if rest.startswith("cap=") else ""
        try:
            cap = int(text)
        except ValueError:
            cap = None
        if cap is None or cap <= 0:
            raise ArgumentError(
                f"objective {objective!r}: expected NAME or NAME@cap=BYTES with a positive "
                f"integer BYTES, e.g. latency@cap=100000000"
            )
    if name not in OBJECTIVES:
        raise ArgumentError(
            f"unknown objective {objective!r}; known: {', '.join(OBJECTIVES)} "
            f"(optionally @cap=BYTES, then optionally {NONSTRICT_NAN_SUFFIX})"
        )
    return name, cap


def objective_string(objective: str, memory_cap_bytes: int | None = None,
                     nonstrict_nan: bool = False) -> str:
    """The objective as it appears in plan keys, e.g. ``latency``, ``latency@cap=1000000`` or
    ``latency+nonstrict-nan``."""
    if memory_cap_bytes is not None:
        objective = f"{objective}@cap={int(memory_cap_bytes)}"
    return objective + (NONSTRICT_NAN_SUFFIX if nonstrict_nan else "")


def nonstrict_nan(objective: str) -> bool:
    """Whether ``objective`` (as in plan keys) lets NaN/Inf differ from the reference."""
    return isinstance(objective, str) and objective.endswith(NONSTRICT_NAN_SUFFIX)


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
