"""The table of plans validated end to end, as the tuner prints it: each objective in its own
unit (latency in milliseconds, memory in megabytes), sorted winner first and then by the
objective, each plan's line saying what the optimiser predicted, what was measured and its
margin to the winner, followed by one line saying why the winner won.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dispatch.objective import Objective

MB = 1e6


def objective_parts(objective: str) -> tuple[str, int | None]:
    """``latency@cap=1000+nonstrict-nan`` -> (``latency``, 1000): the objective's name and
    memory cap (:class:`~dispatch.objective.Objective`)."""
    parsed = Objective.parse(objective)
    return parsed.name, parsed.memory_cap


def _measure(pc: Any, memory: bool) -> float | None:
    if pc.error is not None:
        return None
    return float(pc.peak_bytes) if memory else pc.latency_ms


def _fmt(x: float | None, memory: bool, sign: bool = False) -> str:
    """Bytes in kB or MB, milliseconds with three significant decimals for small times."""
    if x is None:
        return "-"
    plus = "+" if sign else ""
    if memory:
        return f"{x / MB:{plus}.2f} MB" if abs(x) >= MB else f"{x / 1e3:{plus}.1f} kB"
    return f"{x:{plus}.2f} ms" if abs(x) >= 10 else f"{x:{plus}.4f} ms"


def why_won(validated: Sequence[Any], winner: Any, objective: str, note: str = "") -> str:
    """One sentence: why ``winner`` won among ``validated`` under ``objective``."""
    name, cap = objective_parts(objective)
    memory = name == "memory"
    ok = [pc for pc in validated if pc.error is None]
    if note:
        return note
    if len(ok) == 1:
        return "the only plan that passed validation"
    others = [pc for pc in ok if pc is not winner]
    if cap is not None:
        others = [pc for pc in others if pc.peak_bytes is not None and pc.peak_bytes <= cap]
    runner = min(others, key=lambda pc: _measure(pc, memory) or 0.0) if others else None
    what = (f"lowest peak memory, {_fmt(float(winner.peak_bytes), True)}" if memory else
            f"fastest measured, {_fmt(winner.latency_ms, False)} median")
    if cap is not None:
        what += f", among the plans whose peak fits the cap of {cap / MB:.2f} MB"
    if runner is None:
        return what
    base = _measure(winner, memory) or 0.0
    gap = (_measure(runner, memory) or 0.0) - base
    pct = f" ({100 * gap / base:+.0f}%)" if base > 0 else ""
    verb = "needs" if memory else "takes"
    return f"{what}; the next, {runner.label}, {verb} {_fmt(gap, memory)} more{pct}"


def validation_rows(validated: Sequence[Any], winner: Any, objective: str) -> list[list[str]]:
    """The validated plans as table rows, header first: winner first, then by the objective,
    failures last; predicted, measured and margin to the winner in the objective's unit.
    ``validated`` are :class:`~tuner.tune_types.PlanCandidate` (or objects with the same
    fields); ``winner`` is one of them (``None``: not known)."""
    name, cap = objective_parts(objective)
    memory = name == "memory"
    unit = "MB" if memory else "ms"
    target = _measure(winner, memory) if winner is not None else None

    def order(pc: Any) -> tuple:
        m = _measure(pc, memory)
        return (pc is not winner, m is None, m or 0.0, pc.label)

    rows = [["", "plan", f"predicted ({unit})", "peak memory" if memory else "median latency",
             "vs winner", "result"]]
    for pc in sorted(validated, key=order):
        m = _measure(pc, memory)
        if pc.predicted_s is None:
            predicted = "-"
        else:  # the optimiser's cost: seconds for latency, bytes for memory
            predicted = _fmt(pc.predicted_s, True) if memory else _fmt(pc.predicted_s * 1e3, False)
        if m is None:
            measured, margin, result = "-", "-", str(pc.error)
        else:
            spread = (f" ±{_fmt(pc.spread_ms, False).removesuffix(' ms')}"
                      if pc.spread_ms is not None and not memory else "")
            measured = _fmt(m, memory) + spread
            if pc is winner:
                margin, result = "winner", "winner"
            elif target is None:
                margin, result = "-", "ok"
            else:
                gap = m - target
                pct = f" ({100 * gap / target:+.0f}%)" if target else ""
                margin = _fmt(gap, memory, sign=True) + pct
                result = ("over the memory cap" if cap is not None and pc.peak_bytes is not None
                          and pc.peak_bytes > cap else "ok")
            other = (_fmt(pc.latency_ms, False) if memory else
                     _fmt(float(pc.peak_bytes), True) if pc.peak_bytes is not None else "-")
            result += f" ({'latency' if memory else 'peak'} {other})"
        rows.append(["*" if pc is winner else "", pc.label, predicted, measured, margin, result])
    return rows


def validation_lines(validated: Sequence[Any], winner: Any, objective: str,
                     note: str = "") -> list[str]:
    """The validated plans as an aligned table (:func:`validation_rows`) and the line saying
    why the winner won."""
    from tabulate import tabulate

    name, _ = objective_parts(objective)
    rows = validation_rows(validated, winner, objective)
    table = tabulate(rows[1:], headers=rows[0], tablefmt="simple", disable_numparse=True)
    what = "peak memory" if name == "memory" else "end-to-end latency, median of runs"
    lines = [f"validated plans (objective {objective}: {what}):"]
    lines += ["  " + ln.rstrip() for ln in table.splitlines()]
    lines.append(f"winner {winner.label}: {why_won(validated, winner, objective, note)}")
    return lines
