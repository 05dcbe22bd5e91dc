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

