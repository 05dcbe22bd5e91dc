"""The tuner's error, :class:`TuningError`, in a module of its own: every part of the tuner
raises it (the accuracy and throughput packages, validation, the stages) and this module
imports nothing of the tuner, so raising it ties no part to another."""

from __future__ import annotations

from dispatch.errors import OpDispatchError


class TuningError(OpDispatchError):
    """The tuner could not produce a valid plan."""
