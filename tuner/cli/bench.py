"""``opdispatch run`` as a benchmark: warm-up runs, then a number of timed runs or as many as fit
in a duration (both: until both are reached, as trtexec's ``--iterations`` and ``--duration``),
and the statistics benchmark tools print (mean, median, p90, p95, p99, min, max, standard
deviation, throughput), as text and, with ``--json FILE``, as JSON for machines.

Percentiles are numpy's linear interpolation between the closest ranks; throughput is the
number of timed runs divided by their summed wall time (runs one after another, one at a time).
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tuner.cli.args import UsageError

#: Timed runs when neither ``--runs`` nor ``--duration`` is given.
DEFAULT_RUNS = 5
#: Percentiles reported, as (name, q).
PERCENTILES = (("p90", 90.0), ("p95", 95.0), ("p99", 99.0))


def timed_runs(fn: Callable[[], Any], *, runs: int | None, duration_s: float | None,
               warmup: int, clock: Callable[[], float] = time.perf_counter,
               ) -> tuple[list[float], Any]:
    """Call ``fn`` ``warmup`` times untimed, then time it: ``runs`` times, or until
    ``duration_s`` seconds of timed runs have passed (at least one run), or, given both,
    until both are reached. Returns the wall times in seconds and the last result."""
    if runs is None and duration_s is None:
        runs = DEFAULT_RUNS
    result = None
    for _ in range(warmup):
        result = fn()
    times: list[float] = []
    start = clock()
    while True:
        t = clock()
        result = fn()
        times.append(clock() - t)
        enough_runs = runs is None or len(times) >= runs
        enough_time = duration_s is None or clock() - start >= duration_s
        if enough_runs and enough_time:
            return times, result


def stats(times_s: list[float], batch: int | None = None) -> dict[str, Any]:
    """Statistics of timed runs (milliseconds): runs, total, mean, median, p90, p95, p99, min,
    max, standard deviation, throughput (runs per second; ``samples_per_s`` with a batch
    size)."""
    if not times_s:
        raise ValueError("no timed runs")
    ms = np.asarray(times_s, dtype=np.float64) * 1e3
    total_s = float(np.sum(ms)) / 1e3
    out: dict[str, Any] = {
        "runs": len(times_s), "total_s": total_s, "mean_ms": float(np.mean(ms)),
        "median_ms": float(np.median(ms)),
    }
    for name, q in PERCENTILES:
        out[f"{name}_ms"] = float(np.percentile(ms, q))
    out.update({"min_ms": float(np.min(ms)), "max_ms": float(np.max(ms)),
                "std_ms": float(np.std(ms)),
                "throughput_per_s": len(times_s) / total_s if total_s > 0 else None})
    if batch:
        out["batch"] = batch
        out["samples_per_s"] = (len(times_s) * batch / total_s) if total_s > 0 else None
    return out


def stats_text(s: Mapping[str, Any], warmup: int) -> str:
    """The statistics as a few lines of text."""
    lines = [f"timed {s['runs']} run(s) in {s['total_s']:.3f} s after {warmup} warm-up run(s)",
             f"  latency ms: mean {s['mean_ms']:.3f}, median {s['median_ms']:.3f}, "
             f"p90 {s['p90_ms']:.3f}, p95 {s['p95_ms']:.3f}, p99 {s['p99_ms']:.3f}",
             f"              min {s['min_ms']:.3f}, max {s['max_ms']:.3f}, "
             f"std {s['std_ms']:.3f}"]
    tp = s.get("throughput_per_s")
    line = f"  throughput: {tp:.2f} run(s)/s" if tp is not None else "  throughput: not known"
    if s.get("samples_per_s") is not None:
        line += f", {s['samples_per_s']:.2f} sample(s)/s (batch {s['batch']})"
    lines.append(line + " (one run at a time)")
    if s["runs"] < 20:
        lines.append(f"  note: p95/p99 of {s['runs']} run(s) are interpolated; give --runs 100 or "
                     f"--duration 10 for tail latencies that mean something")
    return "\n".join(lines)


def write_json(path: str, data: Mapping[str, Any]) -> None:
    """Write the benchmark's results as JSON (``-`` for stdout); :class:`UsageError` when the
    file cannot be written."""
    text = json.dumps(data, indent=2, allow_nan=False, default=str) + "\n"
    if path == "-":
        print(text, end="")
        return
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write the results to {path!r}: {exc.strerror or exc}") from None


def results(model: str, sess: Any, s: Mapping[str, Any], times_s: list[float], *, warmup: int,
            runs: int | None, duration_s: float | None, load_ms: float,
            feeds: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Everything ``--json`` writes: the model, the plan that ran, the settings, the
    statistics and every timed run."""
    plan = getattr(sess, "plan", None)
    backends = sorted({st.backend for st in plan.steps}) if plan is not None else []
    return {
        "model": model,
        "plan_source": getattr(sess, "plan_source", None),
        "objective": getattr(sess, "objective", None),
        "backends": backends,
        "inputs": {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in feeds.items()},
        "settings": {"warmup": warmup, "runs": runs, "duration_s": duration_s},
        "load_ms": load_ms,
        "stats": dict(s),
        "times_ms": [t * 1e3 for t in times_s],
        "machine": {"system": platform.system(), "machine": platform.machine(),
                    "python": platform.python_version()},
    }


def batch_of(feeds: Mapping[str, np.ndarray]) -> int | None:
    """The batch size: the first dimension shared by every input of rank 2 or more."""
    firsts = {v.shape[0] for v in feeds.values() if v.ndim >= 2}
    return firsts.pop() if len(firsts) == 1 else None
