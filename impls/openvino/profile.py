"""Per-node time inside an OpenVINO region, from OpenVINO's own performance counters.

:func:`profile_region` compiles the region as the plan does (:func:`impls.openvino.region.
compile_config`: latency hint, one stream, float32, the configured threads) with
``PERF_COUNT`` on — outside the compiled cache, so that a profiling build never takes the
place of the plan's entry — runs it once to warm up and a few times more, and maps OpenVINO's
per-layer counters back to the region's nodes (:func:`impls.region_profile.attribute`).

OpenVINO's CPU plugin fuses layers (a Conv with its bias Add and its Relu), inserts layout
reorders and renames what it runs (``<node>/WithoutBiases``); its executed graph
(``compiled_model.get_runtime_model()``) lists, for every layer it runs, the ONNX node names
the layer stands for (``rt_info["originalLayersNames"]``), which become the kernel's aliases,
and the layers it reads from, which become its wiring (``ov:<layer>`` value names, through the
layers that run nothing: in-place reshapes and the like). A layer that ran in no measurable
time (OpenVINO's ``NOT_RUN``) keeps the nodes it names, at 0 ms, when no timed layer names
them; otherwise it is left out.

OpenVINO's counters are running averages since the model was compiled, in whole microseconds
(``avg = sum of per-run durations / runs``), not per-run figures, and its whole run has no
event of its own: a kernel's time is the mean over the profiled runs, recovered from the
averages after the warm-up and after the last run, and ``run_ms`` is the median wall time of
the profiled ``infer()`` calls (a note says so).

What OpenVINO allocated while the region, built as the plan builds it (no profiling, through
the compiled cache when it is on), was compiled and first run is the region's own measure
(``library_bytes`` of :func:`impls.openvino.region.build_region`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dispatch.fusion import FusedNode
from impls.region_profile import Kernel, MemoryProbe, RegionProfile, attribute

#: profiled runs after the first (which allocates and is left out)
RUNS = 3
#: layer types of OpenVINO's executed graph that are no kernels (inputs, outputs, constants)
NOT_KERNELS = frozenset({"Input", "Output", "Const", "Parameter", "Result", "Constant"})
#: the prefix of the value names that wire kernels together (OpenVINO's executed graph keeps
#: no tensor names; these name a layer's output and match no region value)
WIRE = "ov:"


@dataclass
class Layer:
    """One layer of OpenVINO's executed graph: its name, type, the ONNX node names it stands
    for and the layers it reads."""

    name: str
    type: str
    originals: tuple[str, ...]
    sources: tuple[str, ...]


def profile_region(region: FusedNode, impl: str, feeds: Sequence[np.ndarray],
                   runs: int = RUNS) -> RegionProfile:
    """Profile ``region`` as OpenVINO's region implementation builds it, run on ``feeds`` (one
    array per region input) once to warm up and ``runs`` times profiled. ``impl`` names the
    implementation (OpenVINO has one, ``Region.openvino.compiled``, whose settings are
    :func:`impls.openvino.region.compile_config`)."""
    from impls.openvino.compiled_cache import compile_region
    from impls.openvino.region import build_region, compile_config, core

    runs = max(1, runs)
    arrays = [np.require(a, requirements="C") for a in feeds]
    # memory: the region as the plan builds it, run once; it measures its own allocations
    plain = build_region(region)
    plain(*arrays)
    allocated = plain.library_bytes  # type: ignore[attr-defined]
    del plain
    ov_core = core()
    # time: a profiling build, outside the compiled cache (its settings differ from the plan's)
    compiled = compile_region(ov_core, region, dict(compile_config(region=region), PERF_COUNT=True), "off")
    request = compiled.create_infer_request()
    request.infer(arrays, share_inputs=True)
    warm = averages(request.get_profiling_info())
    walls: list[float] = []
    for _ in range(runs):
        t0 = time.perf_counter()
        request.infer(arrays, share_inputs=True)
        walls.append((time.perf_counter() - t0) * 1e3)
    last = averages(request.get_profiling_info())
    layers = runtime_layers(compiled.get_runtime_model())
    del request, compiled
    times = run_means(warm, last, runs)
    kernels = kernels_of(layers, times, region)
    node_ms, shared, notes = attribute(region, kernels)
    notes.insert(0, "OpenVINO's per-layer counters are running averages in whole microseconds "
                    "(each run's time truncated): kernel times are means over the profiled runs, "
                    "its run time the wall time of infer()")
    return RegionProfile(
        library="openvino", node_ms=node_ms, kernels_ms=sum(k.ms for k in kernels),
        run_ms=float(np.median(walls)), runs=runs, shared=shared,
        library_bytes=allocated,
        memory_basis=MemoryProbe.BASIS + ", around the compiled model's creation and first "
                                         "inference",
        notes=notes)


def averages(info: Iterable[Any]) -> dict[str, float]:
    """Layer name -> average µs per run so far, from OpenVINO's profiling info
    (``request.get_profiling_info()``); layers fused into another, and layers that ran in
    under a microsecond, are ``NOT_RUN`` at 0."""
    out: dict[str, float] = {}
    for p in info:
        out[p.node_name] = out.get(p.node_name, 0.0) + p.real_time.total_seconds() * 1e6
    return out


def run_means(warm: Mapping[str, float], last: Mapping[str, float], runs: int) -> dict[str, float]:
    """Layer name -> mean ms per profiled run: OpenVINO's averages cover every run since the
    model was compiled, the warm-up (``warm``, after one run) and the ``runs`` profiled ones
    (``last``), so the profiled runs took ``last * (runs + 1) - warm`` in all (to within a
    microsecond per run: each run's duration is truncated to whole microseconds)."""
    out: dict[str, float] = {}
    for name, avg in last.items():
        out[name] = max(0.0, avg * (runs + 1) - warm.get(name, 0.0)) / runs / 1e3
    return out


def runtime_layers(model: Any) -> list[Layer]:
    """The layers of OpenVINO's executed graph (``compiled_model.get_runtime_model()``) in
    execution order, with the ONNX node names each stands for and the layers it reads."""
    out = []
    for op in model.get_ordered_ops():
        rt = op.get_rt_info()
        kind = _rt_text(rt, "layerType") or op.get_type_name()
        originals = tuple(n.strip() for n in _rt_text(rt, "originalLayersNames").split(",") if n.strip())
        sources = tuple(i.get_source_output().get_node().get_friendly_name() for i in op.inputs())
        out.append(Layer(op.get_friendly_name(), kind, originals, sources))
    return out


def _rt_text(rt: Any, key: str) -> str:
    try:
        return str(rt[key].astype(str)) if key in rt else ""
    except Exception:  # an entry of another type: not needed
        return ""


def kernels_of(layers: Sequence[Layer], ms: Mapping[str, float], region: FusedNode) -> list[Kernel]:
    """The kernels :func:`impls.region_profile.attribute` maps to ``region``'s nodes: every
    timed layer (``ms`` > 0; timed layers missing from ``layers`` too, unwired), then the
    untimed ones that name a region node (an in-place reshape: its node costs 0), each with
    its original layer names as aliases and wired to the nearest kernels it reads, through the
    layers left out."""
    names = {n.name for n in region.nodes}
    produced = {v.name for n in region.nodes for v in n.outputs}

    def claims(layer: Layer) -> bool:
        return any(k in names or k in produced for k in (layer.name, *layer.originals))

    by_name = {layer.name: layer for layer in layers}
    timed = [layer for layer in layers if layer.type not in NOT_KERNELS and ms.get(layer.name, 0.0) > 0]
    untimed = [layer for layer in layers if layer.type not in NOT_KERNELS
               and ms.get(layer.name, 0.0) <= 0 and claims(layer)]
    kept = {layer.name for layer in [*timed, *untimed]}
    resolved: dict[str, tuple[str, ...]] = {}

    def feeders(name: str) -> tuple[str, ...]:
        """The kept layers nearest upstream of (or at) layer ``name``."""
        if name in kept:
            return (name,)
        if name in resolved:
            return resolved[name]
        resolved[name] = ()  # cycles cannot happen; guards anyway
        found: list[str] = []
        layer = by_name.get(name)
        for src in layer.sources if layer is not None else ():
            for f in feeders(src):
                if f not in found:
                    found.append(f)
        resolved[name] = tuple(found)
        return resolved[name]

    kernels = []
    for layer in [*timed, *untimed]:
        inputs: list[str] = []
        for src in layer.sources:
            for f in feeders(src):
                if WIRE + f not in inputs:
                    inputs.append(WIRE + f)
        aliases = tuple(n for n in layer.originals if n != layer.name)
        kernels.append(Kernel(layer.name, layer.type, ms.get(layer.name, 0.0), tuple(inputs),
                              (WIRE + layer.name,), aliases))
    for name, t in ms.items():  # timed but not in the executed graph (not seen): by name only
        if t > 0 and name not in by_name:
            kernels.append(Kernel(name, "", t))
    return kernels
