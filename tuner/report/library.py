"""Inside library regions: per-node times from the library's own profiler, and the memory the
library allocates, for a report.

A region step (onnxruntime, OpenVINO) is measured as a whole; :func:`region_profiles` gets,
for each region step of more than one node, a :class:`~impls.region_profile.RegionProfile`:
from the plan's provenance (``region_profiles``, keyed by step index) when the tuner stored
one, else by profiling the region here (one session built as the plan builds it, a warm-up
run and a few profiled runs), cached per process. The report scales the per-node times so
that they sum to the step's measured median and marks them as the library's
(:data:`LIBRARY_MARK`); :func:`memory_figures` adds the libraries' allocations and the
graph's constants to the executor's liveness peak.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from dispatch.errors import OpDispatchError
from dispatch.fusion import REGION_OP, region_node

if TYPE_CHECKING:
    from dispatch.graph import Graph
    from dispatch.plan import Plan
    from dispatch.registry import Registry
    from impls.region_profile import RegionProfile
    from tuner.report.sources import Sources

#: the suffix of a time that comes from a library's profiler (tables, graph, chart)
LIBRARY_MARK = "*"
#: ``time_source`` of a row whose time comes from a library's profiler starts with this
LIBRARY_SOURCE = "library profiler"

#: the profilers of each library backend: ``(module, function)``
PROFILERS: dict[str, tuple[str, str]] = {
    "onnxruntime": ("impls.onnxruntime.profile", "profile_region"),
    "openvino": ("impls.openvino.profile", "profile_region"),
}

_CACHE: dict[tuple[Any, ...], RegionProfile | str] = {}
_LOCK = threading.Lock()


def is_library_source(source: Any) -> bool:
    """Whether a row's ``time_source`` says its time comes from a library's profiler."""
    return isinstance(source, str) and source.startswith(LIBRARY_SOURCE)


def _profile_here(src: Sources, s: int) -> RegionProfile | str:
    """Profile step ``s``'s region in this process (cached): the profile, or why not."""
    assert src.graph is not None
    return profile_step(src.graph, src.plan, src.registry, s)


def profile_step(graph: Graph, plan: Plan, registry: Registry | None, s: int) -> RegionProfile | str:
    """Profile step ``s`` of ``plan`` (a region) with its library's profiler, in this process
    (cached): the profile, or why not."""
    import importlib

    from tuner.index_bounds import index_bounds
    from tuner.measure import random_input

    step = plan.steps[s]
    key = (graph.name, (plan.provenance or {}).get("plan_key"), step.impl,
           tuple(step.nodes), tuple(step.layouts_in))
    with _LOCK:
        hit = _CACHE.get(key)
    if hit is not None:
        return hit
    module, fn = PROFILERS[step.backend]
    try:
        if registry is not None and step.backend not in registry.available_backends():
            raise OpDispatchError(f"backend {step.backend} is not available here")
        region = region_node(graph, step.nodes)
        rng = np.random.default_rng(0)
        bounds = index_bounds(graph.nodes)
        feeds = [random_input(v, rng, bounds.get(v.name)) for v in region.inputs]
        got: RegionProfile | str = getattr(importlib.import_module(module), fn)(
            region, step.impl, feeds)
    except Exception as exc:  # a profile is extra: the report goes on without it
        got = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    with _LOCK:
        _CACHE[key] = got
    return got


def plan_region_profiles(graph: Graph, plan: Plan, registry: Registry | None) -> dict[str, Any]:
    """Step index (a string) -> the library profile (JSON data) of each region step of more
    than one node that its library can profile here: what the tuner stores with the winner
    (provenance ``region_profiles``), so that every report of the plan, in any process, shows
    the same per-node times."""
    out: dict[str, Any] = {}
    for s, step in enumerate(plan.steps):
        if step.op == REGION_OP and len(step.nodes) >= 2 and step.backend in PROFILERS:
            got = profile_step(graph, plan, registry, s)
            if not isinstance(got, str):
                out[str(s)] = got.to_dict()
    return out


