"""The step ways of every library, in the order a generation prefers them, and which are
available here (:mod:`~dispatch.generation.step_ways` defines a way)."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dispatch.errors import PlanError, known
from dispatch.generation import ort_steps, ov_steps
from dispatch.generation.step_ways import StepWay

if TYPE_CHECKING:
    from dispatch.registry import Registry


def step_ways() -> list[StepWay]:
    """Every step way, whether or not its library is installed, in the order a generation
    prefers them (the tuner measures them; this order is the untuned choice)."""
    return [*ort_steps.ways(), *ov_steps.ways()]


def _library_here(backend: str) -> bool:
    return importlib.util.find_spec(backend) is not None


def available_step_ways(registry: Registry | None = None, backends: Sequence[str] | None = None,
                        ) -> dict[str, StepWay]:
    """The step ways whose backend is available: in ``registry`` (and among ``backends`` when
    given), else whose library is installed."""
    out: dict[str, StepWay] = {}
    for way in step_ways():
        if backends is not None and way.backend not in backends:
            continue
        if registry is not None:
            status = registry.backends.get(way.backend)
            if status is None or not status.available:
                continue
        elif not _library_here(way.backend):
            continue
        out[way.name] = way
    return out


def step_way(name: str, registry: Registry | None = None, backends: Sequence[str] | None = None,
             ) -> StepWay:
    """The step way called ``name``; raises :class:`~dispatch.errors.PlanError` listing the
    ways available here (and every way known) when it is not available."""
    ways = available_step_ways(registry, backends)
    if name not in ways:
        every = [w.name for w in step_ways()]
        why = "unknown" if name not in every else "its library is not available here"
        raise PlanError(f"step way {name!r}: {why}; available here: {known(ways)}; every step "
                        f"way: {', '.join(every)}")
    return ways[name]


def default_step_way(registry: Registry | None = None, backends: Sequence[str] | None = None,
                     ) -> StepWay:
    """The first available way of :func:`step_ways`' order (onnxruntime with IO binding where
    onnxruntime is installed)."""
    ways = available_step_ways(registry, backends)
    if not ways:
        raise PlanError("no step way is available here: every one needs onnxruntime or openvino "
                        "(pip install 'opdispatch[onnxruntime]'); every step way: "
                        + ", ".join(w.name for w in step_ways()))
    return next(iter(ways.values()))
