"""What the accuracy stage recorded, as the tuner stores and shows it: the summary's figures
(:func:`accuracy_summary`) and lines (:func:`accuracy_lines`: what was chosen, in which
precisions, its accuracy on the held-out samples and its speed against float32), and the check
that refuses to store a plan over its budget (:func:`held_out_within`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dispatch.plan import Plan
from tuner.errors import TuningError


def held_out_within(plan: Plan) -> None:
    """Raise :class:`TuningError` unless ``plan`` computes in float32 alone or its accuracy
    on the held-out samples (its provenance) is within its budget: what the tuner checks
    before it stores a plan."""
    if set(plan.precisions()) <= {"float32"}:
        return
    held = (plan.provenance.get("accuracy") or {}).get("held_out") or {}
    if held.get("within") is not True:
        raise TuningError(f"refusing to store a reduced-precision plan whose accuracy on the held-out "
                          f"samples is not within its budget ({held or 'not measured'})")
    served = (plan.provenance.get("accuracy") or {}).get("held_out_served")
    if plan.serving is not None and (served is None or served.get("within") is not True):
        raise TuningError(f"refusing to store a reduced-precision plan whose accuracy on the held-out "
                          f"samples, run with its serving configuration, is not within its budget "
                          f"({served or 'not measured'})")


def accuracy_summary(plan: Plan) -> dict[str, Any]:
    """What the tuning summary says of the accuracy stage (from the plan's provenance)."""
    acc = plan.provenance.get("accuracy") or {}
    return {k: acc.get(k) for k in ("metric", "budget", "data", "held_out", "winner", "precisions",
                                     "speed", "timed", "candidates", "notes", "seconds")}


def _figure(metric: str, value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.5f}" if metric == "cosine" else f"{value:.4g}"


def accuracy_lines(acc: Mapping[str, Any]) -> list[str]:
    """Lines for the terminal summary (``TuneResult.stats["accuracy"]``)."""
    if acc.get("note"):
        return [f"accuracy: {acc['note']}"]
    if not acc.get("metric"):
        return ["accuracy: not recorded with this plan"]
    metric, budget = acc.get("metric"), acc.get("budget")
    data = acc.get("data") or {}
    held = acc.get("held_out") or {}
    bound = ">=" if metric == "cosine" else "<="
    lines = [f"accuracy objective {metric} {bound} {budget:g} on {data.get('source')} "
             f"({data.get('calibration')} samples searched on, {data.get('held_out')} held out; "
             f"data {data.get('digest')})"]
    prec = ", ".join(f"{p}: {n} node(s)" for p, n in (acc.get("precisions") or {}).items())
    lines.append(f"  winner: {acc.get('winner')} ({prec}); "
                 f"held-out {metric} {_figure(metric, held.get('figure'))}"
                 + (" per output: "
                    + ", ".join(f"{k} {_figure(metric, v)}" for k, v in held["per_output"].items())
                    if held.get("per_output") else ""))
    speed = acc.get("speed") or {}
    if speed.get("vs_float32_plan"):
        text = f"  latency {speed['vs_float32_plan']:.2f}x the float32 plan's (timed side by side)"
        if speed.get("vs_best_float32_library"):
            text += (f", {speed['vs_best_float32_library']:.2f}x the best float32 library's "
                     f"({speed['best_float32_library']})")
        lines.append(text)
    for c in acc.get("candidates") or []:
        timed = next((t for t in acc.get("timed") or [] if t["label"] == c["label"]), None)
        ms = f"{timed['latency_ms']:.3f} ms" if timed and timed.get("latency_ms") else "not timed"
        state = "within budget" if c["within"] else c.get("rejected") or "over budget"
        lines.append(f"  {c['label']}: {metric} {_figure(metric, c['figure'])} on the {c['on']} samples "
                     f"({state}), {ms}")
    lines += [f"  {n}" for n in (acc.get("notes") or [])]
    return lines
