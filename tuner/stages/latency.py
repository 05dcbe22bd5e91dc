"""The latency stage, which every tuning run starts with: candidates measured, the optimum and
its alternatives found, whole plans validated end to end one request at a time, and, once a
winner is chosen, the evidence of that choice (see :mod:`tuner.tune` for the steps and their
shares of the budget). Its objective is the per-request one: latency (with an optional memory
cap) or memory; a throughput objective's plans are validated for latency here first.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from dispatch import blas
from dispatch.errors import OpDispatchError
from dispatch.executor import reference_plan
from dispatch.heuristic import heuristic_plan
from dispatch.objective import Objective
from dispatch.plan import Plan, Rejected
from dispatch.reference_fallback import FALLBACK_BACKEND, onnxruntime_referenced
from dispatch.registry import REFERENCE_BACKEND
from tuner import busy
from tuner.candidates import Candidate, enumerate_candidates
from tuner.measure import Measurement
from tuner.optimize import Solution, evaluate, optimize
from tuner.plan_candidate import PlanCandidate
from tuner.stages.base import TuneContext, TuningStage
from tuner.stages.plans import (
    CONVERT_SHARE,
    MEASURE_SHARE,
    OPTIMIZE_SHARE,
    alternative_problems,
    build_problem,
    chosen_ids,
    plan_from,
    validation_order,
)
from tuner.tune_measure import _conversion_costs, _measure_all
from tuner.tune_types import NOISY_SPREAD, TuneOptions
from tuner.tuning_inputs import captured_values, checked_inputs, reference_outputs
from tuner.validate import BUDGET_SKIP, UNTUNED, _validate


def request_options(opts: TuneOptions, objective: Objective, budget_s: float) -> TuneOptions:
    """The options the latency stage runs with: the per-request objective (memory for a memory
    objective, else latency: the plans of every other objective are validated for latency
    first), no concurrency, and ``budget_s``, the stage's share of the budget."""
    name = "memory" if objective.name == "memory" else "latency"
    return dataclasses.replace(opts, objective=name, concurrency=None, max_latency_ms=None,
                               budget_s=budget_s)


