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
included: measurement stops at :data:`MEASURE_SHARE` of it, converter measurement at
:data:`CONVERT_SHARE`, optimisation at :data:`OPTIMIZE_SHARE`; validation takes the rest,
most promising plan first, and skips the plans it has no time left to build (the untuned plan
and the first plan are always validated, so something is stored: one build and a few runs of
them are all a spent budget can add). The summary (``TuneResult.stats``) says what was
skipped.

Objectives: ``latency`` (default); ``memory`` (node cost = bytes of the tensors a candidate
produces in its layouts, the validated plan with the lowest executor peak wins); ``latency``
with ``memory_cap_bytes`` (the fastest validated plan whose peak fits).

This module runs the stages in order (:func:`tune`) and holds the optimisation-stage glue
(the :class:`~tuner.optimize.Problem` built from measurements, plans built from solutions);
the options and result types live in :mod:`tuner.tune_types` and are re-exported here.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dispatch import blas
from dispatch.backend import load_registry
from dispatch.config import Config
from dispatch.errors import ArgumentError, OpDispatchError
from dispatch.graph import Graph
from dispatch.heuristic import heuristic_plan
from dispatch.onnx_import import ModelLike
from dispatch.plan import Plan, PlanStep, Rejected
from dispatch.plan_assembly import order_steps, plan_conversions
from dispatch.plan_policy import (
    OBJECTIVES,
    objective_string,
    plan_backends,
    throughput_target,
    unavailable_backends,
)
from dispatch.registry import REFERENCE_BACKEND, STANDARD, Registry
from tuner import busy
from tuner.accuracy import (
    AccuracyData,
    AccuracyObjective,
    AccuracyStage,
    accuracy_budget,
    accuracy_key,
    accuracy_stage,
    accuracy_summary,
    held_out_within,
    reduced_contenders,
    served_within,
)
from tuner.candidates import Candidate, enumerate_candidates
from tuner.fingerprint import (
    PlanKey,
    hardware_digest,
    plan_key,
    software_digest,
    usable_cores,
)
from tuner.measure import Measurement, reference_overrides
from tuner.model_graph import load_graph
from tuner.nonfinite import nonfinite_winner
from tuner.optimize import Choice, Problem, Solution, evaluate, optimize
from tuner.store import PlanStore
from tuner.store.guarded import GuardedStore
from tuner.throughput.stage import MAX_REDUCED, ThroughputStage, throughput_share
from tuner.throughput.batch import BatchedGraphs
from tuner.tune_measure import _conversion_costs, _measure_all
from tuner.tune_types import NOISY_SPREAD, PlanCandidate, TuneOptions, TuneResult, TuningError
from tuner.tuning_inputs import captured_values, checked_inputs, reference_outputs
from tuner.validate import BUDGET_SKIP, UNTUNED, _validate, _winner

# ------------------------------------------------------------------------------------------
# optimisation stage
# ------------------------------------------------------------------------------------------


#: shares of the budget (from the start of :func:`tune`) by which each stage ends
MEASURE_SHARE = 0.55
CONVERT_SHARE = 0.62
OPTIMIZE_SHARE = 0.70


def _node_cost(c: Candidate, m: Measurement, objective: str) -> float:
    if objective == "memory":
        return float(sum(v.nbytes for v in c.node.outputs if v is not None))
    return m.median_s


