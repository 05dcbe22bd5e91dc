"""Diffs of two plans of the same model: per node, what changed and why. :func:`diff_plans` matches
nodes by name and reports, for each, the step each plan runs it in, what changed
(implementation, backend, layouts, grouping into fused steps or regions), the step times and the
reasons the plans record (backends one side could not use, backend versions that changed, what
each tuner said about the other's choice, the heuristic plan winning validation);
:class:`PlanDiff` renders it as text, markdown, csv or json.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from dispatch.plan import Plan, PlanStep, Rejected
from tuner.plan_lookup import ReportError
from tuner.report.data import fmt_delta, fmt_ms, nodes_label, records
from tuner.report.render import aligned, markdown_table

if TYPE_CHECKING:
    from tuner.fingerprint import PlanKey


@dataclass
class PlanSide:
    """One plan of a diff: the plan, a label, and (when known) its key and measured figures."""

    plan: Plan
    label: str
    key: PlanKey | None = None
    latency_ms: float | None = None
    peak_bytes: int | None = None

    def backends(self) -> dict[str, str]:
        sw = self.key.software if self.key is not None else self.plan.provenance.get("software") or {}
        return dict(sw.get("backends") or {})


@dataclass
class PlanDiff:
    """Per node, what changed between two plans and why (see :func:`diff_plans`)."""

    a: PlanSide
    b: PlanSide
    rows: pd.DataFrame
    key_changes: list[str]
    conversions_only_a: list[str]
    conversions_only_b: list[str]

    @property
    def changed_nodes(self) -> list[str]:
        """Nodes whose implementation, layouts or step grouping differ (or that only one plan
        has), in the order of plan A then plan B."""
        return [str(n) for n in self.rows.loc[self.rows["changed"], "node"]]

    def render(self, fmt: str = "text", *, all_nodes: bool = False) -> str:
        """The diff as ``text``, ``markdown``, ``csv`` or ``json``; only changed nodes unless
        ``all_nodes``."""
        rows = self.rows if all_nodes else self.rows[self.rows["changed"]]
        if fmt == "csv":
            return rows.to_csv(index=False)
        if fmt == "json":
            return json.dumps({"a": self._side(self.a), "b": self._side(self.b),
                               "key_changes": self.key_changes, "changed_nodes": self.changed_nodes,
                               "conversions_only_a": self.conversions_only_a,
                               "conversions_only_b": self.conversions_only_b,
                               "rows": records(rows)}, indent=2, allow_nan=False, default=str) + "\n"
        a, b = self.a, self.b
        head = [f"A: {a.label} — {self._side_line(a)}", f"B: {b.label} — {self._side_line(b)}"]
        if a.latency_ms is not None and b.latency_ms is not None:
            d = b.latency_ms - a.latency_ms
            head.append(f"latency (validated end to end): {fmt_ms(a.latency_ms)} -> "
                        f"{fmt_ms(b.latency_ms)} ms ({d:+.4f} ms, {100 * d / a.latency_ms:+.1f}%)")
        head.append("what differs in the keys: " + ("; ".join(self.key_changes) or "nothing"))
        n_changed = len(self.changed_nodes)
        head.append(f"{n_changed} of {len(self.rows)} node(s) changed; conversions only in A: "
                    f"{len(self.conversions_only_a)}, only in B: {len(self.conversions_only_b)}")
        table = [["node", "change", "A", "A ms", "B", "B ms", "delta ms", "why"]]
        for r in rows.itertuples(index=False):
            table.append([r.node, r.change or "-", r.a_choice, fmt_ms(r.a_step_ms), r.b_choice,
                          fmt_ms(r.b_step_ms), fmt_delta(r.delta_ms), r.why])
        extra = []
        if self.conversions_only_a or self.conversions_only_b:
            extra.append("")
            extra += [f"conversion only in A: {c}" for c in self.conversions_only_a]
            extra += [f"conversion only in B: {c}" for c in self.conversions_only_b]
        if fmt == "markdown":
            return ("\n".join(f"- {h}" for h in head) + "\n\n" + markdown_table(table, (3, 5, 6))
                    + "\n" + "\n".join(f"- {x}" for x in extra if x) + "\n")
        if fmt != "text":
            raise ReportError(f"unknown diff format {fmt!r}; expected text, markdown, csv or json")
        body = aligned(table, max_width=70, numeric=(3, 5, 6)) if len(table) > 1 else "(no node changed)"
        return "\n".join(head) + "\n\n" + body + "\n" + "\n".join(extra) + ("\n" if extra else "")

    @staticmethod
    def _side_line(side: PlanSide) -> str:
        used = ", ".join(f"{b}: {n}" for b, n in side.plan.backends_used().items())
        prov = side.plan.provenance or {}
        return (f"{prov.get('source', '?')} plan, objective {prov.get('objective', '?')}, "
                f"backends allowed {sorted(side.backends()) or '?'}, used {used}")

    @staticmethod
    def _side(side: PlanSide) -> dict[str, Any]:
        return {"label": side.label, "latency_ms": side.latency_ms, "peak_bytes": side.peak_bytes,
                "backends": side.backends(), "backends_used": side.plan.backends_used(),
                "plan_key": side.key.digest() if side.key is not None else
                side.plan.provenance.get("plan_key")}


def _choice(step: PlanStep | None) -> str:
    if step is None:
        return "(not in plan)"
    grouping = f" [{nodes_label(step.nodes)}]" if len(step.nodes) > 1 else ""
    return (f"{step.impl} ({step.backend}; {','.join(step.layouts_in) or '-'} -> "
            f"{','.join(step.layouts_out)}){grouping}")


def _key_for_diff(side: PlanSide) -> PlanKey | None:
    from tuner.fingerprint import PlanKey

    if side.key is not None:
        return side.key
    prov = side.plan.provenance or {}
    if not prov.get("hardware") or not prov.get("software"):
        return None
    return PlanKey(model="", inputs="", hardware=dict(prov["hardware"]),
                   software=dict(prov["software"]), objective=str(prov.get("objective", "")))


def diff_plans(a: PlanSide | Plan, b: PlanSide | Plan) -> PlanDiff:
    """Per node: the step each plan runs it in, what changed (implementation, backend, layouts,
    grouping into fused steps or regions), the step times, and why — backends one side could
    not use, backend versions that changed, what each plan's tuner said about the other's
    choice, the heuristic plan winning validation. Nodes are matched by name."""
    sa = a if isinstance(a, PlanSide) else PlanSide(a, "A")
    sb = b if isinstance(b, PlanSide) else PlanSide(b, "B")
    step_a = {n: s for s in sa.plan.steps for n in s.nodes}
    step_b = {n: s for s in sb.plan.steps for n in s.nodes}
    order = list(step_a) + [n for n in step_b if n not in step_a]
    ka, kb = _key_for_diff(sa), _key_for_diff(sb)
    key_changes: list[str] = []
    if ka is not None and kb is not None:
        key_changes = [c for c in ka.explain_difference(kb)
                       if not (sa.key is None or sb.key is None) or not c.startswith(("model", "inputs"))]
    be_a, be_b = sa.backends(), sb.backends()
    rows = []
    for n in order:
        x, y = step_a.get(n), step_b.get(n)
        change: list[str] = []
        if x is None or y is None:
            change.append("only in A" if y is None else "only in B")
        else:
            if x.impl != y.impl:
                change.append("backend" if x.backend != y.backend else "implementation")
            if (x.layouts_in, x.layouts_out) != (y.layouts_in, y.layouts_out):
                change.append("layouts")
            if sorted(x.nodes) != sorted(y.nodes):
                change.append("grouping")
        why: list[str] = []
        if change and x is not None and y is not None:
            why = _why_changed(x, y, sa, sb, be_a, be_b)
        first_a = x is not None and x.nodes[0] == n
        first_b = y is not None and y.nodes[0] == n
        a_ms = x.cost_ms if x is not None and first_a else None
        b_ms = y.cost_ms if y is not None and first_b else None
        delta = (b_ms - a_ms) if a_ms is not None and b_ms is not None else None
        rows.append({"node": n, "changed": bool(change), "change": ", ".join(change),
                     "a_choice": _choice(x), "a_impl": x.impl if x else None,
                     "a_backend": x.backend if x else None, "a_step_ms": a_ms,
                     "b_choice": _choice(y), "b_impl": y.impl if y else None,
                     "b_backend": y.backend if y else None, "b_step_ms": b_ms,
                     "delta_ms": delta, "why": "; ".join(why)})
    df = pd.DataFrame(rows, columns=["node", "changed", "change", "a_choice", "a_impl",
                                     "a_backend", "a_step_ms", "b_choice", "b_impl", "b_backend",
                                     "b_step_ms", "delta_ms", "why"])
    for col in ("a_step_ms", "b_step_ms", "delta_ms"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
    df["changed"] = df["changed"].astype(bool)

    def conv_set(p: Plan) -> set[str]:
        return {f"{c.value} {c.src}->{c.dst}{' (build time)' if c.at_build else ''}"
                for c in p.conversions}

    ca, cb = conv_set(sa.plan), conv_set(sb.plan)
    return PlanDiff(sa, sb, df, key_changes, sorted(ca - cb), sorted(cb - ca))


def _rejection(step: PlanStep, impl: str) -> Rejected | None:
    return next((r for r in step.rejected if r.impl == impl), None)


def _why_changed(x: PlanStep, y: PlanStep, sa: PlanSide, sb: PlanSide,
                 be_a: Mapping[str, str], be_b: Mapping[str, str]) -> list[str]:
    why: list[str] = []
    if be_a and y.backend not in be_a:
        why.append(f"{y.backend} was not among A's backends ({', '.join(sorted(be_a))})")
    if be_b and x.backend not in be_b:
        why.append(f"{x.backend} was not among B's backends ({', '.join(sorted(be_b))})")
    for backend in sorted({x.backend, y.backend}):
        va, vb = be_a.get(backend), be_b.get(backend)
        if va and vb and va != vb:
            why.append(f"{backend} changed: {va} -> {vb}")
    r = _rejection(x, y.impl)
    if r is not None:
        why.append(f"A's tuner rejected {y.impl}: {r.reason}")
    r = _rejection(y, x.impl)
    if r is not None:
        why.append(f"B's tuner rejected {x.impl}: {r.reason}")
    for side in (sa, sb):
        winner = (side.plan.provenance or {}).get("winner")
        if winner and winner != "optimum":
            why.append(f"{side.label} is the {winner!r} plan, which won validation")
    if x.cost_ms is not None and y.cost_ms is not None and not why:
        why.append(f"measured {x.cost_ms:.4f} ms in A, {y.cost_ms:.4f} ms in B")
    return why or ["not recorded by either plan"]
