"""Throughput tuning: which plan, set up how, answers the most requests per second with N in
flight (the objective ``throughput@n=N[,p99=MS]``, :class:`dispatch.objective.Objective`).

The latency stages have validated whole plans one request at a time (:mod:`tuner.validate`);
this stage takes the valid ones (the fastest first, distinct plans only, as many as its share
of the budget allows) and, for each, the serving configurations that can pay on this machine
(:func:`serving_candidates`: the latency set-up called from N threads, independent streams
splitting the cores, more streams than cores, one onnxruntime session whose requests each run
on their caller's thread, OpenVINO's throughput hint with its own streams; for a model with a
symbolic batch, the fastest float32 plan's requests grouped in batches too:
:mod:`tuner.throughput.batch`). Each is built as a
production process builds it (:func:`dispatch.stream_pool.build_runner`) and measured as a
server runs it: N threads, each sending its next request when the last one returned
(:func:`tuner.throughput.load.run_load`). A configuration over the p99 bound is rejected with its figure;
the plan with the highest throughput wins (its NaN/Inf behaviour checked like any winner's:
:func:`tuner.nonfinite.nonfinite_winner`), and its best configuration is validated end to end
under the same concurrency — every thread's outputs against the reference — then measured once
more for the figure stored with the plan.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from dispatch.graph import Graph
from dispatch.plan import Plan
from dispatch.registry import Registry
from dispatch.serving import ServingConfig
from dispatch.stream_pool import build_runner
from impls.regions import usable_cores
from tuner.errors import TuningError
from tuner.measure import check_outputs, model_tolerance
from tuner.plan_candidate import PlanCandidate
from tuner.throughput.batch import (
    BatchedGraphs,
    batch_sizes,
    batched_call,
    check_batched,
    per_request,
    plan_at_batch,
    samples,
)
from tuner.throughput.load import LoadResult, run_load
from tuner.tune_types import TuneOptions
from tuner.validate import _winner

#: the share of a throughput run's budget this stage gets (the latency stages share the rest)
THROUGHPUT_SHARE = 0.4
#: the share with one request in flight: the stage has one configuration to measure (the
#: latency set-up) and the plan search needs the time (with 40%, minilm's throughput@n=1 plan
#: lost to its latency plan, 51.0 against 57.3/s: bench/README.md)
SINGLE_REQUEST_SHARE = 0.1


def throughput_share(concurrency: int) -> float:
    """The share of a throughput run's budget the serving stage gets at ``concurrency``."""
    return THROUGHPUT_SHARE if concurrency > 1 else SINGLE_REQUEST_SHARE
#: how many distinct validated plans get serving configurations measured, at most
MAX_PLANS = 3
#: a plan slower than the fastest by more than this factor one request at a time gets no
#: serving configurations (unless it is the fastest wholly on a library with pools of its own):
#: on the AVX2 machine, shufflenet's "onednn first" (2x the fastest) served 86/s against 286/s,
#: and its trials took the time the likely winners needed (bench/README.md)
MAX_SLOWDOWN = 1.5
#: how many reduced-precision plans within an accuracy budget are measured too, at most
MAX_REDUCED = 2
#: each configuration's measured window, seconds (the budget may shorten it to MIN_WINDOW_S)
WINDOW_S = 1.5
MIN_WINDOW_S = 0.4
#: a slow model's window is longer (:meth:`ThroughputStage._settle_s`), up to this
MAX_WINDOW_S = 3.0
#: requests per thread that window is sized for
SETTLE_REQUESTS = 3
#: the untimed start of each measurement: pools started, caches warm
WARMUP_S = 0.3
#: the final measurement of the winner, seconds
FINAL_WINDOW_S = 2.0
#: runs of the winner per thread in its validation under concurrency
VALIDATE_RUNS = 3
#: how many of the best configurations are measured a second time
CONFIRM = 3
#: a stream per request in flight is a candidate up to this many streams per core
MAX_STREAMS_PER_CORE = 8
#: what a configuration the budget left no time for says in place of a figure
BUDGET_SKIP = "not measured: tuning budget spent"


