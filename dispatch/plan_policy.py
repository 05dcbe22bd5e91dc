"""The two policies a plan key depends on, written once: objectives and which backends a plan uses.

An objective names what tuning minimises (``latency`` or ``memory``), optionally under a memory
cap (``latency@cap=BYTES``); the spelled-out form is part of every plan key. The backends a plan
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


def parse_objective(objective: str) -> tuple[str, int | None]:
    """Split an objective as it appears in plan keys into ``(objective, memory_cap_bytes)``:
    ``"latency"`` -> ``("latency", None)``, ``"latency@cap=1000000"`` -> ``("latency", 1000000)``.
    Raises :class:`~dispatch.errors.ArgumentError` naming the known objectives."""
    if not isinstance(objective, str):
        raise ArgumentError(f"objective must be a string, received {type(objective).__name__}")
    name, sep, rest = objective.partition("@")
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
            f"(optionally @cap=BYTES)"
        )
    return name, cap


def objective_string(objective: str, memory_cap_bytes: int | None = None) -> str:
    """The objective as it appears in plan keys, e.g. ``latency`` or ``latency@cap=1000000``."""
    if memory_cap_bytes is not None:
        return f"{objective}@cap={int(memory_cap_bytes)}"
    return objective


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
