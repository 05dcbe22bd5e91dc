"""The accuracy objective's stage of tuning: reduced precision per block, within the user's
budget, on the user's data.

After the float32 stages have chosen the float32 winner, for each library with
reduced-precision variants (OpenVINO bf16, onnxruntime dynamic int8, ...):

1. its float32 plan is cut into blocks (:mod:`tuner.accuracy.blocks`) and run on the
   calibration samples; each block's time is measured in place (the executor's per-call
   timings);
2. every (block, variant) is measured *alone*: the variant is built and swapped into the
   float32 plan (:meth:`dispatch.executor.Executor.swap_kernel`), its time measured in place
   and the error it adds on the model's outputs measured on the calibration samples (its
   *sensitivity*);
3. the optimiser picks the fastest assignment whose summed errors fit the allowance (an exact
   knapsack over blocks: :func:`choose`); the assignment is run on every calibration sample
   and, while it breaks the budget, the most sensitive reduced block steps down: to its
   fastest variant that added less error alone (int8 to bf16), else back to float32;
4. the plan is built as it will be stored and checked on the held-out samples; while it
   breaks the budget there, the most sensitive reduced block steps down the same way, and the
   final plan is built and checked again. The library's whole regions in each variant (what
   whole-model quantization does) are checked the same way.

The plans within budget on the held-out samples and the float32 winner are then timed side
by side (the validation stage's interleaved timing, outputs not compared to the reference:
their accuracy is what was measured here), and the fastest wins. A plan over budget on the
held-out samples is never a candidate, so never stored. The report (the winner's provenance,
``accuracy``) keeps the evidence: the error per output on the held-out samples, every
measured (block, variant), the candidates and their figures.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from dispatch.executor import Executor
from dispatch.fusion import region_node
from dispatch.graph import Graph
from dispatch.plan import Plan, PlanStep
from dispatch.registry import Implementation, Registry
from impls.static_quant import FLOAT_KEY
from tuner.accuracy.blocks import (
    BlockPlan,
    block_plan,
    library_regions,
    merged,
    precision_of,
    whole_in,
    with_precisions,
    with_reduced_edges,
)
from tuner.accuracy.data import AccuracyData, Feeds
from tuner.accuracy.metrics import AccuracyObjective
from tuner.accuracy.trials import Trial, call_times, choose, outputs, record_inputs, variant_name
from tuner.plan_candidate import PlanCandidate
from tuner.validate import _validate

#: calibration samples each (block, variant) is measured on (the first ones)
SENSITIVITY_SAMPLES = 16
#: calibration samples a block's static int8 variant is calibrated on alone (the first ones)
CALIBRATION_SAMPLES = 16
#: calibration samples a library's whole regions in static int8 are calibrated on (the first
#: ones; what the stored plan runs with): min-max ranges from 16 samples clipped held-out
#: sentences of MiniLM (real weights) that 128 cover: one int8 MatMul alone, worst held-out
#: cosine 0.99842 calibrated on 16 (over a 0.999 budget), 0.99983 on 128
WHOLE_CALIBRATION_SAMPLES = 128
#: the share of the stage's time the block searches take (the rest: checks and timing)
SEARCH_SHARE = 0.6
#: the share of the stage's time kept for building and timing the plans found side by side
TIMING_SHARE = 0.2
#: the label of the float32 winner among the accuracy stage's candidates
FLOAT32 = "float32 plan"


def _same_steps(a: Plan, b: Plan) -> bool:
    """Whether ``a`` and ``b`` run the same implementations over the same nodes, alike."""
    def sig(p: Plan) -> list:
        return sorted((s.impl, tuple(s.nodes), repr(sorted((s.precision or {}).items()))) for s in p.steps)

    return sig(a) == sig(b)


class AccuracyStage:
    """Chooses reduced precision per block within the budget (see the module docstring)."""

    def __init__(self, graph: Graph, registry: Registry, backends: Sequence[str],
                 objective: AccuracyObjective, data: AccuracyData, deadline: float,
                 say: Callable[[str], None]) -> None:
        self.graph, self.registry, self.backends = graph, registry, list(backends)
        self.objective, self.data, self.deadline, self.say = objective, data, deadline, say
        self.trials: list[Trial] = []
        self.candidates: list[dict[str, Any]] = []
        self.notes: list[str] = []
        #: what each measured (library, block, implementation) records as its precision
        self.precisions: dict[tuple[str, int, str], dict | None] = {}
        self._calibrations: dict[tuple, Any] = {}
        #: each checked plan (by ``id``; the plan kept, so that the id stays its own) and its
        #: held-out outputs, for the report
        self.held_outputs: dict[int, tuple[Plan, list[list[np.ndarray]]]] = {}
        #: when the current library's block search stops (:meth:`run` shares the stage's time)
        self.search_deadline = deadline

    # -- measuring -----------------------------------------------------------------------
    def _error(self, reference: Sequence[Sequence[np.ndarray]],
               got: Sequence[Sequence[np.ndarray]]) -> float:
        return self.objective.error(reference, got)

    def _check(self, plan: Plan, samples: Sequence[Feeds],
               reference: Sequence[Sequence[np.ndarray]]) -> tuple[Executor, float]:
        ex = Executor(self.graph, plan, self.registry)
        got = outputs(ex, samples)
        if samples is self.data.held_out:  # kept for the report's per-output figures
            self.held_outputs[id(plan)] = (plan, got)
        return ex, self._error(reference, got)

    def _check_both(self, plan: Plan, ref_cal: list, ref_held: list) -> tuple[float, str]:
        """``plan``'s error on the calibration samples, then, when within the budget, on the
        held-out ones (one build): ``(error, which samples it was measured on)``."""
        ex = Executor(self.graph, plan, self.registry)
        cal = self.data.calibration
        got: list[list[np.ndarray]] = []
        if self.objective.worst_sample and len(cal) > SENSITIVITY_SAMPLES:
            # the first samples first: over the budget there is over it on them all (a whole
            # model in int8 often is: BERT-base's 128 samples took most of the stage's time)
            got = outputs(ex, cal[:SENSITIVITY_SAMPLES])
            err = self._error(ref_cal[:SENSITIVITY_SAMPLES], got)
            if not self.objective.within(err):
                return err, f"first {SENSITIVITY_SAMPLES} calibration"
        err = self._error(ref_cal, got + outputs(ex, cal[len(got):]))
        if not self.objective.within(err):
            return err, "calibration"
        got = outputs(ex, self.data.held_out)
        self.held_outputs[id(plan)] = (plan, got)
        return self._error(ref_held, got), "held-out"

    def _measure_blocks(self, bp: BlockPlan, ex: Executor, ref_sens: Sequence[Sequence[np.ndarray]],
                        sens: Sequence[Feeds]) -> dict[tuple[int, str], Callable]:
        """Every (block, variant) alone: time in place and added error (see the module
        docstring); returns the built variants by (block, implementation name)."""
        ms32 = call_times(ex, sens[0], bp.blocks)
        calibrated = [k for k, vs in enumerate(bp.variants) if any(i.calibrate for i in vs)]
        recorded = dict(zip(calibrated, record_inputs(ex, [bp.blocks[k] for k in calibrated],
                                                      self.data.calibration[:CALIBRATION_SAMPLES])))
        built: dict[tuple[int, str], Callable] = {}
        for k, (block, variants) in enumerate(zip(bp.blocks, bp.variants)):
            for impl in variants:
                trial = Trial(bp.library, k, len(block.nodes), impl.name, impl.precision, ms32[k])
                self.trials.append(trial)
                if time.monotonic() > self.search_deadline:
                    trial.note = "not measured: tuning budget spent"
                    continue
                node = region_node(self.graph, block.nodes)
                try:
                    precision = self._precision(impl, node, recorded.get(k, []))
                    node.attrs = {**node.attrs, "precision": precision}
                    self.precisions[(bp.library, k, impl.name)] = precision
                    fn = impl.build(node)
                except Exception as exc:
                    trial.note = f"failed to build: {type(exc).__name__}: {exc}"[:300]
                    continue
                f32 = ex.swap_kernel(block, fn)
                try:
                    trial.error = self._error(ref_sens, outputs(ex, sens))
                    trial.ms = call_times(ex, sens[0], [block])[0]
                    built[(k, impl.name)] = fn
                except Exception as exc:
                    trial.note = f"failed to run: {type(exc).__name__}: {exc}"[:300]
                finally:
                    ex.swap_kernel(block, f32)
        return built

    def _precision(self, impl: Implementation, node: Any, samples: list[tuple]) -> dict | None:
        """What a step of ``impl`` over ``node`` records: its precision, and its calibration
        on the recorded input ``samples`` for a calibrated variant (once per region and
        calibration function: onnxruntime's and OpenVINO's static int8 share theirs)."""
        precision = precision_of(impl)
        if impl.calibrate is None:
            return precision
        key = (tuple(n.name for n in node.nodes), impl.calibrate)
        if key not in self._calibrations:
            self._calibrations[key] = calibration = impl.calibrate(node, samples)
            floats = calibration.get(FLOAT_KEY) if isinstance(calibration, dict) else None
            if floats:  # (the transformers exports' attention masks: Where(mask, 0, -inf))
                shown = ", ".join(f"{t} [{lo}, {hi}]" for t, (lo, hi) in list(floats.items())[:3])
                first, last = node.nodes[0].name, node.nodes[-1].name
                self.notes.append(f"{impl.backend}: {len(floats)} tensor(s) of the region {first} ... {last} "
                                  "calibrated to a range that is not finite, left in float32: "
                                  f"{shown}{' ...' if len(floats) > 3 else ''}")
        return {**(precision or {}), "calibration": self._calibrations[key]}

    def _assignment(self, bp: BlockPlan) -> dict[int, Implementation]:
        """The fastest assignment predicted within the allowance (:func:`choose`)."""
        by_name = {i.name: i for vs in bp.variants for i in vs}
        options: list[list[tuple[float, float, Any]]] = [[] for _ in bp.blocks]
        for t in self.trials:
            if t.library == bp.library and not options[t.block]:
                options[t.block].append((t.ms_float32, 0.0, None))
        for k in range(len(bp.blocks)):
            if not options[k]:
                options[k].append((0.0, 0.0, None))
        for t in self.trials:
            if t.library == bp.library and t.ms is not None and t.error is not None and t.ms < t.ms_float32:
                options[t.block].append((t.ms, t.error, t.impl))
        tags = choose(options, self.objective.allowance)
        return {k: by_name[tag] for k, tag in enumerate(tags) if tag is not None}

    def _sensitivity(self, bp: BlockPlan, k: int, impl: Implementation) -> float:
        found = [t.error for t in self.trials
                 if t.library == bp.library and t.block == k and t.impl == impl.name and t.error is not None]
        return found[0] if found else float("inf")

    def _back_off(self, bp: BlockPlan, chosen: dict[int, Implementation], ex: Executor,
                  steps: Mapping[int, PlanStep], float32_fns: Mapping[int, Callable],
                  built: Mapping[tuple[int, str], Callable], samples: Sequence[Feeds],
                  reference: Sequence[Sequence[np.ndarray]], where: str) -> float:
        """While ``ex`` (running ``chosen``) breaks the budget on ``samples``, step the most
        sensitive reduced block down (in ``ex`` and ``chosen``): to its fastest measured variant
        that adds less error alone and still beats float32 (int8 to bf16, :meth:`_step_down`),
        else back to float32. Returns the last error."""
        err = self._error(reference, outputs(ex, samples))
        while not self.objective.within(err) and chosen:
            k = max(chosen, key=lambda j: self._sensitivity(bp, j, chosen[j]))
            down = self._step_down(bp, k, chosen[k], built)
            to = "float32" if down is None else down.precision
            self.notes.append(f"{bp.library}: block {k} ({chosen[k].precision}) back to {to}: "
                              f"{self.objective.describe(err)} on the {where} samples")
            if down is None:
                ex.swap_kernel(steps[k], float32_fns[k])
                del chosen[k]
            else:
                ex.swap_kernel(steps[k], built[(k, down.name)])
                chosen[k] = down
            err = self._error(reference, outputs(ex, samples))
        return err

    def _step_down(self, bp: BlockPlan, k: int, impl: Implementation,
                   built: Mapping[tuple[int, str], Callable]) -> Implementation | None:
        """Block ``k``'s fastest built variant that added less error alone than ``impl`` and
        ran faster than float32, else ``None`` (float32)."""
        limit = self._sensitivity(bp, k, impl)
        better = [t for t in self.trials if t.library == bp.library and t.block == k and (k, t.impl) in built
                  and t.error is not None and t.error < limit and t.ms is not None and t.ms < t.ms_float32]
        if not better:
            return None
        name = min(better, key=lambda t: t.ms or 0.0).impl
        return next(i for i in bp.variants[k] if i.name == name)

    # -- the stage ------------------------------------------------------------------------
    def _library(self, library: str, ref_cal: list, ref_held: list) -> list[tuple[str, Plan, float]]:
        """The plans of ``library`` within budget on the held-out samples: ``(label, plan,
        held-out error)``."""
        bp = block_plan(self.graph, self.registry, library)
        if bp is None or not any(bp.variants):
            self.notes.append(f"{library}: no reduced-precision variant runs this model's regions")
            return []
        cal, held = self.data.calibration, self.data.held_out
        sens = cal[:SENSITIVITY_SAMPLES]
        found: list[tuple[str, Plan, float]] = []
        self.say(f"accuracy: {library}: {len(bp.blocks)} block(s), measuring "
                 f"{sum(len(v) for v in bp.variants)} reduced variant(s) alone")
        whole_inputs: list[list[tuple]] = []
        regions = library_regions(bp)
        index = {id(r): j for j, r in enumerate(regions)}

        def precision_for(impl: Implementation, step: PlanStep) -> dict | None:
            recorded = whole_inputs[index[id(step)]] if whole_inputs else []
            return self._precision(impl, region_node(self.graph, step.nodes), recorded)

        for impl in {i.name: i for vs in bp.variants for i in vs}.values():
            if time.monotonic() > self.deadline:
                break
            label = f"{library} whole {variant_name(impl)}"
            try:
                if impl.calibrate is not None and not whole_inputs:
                    assert bp.whole is not None
                    whole_inputs[:] = record_inputs(Executor(self.graph, bp.whole, self.registry), regions,
                                                    cal[:WHOLE_CALIBRATION_SAMPLES])
                plan_w = whole_in(self.graph, self.registry, bp, impl, functools.partial(precision_for, impl))
                if plan_w is None:
                    continue
                err, where = self._check_both(plan_w, ref_cal, ref_held)
            except Exception as exc:
                self.notes.append(f"{label}: failed: {type(exc).__name__}: {exc}"[:300])
                continue
            self._candidate(label, plan_w, err, None, where)
            if self.objective.within(err):
                found.append((label, plan_w, err))
        if time.monotonic() > self.search_deadline:
            self.notes.append(f"{library}: blocks not searched: tuning budget spent")
            return found
        ex = Executor(self.graph, bp.plan, self.registry)
        built = self._measure_blocks(bp, ex, ref_cal[:len(sens)], sens)
        chosen = {k: impl for k, impl in self._assignment(bp).items() if (k, impl.name) in built}
        if chosen:
            float32_fns = {k: ex.swap_kernel(bp.blocks[k], built[(k, impl.name)])
                           for k, impl in chosen.items()}
            self._back_off(bp, chosen, ex, dict(enumerate(bp.blocks)), float32_fns, built, cal, ref_cal,
                           "calibration")
            for k in chosen:  # (the ones backed off are float32 again already)
                ex.swap_kernel(bp.blocks[k], float32_fns[k])

        def picked() -> dict[int, tuple[Implementation, dict | None]]:
            return {k: (i, self.precisions.get((library, k, i.name))) for k, i in chosen.items()}

        if chosen:
            label = f"{library} per block"
            plan = with_precisions(self.graph, self.registry, bp, picked(), label)
            ex_mixed, err = self._check(plan, held, ref_held)
            if not self.objective.within(err):
                steps = {k: s for k in chosen for s in plan.steps if s.nodes == bp.blocks[k].nodes}
                fns = {k: next(c.fn for c in ex.calls if c.step is bp.blocks[k]) for k in chosen}
                self._back_off(bp, chosen, ex_mixed, steps, fns, built, held, ref_held, "held-out")
                if chosen:
                    plan = with_precisions(self.graph, self.registry, bp, picked(), label)
                    ex_mixed, err = self._check(plan, held, ref_held)
                else:  # the float32 plan again: no candidate (its "error" was inf: cosine -inf)
                    self.notes.append(f"{label}: every reduced block back to float32 on the held-out "
                                      "samples: no per-block plan")
            del ex_mixed
            if chosen:
                self._candidate(label, plan, err, {k: i.precision for k, i in chosen.items()})
            if chosen and self.objective.within(err):
                found.append((label, plan, err))
                found += self._merged(bp, picked(), label, ref_cal, ref_held)
        for impl in {i.name: i for vs in bp.variants for i in vs if i.calibrate is not None}.values():
            if time.monotonic() > self.deadline:
                break
            got = self._whole_except(bp, impl, functools.partial(precision_for, impl), ref_cal, ref_held)
            if got is not None:
                found.append(got)
        return found

    def _whole_except(self, bp: BlockPlan, impl: Implementation,
                      precision_for: Callable[[PlanStep], dict | None],
                      ref_cal: list, ref_held: list) -> tuple[str, Plan, float] | None:
        """The library's regions whole in ``impl`` (a static int8 variant) with the blocks too
        sensitive for it left in float (``precision["exclude"]``): the blocks in int8 are the
        least sensitive ones whose errors alone sum within the allowance; then, while the
        region breaks the budget on the calibration and then the held-out samples, the most
        sensitive of them is excluded too. One region, so no boundary between blocks."""
        errors = {t.block: t.error for t in self.trials
                  if t.library == bp.library and t.impl == impl.name and t.error is not None}
        if not errors:
            return None
        included: list[int] = []
        total = 0.0
        for k in sorted(errors, key=errors.__getitem__):
            if total + errors[k] <= self.objective.allowance:
                included.append(k)
                total += errors[k]
        if not included or len(included) == len(bp.blocks):
            return None  # none fits, or all do (the whole region in int8 was checked already)
        label = f"{bp.library} whole {variant_name(impl)} except sensitive blocks"
        while included and time.monotonic() < self.deadline:
            excluded = [n for k, b in enumerate(bp.blocks) if k not in included for n in b.nodes]

            def with_exclusions(step: PlanStep, _excluded: list[str] = excluded) -> dict | None:
                inside = set(step.nodes)
                return {**(precision_for(step) or {}), "exclude": [n for n in _excluded if n in inside]}

            plan = whole_in(self.graph, self.registry, bp, impl, with_exclusions)
            if plan is None:
                return None
            try:
                err, where = self._check_both(plan, ref_cal, ref_held)
            except Exception as exc:
                self.notes.append(f"{label}: failed: {type(exc).__name__}: {exc}"[:300])
                return None
            if self.objective.within(err):
                break
            worst = max(included, key=errors.__getitem__)
            self.notes.append(f"{label}: block {worst} excluded too: {self.objective.describe(err)} on the "
                              f"{where} samples")
            included.remove(worst)
        else:
            return None
        self._candidate(label, plan, err, {k: impl.precision for k in included})
        return (label, plan, err) if included and self.objective.within(err) else None

    def _merged(self, bp: BlockPlan, chosen: dict[int, tuple[Implementation, dict | None]], label: str,
                ref_cal: list, ref_held: list) -> list[tuple[str, Plan, float]]:
        """The per-block plan with its like neighbours run as one region (:func:`merged`),
        checked like any plan: ``[(label, plan, error)]`` within budget, else ``[]``."""
        if time.monotonic() > self.deadline:
            return []
        try:
            plan = merged(self.graph, self.registry, bp, chosen, label)
            if plan is None:
                return []
            label = str(plan.provenance["label"])
            err, where = self._check_both(plan, ref_cal, ref_held)
        except Exception as exc:
            self.notes.append(f"{label}, like neighbours merged: failed: {type(exc).__name__}: {exc}"[:300])
            return []
        self._candidate(label, plan, err, {k: i.precision for k, (i, _p) in chosen.items()}, where)
        return [(label, plan, err)] if self.objective.within(err) else []

    def _edged(self, label: str, plan: Plan, ref_cal: list, ref_held: list) -> PlanCandidate | None:
        """``plan`` with its reduced regions passing their precision straight to each other
        (:func:`with_reduced_edges`), checked like any plan; ``None`` when it does not apply or
        breaks the budget."""
        if time.monotonic() > self.deadline:
            return None
        try:
            edged = with_reduced_edges(self.graph, self.registry, plan)
            if edged is None:
                return None
            label = f"{label}, reduced precision between regions"
            err, where = self._check_both(edged, ref_cal, ref_held)
        except Exception as exc:
            self.notes.append(f"{label}, reduced precision between regions: failed: "
                              f"{type(exc).__name__}: {exc}"[:300])
            return None
        self._candidate(label, edged, err, None, where)
        return PlanCandidate(label, edged, None) if self.objective.within(err) else None

    def _candidate(self, label: str, plan: Plan, err: float, blocks: dict | None,
                   where: str = "held-out") -> None:
        """``plan`` recorded as measured; an error that is not finite (outputs NaN or Inf where
        float32's are finite) is a rejection, noted with that reason, not a figure."""
        finite = bool(np.isfinite(err))
        if not finite:
            self.notes.append(f"{label}: rejected: {self.objective.describe(err)} on the {where} samples")
        self.candidates.append({
            "label": label, "error": err if finite else None,
            "figure": self.objective.figure(err) if finite else None, "on": where,
            "within": self.objective.within(err), "precisions": plan.precisions(),
            **({} if finite else {"rejected": self.objective.describe(err)}),
            **({"reduced_blocks": {str(k): v for k, v in blocks.items()}} if blocks is not None else {}),
        })

    def within_budget(self, winner: PlanCandidate, validated: Sequence[PlanCandidate],
                      runs: int) -> list[PlanCandidate]:
        """The float32 ``winner`` (labelled :data:`FLOAT32`) and every plan within budget on the
        held-out samples, timed side by side (``latency_ms``); each reduced plan runs requests
        holding NaN or Inf on the float32 plan (``nonfinite_fallback``). :meth:`finish` gives
        the one chosen its evidence."""
        self._t0 = time.monotonic()
        # the searches and checks end early enough to leave the plans found their timing (a
        # stage that spent it all on checks timed none, and kept the float32 plan: bench/README.md)
        final = self.deadline
        self.deadline = self._t0 + (1 - TIMING_SHARE) * max(0.0, final - self._t0)
        self._winner, self._validated = winner, list(validated)
        ex = Executor(self.graph, winner.plan, self.registry)
        ref_cal = outputs(ex, self.data.calibration)
        self._ref_held = ref_held = outputs(ex, self.data.held_out)
        del ex
        plans: list[PlanCandidate] = [PlanCandidate(FLOAT32, winner.plan, None)]
        libraries = [b for b in self.backends
                     if any(i.precision != "float32" for i in self.registry.regions([b], precisions=None))]
        for k, library in enumerate(libraries):
            now = time.monotonic()
            if now > self.deadline:
                self.notes.append(f"{library}: not searched: tuning budget spent")
                continue
            # each library's block search gets its share of SEARCH_SHARE of what is left; the
            # checks on the held-out samples and the final timing take the rest
            self.search_deadline = now + SEARCH_SHARE * (self.deadline - now) / (len(libraries) - k)
            for label, plan, _err in self._library(library, ref_cal, ref_held):
                if any(_same_steps(plan, pc.plan) for pc in plans):
                    continue  # (a merged per-block plan may be a whole one again)
                plans.append(PlanCandidate(label, plan, None))
                edged = self._edged(label, plan, ref_cal, ref_held)
                if edged is not None:
                    plans.append(edged)
        self.deadline = final
        if len(plans) > 1:
            self.say(f"accuracy: timing {len(plans)} plan(s) within budget side by side")
            _validate(self.graph, self.registry, plans, self.data.calibration[0], [], runs,
                      max(self.deadline, time.monotonic() + 2.0), checked=False, say=self.say)
        # requests holding NaN or Inf run the float32 plan (or its own guard), which agrees with
        # the reference there: the reduced variants were measured on the user's finite data
        fallback = winner.plan.nonfinite_fallback or Plan(
            graph=winner.plan.graph, steps=winner.plan.steps, conversions=winner.plan.conversions,
            provenance={"label": "the float32 plan"})
        for pc in plans[1:]:
            pc.plan.nonfinite_fallback = fallback
            pc.peak_bytes = pc.peak_bytes or winner.peak_bytes
        self._plans = plans
        return plans

    def run(self, winner: PlanCandidate, validated: Sequence[PlanCandidate], runs: int) -> PlanCandidate:
        """The fastest plan within budget on the held-out samples, or ``winner`` (the float32
        plan) when none is faster; its provenance's ``accuracy`` holds the evidence."""
        plans = self.within_budget(winner, validated, runs)
        timed = [pc for pc in plans if pc.error is None and pc.latency_ms is not None]
        return self.finish(min(timed, key=lambda pc: pc.latency_ms or 0.0) if timed else plans[0])

    def finish(self, chosen: PlanCandidate) -> PlanCandidate:
        """``chosen`` (one of :meth:`within_budget`'s plans, or another float32 plan: a
        throughput objective chooses under load) with the stage's evidence in its provenance
        (``accuracy``); the float32 winner itself when that was chosen."""
        winner, plans = self._winner, self._plans
        base = plans[0]
        err_by_label = {c["label"]: c["error"] for c in self.candidates if c["within"]}
        reduced = chosen in plans[1:]
        chosen_err = err_by_label.get(chosen.label, 0.0) if reduced else 0.0
        report = self._report(chosen, base, self._validated, plans, self._ref_held, chosen_err,
                              time.monotonic() - self._t0)
        if chosen is base:
            chosen = winner
        chosen.plan.provenance = dict((winner if reduced else chosen).plan.provenance, accuracy=report,
                                      **({"winner": chosen.label} if reduced else {}))
        return chosen

    def served_check_s(self, plans: Sequence[PlanCandidate]) -> float:
        """What :meth:`check_served` of the slowest of ``plans`` will take, about: a build and
        a run of each held-out sample at its measured latency, with a margin."""
        ms = max((pc.latency_ms or 0.0 for pc in plans), default=0.0)
        return 1.5 * ms / 1e3 * len(self.data.held_out) + 2.0 if plans else 0.0

    def check_served(self, plan: Plan) -> dict[str, Any]:
        """``plan`` built as a server builds it (its serving configuration: streams, library
        settings) and run on the held-out samples: its error there, and whether it is within
        the budget (what a throughput objective checks of its winner)."""
        from dispatch.stream_pool import build_runner

        runner = build_runner(self.graph, plan, self.registry)
        got = [[np.array(o, copy=True) for o in runner.run(feeds)] for feeds in self.data.held_out]
        err = self._error(self._ref_held, got)
        return {"error": err, "figure": self.objective.figure(err), "within": self.objective.within(err)}

    def _report(self, chosen: PlanCandidate, base: PlanCandidate, validated: Sequence[PlanCandidate],
                plans: Sequence[PlanCandidate], ref_held: list, err: float, seconds: float) -> dict[str, Any]:
        names = [v.name for v in self.graph.outputs]
        per_output: dict[str, float] = {}
        if id(chosen.plan) in self.held_outputs:
            got = self.held_outputs[id(chosen.plan)][1]
            for j, name in enumerate(names):
                e = self._error([[r[j]] for r in ref_held], [[g[j]] for g in got])
                per_output[name] = self.objective.figure(e)
            err = self._error(ref_held, got)
        subgraph = {i.backend for i in self.registry.regions(self.backends)}  # onnxruntime, OpenVINO
        libraries = [pc for pc in validated if pc.baseline and pc.latency_ms and pc.error is None
                     and pc.label.removesuffix(" first") in subgraph]
        best_lib = min(libraries, key=lambda pc: pc.latency_ms or 0.0) if libraries else None
        speed: dict[str, Any] = {}
        if chosen.latency_ms and base.latency_ms:
            speed["vs_float32_plan"] = chosen.latency_ms / base.latency_ms
            winner_f32 = next((pc for pc in validated if pc.plan is base.plan), None)
            if best_lib is not None and winner_f32 is not None and winner_f32.latency_ms:
                # (the float32 plan timed in both rounds carries the ratio across)
                speed["vs_best_float32_library"] = (speed["vs_float32_plan"] * winner_f32.latency_ms
                                                    / best_lib.latency_ms)
                speed["best_float32_library"] = best_lib.label.removesuffix(" first")
        return {
            "metric": self.objective.metric, "budget": self.objective.budget,
            "data": {"digest": self.data.digest, "source": self.data.source,
                     "calibration": len(self.data.calibration), "held_out": len(self.data.held_out)},
            "held_out": {"error": err, "figure": self.objective.figure(err), "per_output": per_output,
                         "within": self.objective.within(err)},
            "winner": chosen.label, "precisions": chosen.plan.precisions(), "speed": speed,
            "timed": [{"label": pc.label, "latency_ms": pc.latency_ms, "spread_ms": pc.spread_ms,
                       "error": pc.error} for pc in plans],
            "candidates": self.candidates,
            "trials": [t.__dict__ for t in self.trials],
            "notes": self.notes, "seconds": round(seconds, 2),
        }
