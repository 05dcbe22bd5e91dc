"""The report of a range plan (issue 51): ``opdispatch report MODEL --shape input_ids=1x1..128``
(or ``--plan ID`` of a range plan, or a symbolic model with range plans stored and no
``--shape``): the range, its buckets with their winners and margins, and every way's measured
median and first-run time at every sample shape, so that what won where, and by how much, can be
read and checked.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from dispatch.range_plan import RangePlan
from tuner.tables import aligned

#: the formats a range report comes in
RANGE_FORMATS = ("text", "markdown", "json")


def range_report_data(plan_id: int, key: Any, ranged: RangePlan, created: str) -> dict[str, Any]:
    """A range plan's report as plain JSON values."""
    samples = [s for b in ranged.buckets for s in b.samples]
    return {
        "plan_id": plan_id, "range": ranged.range.text(), "axes": ranged.range.axes_text(),
        "objective": key.objective, "key_digest": key.digest()[:16], "created": created,
        "buckets": [{"sizes": [b.lo, b.hi], "way": b.way, "why": b.why, "warm": b.warm}
                    for b in ranged.buckets],
        "ways": dict(ranged.ways), "notes": dict(ranged.notes), "samples": samples,
    }


def render_range_report(reports: Sequence[dict[str, Any]], fmt: str) -> str:
    """``reports`` (:func:`range_report_data`) in ``fmt`` (:data:`RANGE_FORMATS`)."""
    if fmt == "json":
        return json.dumps(list(reports), indent=2) + "\n"
    md = fmt == "markdown"
    out: list[str] = []
    for rep in reports:
        ways = list(rep["ways"])
        title = (f"range plan {rep['plan_id']} ({rep['key_digest']}): {rep['range']} "
                 f"({rep['axes']}), objective {rep['objective']}, tuned {rep['created']}")
        out.append(f"## {title}" if md else title)
        rows = [["sizes", "way", "warmed at load", "why"]]
        rows += [[f"{b['sizes'][0]}..{b['sizes'][1]}", b["way"], "yes" if b["warm"] else "no",
                  b["why"]] for b in rep["buckets"]]
        out += ["", "buckets:", _table(rows, md)]
        rows = [["size", "winner", *[f"{w} ms (first)" for w in ways]]]
        for s in rep["samples"]:
            ms, first = s.get("ms", {}), s.get("first_ms", {})
            winner = min(ms, key=ms.get) if ms else "-"
            rows.append([str(s["size"]), winner, *[
                f"{ms[w]:.3f} ({first.get(w, ms[w]):.2f})" if w in ms
                else ("rejected" if w in s.get("rejected", {}) else "-") for w in ways]])
        out += ["", "measured at the sample shapes (median ms of a seen shape; the first run "
                "at a new shape in brackets):", _table(rows, md)]
        rejected = [f"size {s['size']}: {w}: {why}" for s in rep["samples"]
                    for w, why in s.get("rejected", {}).items()]
        if rejected:
            out += ["", "rejected:"] + [f"- {r}" for r in rejected]
        out += ["", "ways:"] + [f"- {w}: {d}" for w, d in rep["ways"].items()]
        notes = rep["notes"]
        out += ["", "how: " + "; ".join(f"{k} {v}" for k, v in notes.items()), ""]
    return "\n".join(out)


def _table(rows: list[list[str]], markdown: bool) -> str:
    if not markdown:
        return aligned(rows, max_width=90)
    head, *body = rows
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)
