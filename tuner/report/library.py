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
            why = "the report was made without the graph" if src.graph is None else "profiling was off"
            src.notes.append(f"step {s} ({step.backend} region of {len(step.nodes)} nodes): no "
                             f"per-node times (the plan carries no profile and {why})")
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


#: how each library's profiler sums up a kernel over the profiled runs (default: median)
KERNEL_STATISTIC: dict[str, str] = {"openvino": "mean"}
#: what each library's ``run_ms`` is (default: the library's own time per run)
RUN_TIME: dict[str, str] = {"openvino": "median wall time of its infer() calls"}


def profile_note(s: int, profile: RegionProfile, step_ms: float | None) -> str:
    """The report note on step ``s``'s profile: raw totals and how they were reconciled."""
    what = RUN_TIME.get(profile.library, "own run time")
    lib_run = f", {profile.library}'s {what} {profile.run_ms:.4f} ms" if profile.run_ms else ""
    scale = (f"scaled by {step_ms / profile.kernels_ms:.3f} to the step's measured "
             f"{step_ms:.4f} ms" if step_ms is not None and profile.kernels_ms > 0 else
             "not scaled (the step's time is not known)")
    extra = "; ".join(profile.notes)
    stat = KERNEL_STATISTIC.get(profile.library, "median")
    return (f"times marked {LIBRARY_MARK} in step {s} come from {profile.library}'s profiler: "
            f"{len(profile.node_ms)} nodes, kernels {profile.kernels_ms:.4f} ms per run ({stat} "
            f"of {profile.runs} profiled runs{lib_run}), {scale}" + (f"; {extra}" if extra else ""))


def memory_figures(src: Sources, liveness: int | None,
                   profiles: Mapping[int, RegionProfile]) -> dict[str, Any]:
    """The plan's peak memory, whole: the executor's liveness peak (``liveness``, from the
    validation), the graph's constants and their layout copies, and the bytes each region's
    library allocated (from ``profiles``; a region without a figure leaves the total
    unknown). The tuner's own breakdown (provenance ``memory``) is taken when present, with
    the profiles' figures added for the region steps it has none for (the executor counts what
    onnxruntime's region kernels allocate, not OpenVINO's)."""
    prov = (src.plan.provenance or {}).get("memory")
    if isinstance(prov, Mapping) and prov.get("peak_bytes") is not None:
        return _completed(src, prov, profiles)
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
             + (f" + library allocations {sum(known):,} B ({_measured(profiles, library)})"
                if known else ""))
    if missing:
        basis += (f"; regions of steps {', '.join(missing[:5])} have no library figure (single "
                  f"nodes are not measured): a lower bound")
    return {"peak_bytes": total, "liveness_bytes": int(liveness), "constant_bytes": constants,
            "library_bytes": library, "basis": basis}


def _measured(profiles: Mapping[int, RegionProfile], steps: Mapping[str, int | None]) -> str:
    """How the report measured the library figures of ``steps`` (step index -> bytes)."""
    libraries = sorted({profiles[int(s)].library for s, b in steps.items()
                        if b is not None and int(s) in profiles})
    return (f"measured by the report ({', '.join(libraries) or 'library profilers'}): C heap "
            "growth around each region's creation and first run")


def _completed(src: Sources, prov: Mapping[str, Any],
               profiles: Mapping[int, RegionProfile]) -> dict[str, Any]:
    """The tuner's memory breakdown ``prov`` with the profiles' library figures added for the
    region steps it has none for (an OpenVINO region: the executor counts what onnxruntime's
    region kernels allocate only), and a lower bound said where neither has one."""
    out = dict(prov)
    have = prov.get("library_bytes")
    library: dict[str, int | None] = dict(have) if isinstance(have, Mapping) else {}
    added: dict[str, int | None] = {}
    for s, step in enumerate(src.plan.steps):
        if step.op != REGION_OP or step.backend not in PROFILERS or str(s) in library:
            continue
        p = profiles.get(s)
        added[str(s)] = p.library_bytes if p is not None else None
    if not added:
        return out
    known = {s: b for s, b in added.items() if b is not None}
    missing = [s for s, b in added.items() if b is None]
    library.update(added)
    out["library_bytes"] = library
    out["peak_bytes"] = int(prov["peak_bytes"]) + sum(known.values())
    basis = str(prov.get("basis") or "")
    if known:
        basis += (f"; + library allocations of steps {', '.join(list(known)[:5])} "
                  f"{sum(known.values()):,} B ({_measured(profiles, known)})")
    if missing:
        basis += (f"; regions of steps {', '.join(missing[:5])} have no library figure (single "
                  f"nodes are not measured): a lower bound")
    out["basis"] = basis
    return out