@dataclass
class ServingTrial:
    """One plan under one serving configuration, measured under load (or why not)."""

    plan: PlanCandidate
    config: ServingConfig
    result: LoadResult | None = None
    error: str | None = None

    def row(self) -> dict[str, Any]:
        """The trial as plain JSON values (for the plan's provenance and the summary)."""
        r = self.result
        return {"plan": self.plan.label, "config": self.config.to_dict(), "label": self.config.label(),
                "throughput": None if r is None else round(r.throughput, 2),
                "p50_ms": None if r is None else round(r.p50_ms, 3),
                "p90_ms": None if r is None else round(r.p90_ms, 3),
                "p99_ms": None if r is None else round(r.p99_ms, 3), "error": self.error}


def serving_candidates(plan: Plan, concurrency: int, cores: int) -> list[ServingConfig]:
    """The serving configurations worth measuring for ``plan`` with ``concurrency`` requests in
    flight on ``cores`` cores, the latency set-up first (one executor, the configured threads,
    called from every thread: what a latency plan does under load)."""
    n = concurrency
    out = [ServingConfig("shared", 1, 0, n, n)]
    if n == 1:
        return out
    backends = set(plan.backends_used())
    for s in range(2, min(n, cores) + 1):  # streams splitting the cores between them
        out.append(ServingConfig("streams", s, max(1, cores // s), s, n))
    if n > cores:  # more streams than cores: one request's Python time hides behind another's
        s = min(n, 2 * cores)
        out.append(ServingConfig("streams", s, 1, s, n))
        if n <= MAX_STREAMS_PER_CORE * cores:  # a stream per request: onnxruntime's "N x 1"
            out.append(ServingConfig("streams", n, 1, n, n))
    if "onnxruntime" in backends:  # one session, each request on its caller's thread
        out.append(ServingConfig("shared", 1, 1, n, n))
    if "openvino" in backends and cores >= 2:  # OpenVINO's own streams, throughput hint
        out.append(ServingConfig("shared", min(n, cores), 0, n, n))
    seen: set[ServingConfig] = set()
    return [c for c in out if not (c in seen or seen.add(c))]


def _priority(config: ServingConfig, cores: int) -> int:
    """When a configuration is measured, lowest first, so that a short budget skips the ones
    least likely to win: OpenVINO's throughput hint, streams splitting every core between
    them and a stream of one thread per request in flight up to two per core (onnxruntime's
    "N x 1": the best library set-up on six of ten models at N = 4 on the AVX2 machine,
    bench/README.md), the usual winners on a few cores; then one onnxruntime session of one
    thread per caller and the latency set-up (the baseline the report compares against);
    then the rest (partial splits, more streams than that)."""
    if config.mode == "shared":
        if config.streams > 1:
            return 0
        return 1
    if config.streams == min(config.concurrency, cores) and config.streams * config.threads == cores:
        return 0
    if config.threads == 1 and config.streams == config.concurrency <= 2 * cores:
        return 0
    return 2


def _contenders(plans: Sequence[PlanCandidate], limit: int) -> list[PlanCandidate]:
    """The valid plans worth serving, at most ``limit``, one of each set of steps: the fastest
    one request at a time, then the fastest that runs wholly on each library with pools of
    its own (onnxruntime, OpenVINO: their streams and sessions are what throughput set-ups
    change), then the others by latency, leaving out those more than :data:`MAX_SLOWDOWN`
    times slower than the fastest."""
    valid = sorted((p for p in plans if p.error is None and p.latency_ms is not None),
                   key=lambda p: p.latency_ms)
    order = valid[:1]
    for library in ("onnxruntime", "openvino"):
        order += [p for p in valid if set(p.plan.backends_used()) == {library}][:1]
    if valid:
        fastest = valid[0].latency_ms
        order += [p for p in valid if p.latency_ms <= MAX_SLOWDOWN * fastest]  # type: ignore[operator]
    seen: set[tuple] = set()
    out = []
    for pc in order:
        sig = tuple((s.impl, tuple(s.nodes)) for s in pc.plan.steps)
        if sig in seen:
            continue
        seen.add(sig)
        out.append(pc)
        if len(out) == limit:
            break
    return out


def _mean(a: LoadResult, b: LoadResult) -> LoadResult:
    """Two measurements of one configuration as one: requests and seconds added, percentiles
    weighted by each window's requests."""
    n = max(1, a.requests + b.requests)

    def avg(x: float, y: float) -> float:
        return (x * a.requests + y * b.requests) / n

    return LoadResult(a.concurrency, a.requests + b.requests, a.seconds + b.seconds,
                      (a.requests + b.requests) / (a.seconds + b.seconds), avg(a.p50_ms, b.p50_ms),
                      avg(a.p90_ms, b.p90_ms), max(a.p99_ms, b.p99_ms), avg(a.mean_ms, b.mean_ms))


def _float32(plan: Plan) -> bool:
    return set(plan.precisions()) <= {"float32"}


def _with_serving(plan: Plan, config: ServingConfig) -> Plan:
    return Plan(plan.graph, plan.steps, plan.conversions, plan.provenance, plan.version,
                plan.nonfinite_fallback, config.to_dict())


class ThroughputStage:
    """The throughput stage of one tuning run (see the module docstring)."""

    def __init__(self, graph: Graph, registry: Registry, feeds: Mapping[str, np.ndarray],
                 reference: Sequence[np.ndarray], concurrency: int, max_latency_ms: float | None,
                 deadline: float, say: Callable[[str], None] | None = None,
                 batched: BatchedGraphs | None = None) -> None:
        self.graph, self.registry = graph, registry
        #: the model at other batch sizes (a model with a symbolic batch: tuner.throughput.batch)
        self.batched = batched
        self.batch_sizes = batch_sizes(graph, concurrency) if batched is not None else []
        #: a winner run in batches: (batch, graph, plan) of its batched runs, stored beside it
        self.batch_plan: tuple[int, Graph, Plan] | None = None
        self.feeds, self.reference = dict(feeds), list(reference)
        self.concurrency, self.max_latency_ms = concurrency, max_latency_ms
        self.deadline = deadline
        self.say = say or (lambda _msg: None)
        self.cores = usable_cores()
        self.trials: list[ServingTrial] = []
        self.final: LoadResult | None = None
        self.winner: ServingTrial | None = None
        self.note = ""
        self._builds: list[float] = []
        #: seconds kept after the stage for what follows it besides the winner's validation
        #: (an accuracy objective's check of the winner on the held-out samples, as served)
        self.extra_reserve_s = 0.0

    # -- measuring ---------------------------------------------------------------------
    def measure(self, plans: Sequence[PlanCandidate], reduced: Sequence[PlanCandidate] = ()) -> None:
        """Measure every configuration of the distinct valid ``plans`` that the budget allows,
        and of the ``reduced``-precision plans an accuracy objective found within its budget
        (:meth:`tuner.accuracy.stage.AccuracyStage.within_budget`: the fastest
        :data:`MAX_REDUCED` of them, first); then, for a model with a symbolic batch, the best
        float32 plan's requests grouped in batches."""
        baselines: list[ServingTrial] = []
        for group in (_contenders(reduced, MAX_REDUCED), _contenders(plans, MAX_PLANS)):
            for j, pc in enumerate(group):
                for i, config in enumerate(serving_candidates(pc.plan, self.concurrency, self.cores)):
                    self.trials.append(ServingTrial(pc, config))
                    if i == 0 and j == 0:  # the group's fastest plan, its latency set-up
                        baselines.append(self.trials[-1])
        # measured likeliest first (every plan's), shown in plan order; the latency set-up of
        # the fastest plan of each group (reduced precision, float32) first of all (always
        # measured: the baselines the report compares to, and a float32 plan to fall back on
        # when a reduced winner breaks its budget as served)
        first = {id(t) for t in baselines}  # (by identity: a trial's fields hold whole plans)
        order = sorted(self.trials, key=lambda t: self._rank(t, first))
        batches = [b for b in self.batch_sizes if plans]
        # the baselines and the likeliest configurations first, then the best float32 plan's
        # requests grouped in batches (tuner.throughput.batch) on the configurations that fit
        # N / batch groups in flight, then the rest: a short budget leaves out the least likely
        likeliest = [t for t in order if id(t) in first or _priority(t.config, self.cores) == 0]
        taken = {id(t) for t in likeliest}
        rest = [t for t in order if id(t) not in taken]
        later = sum(len(serving_candidates(plans[0].plan, self.concurrency // b, self.cores))
                    for b in batches)
        self._run(likeliest, len(baselines), later + len(rest))
        best = max((t for t in self._valid() if _float32(t.plan.plan)),
                   key=lambda t: t.result.throughput, default=None)  # type: ignore[union-attr]
        if best is not None and batches:
            extra = [ServingTrial(best.plan, replace(c, concurrency=self.concurrency, batch=b))
                     for b in batches
                     for c in serving_candidates(best.plan.plan, self.concurrency // b, self.cores)]
            self.trials += extra
            self._run(sorted(extra, key=lambda t: _priority(t.config, self.cores)), 0, len(rest))
        self._run(rest, 0, 0)
        self._confirm()

    def _rank(self, trial: ServingTrial, first: set[int]) -> tuple[int, int, int]:
        """Where ``trial`` comes in the order of measurement: the baselines (``first``), then by
        :func:`_priority`; within a priority the plans take turns (each plan's first likely
        configuration, then each one's second...), a library's own streams (OpenVINO's
        throughput hint) first in its plan's turn: a short budget then measures every plan's
        likeliest set-up before any plan's second (BERT-base at 40 s measured two of the
        fastest plan's and none of OpenVINO's, the best library set-up there: bench/README.md)."""
        if id(trial) in first:
            return (-1, 0, 0)
        level = _priority(trial.config, self.cores)
        mine = [t for t in self.trials if t.plan is trial.plan and id(t) not in first
                and _priority(t.config, self.cores) == level]
        mine.sort(key=lambda t: 0 if t.config.mode == "shared" and t.config.streams > 1 else 1)
        plans = list(dict.fromkeys(id(t.plan) for t in self.trials))
        return (level, next(k for k, t in enumerate(mine) if t is trial), plans.index(id(trial.plan)))

    def _run(self, order: Sequence[ServingTrial], always: int, later: int) -> None:
        """Measure the trials of ``order`` in that order while the budget allows (the first
        ``always`` of them whatever it allows), sharing the time as if ``later`` more trials
        were to follow."""
        for k, trial in enumerate(order):
            left = self.deadline - self._reserve() - time.monotonic()
            # how many trials the time left still holds at the shortest window, the confirmation
            # round kept: the likeliest run first and the least likely are the ones left out
            # (sharing the time among every trial left instead skipped the likeliest ones while
            # many were left, and measured the least likely at the end: bench/README.md)
            fit = int(left // (MIN_WINDOW_S + WARMUP_S + self._build_s)) - CONFIRM
            if fit < 1 and k >= always:
                trial.error = BUDGET_SKIP
                continue
            # the trials that will run and the confirmation round share what is left, less their builds
            per = (left / (min(len(order) - k + later, max(1, fit)) + CONFIRM)
                   - WARMUP_S - self._build_s)
            window = min(WINDOW_S, max(MIN_WINDOW_S, per))
            # long enough for each thread to count a few requests (load.closed_loop_rate), as
            # far as the time left allows
            window = max(window, min(self._settle_s(trial), left - WARMUP_S - self._build_s))
            self.say(f"throughput: {trial.plan.label}, {trial.config.label()} ({window:.1f} s)")
            try:
                trial.result = self._load(trial.plan.plan, trial.config, window)
            except Exception as exc:  # a configuration that fails to build or run loses
                trial.error = f"{type(exc).__name__}: {exc}"
                continue
            finally:
                gc.collect()  # this configuration's sessions and pools go before the next one's
            if trial.result.errors:
                trial.error = f"{trial.result.errors} request(s) failed: {trial.result.error}"
            elif self.max_latency_ms is not None and trial.result.p99_ms > self.max_latency_ms:
                trial.error = (f"p99 {trial.result.p99_ms:.2f} ms over the bound of "
                               f"{self.max_latency_ms:g} ms")

    def _settle_s(self, trial: ServingTrial) -> float:
        """A window in which each of the N threads completes about :data:`SETTLE_REQUESTS`
        requests even if the plan ran them one at a time (N times its latency each), at most
        :data:`MAX_WINDOW_S`: BERT-base's 110 ms at N = 4 wants 1.3 s, a MobileNetV2's 4 ms
        no more than :data:`MIN_WINDOW_S`."""
        latency_s = (trial.plan.latency_ms or 0.0) / 1e3
        return min(MAX_WINDOW_S, SETTLE_REQUESTS * self.concurrency * latency_s)

    @property
    def _build_s(self) -> float:
        """What the next build may take: the median of those so far (0.3 s before any), so
        that one slow build (OpenVINO compiling a model per stream) does not crowd out the
        cheaper trials after it."""
        return float(np.median(self._builds)) if self._builds else 0.3

    def _reserve(self) -> float:
        """The time kept for the winner's validation and final measurement."""
        return FINAL_WINDOW_S + WARMUP_S + 0.5 + self._build_s + self.extra_reserve_s

    def _confirm(self) -> None:
        """Measure the best few configurations once more, in the opposite order, and keep
        the mean of both windows: one short window on a machine with neighbours can crown a
        configuration by chance."""
        top = sorted(self._valid(), key=lambda t: -t.result.throughput)[:CONFIRM]  # type: ignore[union-attr]
        if len(top) < 2:
            return
        for k, trial in enumerate(reversed(top)):
            first = trial.result
            assert first is not None
            left = self.deadline - self._reserve() - time.monotonic()
            window = min(first.seconds, left / (len(top) - k) - WARMUP_S - self._build_s)
            if window < MIN_WINDOW_S:
                return
            try:
                again = self._load(trial.plan.plan, trial.config, window)
            except Exception:  # measured once already: that figure stands
                continue
            finally:
                gc.collect()
            if again.errors or (self.max_latency_ms is not None
                                and again.p99_ms > self.max_latency_ms):
                trial.error = (f"confirmation: {again.errors} request(s) failed" if again.errors
                               else f"confirmation: p99 {again.p99_ms:.2f} ms over the bound of "
                                    f"{self.max_latency_ms:g} ms")
                continue
            trial.result = _mean(first, again)

    def _load(self, plan: Plan, config: ServingConfig, window: float) -> LoadResult:
        t0 = time.monotonic()
        call, threads = self._caller(plan, config)
        call()  # built and run once before the clock (first-run allocations)
        self._builds.append(time.monotonic() - t0)
        result = run_load(lambda _k: call(), threads, window, warmup_s=WARMUP_S)
        return per_request(result, config.batch, self.concurrency) if config.batch else result

    def _caller(self, plan: Plan, config: ServingConfig) -> tuple[Callable[[], Any], int]:
        """One request of ``plan`` served with ``config`` (built here), and how many threads
        keep the concurrency: a batch size groups that many distinct samples into each call
        (:mod:`tuner.throughput.batch`), run on the plan at that batch size."""
        if not config.batch:
            runner = build_runner(self.graph, _with_serving(plan, config), self.registry)
            feeds = self.feeds
            return (lambda: runner.run(feeds)), self.concurrency
        assert self.batched is not None
        graph = self.batched.at(config.batch)
        batch_runner = build_runner(
            graph, _with_serving(plan_at_batch(plan, graph, self.registry), config), self.registry)
        group = samples(self.feeds, config.batch)
        return (lambda: batched_call(batch_runner.run, group)), self.concurrency // config.batch

    def _valid(self) -> list[ServingTrial]:
        return [t for t in self.trials if t.error is None and t.result is not None]

    def best_for(self, pc: PlanCandidate) -> ServingTrial | None:
        """``pc``'s configuration with the highest throughput, else ``None``."""
        mine = [t for t in self._valid() if t.plan is pc]
        return max(mine, key=lambda t: t.result.throughput) if mine else None  # type: ignore[union-attr]

    def choose(self, plans: Sequence[PlanCandidate], opts: TuneOptions | None = None) -> PlanCandidate:
        """The plan among ``plans`` whose best configuration has the highest throughput (with one
        request in flight: the one the latency objective would choose, :meth:`_by_latency`) —
        the ``choose`` of :func:`tuner.nonfinite.nonfinite_winner`; raises TuningError when none
        has a valid configuration, naming the best p99 found when a bound ruled them out."""
        best = [(t, pc) for pc in plans if pc.error is None
                for t in [self.best_for(pc)] if t is not None]
        single = self._by_latency([pc for _t, pc in best], opts)
        if single is not None:
            return single
        if best:
            return max(best, key=lambda tp: tp[0].result.throughput)[1]  # type: ignore[union-attr]
        measured = [t for t in self.trials if t.result is not None and not t.result.errors]
        if self.max_latency_ms is not None and measured:
            low = min(measured, key=lambda t: t.result.p99_ms)  # type: ignore[union-attr]
            raise TuningError(
                f"no plan meets the p99 bound of {self.max_latency_ms:g} ms at concurrency "
                f"{self.concurrency}: the best p99 found is "
                f"{low.result.p99_ms:.2f} ms "  # type: ignore[union-attr]
                f"({low.plan.label}, {low.config.label()}); raise the bound or lower the "
                f"concurrency")
        errors = "; ".join(f"{t.plan.label}, {t.config.label()}: {t.error}" for t in self.trials)
        raise TuningError(f"no serving configuration could be measured at concurrency "
                          f"{self.concurrency}: {errors or 'no validated plan'}")

    def _by_latency(self, ok: Sequence[PlanCandidate], opts: TuneOptions | None) -> PlanCandidate | None:
        """With one request in flight, the plan the latency objective would choose among ``ok``
        (the plans with a configuration within the bound), else ``None``. Throughput is then one
        over the latency, and the validation stage timed the plans interleaved, which separates
        them more sharply than load windows of a second each: chosen on those windows, the
        ``throughput@n=1`` plans of inception_v1 and efficientnet_b0 ran at 0.92x and 0.90x
        their latency plans (bench/README.md, the full run). Reduced-precision plans were
        timed in another round (the accuracy stage's): then the windows decide."""
        if (self.concurrency != 1 or not ok or opts is None
                or any(pc.latency_ms is None or not _float32(pc.plan) for pc in ok)):
            return None
        return _winner(ok, opts)

    # -- the winner --------------------------------------------------------------------
    def finish(self, win: PlanCandidate) -> Plan:
        """Give ``win`` (the plan :meth:`choose` picked, maybe guarded since) its best
        configuration, validate it under the same concurrency, measure it once more, and
        return the plan to store."""
        trial = self.best_for(win)
        if trial is None:
            raise TuningError(f"{win.label} has no measured serving configuration")
        self.winner = trial
        plan = _with_serving(win.plan, trial.config)
        try:
            self.final = self._validate_under_load(plan, f"{win.label} with {trial.config.label()}")
        finally:
            gc.collect()
        if trial.config.batch:
            assert self.batched is not None
            graph = self.batched.at(trial.config.batch)
            self.batch_plan = (trial.config.batch, graph, plan_at_batch(plan, graph, self.registry))
        latency_setup = next((t for t in self.trials if t.plan is win and t.config.mode == "shared"
                              and t.config.streams == 1 and t.config.threads == 0
                              and not t.config.batch and t.result), None)
        self.note = self._why(win, trial, latency_setup)
        plan.provenance = dict(plan.provenance, throughput={
            "concurrency": self.concurrency, "max_latency_ms": self.max_latency_ms,
            "winner": trial.row(), "final": self.final.to_dict(), "why": self.note,
            "trials": [t.row() for t in self.trials]})
        return plan

    def _validate_under_load(self, plan: Plan, what: str) -> LoadResult:
        config = plan.serving_config()
        assert config is not None
        call, threads = self._caller(plan, config)

        tol = model_tolerance(self.graph.nodes)

        def agrees(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> str | None:
            return check_outputs(got, want, [], tol=tol)

        if config.batch:  # each request of a batch against the batch-1 plan run on it alone
            alone = build_runner(self.graph, _with_serving(plan, ServingConfig()), self.registry)
            want = [[np.array(o, copy=True) for o in alone.run(f)]
                    for f in samples(self.feeds, config.batch)]
            wrong = self._check_concurrent(call, threads, lambda got: check_batched(got, want, agrees))
        else:
            # a reduced-precision plan's accuracy was measured on the user's samples: here its
            # concurrent runs must give what one run alone gives
            reference = self.reference if _float32(plan) else [np.array(o, copy=True) for o in call()]
            wrong = self._check_concurrent(call, threads, lambda got: agrees(got, reference))
        if wrong:
            raise TuningError(f"{what} gave wrong outputs under {self.concurrency} concurrent "
                              f"requests: {wrong}")
        result = run_load(lambda _k: call(), threads, FINAL_WINDOW_S, warmup_s=WARMUP_S)
        return per_request(result, config.batch, self.concurrency) if config.batch else result

    def _check_concurrent(self, call: Callable[[], Any], threads: int,
                          check: Callable[[Any], str | None]) -> str | None:
        """``check`` of every result of ``VALIDATE_RUNS`` calls from each of ``threads``
        threads at once, or what the first wrong one said."""
        problems: list[str] = []
        lock = threading.Lock()
        start = threading.Barrier(threads)

        def worker() -> None:
            start.wait()
            for _ in range(VALIDATE_RUNS):
                try:
                    wrong = check(call())
                except Exception as exc:
                    wrong = f"{type(exc).__name__}: {exc}"
                if wrong:
                    with lock:
                        problems.append(wrong)
                    return

        workers = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        return problems[0] if problems else None

    def _why(self, win: PlanCandidate, trial: ServingTrial, latency_setup: ServingTrial | None) -> str:
        r = trial.result
        assert r is not None
        others = [t for t in self._valid() if t is not trial]
        if self.concurrency == 1 and win.latency_ms is not None and _float32(win.plan):
            text = (f"{win.label} with {trial.config.label()}: one request in flight, so chosen on "
                    f"its validated latency, {win.latency_ms:.3f} ms (timed interleaved with the "
                    f"other plans); under load {r.throughput:.1f}/s")
        else:
            text = (f"{win.label} with {trial.config.label()}: highest throughput measured, "
                    f"{r.throughput:.1f}/s")
        if others:
            runner = max(others, key=lambda t: t.result.throughput)  # type: ignore[union-attr]
            text += (f"; the next, {runner.plan.label} with {runner.config.label()}, "
                     f"{runner.result.throughput:.1f}/s")  # type: ignore[union-attr]
        float32 = [t for t in others if _float32(t.plan.plan)]
        if not _float32(win.plan) and float32:
            best = max(float32, key=lambda t: t.result.throughput)  # type: ignore[union-attr]
            text += (f"; the best float32 plan, {best.plan.label} with {best.config.label()}, "
                     f"{best.result.throughput:.1f}/s "  # type: ignore[union-attr]
                     f"({r.throughput / best.result.throughput:.2f}x)")  # type: ignore[union-attr]
        if latency_setup is not None and latency_setup is not trial:
            text += (f"; the latency set-up of the same plan from {self.concurrency} threads: "
                     f"{latency_setup.result.throughput:.1f}/s "  # type: ignore[union-attr]
                     f"({r.throughput / latency_setup.result.throughput:.2f}x)")  # type: ignore[union-attr]
        return text

    # -- reporting ---------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """The stage's figures for the tuning summary (``stats["throughput"]``)."""
        return {"concurrency": self.concurrency, "max_latency_ms": self.max_latency_ms,
                "trials": [t.row() for t in self.trials],
                "winner": None if self.winner is None else self.winner.row(),
                "final": None if self.final is None else self.final.to_dict(), "why": self.note}