def region_profiles(src: Sources, profile: bool = True) -> dict[int, RegionProfile]:
    """Step index -> the library profile of each region step of more than one node (see the
    module docstring); ``profile=False`` takes only the profiles the plan carries. Why a
    region has none is added to ``src.notes``."""
    from impls.region_profile import RegionProfile

    stored = (src.plan.provenance or {}).get("region_profiles") or {}
    out: dict[int, RegionProfile] = {}
    for s, step in enumerate(src.plan.steps):
        if step.op != REGION_OP or len(step.nodes) < 2 or step.backend not in PROFILERS:
            continue
        data = stored.get(str(s)) if isinstance(stored, Mapping) else None
        if isinstance(data, Mapping):
            try:
                out[s] = RegionProfile.from_dict(data)
                continue
            except TypeError:
                pass
        if not profile or src.graph is None:
            src.notes.append(f"step {s} ({step.backend} region of {len(step.nodes)} nodes): no "
                             f"per-node times (the plan carries no profile and "
                             f"{'the report was made without the graph' if src.graph is None else 'profiling was off'})")
            continue
        got = _profile_here(src, s)
        if isinstance(got, str):
            src.notes.append(f"step {s} ({step.backend} region): not profiled: {got}")
        else:
            out[s] = got
    return out


def node_times(profile: RegionProfile, step_ms: float | None) -> dict[str, float]:
    """The region's per-node times scaled to ``step_ms`` (its measured median)."""
    return profile.scaled(step_ms)


def source_text(profile: RegionProfile, step_ms: float | None, node: str) -> str:
    """The ``time_source`` of a node row whose time comes from ``profile``."""
    basis = "scaled to the step's measured time" if step_ms is not None else "raw"
    shared = profile.shared.get(node)
    return (f"{LIBRARY_SOURCE} ({profile.library}, {basis}"
            + (f"; shares kernel {shared}" if shared else "") + ")")


def profile_note(s: int, profile: RegionProfile, step_ms: float | None) -> str:
    """The report note on step ``s``'s profile: raw totals and how they were reconciled."""
    lib_run = f", {profile.library}'s own run time {profile.run_ms:.4f} ms" if profile.run_ms else ""
    scale = (f"scaled by {step_ms / profile.kernels_ms:.3f} to the step's measured "
             f"{step_ms:.4f} ms" if step_ms is not None and profile.kernels_ms > 0 else
             "not scaled (the step's time is not known)")
    extra = "; ".join(profile.notes)
    return (f"times marked {LIBRARY_MARK} in step {s} come from {profile.library}'s profiler: "
            f"{len(profile.node_ms)} nodes, kernels {profile.kernels_ms:.4f} ms per run (median "
            f"of {profile.runs} profiled runs{lib_run}), {scale}" + (f"; {extra}" if extra else ""))


def memory_figures(src: Sources, liveness: int | None,
                   profiles: Mapping[int, RegionProfile]) -> dict[str, Any]:
    """The plan's peak memory, whole: the executor's liveness peak (``liveness``, from the
    validation), the graph's constants and their layout copies, and the bytes each region's
    library allocated (from ``profiles``; a region without a figure leaves the total
    unknown). The tuner's own breakdown (provenance ``memory``) is taken when present."""
    prov = (src.plan.provenance or {}).get("memory")
    if isinstance(prov, Mapping) and prov.get("peak_bytes") is not None:
        return dict(prov)
    if liveness is None:
        return {"peak_bytes": None, "basis": "not known: no liveness peak recorded"}
    constants = copies = 0
    if src.graph is not None:
        constants = sum(int(v.nbytes) for v in src.graph.values.values() if v.is_const)
        for c in src.plan.conversions:
            if c.at_build:
                constants += int(src.graph.value(c.value).nbytes)
                copies += 1
    library: dict[str, int | None] = {}
    for s, step in enumerate(src.plan.steps):
        if step.op == REGION_OP and step.backend in PROFILERS:
            p = profiles.get(s)
            library[str(s)] = p.library_bytes if p is not None else None
    known = [b for b in library.values() if b is not None]
    missing = [s for s, b in library.items() if b is None]
    total = int(liveness) + constants + sum(known)
    basis = (f"executor liveness {int(liveness):,} B + constants {constants:,} B"
             + (f" ({copies} layout copies)" if copies else "")
             + (f" + library allocations {sum(known):,} B (measured by the report: C heap growth "
                f"around each region's creation and first run)" if known else ""))
    if missing:
        basis += (f"; regions of steps {', '.join(missing[:5])} have no library figure (single "
                  f"nodes are not measured): a lower bound")
    return {"peak_bytes": total, "liveness_bytes": int(liveness), "constant_bytes": constants,
            "library_bytes": library, "basis": basis}
