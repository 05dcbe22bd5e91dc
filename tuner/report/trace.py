"""Profiles: a Chrome-trace / Perfetto JSON of real runs of a plan. :func:`profile_trace` builds
the plan's executor, runs it on seeded random inputs and records one event per step and
converter call per run, one track per backend, and the medians.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from dispatch.errors import OpDispatchError
from tuner.plan_lookup import ReportError
from tuner.report.data import nodes_label

if TYPE_CHECKING:
    from dispatch.graph import Graph
    from dispatch.plan import Plan
    from dispatch.registry import Registry


def profile_trace(
    graph: Graph,
    plan: Plan,
    registry: Registry,
    *,
    runs: int = 5,
    warmup: int = 1,
    seed: int = 0,
    feeds: Mapping[str, np.ndarray] | None = None,
) -> dict[str, Any]:
    """Run ``plan`` ``runs`` times (after ``warmup`` untimed runs) on seeded random inputs
    (or ``feeds``) and return a Chrome-trace / Perfetto JSON object: one complete event
    (``ph: "X"``, ``ts``/``dur`` in microseconds) per node step and per converter in every run,
    one track (``tid``) per backend named by metadata events, and one "runs" track with an
    event per whole run. A call's start is its run's start plus the durations of the calls
    before it (the executor times each call; the loop between calls is not traced)."""
    from dispatch.executor import Executor
    from tuner.measure import random_input

    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise ReportError(f"runs must be a positive integer, received {runs!r}")
    try:
        ex = Executor(graph, plan, registry)
    except OpDispatchError as exc:
        raise ReportError(f"the plan cannot be built on this machine: {exc}") from None
    if feeds is None:
        rng = np.random.default_rng(seed)
        feeds = {v.name: random_input(v, rng) for v in graph.inputs}
    for _ in range(max(0, warmup)):
        ex.run(feeds)
    kernel_steps = iter(range(len(plan.steps)))
    call_step = [next(kernel_steps) if c.kind == "kernel" else None for c in ex.calls]
    tracks: dict[str, int] = {}
    for c in ex.calls:
        tracks.setdefault(c.backend or "(converter)", len(tracks) + 1)
    pid = 1
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
         "args": {"name": f"opdispatch {plan.graph}"}},
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "runs"}},
        {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": 0}},
    ]
    for name, tid in tracks.items():
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                       "args": {"name": name}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                       "args": {"sort_index": tid}})
    origin = time.perf_counter()
    per_call: list[list[float]] = [[] for _ in ex.calls]
    walls = []
    for run in range(runs):
        timings: list[float] = []
        t0 = time.perf_counter()
        ex.run(feeds, timings=timings)
        wall = time.perf_counter() - t0
        walls.append(wall)
        start_us = (t0 - origin) * 1e6
        events.append({"name": f"run {run}", "cat": "run", "ph": "X", "pid": pid, "tid": 0,
                       "ts": round(start_us, 3), "dur": round(wall * 1e6, 3),
                       "args": {"run": run, "calls": len(timings)}})
        at = start_us
        for k, (call, dur) in enumerate(zip(ex.calls, timings)):
            per_call[k].append(dur)
            s = call_step[k]
            args: dict[str, Any] = {"run": run, "impl": call.impl, "backend": call.backend}
            if s is not None:
                step = plan.steps[s]
                args.update(step=s, op=step.op, nodes=step.nodes[:20], n_nodes=len(step.nodes),
                            layouts_in=step.layouts_in, layouts_out=step.layouts_out)
                name = nodes_label(step.nodes)
            else:
                name = call.label
            events.append({"name": name, "cat": "converter" if call.kind == "convert" else "node",
                           "ph": "X", "pid": pid, "tid": tracks[call.backend or "(converter)"],
                           "ts": round(at, 3), "dur": round(dur * 1e6, 3), "args": args})
            at += dur * 1e6
    calls = []
    for k, call in enumerate(ex.calls):
        s = call_step[k]
        calls.append({"label": nodes_label(plan.steps[s].nodes) if s is not None else call.label,
                      "kind": call.kind, "step": s, "impl": call.impl, "backend": call.backend,
                      "median_ms": float(np.median(per_call[k])) * 1e3})
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"model": plan.graph, "runs": runs, "warmup": warmup, "seed": seed,
                      "plan_key": (plan.provenance or {}).get("plan_key"),
                      "median_run_ms": float(np.median(walls)) * 1e3,
                      "peak_bytes": int(ex.memory.peak_bytes), "calls": calls},
    }