class LatencyTuning(TuningStage):
    """Measure, optimise and validate one request at a time; then record why the winner won."""

    name = "latency"

    def __init__(self) -> None:
        self.figures: dict[str, Any] = {}
        self.kept = ""
        self.noisy: list[str] = []

    def run(self, ctx: TuneContext) -> None:
        """Candidates measured, the optimum and alternatives found, the plans validated
        (:attr:`TuneContext.plans`); the reference run kept for the later stages."""
        graph, registry, backends, opts, say = ctx.graph, ctx.registry, ctx.backends, ctx.opts, ctx.say
        untuned = heuristic_plan(graph, registry, backends)
        # the untuned plan and each backend's own untuned plan (the backend first, numpy for what
        # it cannot run) compete in validation; their candidates are measured first, whatever the
        # budget, so that a complete annotated plan exists for each
        baselines = [(UNTUNED, untuned)]
        for b in backends:
            try:
                plan = heuristic_plan(graph, registry,
                                      [b] if b == REFERENCE_BACKEND else [b, REFERENCE_BACKEND])
            except OpDispatchError:
                continue
            baselines.append(("numpy only" if b == "numpy" else f"{b} first", plan))
        first = {f"{s.impl}@{'+'.join(s.nodes)}" for _, plan in baselines for s in plan.steps}
        cands = enumerate_candidates(graph, registry, backends)
        say(f"{len(cands.candidates)} candidates, {len(cands.signatures())} distinct signatures")
        # the budget is a limit: each step ends at its share of the stage's, validation at the deadline
        start = ctx.deadline - opts.budget_s
        stage_s = ctx.stage_s
        t_stage = time.monotonic()
        tuning_inputs = checked_inputs(graph, opts)
        captured = captured_values(graph, registry, tuning_inputs[0], opts, say)
        ms = _measure_all(registry, cands, first, ctx.store, ctx.hw, ctx.sw, opts,
                          start + MEASURE_SHARE * opts.budget_s, captured)
        stage_s["measure_s"] = time.monotonic() - t_stage
        usable = [(c, ms.by_signature[c.signature]) for c in cands.candidates
                  if c.signature in ms.by_signature and ms.by_signature[c.signature].ok]
        wrong = sum(1 for m in ms.by_signature.values() if not m.ok)
        t_stage = time.monotonic()
        estimated: list[str] = []
        conv_costs, conv_measured = _conversion_costs(
            registry, graph, [c for c, _ in usable], ctx.store, ctx.hw, ctx.sw, opts,
            start + CONVERT_SHARE * opts.budget_s, estimated)
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

        problem = build_problem(graph, usable, conv_costs, opts.objective)
        t0 = time.monotonic()
        opt_end = start + OPTIMIZE_SHARE * opts.budget_s

        def time_limit() -> float:
            return max(0.2, min(opts.optimize_time_limit_s, opt_end - time.monotonic()))

        key = ctx.key
        provenance = {
            "source": "tuned", "objective": key.objective, "plan_key": key.digest(),
            "hardware": key.hardware, "software": key.software, "tuning_run": ctx.run_id,
            "tuned_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        if ctx.model_file:  # the file the user gave, for `opdispatch plans list`
            provenance["model_file"] = ctx.model_file
        if ctx.threading is not None:  # the thread settings it was measured under and will run with
            provenance["threading"] = ctx.threading
        referenced = onnxruntime_referenced(graph, registry) if FALLBACK_BACKEND in backends else []
        if referenced:  # no numpy reference: onnxruntime's result is theirs (never independent)
            provenance["reference_from_onnxruntime"] = referenced
        plans: list[PlanCandidate] = []
        skipped_alternatives = 0
        try:
            best: Solution | None = optimize(problem, time_limit_s=time_limit())
        except OpDispatchError as exc:  # candidates left unmeasured by the budget: no optimum
            best = None
            say(f"no optimised plan: {exc}")
        if best is not None:
            provenance["optimizer"] = {"method": best.method, "optimal": best.optimal,
                                       "predicted_s": best.total}
            plans.append(PlanCandidate("optimum", plan_from(
                graph, registry, chosen_ids(best), by_id, alternatives, rejected, dict(provenance)),
                best.total))
            for k, alt_problem in enumerate(alternative_problems(problem, best, max(0, opts.top_k - 1))):
                if time.monotonic() > opt_end:
                    skipped_alternatives += 1
                    continue
                try:
                    alt = optimize(alt_problem, time_limit_s=time_limit())
                except OpDispatchError:
                    continue
                alt_provenance = dict(provenance, optimizer={
                    "method": alt.method, "optimal": alt.optimal, "predicted_s": alt.total})
                plans.append(PlanCandidate(f"alternative {k + 1}", plan_from(
                    graph, registry, chosen_ids(alt), by_id, alternatives, rejected, alt_provenance),
                    alt.total))
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
                plan = plan_from(graph, registry, ids, by_id, alternatives, rejected, tuned_provenance)
                try:  # the same cost model as the optimiser's: its steps and conversions measured
                    predicted = evaluate(problem, ids)[0]
                except OpDispatchError:
                    predicted = None
            else:  # some of its candidates were not measured (budget) or failed: as it is
                plan = Plan(graph=plan.graph, steps=plan.steps, conversions=plan.conversions,
                            provenance=tuned_provenance)
            plans.append(PlanCandidate(label, plan, predicted, baseline=True))
        plans = validation_order(plans)

        # onnxruntime's result where numpy has no reference, when onnxruntime is allowed
        ctx.reference_plan = reference_plan(graph, registry, fallback=FALLBACK_BACKEND in backends)
        feeds, reference, more = reference_outputs(graph, registry, ctx.reference_plan, tuning_inputs, opts)
        ctx.feeds, ctx.reference = feeds, reference
        t_stage = time.monotonic()
        _validate(graph, registry, plans, feeds, reference, opts.validate_runs, ctx.deadline,
                  grace_s=0.05 * opts.budget_s, say=say, more=more)
        stage_s["validate_s"] = time.monotonic() - t_stage
        ctx.plans = plans
        self.figures = {
            "candidates": len(cands.candidates), "signatures": len(cands.signatures()),
            "measured": ms.measured, "reused": ms.reused, "wrong": wrong,
            "skipped_budget": len(ms.skipped), "conversions_measured": conv_measured,
            "conversions_estimated": len(estimated),
        }
        self.optimizer = {
            "optimizer_method": best.method if best else None,
            "optimizer_optimal": bool(best.optimal) if best else False, "optimizer_s": opt_s,
        }
        self.skipped_alternatives = skipped_alternatives

    def refine(self, ctx: TuneContext, winner: PlanCandidate) -> PlanCandidate:
        """The evidence of the choice in the winner's provenance: every validated plan's
        figures and the winner's label (and why a single-backend plan was kept)."""
        plans = ctx.plans
        valid = [pc for pc in plans if pc.error is None]
        fastest = min(valid, key=lambda pc: pc.latency_ms or 0.0)
        chosen_alone = ctx.opts.objective == "latency" and ctx.choose is None
        self.kept = "" if fastest is winner or not chosen_alone else (
            f"{fastest.label} measured {fastest.latency_ms:.3f} ms, within the measured spread of "
            f"{winner.label}'s {winner.latency_ms:.3f} ms: the single-backend plan is kept")
        self.noisy = [pc.label for pc in valid
                      if pc.latency_ms and (pc.spread_ms or 0) > NOISY_SPREAD * pc.latency_ms]
        winner.plan.provenance = dict(winner.plan.provenance, validated=[
            {"label": pc.label, "latency_ms": pc.latency_ms, "spread_ms": pc.spread_ms,
             "peak_bytes": pc.peak_bytes, "error": pc.error,
             "predicted_ms": None if pc.predicted_s is None else pc.predicted_s * 1e3}
            for pc in plans
        ], winner=winner.label, **({"memory": winner.memory} if winner.memory else {}))
        return winner

    def summary(self, ctx: TuneContext, winner: PlanCandidate) -> dict[str, Any]:
        """The run's figures: candidates, measurements, each stage's seconds, the optimiser,
        the budget and what it left out, the winner's note, timing noise, the machine's load,
        the NaN/Inf check and the thread settings."""
        stats = {
            **self.figures, **{k: round(v, 2) for k, v in ctx.stage_s.items()}, **self.optimizer,
            "budget_s": ctx.budget.total_s, "skipped_alternatives": self.skipped_alternatives,
            "winner_note": self.kept, "noisy_plans": self.noisy,
            "others_cpu_share": busy.others_share(ctx.cpu_start, ctx.cpu_end or busy.snapshot()),
            "skipped_validation": [pc.label for pc in ctx.plans if pc.error == BUDGET_SKIP],
            "nonfinite": ctx.nonfinite,
        }
        if ctx.threading is not None:
            stats["threading"] = blas.describe(ctx.threading)
            stats["threading_differs"] = blas.differences(ctx.threading, ctx.threading.get("process"))
        return stats
