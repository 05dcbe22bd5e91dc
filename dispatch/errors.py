"""Exceptions raised by opdispatch.

Every error says what was received and what was expected, and where a lookup fails it
lists what exists. The CLI turns any :class:`OpDispatchError` into a one-line message and a
non-zero exit code, without a traceback.
"""

from __future__ import annotations

from collections.abc import Iterable


class OpDispatchError(Exception):
    """Base class of every error that opdispatch raises on purpose."""


class ModelLoadError(OpDispatchError):
    """The model file or proto could not be read, checked or imported."""


class UnsupportedOpError(OpDispatchError):
    """One or more nodes have no implementation in any allowed backend."""


class ShapeInferenceError(OpDispatchError):
    """A value's shape could not be determined statically."""


class FeedError(OpDispatchError):
    """Inputs passed to ``Session.run`` do not match the model's inputs."""


class RegistryError(OpDispatchError):
    """Duplicate registrations or failed lookups in a registry."""


class LayoutError(OpDispatchError):
    """A layout or converter lookup failed, or no conversion path exists."""


class PlanError(OpDispatchError):
    """A plan is malformed, does not match its graph, or names unknown pieces."""


class KernelError(OpDispatchError):
    """An implementation raised while running; names the node, implementation and backend."""


class ConfigError(OpDispatchError):
    """A configuration value could not be parsed."""


def known(items: Iterable[str], limit: int = 60) -> str:
    """Format a sorted, bounded list of known names for an error message."""
    names = sorted(set(items))
    shown = ", ".join(names[:limit])
    if len(names) > limit:
        shown += f", ... ({len(names) - limit} more)"
    return shown or "(none)"
