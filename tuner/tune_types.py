"""The tuner's public types: :class:`TuneOptions` (how to tune), :class:`PlanCandidate` (one
whole plan validated end to end), :class:`TuneResult` (what a run produced, with its terminal
summary) and :class:`TuningError`. They are re-exported by :mod:`tuner.tune`, where callers
import them from; :class:`TuningError` and :class:`PlanCandidate` live in the leaf modules
:mod:`tuner.errors` and :mod:`tuner.plan_candidate` (the accuracy and throughput packages and
validation import them from there, so that no part of the tuner imports this module to name a
type).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dispatch.plan import Plan
from tuner.busy import BUSY_SHARE
from tuner.errors import TuningError
from tuner.fingerprint import PlanKey
from tuner.plan_candidate import PlanCandidate

__all__ = ["NOISY_SPREAD", "PlanCandidate", "TuneOptions", "TuneResult", "TuningError"]

#: a validated plan whose spread (IQR) exceeds this share of its median was timed on a busy
#: or unsteady machine (said in the summary)
NOISY_SPREAD = 0.15


@dataclass
class TuneOptions:
    """How to tune. ``budget_s`` is a limit on the whole run, import included (see
    :mod:`tuner.tune`: each stage ends at its share of it; past it, only the first and the
    untuned plan are still validated, in a few rounds, so that a plan is stored)."""

    budget_s: float = 120.0
    objective: str = "latency"
    memory_cap_bytes: int | None = None
    #: the throughput objective's requests in flight (``None``: one per usable core) and its
    #: optional p99 latency bound in milliseconds (:mod:`tuner.throughput`)
    concurrency: int | None = None
    max_latency_ms: float | None = None
    top_k: int = 3
    backends: Sequence[str] | None = None
    validate_runs: int = 10
    per_candidate_cap_s: float = 0.5
    ci_target: float = 0.05
    seed: int = 0
    progress: bool = True
    optimize_time_limit_s: float = 10.0
    #: let candidates and plans differ from the reference on NaN/Inf inputs (skips the checks
    #: of :mod:`tuner.nonfinite`); the plan key's objective then ends in ``+nonstrict-nan``
    allow_nonstrict_nan: bool = False
    #: a winner that differs from the reference on NaN/Inf inputs is kept, guarded: requests
    #: holding NaN or Inf run a plan that agrees (:func:`tuner.nonfinite.nonfinite_winner`);
    #: ``False``: such candidates and plans are rejected instead (the strict check alone)
    nonfinite_guard: bool = True
    #: representative inputs (input name -> array, each set of the shapes being tuned): the
    #: first is what plans are checked and timed on and what candidates over dynamic values
    #: run on; every plan must match the reference on each (an If's branch and a NonZero's
    #: output length follow the data). Empty: seeded random inputs
    inputs: Sequence[Mapping[str, np.ndarray]] = ()
    #: an accuracy objective, ``METRIC:BUDGET`` (``cosine:0.999``, ``max-rel:1e-2``,
    #: ``top1:0.01``, or a name of the user's with :attr:`accuracy_fn`): regions may compute in
    #: reduced precision (int8, bf16) where the metric on :attr:`accuracy_data` stays within the
    #: budget (:mod:`tuner.accuracy`). Without data, reduced precision is never chosen
    accuracy: str | None = None
    #: the user's samples: an .npz file (arrays named like the inputs, first axis = samples), a
    #: folder of them, or an iterable of feeds
    accuracy_data: Any = None
    #: a metric of the user's: ``error(float32 outputs per sample, outputs per sample) -> float``
    accuracy_fn: Any = None


@dataclass
class TuneResult:
    """What a tuning run produced."""

    plan: Plan
    key: PlanKey
    #: the stored plan's id; ``None`` when the store could not be written (:attr:`store_error`)
    plan_id: int | None
    latency_ms: float
    peak_bytes: int
    validated: list[PlanCandidate]
    stats: dict[str, Any] = field(default_factory=dict)
    #: why the plan (or some measurements) could not be written to the store, else ``None``
    store_error: str | None = None

    def summary(self) -> str:
        """A few lines for the terminal."""
        s = self.stats
        stored = (f"stored (id {self.plan_id})" if self.plan_id is not None
                  else f"NOT stored ({self.store_error})")
        lines = [
            f"plan {self.key.digest()[:16]} {stored}; objective {self.key.objective}",
            f"measured {s['measured']} new candidate signature(s), reused {s['reused']}, "
            f"rejected {s['wrong']} wrong/failing, skipped {s['skipped_budget']} over budget; "
            f"{s['conversions_measured']} converter cost(s) measured, "
            f"{s.get('conversions_estimated', 0)} estimated",
            f"stages: measure {s.get('measure_s', 0):.1f} s, converters {s.get('conversions_s', 0):.1f} s, "
            f"validate {s.get('validate_s', 0):.1f} s",
            f"optimiser: {s['optimizer_method'] or 'no plan (candidates not measured)'} "
            f"({'optimal' if s['optimizer_optimal'] else 'not proven optimal'}) in {s['optimizer_s']:.2f} s",
        ]
        skipped = [f"{n} alternative plan(s) not optimised" for n in [s.get("skipped_alternatives", 0)] if n]
        skipped += ([f"not validated: {', '.join(s['skipped_validation'])}"]
                    if s.get("skipped_validation") else [])
        if skipped:
            lines.append(f"over budget ({s.get('budget_s', '?')} s): " + "; ".join(skipped))
        share = s.get("others_cpu_share")
        if share is not None and share >= BUSY_SHARE:
            lines.append(f"the machine was busy while tuning (other processes took {share:.0%} of its "
                         "CPU time): the measurements, and so the plan, may not hold on a quiet "
                         "machine; re-tune when it is quiet")
        if s.get("threading"):
            lines.append(f"threads: measured, validated and run with {s['threading']}")
        if s.get("threading_differs"):
            lines.append("this process's own BLAS/OpenMP settings differ from those the plan was "
                         "tuned and runs with: " + "; ".join(s["threading_differs"]))
        if s.get("noisy_plans"):
            lines.append(f"unsteady timings (spread above {NOISY_SPREAD:.0%} of the median): "
                         f"{', '.join(s['noisy_plans'])}")
        referenced = (self.plan.provenance or {}).get("reference_from_onnxruntime") if self.plan else None
        if referenced:
            lines.append(f"reference: onnxruntime's own result for {len(referenced)} node(s) no numpy "
                         f"reference implements ({', '.join(referenced[:5])}"
                         f"{', ...' if len(referenced) > 5 else ''}): checked against it, other backends "
                         "are validated; onnxruntime itself is not independently validated there")
        if s.get("nonfinite"):
            lines.append(f"NaN/Inf: {s['nonfinite']}")
        if s.get("accuracy"):
            from tuner.accuracy.summary import accuracy_lines

            lines += accuracy_lines(s["accuracy"])
        if s.get("throughput"):
            from tuner.throughput.table import throughput_lines

            lines.append("plans validated one request at a time, then measured under load:")
            lines += throughput_lines(s["throughput"])
        from tuner.validation_table import validation_lines

        winner = next((pc for pc in self.validated if pc.plan is self.plan), None)
        if winner is not None:
            lines += validation_lines(self.validated, winner, self.key.objective,
                                      s.get("winner_note") or "")
        used = ", ".join(f"{b}: {n}" for b, n in self.plan.backends_used().items())
        lines.append(f"winner runs {used}; {len(self.plan.conversions)} conversion(s); "
                     f"tuning took {s['tuning_s']:.1f} s")
        return "\n".join(lines)
