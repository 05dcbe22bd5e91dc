"""The checked, integer-indexed form of a :class:`~tuner.optimize.problem.Problem` that every
method works on (:class:`_Indexed`: validation of the problem, numbered nodes, values and
layouts, producers/readers/cover tables, cached conversion costs), plus what is computed on it
before and after any method runs: plain evaluation of an assignment (:func:`evaluate`, also the
final totals of every :class:`~tuner.optimize.problem.Solution`) and pruning of the choices
that can never be part of a feasible plan.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from tuner.optimize.problem import (
    Choice,
    Conversion,
    InfeasibleError,
    Problem,
    ProblemError,
    Solution,
)

# ------------------------------------------------------------------------------------------
# checks and the indexed form of a problem
# ------------------------------------------------------------------------------------------


def _check_cost(what: str, cost: object) -> float:
    if isinstance(cost, bool) or not isinstance(cost, int | float | np.floating | np.integer):
        raise ProblemError(f"{what} must be a number, received {cost!r}")
    cost = float(cost)
    if not math.isfinite(cost):
        raise ProblemError(f"{what} must be finite, received {cost!r}")
    return cost


class _Indexed:
    """A checked problem with integer indices: the shared base of every method."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        self.nodes = list(problem.nodes)
        self.node_ix = self._index_nodes(self.nodes)
        self.choices = list(problem.choices)
        self.values: list[str] = []
        self.value_ix: dict[str, int] = {}
        self.layouts: list[str] = []
        self.layout_ix: dict[str, int] = {}
        self._conv: dict[tuple[int, int, int], float | None] = {}
        self._check_ids()
        # values and layouts are numbered in order of appearance: graph inputs, then choices
        self.gin = {self.value(v): self.layout(lay) for v, lay in problem.graph_inputs.items()}
        self.ch_nodes = [self._choice_nodes(c) for c in self.choices]
        self.ch_in: list[tuple[tuple[int, int], ...]] = []
        self.ch_out: list[tuple[tuple[int, int], ...]] = []
        for c in self.choices:
            self._index_io(c)
        self.ch_cost = [_check_cost(f"cost of choice {c.id!r}", c.cost) for c in self.choices]
        self.gout = {self.value(v): self.layout(lay) for v, lay in problem.graph_outputs.items()}
        nv = len(self.values)
        self.producers: list[list[tuple[int, int]]] = [[] for _ in range(nv)]
        self.readers: list[list[tuple[int, int]]] = [[] for _ in range(nv)]
        self.cover: list[list[int]] = [[] for _ in self.nodes]
        for ci in range(len(self.choices)):
            for n in self.ch_nodes[ci]:
                self.cover[n].append(ci)
            for v, lay in self.ch_out[ci]:
                self.producers[v].append((ci, lay))
            for v, lay in self.ch_in[ci]:
                self.readers[v].append((ci, lay))
        self._check_structure()

    # -- indexing ---------------------------------------------------------------------------

    @staticmethod
    def _index_nodes(nodes: Sequence[str]) -> dict[str, int]:
        ix: dict[str, int] = {}
        for i, n in enumerate(nodes):
            if n in ix:
                raise ProblemError(f"node {n!r} is listed twice in Problem.nodes")
            ix[n] = i
        return ix

    def value(self, name: str) -> int:
        i = self.value_ix.get(name)
        if i is None:
            i = self.value_ix[name] = len(self.values)
            self.values.append(name)
        return i

    def layout(self, name: str) -> int:
        i = self.layout_ix.get(name)
        if i is None:
            i = self.layout_ix[name] = len(self.layouts)
            self.layouts.append(name)
        return i

    def _check_ids(self) -> None:
        seen: set[str] = set()
        for c in self.choices:
            if c.id in seen:
                raise ProblemError(f"choice id {c.id!r} is used twice; ids must be unique")
            seen.add(c.id)

    def _choice_nodes(self, c: Choice) -> tuple[int, ...]:
        if not c.nodes:
            raise ProblemError(f"choice {c.id!r} covers no node")
        unknown = [n for n in c.nodes if n not in self.node_ix]
        if unknown:
            known = ", ".join(self.nodes[:20]) + (", ..." if len(self.nodes) > 20 else "")
            raise ProblemError(f"choice {c.id!r} names unknown node(s) {unknown}; known nodes: {known}")
        if len(set(c.nodes)) != len(c.nodes):
            raise ProblemError(f"choice {c.id!r} lists a node twice: {list(c.nodes)}")
        return tuple(sorted(self.node_ix[n] for n in c.nodes))

    def _index_io(self, c: Choice) -> None:
        ins: list[tuple[int, int]] = []
        for v, lay in c.inputs:
            key = (self.value(v), self.layout(lay))
            if key not in ins:
                ins.append(key)
        outs: dict[int, int] = {}
        for v, lay in c.outputs:
            vi = self.value(v)
            if vi in outs:
                raise ProblemError(f"choice {c.id!r} lists output {v!r} twice")
            if any(vi == u for u, _ in ins):
                raise ProblemError(f"choice {c.id!r} reads its own output {v!r}")
            outs[vi] = self.layout(lay)
        self.ch_in.append(tuple(ins))
        self.ch_out.append(tuple(outs.items()))

    def _check_structure(self) -> None:
        uncovered = [self.nodes[n] for n, cs in enumerate(self.cover) if not cs]
        if uncovered:
            raise ProblemError(f"no choice covers node(s) {uncovered}")
        for v, name in enumerate(self.values):
            if v in self.gin and self.producers[v]:
                ids = [self.choices[c].id for c, _ in self.producers[v]]
                raise ProblemError(f"value {name!r} is a graph input but choices {ids} also produce it")
            if v in self.gin or self.producers[v]:
                continue
            if self.readers[v]:
                ids = [self.choices[c].id for c, _ in self.readers[v]][:5]
                raise ProblemError(
                    f"value {name!r} is read by {ids} but no choice produces it and it is not a graph input")
            if v in self.gout:
                raise ProblemError(f"graph output {name!r} is produced by no choice and is not a graph input")

    # -- conversions ------------------------------------------------------------------------

    def conv(self, v: int, s: int, d: int) -> float | None:
        """Cost of converting value ``v`` from layout ``s`` to ``d`` (cached; 0 when equal)."""
        if s == d:
            return 0.0
        key = (v, s, d)
        if key in self._conv:
            return self._conv[key]
        got = self.problem.conversion_cost(self.values[v], self.layouts[s], self.layouts[d])
        if got is not None:
            got = _check_cost(f"conversion_cost{(self.values[v], self.layouts[s], self.layouts[d])}", got)
            if got < 0:
                raise ProblemError(
                    f"conversion_cost{(self.values[v], self.layouts[s], self.layouts[d])} "
                    f"is negative ({got})")
        self._conv[key] = got
        return got


