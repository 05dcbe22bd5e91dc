"""The tuner's validation stage: every candidate plan run end to end against the reference
(all-numpy) outputs, the valid ones timed interleaved until their medians separate or the time
cap is spent (:func:`_validate`), and the winner chosen among them by the objective and the
memory cap (:func:`_winner`: a plan the optimiser made must beat the best single-backend plan
by more than the measured spread, :func:`clearly_faster`).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from dispatch.compare import dequantized_output_steps
from dispatch.executor import Executor
from dispatch.graph import Graph
from dispatch.registry import Registry
from tuner.errors import TuningError
from tuner.index_bounds import index_bounds
from tuner.measure import check_outputs, model_tolerance, random_input
from tuner.plan_candidate import PlanCandidate
from tuner.plan_memory import plan_memory
from tuner.tune_types import TuneOptions

#: the longest validation goes without saying what it does (through ``say``), in seconds
PROGRESS_EVERY_S = 2.0
#: how long each plan runs untimed before its timed runs, in every round (seconds; at least
#: one run): long enough for the previous plan's libraries to stop spinning (onnxruntime's
#: workers spin for up to ~50 ms after a run, OpenVINO's and OpenMP's pools for a few ms), so
#: that each plan is timed in the steady state a production process runs it in, back to back
#: with itself, not in the wake of another library's pool
SETTLE_S = 0.06
#: how long each plan's timed runs last in every round (seconds; at least one run): the
#: round's sample is their median
TIMED_S = 0.02
#: the label of the untuned plan among the validated ones
UNTUNED = "untuned (heuristic)"
#: what a plan that the budget left no time to validate says in place of an error
BUDGET_SKIP = "not validated: tuning budget spent"


def _random_feeds(graph: Graph, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    bounds = index_bounds(graph.nodes)
    return {v.name: random_input(v, rng, bounds.get(v.name)) for v in graph.inputs}


def _validate(
    graph: Graph,
    registry: Registry,
    plans: Sequence[PlanCandidate],
    feeds: Mapping[str, np.ndarray],
    reference: Sequence[np.ndarray],
    runs: int,
    deadline: float,
    grace_s: float = 0.0,
    say: Callable[[str], None] | None = None,
    more: Sequence[tuple[Mapping[str, np.ndarray], Sequence[np.ndarray]]] = (),
    checked: bool = True,
) -> None:
    """Run every plan end to end: its outputs must match the reference plan's; then time the
    valid ones interleaved, one block of each per round (:func:`_block`: untimed runs until the
    previous plan's leftovers died down, then timed runs), so that machine noise (another
    process, a frequency change) hits them alike instead of favouring whichever ran in a quiet
    moment, while each plan is timed back to back with itself, as production runs it.
    Plans are built in the given order while their predicted latency says that checking and
    timing them fits before ``deadline`` (``time.monotonic()``); the first and the untuned
    plan always are, the others get :data:`BUDGET_SKIP` as their error. At least ``runs``
    rounds (down to 3 past the deadline, and to 1 when another round would end past
    ``deadline + grace_s``), then rounds until the 95% confidence intervals of the medians
    stop overlapping or the deadline passes. ``say`` hears what is being done, at least every
    :data:`PROGRESS_EVERY_S` seconds. ``more``: further (feeds, reference outputs) every plan
    must also match, shapes included (a model whose branches or output lengths follow the
    data is checked on inputs that take different ones). ``checked=False``: the outputs are
    not compared (reduced-precision plans, whose accuracy the caller measured on the user's
    data: :mod:`tuner.accuracy`); a plan that fails to build or run is still rejected."""
    tell = say or (lambda _msg: None)
    left = max(0.0, deadline - time.monotonic())
    tell(f"validating {len(plans)} plan(s) end to end against the reference ({left:.0f} s of "
         f"the budget left)")
    ready: list[tuple[PlanCandidate, Executor]] = []
    steps = dequantized_output_steps(graph)  # a QDQ model's outputs: requantization steps
    tol = model_tolerance(graph.nodes)  # looser where the file declares int8 activations
    for k, pc in enumerate(plans):
        tell(f"  [{k + 1}/{len(plans)}] checking {pc.label}")
        # checking and warming a plan up takes two runs, timing it at least two more: a plan
        # predicted not to fit in what is left is not started
        need = 4 * pc.predicted_s if pc.predicted_s is not None else 0.0
        if k and pc.label != UNTUNED and time.monotonic() + need > deadline:
            pc.error = BUDGET_SKIP
            continue
        try:
            ex = Executor(graph, pc.plan, registry)
            outs = ex.run(feeds)
            ex.run(feeds)  # warm-up
        except Exception as exc:
            pc.error = f"failed: {type(exc).__name__}: {exc}"
            continue
        wrong = check_outputs(outs, reference, [], tol=tol, extra_atol=steps) if checked else ""
        for k_more, (extra, expected) in enumerate(more if checked else ()):
            if wrong:
                break
            try:
                got = ex.run(extra)
            except Exception as exc:
                wrong = f"on tuning input {k_more + 2}: {type(exc).__name__}: {exc}"
                break
            if [np.shape(g) for g in got] != [np.shape(e) for e in expected]:
                wrong = (f"on tuning input {k_more + 2}: output shapes "
                         f"{[np.shape(g) for g in got]}, expected {[np.shape(e) for e in expected]}")
                break
            found = check_outputs(got, expected, [], tol=tol, extra_atol=steps)
            wrong = f"on tuning input {k_more + 2}: {found}" if found else ""
        if wrong:
            pc.error = f"wrong result: {wrong}"
            continue
        memory = plan_memory(ex)  # liveness + constants + what the region libraries allocate
        pc.peak_bytes, pc.memory = memory.peak_bytes, memory.to_dict()
        ready.append((pc, ex))
    if not ready:
        return
    times: list[list[float]] = [[] for _ in ready]
    rounds = 0
    tell(f"timing {len(ready)} valid plan(s), interleaved, until their medians separate")
    last_said = time.monotonic()
    while True:
        t_round = time.monotonic()
        for k, (_, ex) in enumerate(ready):
            times[k].append(_block(ex, feeds))
        rounds += 1
        now = time.monotonic()
        if now - last_said >= PROGRESS_EVERY_S:
            best = min(range(len(ready)), key=lambda j: float(np.median(times[j])))
            tell(f"  round {rounds}: fastest so far {ready[best][0].label} "
                 f"({float(np.median(times[best])) * 1e3:.2f} ms median), "
                 f"{max(0.0, deadline - now):.0f} s of the budget left")
            last_said = now
        round_s = now - t_round
        if rounds >= 3 * max(1, runs) or (now > deadline and rounds >= 3):
            break
        if now + round_s > deadline + grace_s:
            break  # another round would overrun the budget
        if rounds >= max(1, runs) and (now > deadline or _separated(times)):
            break
    tell(f"timed {len(ready)} plan(s) in {rounds} round(s)")
    for (pc, _), t in zip(ready, times):
        q1, med, q3 = np.percentile(t, [25, 50, 75])
        pc.latency_ms, pc.spread_ms = float(med * 1e3), float((q3 - q1) * 1e3)
        pc.samples = len(t)
    ready.clear()
    gc.collect()  # free the executors now: their libraries' thread pools must not outlive them


def _block(ex: Executor, feeds: Mapping[str, np.ndarray]) -> float:
    """One round's sample of ``ex``: runs untimed for :data:`SETTLE_S` (what the previous plan
    left behind -- caches, other libraries' spinning threads -- dies down, and this plan's own
    pools reach the state back-to-back runs keep them in), then the median of its runs over
    :data:`TIMED_S`. One sample per block keeps the rounds' samples independent for the
    confidence intervals of :func:`_separated`."""
    clock = time.perf_counter
    settled = clock() + SETTLE_S
    ex.run(feeds)
    while clock() < settled:
        ex.run(feeds)
    runs: list[float] = []
    end = clock() + TIMED_S
    while True:
        t0 = clock()
        ex.run(feeds)
        t1 = clock()
        runs.append(t1 - t0)
        if t1 >= end:
            return float(np.median(runs))


def _separated(times: Sequence[Sequence[float]]) -> bool:
    """Whether the fastest plan's median is clear of every other's (95% notches, McGill et
    al.: median +- 1.57 IQR / sqrt(n)) -- more rounds would not change the winner."""
    if len(times) < 2:
        return True
    notches = []
    for t in times:
        q1, med, q3 = np.percentile(t, [25, 50, 75])
        half = 1.57 * (q3 - q1) / np.sqrt(len(t))
        notches.append((med - half, med, med + half))
    best = min(range(len(notches)), key=lambda k: notches[k][1])
    return all(notches[best][2] < n[0] for k, n in enumerate(notches) if k != best)


def _winner(validated: Sequence[PlanCandidate], opts: TuneOptions) -> PlanCandidate:
    ok = [pc for pc in validated if pc.error is None]
    if opts.memory_cap_bytes is not None:
        fits = [pc for pc in ok if pc.peak_bytes is not None and pc.peak_bytes <= opts.memory_cap_bytes]
        if not fits:
            peaks = ", ".join(f"{pc.label}: {pc.peak_bytes:,}" for pc in ok)
            raise TuningError(
                f"no validated plan fits the memory cap of {opts.memory_cap_bytes:,} bytes; peaks: {peaks}"
            )
        ok = fits
    if not ok:
        errors = "; ".join(f"{pc.label}: {pc.error}" for pc in validated)
        raise TuningError(f"no plan passed validation: {errors}")
    if opts.objective == "memory":
        return min(ok, key=lambda pc: (pc.peak_bytes, pc.latency_ms))
    fastest = min(ok, key=lambda pc: pc.latency_ms)
    baselines = [pc for pc in ok if pc.baseline]
    if fastest.baseline or not baselines:
        return fastest
    best = min(baselines, key=lambda pc: pc.latency_ms)
    return fastest if clearly_faster(fastest, best) else best


def _notch(pc: PlanCandidate) -> tuple[float, float]:
    """The 95% confidence interval of ``pc``'s median latency (McGill et al.'s notch:
    median +- 1.57 IQR / sqrt(n))."""
    half = 1.57 * (pc.spread_ms or 0.0) / np.sqrt(max(pc.samples, 1))
    return pc.latency_ms - half, pc.latency_ms + half  # type: ignore[operator]


def clearly_faster(a: PlanCandidate, b: PlanCandidate) -> bool:
    """Whether ``a``'s median latency is below ``b``'s by more than the measured spread (their
    notches do not overlap): only then is a plan of the optimiser preferred over the best
    single-backend plan, so that noise during tuning does not store a plan that only won by
    chance."""
    return _notch(a)[1] < _notch(b)[0]
