"""Measuring whole-model ways at the sample shapes of a range.

At each sample shape every way runs the same inputs once (the *first run* at that shape, timed
after a pause that lets the previous way's threads settle: what a shape new to the process
costs) and its outputs are checked against the reference way's
(onnxruntime's when it is one of the ways: the library users compare against); a way whose
outputs differ, or which raises, is rejected at that shape with the reason. Then the ways are
timed in rounds, one block of each per round (untimed runs first, so that the previous way's
leftover threads have died down, then timed runs back to back, as production runs one way),
until the sample's share of the budget is spent; each way's figure is its median.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from dispatch.model_ways import WayRunner
from tuner.shapes.buckets import Sample

Feeds = dict[str, np.ndarray]
#: untimed runs before each way's timed block (at least), timed runs per block, rounds at
#: least / at most
WARM_RUNS, BLOCK_RUNS, MIN_ROUNDS, MAX_ROUNDS = 1, 3, 1, 40
#: how long each way runs untimed before its timed block, in every round (seconds; at least
#: :data:`WARM_RUNS` runs), as the fixed-shape validation does (tuner.validate.SETTLE_S): the
#: previous way's library must have stopped disturbing this one. One untimed run was not
#: enough: MiniLM (the real-weight optimized file) at 18 / 49 tokens, onnxruntime and OpenVINO
#: interleaved in one process by blocks of 1 + 3 runs measured 2.71 / 4.44 ms and 5.44 / 7.54
#: ms, each alone 2.00 / 2.14 and 4.65 / 4.31 (the order at 49 reversed); after 0.1 s of
#: untimed runs 2.03 / 2.16 and 5.02 / 4.77 (Intel Xeon, Sapphire Rapids class, 2 cores).
#: A small budget (a sample's share under 4 x 0.1 s per way) settles for a quarter of its share.
WARM_S = 0.1
#: the pause before each way's first run at a shape: another library's pool threads spinning
#: after its run (onnxruntime's do) would otherwise be counted in that first run (measured on
#: PP-OCRv4's recogniser: OpenVINO's first run at a new width 33 ms right after onnxruntime,
#: 12 ms alone)
SETTLE_S = 0.05
#: how far a way's outputs may be from the reference's: |a - b| <= ATOL + RTOL * |b|
RTOL, ATOL = 1e-3, 1e-4


def disagreement(got: Sequence[np.ndarray], want: Sequence[np.ndarray],
                 names: Sequence[str], tol: tuple[float, float] = (RTOL, ATOL)) -> str | None:
    """Why outputs ``got`` differ from ``want`` (shape, dtype or values), else ``None``;
    ``tol``: (rtol, atol relative to max(1, max |want|)), default :data:`RTOL`, :data:`ATOL`
    (a model's own: :func:`dispatch.compare.model_tolerance`)."""
    rtol, atol = tol
    for name, a, b in zip(names, got, want):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return f"output {name!r} has shape {list(a.shape)}, the reference {list(b.shape)}"
        if a.dtype.kind in "fc" or b.dtype.kind in "fc":
            scale = float(np.max(np.abs(b))) if b.size else 0.0
            err = np.abs(a.astype(np.float64) - b.astype(np.float64))
            bad = err > atol * max(1.0, scale) + rtol * np.abs(b)
            if np.any(bad | (np.isnan(a) != np.isnan(b))):
                return (f"output {name!r} differs from the reference by up to "
                        f"{float(np.nanmax(err)) if err.size else 0.0:.3g} (scale {scale:.3g})")
        elif not np.array_equal(a, b):
            return f"output {name!r} differs from the reference"
    return None


def measure_sample(point: tuple[int, ...], size: int, feeds: Feeds,
                   runners: Mapping[str, WayRunner], reference: str, names: Sequence[str],
                   seconds: float, clock: Callable[[], float] = time.perf_counter,
                   approximate: Sequence[str] = (), concurrency: int = 1,
                   tol: tuple[float, float] = (RTOL, ATOL)) -> Sample:
    """Every way of ``runners`` at one sample shape within about ``seconds``; ``reference``
    names the way whose outputs the others must match, except the ``approximate`` ones
    (reduced precision: judged on the user's requests against a budget instead,
    :mod:`tuner.shapes.accuracy`), within ``tol`` (:func:`disagreement`). With
    ``concurrency`` above 1 (a throughput objective), each way's figure is the time per
    request it sustains with that many in flight (:func:`_under_load`)."""
    sample = Sample(point, size)
    end = clock() + seconds  # the first runs' pauses and runs count in the sample's share
    outputs: dict[str, Sequence[np.ndarray]] = {}
    for way, run in runners.items():
        time.sleep(SETTLE_S)  # the previous way's pool threads stop spinning first
        t0 = clock()
        try:
            outputs[way] = run(feeds)
        except Exception as exc:  # a way that cannot run a shape is rejected there, not fatal
            sample.rejected[way] = f"{type(exc).__name__}: {exc}"
            continue
        sample.first_ms[way] = (clock() - t0) * 1e3
    want = outputs.get(reference)
    for way, got in outputs.items():
        why = (None if want is None or way == reference or way in approximate
               else disagreement(got, want, names, tol))
        if why:
            sample.rejected[way] = f"wrong outputs: {why}"
    live = [w for w in outputs if w not in sample.rejected]
    if concurrency > 1:
        return _under_load(sample, runners, live, feeds, concurrency, seconds)
    times: dict[str, list[float]] = {w: [] for w in live}
    settle = min(WARM_S, max(0.0, end - clock()) / (4 * max(1, len(live))))
    for rnd in range(MAX_ROUNDS):
        if rnd >= MIN_ROUNDS and clock() > end:
            break
        for way in live:
            run = runners[way]
            settled = clock() + settle
            for _ in range(WARM_RUNS):
                run(feeds)
            while clock() < settled:
                run(feeds)
            for _ in range(BLOCK_RUNS):
                t0 = clock()
                run(feeds)
                times[way].append((clock() - t0) * 1e3)
    for way, ts in times.items():
        sample.ms[way] = statistics.median(ts)
    return sample


def _under_load(sample: Sample, runners: Mapping[str, WayRunner], live: Sequence[str],
                feeds: Feeds, concurrency: int, seconds: float) -> Sample:
    """Each way of ``live`` run from ``concurrency`` threads at once, one after the other, for
    its share of ``seconds`` (:func:`tuner.throughput.load.run_load`); its figure is ``1000 /
    throughput``: milliseconds per request at that load, so that the cut compares ways as it
    does latencies."""
    from tuner.throughput.load import run_load

    share = max(0.05, seconds / max(1, len(live)))
    for way in live:
        run = runners[way]
        time.sleep(SETTLE_S)
        try:
            got = run_load(lambda _k, run=run: run(feeds), concurrency, share,
                           warmup_s=min(0.1, share / 2))
        except Exception as exc:  # a way that fails under load is rejected here
            sample.rejected[way] = f"under load: {type(exc).__name__}: {exc}"
            continue
        if got.errors or not got.throughput:
            sample.rejected[way] = f"under load: {got.error or 'no request completed'}"
            continue
        sample.ms[way] = 1e3 / got.throughput
        # under load the figure is a rate: a first run's excess over it is no cost per shape
        sample.first_ms[way] = sample.ms[way]
    return sample
