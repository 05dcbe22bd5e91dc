"""The throughput stage's part of the tuning summary (:mod:`tuner.throughput`): every serving
configuration measured under load, the winner's figures under load and why it won."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def throughput_lines(stats: Mapping[str, Any]) -> list[str]:
    """The throughput stage's part of the tuning summary: every configuration measured (plan,
    configuration, throughput, p50/p99 or why not), the winner's final figures and why it won."""
    from tabulate import tabulate

    rows = []
    win = stats.get("winner") or {}
    for t in stats.get("trials", []):
        mark = "*" if t["plan"] == win.get("plan") and t["config"] == win.get("config") else ""
        if t["throughput"] is None or t["error"]:
            figures = ["-", "-", "-"] if t["throughput"] is None else [
                f"{t['throughput']:.1f}", f"{t['p50_ms']:.2f}", f"{t['p99_ms']:.2f}"]
            rows.append([mark, t["plan"], t["label"], *figures, t["error"] or ""])
        else:
            rows.append([mark, t["plan"], t["label"], f"{t['throughput']:.1f}",
                         f"{t['p50_ms']:.2f}", f"{t['p99_ms']:.2f}", "ok"])
    bound = stats.get("max_latency_ms")
    head = (f"serving configurations at concurrency {stats.get('concurrency')}"
            + (f", p99 bound {bound:g} ms" if bound is not None else "") + ":")
    table = tabulate(rows, headers=["", "plan", "configuration", "inferences/s", "p50 ms",
                                    "p99 ms", "result"], tablefmt="simple", disable_numparse=True)
    lines = [head] + ["  " + ln.rstrip() for ln in table.splitlines()]
    final = stats.get("final")
    if final:
        lines.append(f"winner under load (validated at concurrency {final['concurrency']}): "
                     f"{final['throughput']:.1f} inferences/s, p50 {final['p50_ms']:.2f} ms, "
                     f"p90 {final['p90_ms']:.2f} ms, p99 {final['p99_ms']:.2f} ms")
    if stats.get("why"):
        lines.append(f"why: {stats['why']}")
    return lines
