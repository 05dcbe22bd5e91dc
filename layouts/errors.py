"""The base errors of opdispatch, below both ``layouts`` and ``dispatch``.

:class:`OpDispatchError` is the base class of every error opdispatch raises on purpose and
:class:`LayoutError` the one the layout registry raises; :mod:`dispatch.errors` re-exports both
with the rest of the core's errors (import them from there). They live here so that
``layouts``, the floor below ``dispatch``, imports nothing from it.
"""

from __future__ import annotations

from collections.abc import Iterable


class OpDispatchError(Exception):
    """Base class of every error that opdispatch raises on purpose."""


class LayoutError(OpDispatchError):
    """A layout or converter lookup failed, or no conversion path exists."""


def known(items: Iterable[str], limit: int = 60) -> str:
    """Format a sorted, bounded list of known names for an error message."""
    names = sorted(set(items))
    shown = ", ".join(names[:limit])
    if len(names) > limit:
        shown += f", ... ({len(names) - limit} more)"
    return shown or "(none)"
