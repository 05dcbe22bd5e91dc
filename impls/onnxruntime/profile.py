"""Per-node time inside an onnxruntime region, from onnxruntime's own profiler.

:func:`profile_region` builds the region's session as the plan does (the same optimisation
level and threads) with profiling on and its optimised model written out, runs it a few times
and maps the ``Node`` events of the trace (one per kernel per run) back to the region's nodes
through the optimised model's node and value names (:func:`impls.region_profile.attribute`):
onnxruntime fuses (Conv with its activation), inserts NCHWc reorders and renames kernels
(``<output>_nchwc``). What onnxruntime allocated while a session as the plan builds it was created
and first run is measured alongside (:class:`impls.region_profile.MemoryProbe`).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dispatch.fusion import FusedNode
from impls.region_profile import Kernel, MemoryProbe, RegionProfile, attribute

#: profiled runs after the first (which allocates and is left out)
RUNS = 3
#: the settings variant of each region implementation (its ``graph_optimization_level``)
OPTIMIZATION = {"Region.onnxruntime.session": "all",
                "Region.onnxruntime.session_extended": "extended",
                "Region.onnxruntime.session_1thread": "all"}
#: the settings variants with an intra-op thread count of their own
THREADS = {"Region.onnxruntime.session_1thread": 1}


def profile_region(region: FusedNode, impl: str, feeds: Sequence[np.ndarray],
                   runs: int = RUNS) -> RegionProfile:
    """Profile ``region`` as implementation ``impl`` builds it, run on ``feeds`` (one array
    per region input) once to warm up and ``runs`` times profiled."""
    import onnx

    from impls.onnxruntime.region import bound_run, session

    optimization = OPTIMIZATION.get(impl, "all")
    arrays = {v.name: np.require(a, requirements="C") for v, a in zip(region.inputs, feeds)}
    # memory: the region as the plan builds it (a profiling session also holds the profiler's
    # buffers and writes its optimised model), run once; it measures its own allocations
    threads = THREADS.get(impl)
    plain = bound_run(region, lambda: session(region, optimization, threads=threads))
    plain(*arrays.values())
    allocated = plain.library_bytes  # type: ignore[attr-defined]
    del plain
    with tempfile.TemporaryDirectory(prefix="opdispatch-ortprof-") as tmp:
        sess = session(region, optimization, profile_dir=tmp, threads=threads)
        for _ in range(1 + max(1, runs)):
            sess.run(None, arrays)
        trace_path = sess.end_profiling()
        with open(trace_path) as f:
            events = json.load(f)
        optimised = onnx.load(os.path.join(tmp, "optimized.onnx"), load_external_data=False)
    del sess
    wiring = {n.name: (tuple(n.input), tuple(n.output)) for n in optimised.graph.node}
    kernels, run_ms = kernel_times(events, wiring)
    node_ms, shared, notes = attribute(region, kernels)
    return RegionProfile(
        library="onnxruntime", node_ms=node_ms, kernels_ms=sum(k.ms for k in kernels),
        run_ms=run_ms, runs=max(1, runs), shared=shared,
        library_bytes=allocated,
        memory_basis=MemoryProbe.BASIS + ", around the session's creation and first run",
        notes=notes)


def kernel_times(events: Sequence[Mapping[str, Any]],
                 wiring: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]]
                 ) -> tuple[list[Kernel], float | None]:
    """``(kernels, run ms)``: each kernel's median time per run over the profiled runs after
    the first, and the median of ``model_run`` (onnxruntime's own time per run), from the
    trace ``events``; ``wiring`` maps kernel names to their inputs and outputs."""
    model_runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                        key=lambda e: e["ts"])
    windows = [(e["ts"], e["ts"] + e["dur"]) for e in model_runs[1:]]  # the first warms up
    per: dict[str, list[float]] = {}
    ops: dict[str, str] = {}
    order: list[str] = []
    for e in events:
        if e.get("cat") != "Node" or not str(e.get("name", "")).endswith("_kernel_time"):
            continue
        ts = e["ts"]
        run = next((k for k, (a, b) in enumerate(windows) if a <= ts <= b), None)
        if run is None:
            continue
        name = e["name"][: -len("_kernel_time")]
        if name not in per:
            order.append(name)
            per[name] = [0.0] * len(windows)
        per[name][run] += e["dur"] / 1e3
        ops[name] = str((e.get("args") or {}).get("op_name", ""))
    kernels = [Kernel(name, ops[name], float(np.median(per[name])),
                      *wiring.get(name, ((), ()))) for name in order]
    run_ms = float(np.median([(b - a) / 1e3 for a, b in windows])) if windows else None
    return kernels, run_ms