def _problem(
    graph: Graph,
    usable: Sequence[tuple[Candidate, Measurement]],
    conv_costs: Mapping[tuple[str, str, str], float | None],
    objective: str,
) -> Problem:
    choices = []
    for c, m in usable:
        choices.append(Choice(
            id=c.id,
            nodes=c.nodes,
            inputs=tuple((v.name, lay) for v, lay in zip(c.node.inputs, c.layouts_in) if v is not None and not v.is_const),
            outputs=tuple((v.name, lay) for v, lay in zip(c.node.outputs, c.layouts_out)),
            cost=_node_cost(c, m, objective),
            priority=c.impl.priority,
            noise=m.spread_s if objective == "latency" else 0.0,
        ))

    def conversion_cost(value: str, src: str, dst: str) -> float | None:
        if src == dst:
            return 0.0
        cost = conv_costs.get((value, src, dst))
        if cost is None:
            return None
        if objective == "memory":
            v = graph.value(value)
            return float(v.nbytes)
        return cost

    return Problem(
        nodes=[n.name for n in graph.nodes],
        choices=choices,
        graph_inputs={v.name: STANDARD for v in graph.inputs},
        graph_outputs={v.name: STANDARD for v in graph.outputs},
        conversion_cost=conversion_cost,
    )


def _plan_from(
    graph: Graph,
    registry: Registry,
    chosen_ids: Sequence[str],
    by_id: Mapping[str, tuple[Candidate, Measurement]],
    alternatives: Mapping[str, list[tuple[Candidate, Measurement]]],
    rejected: Mapping[str, list[Rejected]],
    provenance: dict[str, Any],
) -> Plan:
    steps = []
    for cid in chosen_ids:
        cand, m = by_id[cid]
        losers = []
        for node in cand.nodes:
            for other, om in alternatives.get(node, []):
                if other.id == cand.id:
                    continue
                if om.error:
                    losers.append(Rejected(other.impl.name, other.impl.backend, om.error))
                else:
                    pct = 100.0 * (om.median_s - m.median_s) / m.median_s if m.median_s > 0 else 0.0
                    losers.append(Rejected(other.impl.name, other.impl.backend,
                                           f"lost: {om.median_s * 1e3:.4f} ms ({pct:+.0f}% vs winner), covers {'+'.join(other.nodes)}"))
            losers += rejected.get(node, [])
        steps.append(PlanStep(
            nodes=list(cand.nodes), op=cand.impl.op, impl=cand.impl.name, backend=cand.impl.backend,
            layouts_in=list(cand.layouts_in), layouts_out=list(cand.layouts_out),
            why=f"tuned: measured {m.median_s * 1e3:.4f} ms (spread {m.spread_s * 1e3:.4f})",
            rejected=_dedupe(losers), cost_ms=m.median_s * 1e3,
        ))
    steps = order_steps(graph, steps)
    return Plan(graph=graph.name, steps=steps, conversions=plan_conversions(graph, registry, steps),
                provenance=provenance)


def _ids(solution: Solution) -> list[str]:
    return [c.id for c in _chosen(solution)]


def _chosen(solution: Solution) -> list[Choice]:
    chosen = solution.choices
    if isinstance(chosen, Mapping):
        seen, out = set(), []
        for c in chosen.values():
            if c.id not in seen:
                seen.add(c.id)
                out.append(c)
        return out
    return list(chosen)


def _dedupe(rejected: Sequence[Rejected]) -> list[Rejected]:
    seen, out = set(), []
    for r in rejected:
        if r.impl not in seen:
            seen.add(r.impl)
            out.append(r)
    return out


def _validation_order(plans: Sequence[PlanCandidate]) -> list[PlanCandidate]:
    """The order validation builds plans in, most promising first (when the budget runs out,
    the rest are skipped): the optimum, the untuned plan, then by predicted latency (plans
    without a prediction last)."""
    def rank(pc: PlanCandidate) -> tuple:
        return (pc.label != "optimum", pc.label != UNTUNED, pc.predicted_s is None, pc.predicted_s or 0.0)
    return sorted(plans, key=rank)


def _alternative_problems(problem: Problem, best: Solution, k: int) -> list[Problem]:
    """Up to ``k`` problems that each forbid one decision of ``best``: the ones whose
    runner-up on the same nodes is closest (the least certain decisions)."""
    margins = []
    for choice in _chosen(best):
        rivals = [c.cost for c in problem.choices if c.id != choice.id and set(c.nodes) & set(choice.nodes)]
        if rivals:
            margins.append((min(rivals) - choice.cost, choice.id))
    margins.sort()
    out = []
    for _, cid in margins[:k]:
        out.append(Problem(
            nodes=problem.nodes,
            choices=[c for c in problem.choices if c.id != cid],
            graph_inputs=problem.graph_inputs,
            graph_outputs=problem.graph_outputs,
            conversion_cost=problem.conversion_cost,
        ))
    return out


