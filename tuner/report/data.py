"""What a plan report is made of, shared by every part of :mod:`tuner.report`. The column and
verdict vocabularies, the formatting of numbers that may not be known (``-`` for a missing or
NaN figure), node and shape labels, the JSON conversions (NaN and ``pd.NA`` as null),
:class:`Alternative` (a candidate that did not win) and :class:`ReportData`, the fields of a
report; :class:`tuner.report.table.PlanReport` adds the renderings to it. Nothing here reads a
plan store or draws.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from dispatch.graph import Graph, Node, Value
    from dispatch.plan import Plan


#: Output formats of :meth:`PlanReport.render`.
FORMATS = ("text", "markdown", "csv", "json", "html")
#: Columns of :attr:`PlanReport.table`, in order.
COLUMNS = (
    "order", "kind", "step", "name", "op", "step_op", "step_nodes", "shapes", "impl",
    "settings", "backend", "layouts_in", "layouts_out", "when", "median_ms", "spread_ms", "samples",
    "share", "time_source", "runner_up", "runner_up_backend", "runner_up_ms",
    "runner_up_delta_ms", "n_rejected", "rejected", "cost_bytes", "why",
)
#: Columns of :attr:`PlanReport.rejections`.
REJECTION_COLUMNS = (
    "node", "step", "impl", "backend", "covers", "verdict", "median_ms", "compare_ms",
    "plan_ms", "delta_ms", "reason",
)
#: Verdicts a rejected candidate can get.
VERDICTS = ("slower", "faster alone", "wrong result", "failed", "unsupported", "not measured",
            "not tried", "backend unavailable", "lost")


def is_known(x: Any) -> bool:
    """Whether ``x`` is a figure at all (neither ``None`` nor NaN)."""
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def fmt_ms(x: Any) -> str:
    """Milliseconds as text: 4 decimals, ``-`` when not known."""
    return f"{float(x):.4f}" if is_known(x) else "-"


def fmt_delta(x: Any) -> str:
    """A signed millisecond difference, ``-`` when not known."""
    return f"{float(x):+.4f}" if is_known(x) else "-"


def fmt_share(x: Any) -> str:
    """A fraction as a percentage with one decimal."""
    return f"{100.0 * float(x):.1f}%" if is_known(x) else "-"


def fmt_bytes(x: Any) -> str:
    """Bytes with thousands separators and a MB figure."""
    if not is_known(x):
        return "-"
    return f"{int(x):,} B ({int(x) / 1e6:.2f} MB)"


def shape_text(v: Value | None) -> str:
    """``2x3x4``, ``scalar``, ``dynamic`` (known only at run time), or ``?``."""
    if v is not None and v.shape is None and v.dtype is not None:
        return "dynamic"
    if v is None or v.shape is None:
        return "?"
    return "x".join(str(d) for d in v.shape) or "scalar"


def nodes_label(names: Sequence[str], limit: int = 3) -> str:
    """``A+B+C`` for short node lists, ``A..Z (N nodes)`` for long ones."""
    if len(names) <= limit:
        return "+".join(names)
    return f"{names[0]}..{names[-1]} ({len(names)} nodes)"


def share_of(ms: float | None, total: float | None) -> float | None:
    """``ms`` as a fraction of ``total`` (``None`` when either is not known)."""
    if ms is None or not total:
        return None
    return float(ms) / float(total)


def node_shapes(node: Node | None) -> str:
    """``in, in -> out``: the shapes of a node's non-constant inputs and its outputs."""
    if node is None:
        return ""
    ins = [shape_text(v) for v in node.inputs if v is not None and not v.is_const]
    outs = [shape_text(v) for v in node.outputs]
    return f"{', '.join(ins) or '-'} -> {', '.join(outs)}"


def jsonable(data: Any) -> Any:
    """``data`` with string keys, lists, plain numbers and ``None`` for NaN and ``pd.NA``."""
    if isinstance(data, Mapping):
        return {str(k): jsonable(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [jsonable(v) for v in data]
    if isinstance(data, float | np.floating):
        return float(data) if math.isfinite(float(data)) else None
    if isinstance(data, np.integer):
        return int(data)
    if data is pd.NA:
        return None
    return data


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows of ``df`` as JSON-able dicts (NaN and ``pd.NA`` as ``None``)."""
    out = []
    for rec in df.astype(object).to_dict("records"):
        out.append({k: (None if (v is pd.NA or (isinstance(v, float) and math.isnan(v))) else
                        jsonable(v)) for k, v in rec.items()})
    return out


@dataclass
class Alternative:
    """A candidate that did not win, compared with the plan."""

    node: str
    step: int | None
    impl: str
    backend: str
    covers: tuple[str, ...]
    verdict: str
    reason: str
    median_ms: float | None = None
    spread_ms: float | None = None
    samples: int | None = None
    measured_at: str | None = None
    compare_ms: float | None = None
    plan_ms: float | None = None
    delta_ms: float | None = None
    layouts_in: tuple[str, ...] = ()
    layouts_out: tuple[str, ...] = ()
    signature: str | None = None
    #: the whole alternative term by term (only where the candidate is completed by other
    #: implementations or spans several steps); shown on request
    details: str = ""

    def record(self, details: bool = False) -> dict[str, Any]:
        """The row of :attr:`ReportData.rejections` (``details``: with the whole breakdown)."""
        extra = {"details": self.details} if details else {}
        return {
            "node": self.node, "step": self.step, "impl": self.impl, "backend": self.backend,
            "covers": nodes_label(self.covers, 4) if self.covers else "", "verdict": self.verdict,
            "median_ms": self.median_ms, "compare_ms": self.compare_ms, "plan_ms": self.plan_ms,
            "delta_ms": self.delta_ms, "reason": self.reason, **extra,
        }


@dataclass
class ReportData:
    """Everything a report shows (see :func:`tuner.report.build_report`); the renderers take
    it, :class:`~tuner.report.table.PlanReport` adds :meth:`~PlanReport.render` to it."""

    plan: Plan
    graph: Graph | None
    table: pd.DataFrame
    rejections: pd.DataFrame
    summary: dict[str, Any]
    alternatives: dict[str, list[Alternative]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able data: summary, rows, rejections (NaN as null)."""
        return {
            "summary": jsonable(self.summary),
            "rows": records(self.table),
            "rejections": records(self.rejections),
            "notes": list(self.notes),
        }