# ------------------------------------------------------------------------------------------
# evaluation (deliberately plain: brute_force and the final totals use it)
# ------------------------------------------------------------------------------------------


def evaluate(problem: Problem, choices: Iterable[Choice | str]) -> tuple[float, list[Conversion]]:
    """Total cost and conversions of an assignment; raises :class:`InfeasibleError` when it is
    not a valid plan (a node covered twice or not at all, a value read but not produced or
    produced twice, a conversion that does not exist)."""
    ix = _Indexed(problem)
    by_id = {c.id: i for i, c in enumerate(ix.choices)}
    picked = []
    for c in choices:
        cid = c if isinstance(c, str) else c.id
        if cid not in by_id:
            raise ProblemError(f"choice {cid!r} is not in the problem")
        picked.append(by_id[cid])
    return _evaluate(ix, picked)


def _evaluate(ix: _Indexed, picked: Sequence[int]) -> tuple[float, list[Conversion]]:
    owner: dict[int, int] = {}
    for c in picked:
        for n in ix.ch_nodes[c]:
            if n in owner:
                raise InfeasibleError(
                    f"node {ix.nodes[n]!r} is covered twice: "
                    f"by {ix.choices[owner[n]].id!r} and {ix.choices[c].id!r}")
            owner[n] = c
    missing = [ix.nodes[n] for n in range(len(ix.nodes)) if n not in owner]
    if missing:
        raise InfeasibleError(f"node(s) {missing} are not covered")
    produced: dict[int, int] = dict(ix.gin)
    for c in picked:
        for v, lay in ix.ch_out[c]:
            if v in produced:
                raise InfeasibleError(f"value {ix.values[v]!r} is produced twice")
            produced[v] = lay
    wanted: dict[int, set[int]] = {v: {lay} for v, lay in ix.gout.items()}
    for c in picked:
        for v, lay in ix.ch_in[c]:
            wanted.setdefault(v, set()).add(lay)
    conversions = []
    for v in sorted(wanted):
        if v not in produced:
            raise InfeasibleError(f"value {ix.values[v]!r} is read but the chosen choices do not produce it")
        s = produced[v]
        for d in sorted(wanted[v]):
            if d == s:
                continue
            cost = ix.conv(v, s, d)
            if cost is None:
                raise InfeasibleError(
                    f"value {ix.values[v]!r} is produced in {ix.layouts[s]!r} "
                    f"and cannot be converted to {ix.layouts[d]!r}")
            conversions.append(Conversion(ix.values[v], ix.layouts[s], ix.layouts[d], cost))
    total = math.fsum([ix.ch_cost[c] for c in picked] + [c.cost for c in conversions])
    return total, conversions