# ------------------------------------------------------------------------------------------
# the tuner
# ------------------------------------------------------------------------------------------


def objective_key(opts: TuneOptions) -> str:
    """The objective as it appears in plan keys, e.g. ``latency``, ``latency@cap=1000000`` or
    ``throughput@n=4,p99=50`` (a throughput objective without a concurrency: one request in
    flight per configured thread)."""
    if opts.objective not in OBJECTIVES:
        raise TuningError(f"unknown objective {opts.objective!r}; known: {', '.join(OBJECTIVES)}")
    concurrency = opts.concurrency
    if opts.objective == "throughput" and concurrency is None:
        concurrency = blas.configured_threads()
    try:
        return objective_string(opts.objective, opts.memory_cap_bytes, opts.allow_nonstrict_nan,
                                concurrency=concurrency, max_latency_ms=opts.max_latency_ms)
    except ArgumentError as exc:
        raise TuningError(str(exc)) from None


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
    objective = objective_key(opts)
    # a throughput objective: the latency stages validate plans one request at a time within
    # their share of the budget, then the throughput stage measures them under load
    target = throughput_target(objective)
    full_budget_s = opts.budget_s
    if target is not None:
        opts = dataclasses.replace(opts, objective="latency", concurrency=None, max_latency_ms=None,
                                   budget_s=opts.budget_s * (1 - throughput_share(target[0])))
    opts, accuracy_share = accuracy_budget(opts, objective)
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
        # (with a throughput objective the serving stage keeps its share after the accuracy stage)
        objective, accuracy = accuracy_key(opts, graph, objective, t_start + full_budget_s * (
            1 - (0.0 if target is None else throughput_share(target[0])))) if accuracy_share else (objective, None)
        key = plan_key(graph, registry, backends, objective)
        hw, sw = hardware_digest(key.hardware), software_digest(key.software)
        run_id = store.start_run(model_fp=key.model, budget_s=full_budget_s, objective=objective)
        deadline = t_start + opts.budget_s
        try:
            result = _tune(graph, registry, backends, store, key, hw, sw, opts, deadline, run_id, say,
                           cpu_start, blas.record(settings, outside),
                           model_file=(os.path.abspath(model)
                                       if isinstance(model, str | os.PathLike) else None),
                           throughput=None if target is None else (*target, t_start + full_budget_s),
                           accuracy=accuracy, batched=None if target is None else BatchedGraphs(
                               graph, lambda shapes: load_graph(model, registry, backends, shapes)))
        except KeyboardInterrupt:
            store.finish_run(run_id, "interrupted", {"elapsed_s": time.monotonic() - t_start})
            raise
        except Exception as exc:
            store.finish_run(run_id, "failed", {"error": f"{type(exc).__name__}: {exc}"})
            raise
    result.stats["tuning_s"] = time.monotonic() - t_start
    result.stats["budget_s"] = full_budget_s
    store.finish_run(run_id, "finished", result.stats)
    result.store_error = store.error
    return result


