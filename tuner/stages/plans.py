"""The optimisation stage's glue: the :class:`~tuner.optimize.Problem` built from measurements
(node costs plus converter costs in the objective's unit), plans built from the optimiser's
solutions (each step annotated with what it beat), the alternatives that forbid the optimum's
least certain decisions, and the order validation builds plans in. Used by
:class:`tuner.stages.latency.LatencyTuning`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dispatch.graph import Graph
from dispatch.plan import Plan, PlanStep, Rejected
from dispatch.plan_assembly import order_steps, plan_conversions
from dispatch.registry import STANDARD, Registry
from tuner.candidates import Candidate
from tuner.measure import Measurement
from tuner.optimize import Choice, Problem, Solution
from tuner.plan_candidate import PlanCandidate
from tuner.validate import UNTUNED

#: shares of the budget (from the start of :func:`tune`) by which each stage ends
MEASURE_SHARE = 0.55
CONVERT_SHARE = 0.62
OPTIMIZE_SHARE = 0.70


def node_cost(c: Candidate, m: Measurement, objective: str) -> float:
    """A candidate's cost in the objective's unit: its measured median, seconds, or for the
    memory objective the bytes of the tensors it produces."""
    if objective == "memory":
        return float(sum(v.nbytes for v in c.node.outputs if v is not None))
    return m.median_s


def build_problem(
    graph: Graph,
    usable: Sequence[tuple[Candidate, Measurement]],
    conv_costs: Mapping[tuple[str, str, str], float | None],
    objective: str,
) -> Problem:
    """The optimiser's problem: a choice per usable candidate at its cost
    (:func:`node_cost`), and converters at their measured cost (bytes, for memory)."""
    choices = []
    for c, m in usable:
        choices.append(Choice(
            id=c.id,
            nodes=c.nodes,
            inputs=tuple((v.name, lay) for v, lay in zip(c.node.inputs, c.layouts_in)
                         if v is not None and not v.is_const),
            outputs=tuple((v.name, lay) for v, lay in zip(c.node.outputs, c.layouts_out)),
            cost=node_cost(c, m, objective),
            priority=c.impl.priority,
            noise=m.spread_s if objective == "latency" else 0.0,
        ))

    def conversion_cost(value: str, src: str, dst: str) -> float | None:
        if src == dst:
            return 0.0
        cost = conv_costs.get((value, src, dst))
        if cost is None:
            return None
        if objective == "memory":
            v = graph.value(value)
            return float(v.nbytes)
        return cost

    return Problem(
        nodes=[n.name for n in graph.nodes],
        choices=choices,
        graph_inputs={v.name: STANDARD for v in graph.inputs},
        graph_outputs={v.name: STANDARD for v in graph.outputs},
        conversion_cost=conversion_cost,
    )


def plan_from(
    graph: Graph,
    registry: Registry,
    chosen_ids: Sequence[str],
    by_id: Mapping[str, tuple[Candidate, Measurement]],
    alternatives: Mapping[str, list[tuple[Candidate, Measurement]]],
    rejected: Mapping[str, list[Rejected]],
    provenance: dict[str, Any],
) -> Plan:
    """The plan of the candidates ``chosen_ids``, each step annotated with what it beat (the
    other candidates over its nodes, measured or rejected) and the conversions between them."""
    steps = []
    for cid in chosen_ids:
        cand, m = by_id[cid]
        losers = []
        for node in cand.nodes:
            for other, om in alternatives.get(node, []):
                if other.id == cand.id:
                    continue
                if om.error:
                    losers.append(Rejected(other.impl.name, other.impl.backend, om.error))
                else:
                    pct = 100.0 * (om.median_s - m.median_s) / m.median_s if m.median_s > 0 else 0.0
                    losers.append(Rejected(other.impl.name, other.impl.backend,
                                           f"lost: {om.median_s * 1e3:.4f} ms ({pct:+.0f}% vs winner), "
                                           f"covers {'+'.join(other.nodes)}"))
            losers += rejected.get(node, [])
        steps.append(PlanStep(
            nodes=list(cand.nodes), op=cand.impl.op, impl=cand.impl.name, backend=cand.impl.backend,
            layouts_in=list(cand.layouts_in), layouts_out=list(cand.layouts_out),
            why=f"tuned: measured {m.median_s * 1e3:.4f} ms (spread {m.spread_s * 1e3:.4f})",
            rejected=_dedupe(losers), cost_ms=m.median_s * 1e3,
        ))
    steps = order_steps(graph, steps)
    return Plan(graph=graph.name, steps=steps, conversions=plan_conversions(graph, registry, steps),
                provenance=provenance)


def chosen_ids(solution: Solution) -> list[str]:
    """The ids of the candidates ``solution`` chose, each once."""
    return [c.id for c in chosen(solution)]


def chosen(solution: Solution) -> list[Choice]:
    """The choices ``solution`` made, each once (a solution may map nodes to choices)."""
    picked = solution.choices
    if isinstance(picked, Mapping):
        seen, out = set(), []
        for c in picked.values():
            if c.id not in seen:
                seen.add(c.id)
                out.append(c)
        return out
    return list(picked)


def _dedupe(rejected: Sequence[Rejected]) -> list[Rejected]:
    seen, out = set(), []
    for r in rejected:
        if r.impl not in seen:
            seen.add(r.impl)
            out.append(r)
    return out


def validation_order(plans: Sequence[PlanCandidate]) -> list[PlanCandidate]:
    """The order validation builds plans in, most promising first (when the budget runs out,
    the rest are skipped): the optimum, the untuned plan, then by predicted latency (plans
    without a prediction last)."""
    def rank(pc: PlanCandidate) -> tuple:
        return (pc.label != "optimum", pc.label != UNTUNED, pc.predicted_s is None, pc.predicted_s or 0.0)
    return sorted(plans, key=rank)


def alternative_problems(problem: Problem, best: Solution, k: int) -> list[Problem]:
    """Up to ``k`` problems that each forbid one decision of ``best``: the ones whose
    runner-up on the same nodes is closest (the least certain decisions)."""
    margins = []
    for choice in chosen(best):
        rivals = [c.cost for c in problem.choices if c.id != choice.id and set(c.nodes) & set(choice.nodes)]
        if rivals:
            margins.append((min(rivals) - choice.cost, choice.id))
    margins.sort()
    out = []
    for _, cid in margins[:k]:
        out.append(Problem(
            nodes=problem.nodes,
            choices=[c for c in problem.choices if c.id != cid],
            graph_inputs=problem.graph_inputs,
            graph_outputs=problem.graph_outputs,
            conversion_cost=problem.conversion_cost,
        ))
    return out
