"""The accuracy stage's lines in the tuning summary and reports: what was chosen, in which
precisions, its accuracy on the held-out samples and its speed against float32."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


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
             f"({data.get('calibration')} samples searched on, {data.get('held_out')} held out; data {data.get('digest')})"]
    prec = ", ".join(f"{p}: {n} node(s)" for p, n in (acc.get("precisions") or {}).items())
    lines.append(f"  winner: {acc.get('winner')} ({prec}); held-out {metric} {_figure(metric, held.get('figure'))}"
                 + (" per output: " + ", ".join(f"{k} {_figure(metric, v)}" for k, v in held["per_output"].items())
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
        state = "within budget" if c["within"] else "over budget"
        lines.append(f"  {c['label']}: {metric} {_figure(metric, c['figure'])} on the {c['on']} samples "
                     f"({state}), {ms}")
    lines += [f"  {n}" for n in (acc.get("notes") or [])]
    return lines