def _solution(ix: _Indexed, picked: Iterable[int], method: str, optimal: bool, status: str) -> Solution:
    picked = sorted(set(picked), key=lambda c: ix.ch_nodes[c][0])
    total, conversions = _evaluate(ix, picked)
    by_node = {}
    for c in picked:
        for n in ix.ch_nodes[c]:
            by_node[n] = ix.choices[c]
    return Solution(
        choices={ix.nodes[n]: by_node[n] for n in range(len(ix.nodes))},
        conversions=conversions, total=total, method=method, optimal=optimal, status=status)


# ------------------------------------------------------------------------------------------
# pruning: drop choices that cannot be part of any feasible plan
# ------------------------------------------------------------------------------------------


def _prune(ix: _Indexed) -> list[bool]:
    """Alive mask after removing, to a fixed point, every choice that wants an input in a layout
    no remaining producer can be converted to, or produces a graph output in a layout that
    cannot be converted to the required one. Raises :class:`InfeasibleError` when a node loses
    all its choices, with the reasons."""
    nc = len(ix.choices)
    alive = [True] * nc
    why: dict[int, str] = {}
    counts: list[dict[int, int]] = [{} for _ in ix.values]
    for v, lay in ix.gin.items():
        counts[v][lay] = 1 << 30
    for c in range(nc):
        for v, lay in ix.ch_out[c]:
            counts[v][lay] = counts[v].get(lay, 0) + 1
    for v, req in ix.gout.items():
        if v in ix.gin and ix.conv(v, ix.gin[v], req) is None:
            raise InfeasibleError(
                f"graph output {ix.values[v]!r} arrives as a graph input in {ix.layouts[ix.gin[v]]!r} "
                f"and cannot be converted to the required {ix.layouts[req]!r}")

    def reason(c: int) -> str | None:
        for v, lay in ix.ch_out[c]:
            req = ix.gout.get(v)
            if req is not None and ix.conv(v, lay, req) is None:
                return (f"produces graph output {ix.values[v]!r} in {ix.layouts[lay]!r}, which cannot be "
                        f"converted to the required {ix.layouts[req]!r}")
        for v, d in ix.ch_in[c]:
            srcs = [s for s, k in counts[v].items() if k > 0]
            if not any(ix.conv(v, s, d) is not None for s in srcs):
                have = sorted(ix.layouts[s] for s in srcs)
                return (f"wants {ix.values[v]!r} in {ix.layouts[d]!r}, but it can be produced only in "
                        f"{have} and none of them converts to {ix.layouts[d]!r}")
        return None

    queue = list(range(nc))
    queued = [True] * nc
    while queue:
        c = queue.pop()
        queued[c] = False
        if not alive[c]:
            continue
        r = reason(c)
        if r is None:
            continue
        alive[c], why[c] = False, r
        for v, lay in ix.ch_out[c]:
            counts[v][lay] -= 1
            if counts[v][lay] == 0:
                for reader, _ in ix.readers[v]:
                    if alive[reader] and not queued[reader]:
                        queued[reader] = True
                        queue.append(reader)
    for n, cs in enumerate(ix.cover):
        if not any(alive[c] for c in cs):
            lines = "; ".join(f"{ix.choices[c].id!r} {why[c]}" for c in cs[:6])
            raise InfeasibleError(f"node {ix.nodes[n]!r} cannot be run: every choice is impossible: {lines}")
    return alive


def _cheapest_of_equals(ix: _Indexed, alive: Sequence[bool]) -> list[bool]:
    """Alive mask keeping, among choices with the same nodes, inputs and outputs, only the
    cheapest (the first on equal cost): the others cannot do better, and the tie-break, which
    looks at every alive choice, still considers them."""
    use = list(alive)
    best: dict[tuple, int] = {}
    for c in range(len(ix.choices)):
        if not alive[c]:
            continue
        sig = (ix.ch_nodes[c], frozenset(ix.ch_in[c]), frozenset(ix.ch_out[c]))
        other = best.get(sig)
        if other is None:
            best[sig] = c
        elif ix.ch_cost[c] < ix.ch_cost[other]:
            use[other] = False
            best[sig] = c
        else:
            use[c] = False
    return use
