"""The candidates that did not win, and why each lost. Every candidate the tuner could have picked
for the plan's graph is compared with the plan (see :mod:`tuner.report`): a rejected candidate's
measured kernel time, completed where it covers only part of the plan's steps by the fastest
measured single-node implementation of each remaining node, against the plan's kernel time for
the same steps. "slower" gives the difference; "faster alone" says whether it lost on the layout
conversions it forces or in the whole-plan optimisation and validation. Also what the planner
recorded and the enumeration here does not know, the runner-up of each step, and a rejection as
one line of text.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dispatch.errors import OpDispatchError
from dispatch.fusion import step_node
from dispatch.registry import STANDARD
from tuner.report.data import VERDICTS, Alternative, fmt_ms, nodes_label
from tuner.report.sources import Sources, measured_ms, measured_spread_ms, plan_backends

#: The longest rejection reason shown by default (longer ones are cut; the whole text is the
#: alternative's ``details``).
REASON_LIMIT = 400

if TYPE_CHECKING:
    from dispatch.plan import PlanStep
    from tuner.candidates import Candidate
    from tuner.store import StoredMeasurement


def find_alternatives(src: Sources,
                      times: list[dict[str, Any]]) -> dict[str, list[Alternative]]:
    """Node -> the candidates that did not win, listed at the first node each covers, best
    verdict and fastest first; ``times`` are :meth:`Sources.step_times`."""
    return _Finder(src).alternatives(times)


def runner_up(step: PlanStep, alts: Mapping[str, list[Alternative]],
              step_ms: float | None) -> tuple[str, str, float | None, float | None]:
    """The fastest measured alternative over exactly this step's nodes (completed by
    single-node implementations where it covers part of them)."""
    best: Alternative | None = None
    nodes = set(step.nodes)
    for n in step.nodes:
        for a in alts.get(n, []):
            if a.compare_ms is None or not a.covers or not set(a.covers) <= nodes:
                continue
            if best is None or a.compare_ms < best.compare_ms:  # type: ignore[operator]
                best = a
    # an alternative starting before this step but covering only its nodes is listed at
    # its first node, which is in this step by construction
    if best is None:
        return "", "", None, None
    label = best.impl if set(best.covers) == nodes else f"{best.impl} (+ single-node impls)"
    delta = best.compare_ms - step_ms if step_ms is not None else None  # type: ignore[operator]
    return label, best.backend, best.compare_ms, delta


def rejection_text(a: Alternative) -> str:
    """``impl (backend): verdict: reason`` (the verdict once when the reason starts with it)."""
    if a.reason.lower().startswith(a.verdict):
        return f"{a.impl} ({a.backend}): {a.reason}"
    return f"{a.impl} ({a.backend}): {a.verdict}: {a.reason}"


def rejection_brief(a: Alternative) -> str:
    """``impl (backend): verdict[ +delta ms]``: one rejected candidate in a table cell."""
    delta = f" {a.delta_ms:+.4f} ms" if a.delta_ms is not None else ""
    return f"{a.impl} ({a.backend}): {a.verdict}{delta}"


def _verdict_of(reason: str) -> str:
    """The verdict of a rejection reason written by the planner or the tuner."""
    low = reason.lower()
    for prefix, verdict in (("unsupported", "unsupported"), ("wrong result", "wrong result"),
                            ("failed", "failed"), ("not measured", "not measured"),
                            ("not tried", "not tried"), ("backend unavailable", "backend unavailable"),
                            ("lost", "lost")):
        if low.startswith(prefix):
            return verdict
    return "lost"


class _Finder:
    """Compares every enumerated candidate with the plan (see :func:`find_alternatives`)."""

    def __init__(self, src: Sources) -> None:
        self.plan, self.graph, self.registry, self.key = src.plan, src.graph, src.registry, src.key
        self.m, self.run, self.notes = src.m, src.run, src.notes
        self._wanted: dict[str, set[str]] | None = None

    def _candidates(self) -> Any:
        if self.graph is None or self.registry is None:
            return None
        from tuner.candidates import enumerate_candidates

        available = self.registry.available_backends()
        wanted = plan_backends(self.plan, self.key)
        allowed = [b for b in wanted if b in available]
        missing = [b for b in wanted if b not in available]
        if missing:
            self.notes.append(f"backend(s) {missing} of the plan are not available here: their "
                              f"candidates are not listed")
        try:
            return enumerate_candidates(self.graph, self.registry, allowed or available)
        except OpDispatchError as exc:
            self.notes.append(f"candidates could not be enumerated: {exc}")
            return None

    def alternatives(self, times: list[dict[str, Any]]) -> dict[str, list[Alternative]]:
        plan = self.plan
        step_of = {n: k for k, s in enumerate(plan.steps) for n in s.nodes}
        cands = self._candidates()
        out: dict[str, list[Alternative]] = {}
        if cands is None:
            for k, step in enumerate(plan.steps):
                for r in step.rejected:
                    out.setdefault(step.nodes[0], []).append(Alternative(
                        step.nodes[0], k, r.impl, r.backend, (), _verdict_of(r.reason), r.reason))
            return out
        measured: dict[str, tuple[Candidate, StoredMeasurement | None]] = {}
        for c in cands.candidates:
            measured[c.id] = (c, self.m.get(c.signature, c.impl.name))
        best_single: dict[str, tuple[str, float]] = {}
        for c, m in measured.values():
            ms = measured_ms(m)
            if len(c.nodes) == 1 and ms is not None:
                n = c.nodes[0]
                if n not in best_single or ms < best_single[n][1]:
                    best_single[n] = (c.impl.name, ms)
        chosen = {(s.impl, tuple(s.nodes)) for s in plan.steps}
        produced = self._produced_layouts()
        skipped = bool(self.run and (self.run.stats or {}).get("skipped_budget"))
        for c, m in measured.values():
            if (c.impl.name, tuple(c.nodes)) in chosen:
                continue
            first = c.nodes[0]
            alt = Alternative(first, step_of.get(first), c.impl.name, c.impl.backend, c.nodes,
                              "", "", layouts_in=tuple(c.layouts_in),
                              layouts_out=tuple(c.layouts_out), signature=c.signature)
            if m is not None:
                alt.samples, alt.measured_at = m.samples, m.created_at
            if m is None:
                alt.verdict = "not measured"
                alt.reason = ("not measured: the tuning budget was spent before it" if skipped
                              else "not measured on this machine and software")
            elif m.error is not None:
                alt.verdict = "wrong result" if m.error.startswith("wrong") else "failed"
                alt.reason = m.error
            else:
                alt.median_ms, alt.spread_ms = measured_ms(m), measured_spread_ms(m)
                self._compare(alt, c, step_of, times, best_single, produced)
            out.setdefault(first, []).append(alt)
        for node, rejected in cands.rejected.items():
            for r in rejected:
                out.setdefault(node, []).append(Alternative(
                    node, step_of.get(node), r.impl, r.backend, (node,), "unsupported",
                    r.reason.removeprefix("unsupported: ")))
        # what the planner recorded that the enumeration here does not know (another
        # machine's backends, the heuristic's "not tried" ones)
        known_impls = {(a.node, a.impl) for alts in out.values() for a in alts}
        enumerated = {c.impl.name for c in cands.candidates}
        for k, step in enumerate(plan.steps):
            for r in step.rejected:
                if r.impl in enumerated or (step.nodes[0], r.impl) in known_impls:
                    continue
                if any((n, r.impl) in known_impls for n in step.nodes):
                    continue
                out.setdefault(step.nodes[0], []).append(Alternative(
                    step.nodes[0], k, r.impl, r.backend, (), _verdict_of(r.reason), r.reason))
                known_impls.add((step.nodes[0], r.impl))
        for alts in out.values():
            for a in alts:
                if len(a.reason) > REASON_LIMIT:  # an error message or a planner's note
                    a.details = a.details or a.reason
                    a.reason = a.reason[: REASON_LIMIT - 1] + "…"
            alts.sort(key=lambda a: (VERDICTS.index(a.verdict) if a.verdict in VERDICTS else 99,
                                     a.compare_ms if a.compare_ms is not None else math.inf,
                                     a.impl))
        return out

    def _produced_layouts(self) -> dict[str, str]:
        assert self.graph is not None
        produced = {v.name: STANDARD for v in self.graph.inputs}
        for step in self.plan.steps:
            node = step_node(self.graph, step.nodes, step.op)
            for v, lay in zip(node.outputs, step.layouts_out):
                produced[v.name] = lay
        return produced

    def _wanted_layouts(self) -> dict[str, set[str]]:
        """Value -> the layouts the plan's steps (and the graph outputs) read it in; cached."""
        if self._wanted is not None:
            return self._wanted
        assert self.graph is not None
        wanted: dict[str, set[str]] = {v.name: {STANDARD} for v in self.graph.outputs}
        for step in self.plan.steps:
            node = step_node(self.graph, step.nodes, step.op)
            for v, lay in zip(node.inputs, step.layouts_in):
                if v is not None and not v.is_const:
                    wanted.setdefault(v.name, set()).add(lay)
        self._wanted = wanted
        return wanted

    def _compare(self, alt: Alternative, c: Candidate, step_of: Mapping[str, int],
                 times: list[dict[str, Any]], best_single: Mapping[str, tuple[str, float]],
                 produced: Mapping[str, str]) -> None:
        plan = self.plan
        steps = sorted({step_of[n] for n in c.nodes if n in step_of})
        covered = [n for k in steps for n in plan.steps[k].nodes]
        rest = [n for n in covered if n not in c.nodes]
        plan_parts = [times[k]["median_ms"] for k in steps]
        assert alt.median_ms is not None
        if any(p is None for p in plan_parts):
            alt.verdict = "lost"
            alt.reason = (f"{fmt_ms(alt.median_ms)} ms; the plan's time for the same nodes is "
                          f"not known")
            return
        plan_ms = float(sum(plan_parts))
        fill = [(n, *best_single[n]) for n in rest if n in best_single]
        if len(fill) < len(rest):
            lacking = [n for n in rest if n not in best_single]
            alt.verdict = "lost"
            alt.plan_ms = plan_ms
            alt.reason = (f"covers {nodes_label(c.nodes)} in {fmt_ms(alt.median_ms)} ms; not "
                          f"comparable: no measured single-node implementation for "
                          f"{nodes_label(lacking)}")
            return
        compare = alt.median_ms + sum(ms for _, _, ms in fill)
        alt.compare_ms, alt.plan_ms = compare, plan_ms
        alt.delta_ms = compare - plan_ms
        pct = 100.0 * alt.delta_ms / plan_ms if plan_ms > 0 else 0.0
        same = not rest and len(steps) == 1
        if same:
            what = ""
        else:
            what = self._concise(alt, c, steps, fill, times)
            alt.details = self._details(alt, c, steps, fill, compare, plan_ms)
        if alt.delta_ms >= 0:
            alt.verdict = "slower"
            alt.reason = f"slower by {alt.delta_ms:.4f} ms ({pct:+.0f}%)" + (f": {what}" if what else "")
            return
        alt.verdict = "faster alone"
        why = self._why_faster_lost(c, plan.steps[steps[0]], times[steps[0]]["median_ms"],
                                    alt.median_ms, produced) if same else None
        alt.reason = (f"faster alone by {-alt.delta_ms:.4f} ms ({pct:+.0f}%)"
                      + (f" ({what})" if what else "") + "; " + (why or self._lost_whole_plan()))

    def _concise(self, alt: Alternative, c: Candidate, steps: Sequence[int],
                 fill: Sequence[tuple[str, str, float]], times: list[dict[str, Any]]) -> str:
        """What the candidate would cost against the plan's steps for the same nodes, naming
        the plan's largest step there and the largest single-node filler: bounded in length
        whatever the number of nodes (the whole breakdown is :attr:`Alternative.details`)."""
        assert alt.median_ms is not None and alt.compare_ms is not None
        plan = self.plan
        covered = sum(len(plan.steps[k].nodes) for k in steps)
        text = f"{fmt_ms(alt.compare_ms)} vs {fmt_ms(alt.plan_ms)} ms over {len(steps)} step(s)"
        if covered != len(steps):
            text += f" ({covered} nodes)"
        if fill:
            n, impl, ms = max(fill, key=lambda f: f[2])
            text += (f"; {fmt_ms(sum(f[2] for f in fill))} ms of it fills {len(fill)} node(s), "
                     f"most {n} by {impl} ({fmt_ms(ms)} ms)")
        big = max(steps, key=lambda k: times[k]["median_ms"] or 0.0)
        if len(steps) > 1:
            text += (f"; the plan's largest: {nodes_label(plan.steps[big].nodes)} by "
                     f"{plan.steps[big].impl} ({fmt_ms(times[big]['median_ms'])} ms)")
        return text

    def _details(self, alt: Alternative, c: Candidate, steps: Sequence[int],
                 fill: Sequence[tuple[str, str, float]], compare: float, plan_ms: float) -> str:
        """The whole alternative, term by term (shown on request: ``--details``)."""
        assert alt.median_ms is not None
        parts = [f"{fmt_ms(alt.median_ms)} ms for {nodes_label(c.nodes)}"]
        parts += [f"{ms:.4f} ms for {n} by {impl}" for n, impl, ms in fill]
        labels = ", ".join(nodes_label(self.plan.steps[k].nodes) for k in steps)
        return (f"{' + '.join(parts)} = {fmt_ms(compare)} ms vs {fmt_ms(plan_ms)} ms for the "
                f"plan's step(s) {labels}")

    def _lost_whole_plan(self) -> str:
        winner = (self.plan.provenance or {}).get("winner")
        if winner and winner != "optimum":
            return f"the {winner!r} plan beat the optimum end to end"
        return "lost on the layout conversions it forces or in the whole-plan optimisation"

    def _why_faster_lost(self, c: Candidate, step: PlanStep, step_ms: float, alt_ms: float,
                         produced: Mapping[str, str]) -> str | None:
        """Conversions the candidate would force in place of the chosen step (neighbours as
        planned) against those the chosen step forces."""
        assert self.graph is not None
        wanted = self._wanted_layouts()
        node = step_node(self.graph, step.nodes, step.op)

        def forced(lin: Sequence[str], lout: Sequence[str]) -> tuple[float | None, list[str]]:
            total, what = 0.0, []
            for v, lay in zip(node.inputs, lin):
                if v is None or v.is_const:
                    continue
                src = produced.get(v.name, STANDARD)
                if src != lay:
                    ms = measured_ms(self.m.conversion(v, src, lay))
                    if ms is None:
                        return None, [f"{v.name} {src}->{lay} (not measured)"]
                    total += ms
                    what.append(f"{v.name} {src}->{lay} {ms:.4f} ms")
            for v, lay in zip(node.outputs, lout):
                for dst in sorted(wanted.get(v.name, set()) - {lay}):
                    ms = measured_ms(self.m.conversion(v, lay, dst))
                    if ms is None:
                        return None, [f"{v.name} {lay}->{dst} (not measured)"]
                    total += ms
                    what.append(f"{v.name} {lay}->{dst} {ms:.4f} ms")
            return total, what

        alt_conv, alt_what = forced(c.layouts_in, c.layouts_out)
        own_conv, own_what = forced(step.layouts_in, step.layouts_out)
        if alt_conv is None or own_conv is None:
            unknown = alt_what if alt_conv is None else own_what
            return f"its conversion costs are not known ({', '.join(unknown)})"
        alt_total, own_total = alt_ms + alt_conv, step_ms + own_conv
        if alt_total > own_total:
            return (f"lost on layout conversions: it needs {alt_conv:.4f} ms "
                    f"({', '.join(alt_what) or 'none'}) where the chosen one needs "
                    f"{own_conv:.4f} ms ({', '.join(own_what) or 'none'}): "
                    f"{alt_total - own_total:.4f} ms slower in place")
        return (f"cheaper in place too ({alt_total:.4f} vs {own_total:.4f} ms with conversions); "
                + self._lost_whole_plan())