def _tune(
    graph: Graph,
    registry: Registry,
    backends: Sequence[str],
    store: GuardedStore,
    key: PlanKey,
    hw: str,
    sw: str,
    opts: TuneOptions,
    deadline: float,
    run_id: int | None,
    say: Callable[[str], None],
    cpu_start: busy.CpuSnapshot | None = None,
    threading: dict[str, Any] | None = None,
    *,
    model_file: str | None = None,
    throughput: tuple[int, float | None, float] | None = None,
    accuracy: tuple[AccuracyObjective, AccuracyData, float] | None = None,
    batched: BatchedGraphs | None = None,
) -> TuneResult:
    untuned = heuristic_plan(graph, registry, backends)
    # the untuned plan and each backend's own untuned plan (the backend first, numpy for what
    # it cannot run) compete in validation; their candidates are measured first, whatever the
    # budget, so that a complete annotated plan exists for each
    baselines = [(UNTUNED, untuned)]
    for b in backends:
        try:
            plan = heuristic_plan(graph, registry, [b] if b == REFERENCE_BACKEND else [b, REFERENCE_BACKEND])
        except OpDispatchError:
            continue
        baselines.append(("numpy only" if b == "numpy" else f"{b} first", plan))
    first = {f"{s.impl}@{'+'.join(s.nodes)}" for _, plan in baselines for s in plan.steps}
    cands = enumerate_candidates(graph, registry, backends)
    say(f"{len(cands.candidates)} candidates, {len(cands.signatures())} distinct signatures")
    # the budget is a limit: each stage ends at its share of it, validation at the deadline
    start = deadline - opts.budget_s
    stage_s: dict[str, float] = {}
    t_stage = time.monotonic()
    tuning_inputs = checked_inputs(graph, opts)
    captured = captured_values(graph, registry, tuning_inputs[0], opts, say)
    ms = _measure_all(registry, cands, first, store, hw, sw, opts,
                      start + MEASURE_SHARE * opts.budget_s, captured)
    stage_s["measure_s"] = time.monotonic() - t_stage
    usable = [(c, ms.by_signature[c.signature]) for c in cands.candidates
              if c.signature in ms.by_signature and ms.by_signature[c.signature].ok]
    wrong = sum(1 for m in ms.by_signature.values() if not m.ok)
    t_stage = time.monotonic()
    estimated: list[str] = []
    conv_costs, conv_measured = _conversion_costs(
        registry, graph, [c for c, _ in usable], store, hw, sw, opts, start + CONVERT_SHARE * opts.budget_s,
        estimated)
    stage_s["conversions_s"] = time.monotonic() - t_stage
    by_id = {c.id: (c, m) for c, m in usable}
    alternatives: dict[str, list[tuple[Candidate, Measurement]]] = {}
    for c in cands.candidates:
        m = ms.by_signature.get(c.signature)
        if m is None:
            continue
        for n in c.nodes:
            alternatives.setdefault(n, []).append((c, m))
    rejected = {n: list(r) for n, r in cands.rejected.items()}
    for sig in ms.skipped:
        for c in cands.signatures()[sig]:
            rejected.setdefault(c.nodes[0], []).append(
                Rejected(c.impl.name, c.impl.backend, "not measured: tuning budget spent"))

    problem = _problem(graph, usable, conv_costs, opts.objective)
    t0 = time.monotonic()
    opt_end = start + OPTIMIZE_SHARE * opts.budget_s

    def time_limit() -> float:
        return max(0.2, min(opts.optimize_time_limit_s, opt_end - time.monotonic()))

    provenance = {
        "source": "tuned", "objective": key.objective, "plan_key": key.digest(),
        "hardware": key.hardware, "software": key.software, "tuning_run": run_id,
        "tuned_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if model_file:  # the file the user gave, for `opdispatch plans list`
        provenance["model_file"] = model_file
    if threading is not None:  # the thread settings it was measured under and will run with
        provenance["threading"] = threading
    plans: list[PlanCandidate] = []
    skipped_alternatives = 0
    try:
        best: Solution | None = optimize(problem, time_limit_s=time_limit())
    except OpDispatchError as exc:  # candidates left unmeasured by the budget: no optimum
        best = None
        say(f"no optimised plan: {exc}")
    if best is not None:
        provenance["optimizer"] = {"method": best.method, "optimal": best.optimal, "predicted_s": best.total}
        plans.append(PlanCandidate("optimum", _plan_from(
            graph, registry, _ids(best), by_id, alternatives, rejected, dict(provenance)), best.total))
        for k, alt_problem in enumerate(_alternative_problems(problem, best, max(0, opts.top_k - 1))):
            if time.monotonic() > opt_end:
                skipped_alternatives += 1
                continue
            try:
                alt = optimize(alt_problem, time_limit_s=time_limit())
            except OpDispatchError:
                continue
            plans.append(PlanCandidate(f"alternative {k + 1}", _plan_from(
                graph, registry, _ids(alt), by_id, alternatives, rejected, dict(provenance, optimizer={
                    "method": alt.method, "optimal": alt.optimal, "predicted_s": alt.total})), alt.total))
    opt_s = time.monotonic() - t0
    # the baselines compete too, annotated with the same measurements as the others: the
    # winner is then measured against every single-backend plan, not predicted to beat it
    seen_plans: set[tuple] = set()
    for label, plan in baselines:
        ids = [f"{s.impl}@{'+'.join(s.nodes)}" for s in plan.steps]
        if tuple(ids) in seen_plans:
            continue
        seen_plans.add(tuple(ids))
        tuned_provenance = dict(provenance, optimizer=None, baseline=plan.provenance)
        predicted = None
        if all(i in by_id for i in ids):
            plan = _plan_from(graph, registry, ids, by_id, alternatives, rejected, tuned_provenance)
            try:  # the same cost model as the optimiser's: its steps and conversions measured
                predicted = evaluate(problem, ids)[0]
            except OpDispatchError:
                predicted = None
        else:  # some of its candidates were not measured (budget) or failed: as it is
            plan = Plan(graph=plan.graph, steps=plan.steps, conversions=plan.conversions,
                        provenance=tuned_provenance)
        plans.append(PlanCandidate(label, plan, predicted, baseline=True))
    plans = _validation_order(plans)

    reference_plan = heuristic_plan(graph, registry, [REFERENCE_BACKEND], overrides=reference_overrides(graph, registry))
    feeds, reference, more = reference_outputs(graph, registry, reference_plan, tuning_inputs, opts)
    t_stage = time.monotonic()
    _validate(graph, registry, plans, feeds, reference, opts.validate_runs, deadline,
              grace_s=0.05 * opts.budget_s, say=say, more=more)
    stage_s["validate_s"] = time.monotonic() - t_stage
    serving: ThroughputStage | None = None
    choose = _winner
    reduced: list[PlanCandidate] = []  # an accuracy objective's plans within budget, under load
    precision: AccuracyStage | None = None
    if throughput is not None:  # (concurrency, p99 bound, deadline): measured under load
        if accuracy is not None:  # reduced precision first, on the float32 latency winner
            t_stage = time.monotonic()
            f32 = nonfinite_winner(graph, registry, plans, reference_plan, opts, _winner)[0]
            precision, reduced = reduced_contenders(graph, registry, backends, opts, accuracy, f32, plans, say)
            stage_s["accuracy_s"] = time.monotonic() - t_stage
        t_stage = time.monotonic()
        serving = ThroughputStage(graph, registry, feeds, reference, throughput[0], throughput[1],
                                  throughput[2], say, batched=batched)
        if precision is not None:  # the winner's check on the held-out samples, as served
            serving.extra_reserve_s = precision.served_check_s(reduced[:MAX_REDUCED])
        serving.measure(plans, reduced)
        choose = serving.choose
        stage_s["throughput_s"] = time.monotonic() - t_stage
    # the winner must also agree with the reference on NaN/Inf inputs (tuner.nonfinite)
    win, nonfinite = nonfinite_winner(graph, registry, [*plans, *reduced], reference_plan, opts, choose)
    valid = [pc for pc in plans if pc.error is None]
    fastest = min(valid, key=lambda pc: pc.latency_ms or 0.0)
    kept = "" if fastest is win or opts.objective != "latency" or serving is not None else (
        f"{fastest.label} measured {fastest.latency_ms:.3f} ms, within the measured spread of "
        f"{win.label}'s {win.latency_ms:.3f} ms: the single-backend plan is kept")
    noisy = [pc.label for pc in valid if pc.latency_ms and (pc.spread_ms or 0) > NOISY_SPREAD * pc.latency_ms]
    win.plan.provenance = dict(win.plan.provenance, validated=[
        {"label": pc.label, "latency_ms": pc.latency_ms, "spread_ms": pc.spread_ms,
         "peak_bytes": pc.peak_bytes, "error": pc.error,
         "predicted_ms": None if pc.predicted_s is None else pc.predicted_s * 1e3}
        for pc in plans
    ], winner=win.label, **({"memory": win.memory} if win.memory else {}))
    t_stage = time.monotonic()  # (metric, data, deadline): reduced precision within the budget
    if precision is not None:  # chosen under load: its evidence
        win = precision.finish(win)
        accuracy_stats = accuracy_summary(win.plan)
    else:
        win, accuracy_stats = accuracy_stage(graph, registry, backends, opts, accuracy, win, plans, say)
        if accuracy is not None:
            stage_s["accuracy_s"] = time.monotonic() - t_stage
    profiles: dict[str, Any] = {}
    # per-node times inside the winner's library regions, for its reports (issue 18), while the
    # budget allows (its limit, plus the grace validation has); reports profile them otherwise
    if time.monotonic() < deadline + 0.05 * opts.budget_s:
        try:
            from tuner.report.library import plan_region_profiles

            profiles = plan_region_profiles(graph, win.plan, registry)
        except Exception:  # a profile is extra: the plan is stored without it
            profiles = {}
    if profiles:
        win.plan.provenance["region_profiles"] = profiles
    stats = {
        "candidates": len(cands.candidates), "signatures": len(cands.signatures()),
        "measured": ms.measured, "reused": ms.reused, "wrong": wrong,
        "skipped_budget": len(ms.skipped), "conversions_measured": conv_measured,
        "conversions_estimated": len(estimated), **{k: round(v, 2) for k, v in stage_s.items()},
        "optimizer_method": best.method if best else None,
        "optimizer_optimal": bool(best.optimal) if best else False, "optimizer_s": opt_s,
        "budget_s": opts.budget_s, "skipped_alternatives": skipped_alternatives,
        "winner_note": kept, "noisy_plans": noisy,
        "others_cpu_share": busy.others_share(cpu_start, busy.snapshot()),
        "skipped_validation": [pc.label for pc in plans if pc.error == BUDGET_SKIP],
        "nonfinite": nonfinite,
    }
    if threading is not None:
        stats["threading"] = blas.describe(threading)
        stats["threading_differs"] = blas.differences(threading, threading.get("process"))
    if serving is not None:  # its best configuration, validated under load
        if precision is None:
            win.plan = serving.finish(win)
        else:  # a reduced winner is checked on the held-out samples as served, too
            win = served_within(precision, win, serving.finish, lambda: nonfinite_winner(
                graph, registry, plans, reference_plan, opts, serving.choose)[0])
            accuracy_stats = accuracy_summary(win.plan)
        stats["throughput"] = serving.stats()
    if accuracy_stats is not None:
        stats["accuracy"] = accuracy_stats
    if accuracy is not None:
        held_out_within(win.plan)  # never stored over its budget
    plan_id = store.put_plan(key, win.plan.to_json(), latency_ms=win.latency_ms,
                             peak_bytes=win.peak_bytes, run_id=run_id,
                             notes={"winner": win.label, "stats": stats})
    if serving is not None and serving.batch_plan is not None:  # what its batched runs load
        batch, graph_b, plan_b = serving.batch_plan
        store.put_plan(plan_key(graph_b, registry, backends, key.objective), plan_b.to_json(),
                       latency_ms=serving.final.p50_ms if serving.final else None, run_id=run_id,
                       notes={"winner": f"{win.label}, batches of {batch}", "batch_of": plan_id})
    return TuneResult(win.plan, key, plan_id, float(win.latency_ms), int(win.peak_bytes), plans, stats)
