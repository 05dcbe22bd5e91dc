"""The warm-up tuner: candidates -> measurements -> conversion-aware optimisation ->
end-to-end validation of the best plans -> plan store.

1. Candidates (:mod:`tuner.candidates`): every supporting (implementation, layouts) of every
   allowed backend for every node, and every fused pattern match.
2. Measurements (:mod:`tuner.tune_measure`, timed by :mod:`tuner.measure`): one per distinct
   signature, reused from the store's measurements table when this machine and software
   measured it before (across models and runs); each new one is checked against the numpy
   reference and committed at once, so an interrupted run keeps it. The candidates of the
   untuned and single-backend plans are measured first. Converter chains are measured per
   (shape, dtype, source layout, target layout).
3. Optimisation (:mod:`tuner.optimize`): node costs plus converter costs, each conversion paid
   once per (tensor, target layout); exact DP or MILP, greedy fallback.
4. Validation (:mod:`tuner.validate`): the optimum and up to ``top_k - 1`` alternatives (each
   re-optimised without the optimum's least certain decision) plus the untuned plan run end to
   end; outputs must match the all-numpy plan; the objective picks the winner among the valid
   ones.
5. Store (:mod:`tuner.store`): the winner under its plan key, with the provenance needed by
   reports (measurements, rejections, alternatives).

The budget (``TuneOptions.budget_s``) is a limit on the whole run, import and folding
included, split once between the stages (:class:`tuner.stages.base.StageBudget`). Within the
latency stage's share, measurement stops at :data:`~tuner.stages.plans.MEASURE_SHARE` of it,
converter measurement at :data:`~tuner.stages.plans.CONVERT_SHARE`, optimisation at
:data:`~tuner.stages.plans.OPTIMIZE_SHARE`; validation takes the rest, most promising plan
first, and skips the plans it has no time left to build (the untuned plan
and the first plan are always validated, so something is stored: one build and a few runs of
them are all a spent budget can add). The summary (``TuneResult.stats``) says what was
skipped.

Objectives (:class:`dispatch.objective.Objective`): ``latency`` (default); ``memory`` (node
cost = bytes of the tensors a candidate produces in its layouts, the validated plan with the
lowest executor peak wins); ``latency`` with ``memory_cap_bytes`` (the fastest validated plan
whose peak fits). Steps 1-4 are the latency stage (:mod:`tuner.stages.latency`); the further
parts of an objective are further stages, each with its share of the budget (:mod:`tuner.stages`;
:func:`tuner.stages.sequence.stages_for` builds the list). This module names no stage but the
first: the objective's own parts stay with their stages.

This module runs the stages in order (:func:`tune`, :func:`_tune`) and stores the winner; the
options and result types live in :mod:`tuner.tune_types` and are re-exported here.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dispatch import blas
from dispatch.backend import load_registry
from dispatch.config import Config
from dispatch.errors import ArgumentError
from dispatch.objective import Objective
from dispatch.onnx_import import ModelLike
from dispatch.plan_policy import plan_backends, unavailable_backends
from dispatch.registry import Registry
from tuner import busy
from tuner.fingerprint import hardware_digest, plan_key, software_digest, usable_cores
from tuner.model_graph import load_graph
from tuner.stages.base import StageBudget, TuneContext, TuningStage
from tuner.stages.latency import request_options
from tuner.stages.sequence import stages_for
from tuner.store import PlanStore
from tuner.store.guarded import GuardedStore
from tuner.tune_types import NOISY_SPREAD, PlanCandidate, TuneOptions, TuneResult, TuningError

__all__ = ["NOISY_SPREAD", "PlanCandidate", "TuneOptions", "TuneResult", "TuningError", "load_graph",
           "objective_key", "objective_of", "plan_key", "tune"]


def objective_of(opts: TuneOptions) -> Objective:
    """The objective ``opts`` tune for, resolved (:meth:`dispatch.objective.Objective.resolved`)
    and checked; the parts that need the model (a data digest) are added by the stages once it
    is loaded (:meth:`tuner.stages.base.TuningStage.prepare`)."""
    try:
        return Objective(opts.objective, memory_cap=opts.memory_cap_bytes, concurrency=opts.concurrency,
                         p99_ms=opts.max_latency_ms, nonstrict_nan=opts.allow_nonstrict_nan).resolved()
    except ArgumentError as exc:
        raise TuningError(str(exc)) from None


def objective_key(opts: TuneOptions) -> str:
    """The objective as it appears in plan keys, e.g. ``latency``, ``latency@cap=1000000`` or
    ``memory+nonstrict-nan``, before the stages add what needs the model (:func:`objective_of`)."""
    return str(objective_of(opts))


def tune(
    model: ModelLike,
    *,
    store: PlanStore | str | os.PathLike | None = None,
    options: TuneOptions | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    registry: Registry | None = None,
    config: Config | None = None,
    log: Callable[[str], None] | None = None,
) -> TuneResult:
    """Tune ``model`` on this machine and store the winning plan (see the module docstring)."""
    t_start = time.monotonic()
    cpu_start = busy.snapshot()
    opts = options or TuneOptions()
    config = config or Config.load()
    objective = objective_of(opts)
    stages = stages_for(opts, objective)  # each stage's options checked before anything is imported
    budget = StageBudget.split(t_start, opts.budget_s, stages)
    step_opts = request_options(opts, objective, budget.seconds(stages[0]))
    registry = registry or load_registry(config.plugin_path or None, order=config.backend_order)
    say = log or (lambda _msg: None)
    backends = plan_backends(registry, config.backend_order, opts.backends)
    missing = unavailable_backends(registry, opts.backends or [])
    if missing:
        why = "; ".join(
            f"{b}: {registry.backends[b].reason or 'unavailable'}" if b in registry.backends
            else f"{b}: no such backend (known: {', '.join(registry.backends)})" for b in missing)
        raise TuningError(
            f"backends {missing} are not available ({why}); available: "
            f"{registry.available_backends()}"
        )
    for status in registry.backends.values():
        configure = getattr(status.backend, "configure", None)
        if status.available and configure is not None:
            configure(config)
    if not isinstance(store, PlanStore):
        store = PlanStore(store or config.store_path)
    store = GuardedStore(store)
    # everything from here on (measurements, validation, the reference run) under the thread
    # settings the plan will run with, whatever the caller's are (restored at the end)
    settings = blas.ThreadSettings.default(config.threads or usable_cores())
    outside = blas.process_state()
    with blas.in_force(settings):
        graph = load_graph(model, registry, backends, input_shapes)
        for stage in stages:
            objective = stage.prepare(graph, objective)
        key = plan_key(graph, registry, backends, str(objective))
        run_id = store.start_run(model_fp=key.model, budget_s=opts.budget_s, objective=key.objective)
        ctx = TuneContext(
            graph=graph, registry=registry, backends=backends, store=store, key=key,
            hw=hardware_digest(key.hardware), sw=software_digest(key.software), opts=step_opts,
            objective=objective, budget=budget, run_id=run_id, say=say,
            load=lambda shapes: load_graph(model, registry, backends, shapes),
            key_for=lambda other: plan_key(other, registry, backends, key.objective),
            cpu_start=cpu_start, threading=blas.record(settings, outside),
            model_file=os.path.abspath(model) if isinstance(model, str | os.PathLike) else None,
            deadline=t_start + step_opts.budget_s)
        try:
            result = _tune(ctx, stages)
        except KeyboardInterrupt:
            store.finish_run(run_id, "interrupted", {"elapsed_s": time.monotonic() - t_start})
            raise
        except Exception as exc:
            store.finish_run(run_id, "failed", {"error": f"{type(exc).__name__}: {exc}"})
            raise
    result.stats["tuning_s"] = time.monotonic() - t_start
    store.finish_run(run_id, "finished", result.stats)
    result.store_error = store.error
    return result


def _tune(ctx: TuneContext, stages: Sequence[TuningStage]) -> TuneResult:
    """Run ``stages`` (the latency stage first) and store the winner: the phases of
    :mod:`tuner.stages.base`."""
    for stage in stages:  # the plans validated, then what each later stage measures
        stage.run(ctx)
    win, ctx.nonfinite = ctx.winner([*ctx.plans, *ctx.contenders], ctx.choose)
    for stage in stages:  # what each stage adds to the winner
        win = stage.refine(ctx, win)
    _region_profiles(ctx, win)
    ctx.cpu_end = busy.snapshot()
    for stage in reversed(stages):  # the winner as stored: set up to serve, then checked as served
        win = stage.serve(ctx, win)
    stats: dict[str, Any] = {}
    for stage in stages:
        stats.update(stage.summary(ctx, win))
    plan_id = ctx.store.put_plan(ctx.key, win.plan.to_json(), latency_ms=win.latency_ms,
                                 peak_bytes=win.peak_bytes, run_id=ctx.run_id,
                                 notes={"winner": win.label, "stats": stats})
    for stage in stages:
        stage.stored(ctx, win, plan_id)
    return TuneResult(win.plan, ctx.key, plan_id, float(win.latency_ms), int(win.peak_bytes), ctx.plans,
                      stats)


def _region_profiles(ctx: TuneContext, win: PlanCandidate) -> None:
    """Per-node times inside the winner's library regions, for its reports (issue 18), while the
    budget allows (validation's deadline, plus the grace validation has); reports profile them
    otherwise."""
    if time.monotonic() >= ctx.deadline + 0.05 * ctx.opts.budget_s:
        return
    try:
        from tuner.report.library import plan_region_profiles

        profiles = plan_region_profiles(ctx.graph, win.plan, ctx.registry)
    except Exception:  # a profile is extra: the plan is stored without it
        profiles = {}
    if profiles:
        win.plan.provenance["region_profiles"] = profiles
