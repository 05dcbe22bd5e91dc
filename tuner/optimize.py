"""Conversion-aware graph-level optimisation: pick one candidate per node so that the sum of
the candidates' costs plus the layout conversions they force is minimal.

The problem
-----------
A :class:`Problem` lists the graph's nodes (topological order) and the :class:`Choice` s that
can run them. A choice covers one node, or several (a fused pattern, a region handed to an
external library); it reads external values in the layouts it wants and produces the values
visible outside it in the layouts it writes. A value arrives from its single producer (the
chosen choice that outputs it, or the graph input) in that producer's layout; every consumer
that wants another layout needs a conversion, and a conversion ``(value, target layout)`` is
paid **once** however many consumers want it. Graph outputs are delivered in their required
layout. Minimise ``sum(choice costs) + sum(conversion costs)``.

Conversion costs must be non-negative (a converter chain through the standard layout is one
cost here: the layout registry's cheapest path). Not checked: that a multi-node choice is a
convex region (one whose external input depends on its own output would make a cycle); the
candidate generator only proposes convex ones.

Methods (:func:`optimize`)
--------------------------
0. *Checks and pruning.* Malformed problems raise :class:`ProblemError` (an uncovered node, a
   choice naming unknown nodes, a value read that nothing produces, a duplicate id...). Choices
   that can never be part of a feasible plan (an input produced in no layout that converts to
   the layout the choice wants, a graph output produced in a layout that cannot be converted to
   the required one) are pruned to a fixed point; a node left without choices raises
   :class:`InfeasibleError` naming the value and the layouts that cannot be converted. Among
   choices with the same nodes, inputs and outputs only the cheapest is searched over.
1. *Frontier dynamic programming* (``method="dp"``, exact). Nodes are visited in topological
   order; the state after node ``i`` is the set of values still to be read (each with the layout
   it was produced in and the layouts already converted to, so a conversion is paid once) plus
   the multi-node choices already started. A choice is selected at its first node, reads when
   its inputs exist (its first node, else its last) and writes at its last node. On a chain the
   state is the layout of the value flowing along (the classic chain DP); on trees and on
   residual networks it stays a few dozen states. It is exact when every producer of a value
   writes before any reader of that value reads and a value's producers share a node; it gives
   up (for the MILP) past ``max_dp_states`` states in a step, or when its pace projects past its
   share of the time limit. States that another state dominates (same open values and layouts, no more
   expensive, every conversion paid by the other paid too) are dropped.
2. *Integer program* (``method="milp"``, exact) for the rest, solved by HiGHS through
   :func:`scipy.optimize.milp` under the time left:

   - ``x_c`` binary per choice; ``sum_{c covers n} x_c = 1`` per node;
   - produced indicator ``p_{v,s} = sum_{c outputs (v,s)} x_c`` (+1 when ``v`` is a graph input
     arriving in ``s``), an expression, not a variable; ``sum_c x_c <= 1`` over the producers of
     ``v`` when they do not all share a node;
   - wanted indicator ``w_{v,d} >= sum_{c in G} x_c`` for each group ``G`` of readers of
     ``(v, d)`` that share a node (so at most one of them is chosen); ``w`` is replaced by that
     sum when there is one group and fixed to 1 for a graph output's required layout;
   - conversion variables ``z_{v,s,d}`` in [0, 1] with ``z_{v,s,d} <= p_{v,s}`` and
     ``sum_s z_{v,s,d} >= w_{v,d}``, cost ``conv(v, s, d)`` (0 when ``s == d``); an impossible
     conversion has no ``z``, which forbids producing in ``s`` while ``d`` is wanted.

   This is the strong (facility-location) form of ``y_{v,s,d} >= p_{v,s} + w_{v,d} - 1``: the
   same integer solutions, but a linear relaxation that cannot split ``p`` and ``w`` in halves to
   make conversions free, so on residual networks the root LP is within 0.1 % of the optimum.
   A conversion is paid once per ``(v, d)`` because ``z`` is indexed by the target layout, not
   by the reader. The objective is scaled so that HiGHS's absolute gap (1e-6) is negligible,
   with ``mip_rel_gap=0``.
3. *Fallback* (``optimal=False``) when HiGHS raises or stops without a proven optimum: the best
   of HiGHS's incumbent, a *beam-search* frontier DP (the K cheapest states per step, K from the
   time left; run before the MILP when the exact DP was only too wide) and a *greedy*
   conversion-aware forward pass (in topological order, each uncovered node takes the choice,
   among those whose nodes are all uncovered, with the least ``(choice cost + conversions it
   forces given the producers already placed) / nodes covered``), then improved by *insert
   moves* (put one choice in, take out the choices it overlaps, re-cover the displaced nodes
   greedily, keep the move if the total drops) until no move improves or the time is up.
   ``method`` says which start won (``"milp"`` for the incumbent, else ``"greedy"``).

Time: the exact DP may use 75 % of ``time_limit_s`` (it stops as soon as its pace projects
past that); the beam search a quarter (at most half of what is left); HiGHS 70 % of what is
left once its model is built; the fallback the rest. HiGHS may overrun its limit by a
little, and the runner-up scan gets at least 5 % more, so a call can exceed the limit slightly.

Ties (issue 4, item 6): measurements are noisy, so after optimisation a chosen choice is swapped
for a higher-priority one covering the same nodes when the total does not get worse by more
than ``max(noise of the two)`` (exact ties, noise 0, therefore always go to the higher
priority). Swaps are judged against the current plan one at a time (highest priority first) and
recorded in :attr:`Solution.tie_swaps`; the total may exceed the proven optimum by at most the
sum of those tolerances.

Nothing here measures anything: tests drive it with a FAKE problem generator whose costs are
deterministic numbers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from dispatch.errors import OpDispatchError

#: the objective is scaled so that its largest coefficient is this big before HiGHS sees it
#: (HiGHS stops at an absolute gap of 1e-6, which must be negligible next to the costs)
_MILP_SCALE = 1e6
#: fraction of the time left that HiGHS may use; the rest is kept for the fallback
_MILP_TIME_SHARE = 0.7
#: relative tolerance below which two totals count as equal (float rounding, not noise)
_REL_EPS = 1e-12
#: the frontier DP gives up (and the MILP takes over) when a step has more states than this
DP_MAX_STATES = 5_000
#: share of the time limit for the exact DP (it gives up early when its pace projects past it)
_DP_SHARE = 0.75
#: share of the time limit (at most half of what is left) for the beam search run when the
#: exact DP is too wide
_BEAM_SHARE = 0.25
#: steps over which the DP measures its pace
_DP_WINDOW = 16
#: widest beam of the fallback's beam-search DP (the time left usually allows less)
_BEAM_MAX = 256
#: brute_force refuses problems with more candidate assignments than this
BRUTE_FORCE_LIMIT = 1_000_000

#: the values of :attr:`Solution.method`
METHODS = ("dp", "milp", "greedy", "brute_force")


class OptimizeError(OpDispatchError):
    """The optimiser could not produce a plan."""


class ProblemError(OptimizeError):
    """The problem is malformed: an uncovered node, a choice naming unknown nodes, a value read
    that nothing produces, a duplicate id..."""


class InfeasibleError(OptimizeError):
    """No assignment satisfies the problem (typically: a value cannot be converted to a layout
    that every remaining choice needs)."""


# ------------------------------------------------------------------------------------------
# public data types
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    """One candidate the optimiser may choose.

    Attributes:
        id: unique name (e.g. ``"Conv.native.nchw16c@conv1"``).
        nodes: the graph nodes it covers: one for a single-node implementation, several for a
            fused pattern or a region handed to an external library.
        inputs: ``(value, layout wanted)`` for each non-constant value it reads from outside.
        outputs: ``(value, layout produced)`` for each value it produces that is visible outside
            it (values internal to a fused region are not listed).
        cost: measured time in seconds, or another additive objective.
        priority: higher wins ties (see the module docstring).
        noise: measured spread of ``cost``; costs closer than the noise count as tied.
    """

    id: str
    nodes: tuple[str, ...]
    inputs: tuple[tuple[str, str], ...]
    outputs: tuple[tuple[str, str], ...]
    cost: float
    priority: int = 0
    noise: float = 0.0


ConversionCost = Callable[[str, str, str], "float | None"]


@dataclass
class Problem:
    """A graph-level selection problem.

    Attributes:
        nodes: node names in topological order.
        choices: every candidate (see :class:`Choice`).
        graph_inputs: value -> the layout it arrives in (normally ``"std"``).
        graph_outputs: value -> the layout it must be delivered in (normally ``"std"``).
        conversion_cost: ``(value, src layout, dst layout) -> cost``, ``None`` when no converter
            exists; called at most once per triple, never with ``src == dst`` (free).
    """

    nodes: list[str]
    choices: list[Choice]
    graph_inputs: dict[str, str]
    graph_outputs: dict[str, str]
    conversion_cost: ConversionCost


class Conversion(NamedTuple):
    """A conversion the plan pays for: ``value`` from layout ``src`` to ``dst``."""

    value: str
    src: str
    dst: str
    cost: float


@dataclass
class Solution:
    """The optimiser's answer.

    Attributes:
        choices: node -> the chosen choice covering it (a fused choice appears under each of
            its nodes; :attr:`chosen` lists each once).
        conversions: every conversion paid, once per ``(value, dst)``.
        total: sum of the chosen costs plus the conversion costs.
        method: ``"dp"``, ``"milp"``, ``"greedy"`` or ``"brute_force"``.
        optimal: whether ``total`` is proven minimal (up to the tie swaps below).
        solve_s: wall time of the optimisation in seconds.
        status: one line on how the answer was found (solver status, fallback reason).
        tie_swaps: ``(from id, to id)`` for every swap to a higher-priority choice within noise.
        runner_up: node -> ``(choice id, total)``: the best total found with another choice on
            that node, the rest of the plan held fixed (nodes displaced by a fused alternative
            re-covered greedily); an upper bound on the true second best, for reports.
    """

    choices: dict[str, Choice]
    conversions: list[Conversion]
    total: float
    method: str
    optimal: bool
    solve_s: float = 0.0
    status: str = ""
    tie_swaps: list[tuple[str, str]] = field(default_factory=list)
    runner_up: dict[str, tuple[str, float]] = field(default_factory=dict)

    @property
    def chosen(self) -> list[Choice]:
        """The chosen choices, each once, in the order of their first node."""
        seen: set[str] = set()
        out = []
        for c in self.choices.values():
            if c.id not in seen:
                seen.add(c.id)
                out.append(c)
        return out

    @property
    def choice_cost(self) -> float:
        """Sum of the chosen choices' costs (without conversions)."""
        return math.fsum(c.cost for c in self.chosen)

    @property
    def conversion_total(self) -> float:
        """Sum of the conversion costs."""
        return math.fsum(c.cost for c in self.conversions)


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
                    f"conversion_cost{(self.values[v], self.layouts[s], self.layouts[d])} is negative ({got})")
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
                    f"node {ix.nodes[n]!r} is covered twice: by {ix.choices[owner[n]].id!r} and {ix.choices[c].id!r}")
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
                    f"value {ix.values[v]!r} is produced in {ix.layouts[s]!r} and cannot be converted to {ix.layouts[d]!r}")
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


# ------------------------------------------------------------------------------------------
# method 1: frontier dynamic programming (and the beam search of the fallback)
# ------------------------------------------------------------------------------------------


def _pairwise_overlap(ix: _Indexed, cs: Sequence[int]) -> bool:
    sets = [set(ix.ch_nodes[c]) for c in cs]
    return all(sets[i] & sets[j] for i in range(len(sets)) for j in range(i + 1, len(sets)))


class _Frontier:
    """Static tables of the frontier DP; ``ok`` is False when the DP would not be exact."""

    def __init__(self, ix: _Indexed, alive: Sequence[bool]) -> None:
        n, nv = len(ix.nodes), len(ix.values)
        self.alive = alive
        self.cs = [c for c in range(len(ix.choices)) if alive[c]]
        self.last = {c: ix.ch_nodes[c][-1] for c in self.cs}
        self.ok = self._exact(ix, alive)
        # a choice reads at its first node when every producer of its inputs has run by then
        # (keeps fewer values open), else at its last node; it writes at its last node
        self.read_at = {c: self._read_at(ix, alive, c) for c in self.cs}
        self.last_read = [-1] * nv
        for c in self.cs:
            for u, _ in ix.ch_in[c]:
                self.last_read[u] = max(self.last_read[u], self.read_at[c])
        for v in ix.gout:
            self.last_read[v] = n  # kept open to the end: the final state must hold it
        self.closing: list[list[int]] = [[] for _ in range(n)]
        for v, t in enumerate(self.last_read):
            if 0 <= t < n:
                self.closing[t].append(v)
        self.starting: list[list[int]] = [[] for _ in range(n)]
        for c in self.cs:
            self.starting[ix.ch_nodes[c][0]].append(c)
        self.nodeset = {c: frozenset(ix.ch_nodes[c]) for c in self.cs}

    def _exact(self, ix: _Indexed, alive: Sequence[bool]) -> bool:
        """Every producer of a value runs (at its last node) before every reader, and producers
        of one value pairwise share a node (so a value has at most one)."""
        for v in range(len(ix.values)):
            if not _pairwise_overlap(ix, [c for c, _ in ix.producers[v] if alive[c]]):
                return False
        for c in self.cs:
            for u, _ in ix.ch_in[c]:
                if any(alive[p] and self.last[p] >= self.last[c] for p, _ in ix.producers[u]):
                    return False
        return True

    def _read_at(self, ix: _Indexed, alive: Sequence[bool], c: int) -> int:
        first = ix.ch_nodes[c][0]
        for u, _ in ix.ch_in[c]:
            if any(alive[p] and self.last[p] >= first for p, _ in ix.producers[u]):
                return self.last[c]
        return first


_OpenValues = tuple[tuple[int, int, int], ...]  # (value, layout produced, bitmask of layouts paid)
_DPKey = tuple[tuple[int, ...], _OpenValues]  # (pending choices, open values)
_DPEntry = tuple[float, "_DPKey | None", int]  # (cost, previous key, choice selected or -1)


def _dp(ix: _Indexed, fr: _Frontier, deadline: float, max_states: int,
        beam: int | None = None) -> list[int] | None:
    """Frontier DP over the nodes in topological order.

    Exact (``beam=None``): None when not applicable (module docstring), when a step has more
    than ``max_states`` states or when the deadline passes; raises InfeasibleError when it
    completes without a feasible assignment. Beam search (``beam=K``, the fallback): keeps the
    K cheapest states per step (1 once the deadline has passed) and returns None instead of
    raising."""
    if not fr.ok:
        return None
    cost0, open0 = 0.0, []
    for v, s in sorted(ix.gin.items()):
        if fr.last_read[v] < 0:
            continue
        mask, extra = _deliver(ix, v, s)
        if extra is None:
            raise InfeasibleError(f"graph output {ix.values[v]!r} cannot be converted to its required layout")
        cost0 += extra
        open0.append((v, s, mask))
    states: dict[_DPKey, _DPEntry] = {((), tuple(open0)): (cost0, None, -1)}
    history = []
    n = len(ix.nodes)
    recent: list[float] = []  # durations of the last steps, to project the time still needed
    now = time.perf_counter()
    for i in range(n):
        late = now > deadline
        if beam is None and (late or _dp_hopeless(recent, n - i, deadline - now)):
            return None
        new: dict[_DPKey, _DPEntry] = {}
        for key, (cost, _, _) in states.items():
            for nkey, ncost, picked in _dp_moves(ix, fr, i, key, cost):
                old = new.get(nkey)
                if old is None or ncost < old[0]:
                    new[nkey] = (ncost, key, picked)
        if beam is None and len(new) > max_states:
            return None
        new = _undominated(new)
        if beam is not None and len(new) > (1 if late else beam):
            new = dict(sorted(new.items(), key=lambda kv: (kv[1][0], kv[0]))[: 1 if late else beam])
        history.append(new)
        states = new
        before, now = now, time.perf_counter()
        recent = [*recent[-(_DP_WINDOW - 1):], now - before]
    outputs = set(ix.gout)
    final = [(cost, key) for key, (cost, _, _) in states.items()
             if not key[0] and {v for v, _, _ in key[1]} >= outputs]
    if not final:
        if beam is not None:
            return None
        raise InfeasibleError("no feasible assignment: every combination of choices leaves a value "
                              "without a producer or needs a conversion that does not exist")
    at: _DPKey | None = min(final)[1]
    picked = []
    for step in reversed(history):
        assert at is not None
        _, at, c = step[at]
        if c >= 0:
            picked.append(c)
    return picked


def _dp_hopeless(recent: Sequence[float], steps_left: int, seconds_left: float) -> bool:
    """Whether the median duration of the last steps (a median, so that a garbage collection
    or a busy machine for a moment does not decide) projects past the deadline: give the time
    to the MILP rather than finding out at the deadline."""
    if len(recent) < _DP_WINDOW:
        return False
    return sorted(recent)[len(recent) // 2] * steps_left > seconds_left


def _undominated(states: dict[_DPKey, _DPEntry]) -> dict[_DPKey, _DPEntry]:
    """Drop states that another state with the same pending choices and the same open values
    in the same layouts beats: no more expensive and every conversion it has paid paid too."""
    groups: dict[tuple, list[_DPKey]] = {}
    for key in states:
        groups.setdefault((key[0], tuple((v, s) for v, s, _ in key[1])), []).append(key)
    drop = set()
    for keys in groups.values():
        if len(keys) < 2:
            continue
        for a in keys:
            ca = states[a][0]
            for b in keys:
                if a is b or b in drop:
                    continue
                # distinct keys of one group differ in a mask, so domination is never mutual
                if states[b][0] <= ca and all(mb | ma == mb for (_, _, ma), (_, _, mb) in zip(a[1], b[1])):
                    drop.add(a)
                    break
    return {k: e for k, e in states.items() if k not in drop} if drop else states


def _deliver(ix: _Indexed, v: int, s: int) -> tuple[int, float | None]:
    """(paid mask, cost) of making ``v`` produced in ``s`` available: the graph-output conversion
    is paid at once."""
    mask = 1 << s
    req = ix.gout.get(v)
    if req is None or req == s:
        return mask, 0.0
    return mask | (1 << req), ix.conv(v, s, req)


def _dp_moves(ix: _Indexed, fr: _Frontier, i: int, key: _DPKey, cost: float):
    """Successor states at node ``i``: (key, cost, choice selected here or -1)."""
    pend, opn = key
    owner = next((c for c in pend if i in fr.nodeset[c]), -1)
    if owner >= 0:
        options = [owner]
    else:
        taken = frozenset().union(*(fr.nodeset[c] for c in pend)) if pend else frozenset()
        options = [c for c in fr.starting[i] if not (fr.nodeset[c] & taken)]
    for c in options:
        npend = pend if owner >= 0 else (*pend, c)
        base = cost + (ix.ch_cost[c] if owner < 0 else 0.0)
        values = {v: (s, m) for v, s, m in opn}
        ncost = _dp_read(ix, c, values, base) if fr.read_at[c] == i else base
        if ncost is not None and fr.last[c] == i:
            ncost = _dp_write(ix, fr, c, values, ncost)
            npend = tuple(p for p in npend if p != c)
        if ncost is None:
            continue
        for v in fr.closing[i]:
            values.pop(v, None)
        nopen = tuple(sorted((v, s, m) for v, (s, m) in values.items()))
        yield (tuple(sorted(npend)), nopen), ncost, (c if owner < 0 else -1)


def _dp_read(ix: _Indexed, c: int, values: dict[int, tuple[int, int]], cost: float) -> float | None:
    """Choice ``c`` reads its inputs in the DP, paying each new (value, layout) once; updates
    ``values`` and returns the cost, or None when infeasible."""
    for u, d in ix.ch_in[c]:
        got = values.get(u)
        if got is None:
            return None
        s, m = got
        if not m >> d & 1:
            extra = ix.conv(u, s, d)
            if extra is None:
                return None
            cost += extra
            values[u] = (s, m | 1 << d)
    return cost


def _dp_write(ix: _Indexed, fr: _Frontier, c: int, values: dict[int, tuple[int, int]], cost: float) -> float | None:
    """Choice ``c`` opens its outputs (paying graph-output conversions); None when infeasible."""
    for v, s in ix.ch_out[c]:
        if fr.last_read[v] < 0:
            continue
        if v in values:
            return None
        mask, extra = _deliver(ix, v, s)
        if extra is None:
            return None
        cost += extra
        values[v] = (s, mask)
    return cost


# ------------------------------------------------------------------------------------------
# method 2: integer program (HiGHS)
# ------------------------------------------------------------------------------------------


class _Rows:
    """Sparse constraint rows in COO form."""

    def __init__(self) -> None:
        self.r: list[int] = []
        self.c: list[int] = []
        self.a: list[float] = []
        self.lb: list[float] = []
        self.ub: list[float] = []

    def add(self, terms: Iterable[tuple[int, float]], lb: float, ub: float) -> None:
        row = len(self.lb)
        for col, coef in terms:
            self.r.append(row)
            self.c.append(col)
            self.a.append(coef)
        self.lb.append(lb)
        self.ub.append(ub)


def _milp_model(ix: _Indexed, alive: Sequence[bool]):
    """Objective, integrality, bounds and rows of the strong formulation (module docstring)."""
    xs = [c for c in range(len(ix.choices)) if alive[c]]
    col = {c: i for i, c in enumerate(xs)}
    obj = [ix.ch_cost[c] for c in xs]
    rows = _Rows()

    def new_var(cost: float) -> int:
        obj.append(cost)
        return len(obj) - 1

    for cs in ix.cover:
        rows.add(((col[c], 1.0) for c in cs if alive[c]), 1.0, 1.0)
    for v in range(len(ix.values)):
        prods = [(c, lay) for c, lay in ix.producers[v] if alive[c]]
        if len(prods) > 1 and not set.intersection(*(set(ix.ch_nodes[c]) for c, _ in prods)):
            rows.add(((col[c], 1.0) for c, _ in prods), 0.0, 1.0)
        by_layout: dict[int, list[int]] = {}
        for c, lay in prods:
            by_layout.setdefault(lay, []).append(col[c])
        wanted: dict[int, dict[int, list[int]]] = {}
        for c, d in ix.readers[v]:
            if alive[c]:
                wanted.setdefault(d, {}).setdefault(ix.ch_nodes[c][0], []).append(col[c])
        if v in ix.gout:
            wanted[ix.gout[v]] = {}
        for d, groups in wanted.items():
            _milp_value(ix, rows, new_var, v, d, by_layout, groups)
    return xs, np.array(obj, dtype=float), rows


def _milp_value(ix: _Indexed, rows: _Rows, new_var: Callable[[float], int], v: int, d: int,
                by_layout: Mapping[int, list[int]], groups: Mapping[int, list[int]]) -> None:
    """Rows for one wanted ``(value, layout)``: the wanted indicator and the conversion
    variables ``z`` from each possible source layout."""
    fixed = v in ix.gout and ix.gout[v] == d
    if fixed:
        want_terms: list[tuple[int, float]] = []
        want_lb = 1.0
    elif len(groups) == 1:
        (group,) = groups.values()
        want_terms, want_lb = [(x, -1.0) for x in group], 0.0
    else:
        w = new_var(0.0)
        for group in groups.values():
            rows.add([(w, 1.0)] + [(x, -1.0) for x in group], 0.0, math.inf)
        want_terms, want_lb = [(w, -1.0)], 0.0
    sources = dict.fromkeys(by_layout, False)
    if v in ix.gin:
        sources[ix.gin[v]] = True
    zs = []
    for s, constant in sources.items():
        cost = ix.conv(v, s, d)
        if cost is None:
            continue
        z = new_var(cost)
        zs.append((z, 1.0))
        if not constant:
            rows.add([(z, 1.0)] + [(x, -1.0) for x in by_layout[s]], -math.inf, 0.0)
    rows.add(zs + want_terms, want_lb, math.inf)


def _milp(ix: _Indexed, alive: Sequence[bool], deadline: float) -> tuple[list[int] | None, bool, str]:
    """Solve the integer program, HiGHS getting ``_MILP_TIME_SHARE`` of the time left once the
    model is built: (chosen choices or None, proven optimal, status line)."""
    import scipy.optimize
    from scipy.optimize import Bounds, LinearConstraint
    from scipy.sparse import csr_array

    xs, obj, rows = _milp_model(ix, alive)
    time_limit_s = (deadline - time.perf_counter()) * _MILP_TIME_SHARE
    scale = float(np.max(np.abs(obj))) if obj.size else 0.0
    scale = _MILP_SCALE / scale if scale > 0 else 1.0
    integrality = np.zeros(obj.size)
    integrality[: len(xs)] = 1
    matrix = csr_array((rows.a, (rows.r, rows.c)), shape=(len(rows.lb), obj.size))
    try:
        res = scipy.optimize.milp(
            obj * scale, integrality=integrality, bounds=Bounds(0.0, 1.0),
            constraints=LinearConstraint(matrix, rows.lb, rows.ub),
            options={"time_limit": max(time_limit_s, 1e-3), "mip_rel_gap": 0.0, "presolve": True})
    except Exception as exc:  # HiGHS or scipy failure: the fallback takes over
        return None, False, f"milp raised {type(exc).__name__}: {exc}"
    status = f"milp status {res.status}: {res.message}"
    if res.status == 2:
        raise InfeasibleError(
            "no feasible assignment: every combination of choices covers some node twice, leaves a "
            "value without a producer, or needs a conversion that does not exist (HiGHS: infeasible)")
    if res.x is None:
        return None, False, status
    picked = [c for c, x in zip(xs, res.x[: len(xs)]) if x > 0.5]
    return picked, res.status == 0, status


# ------------------------------------------------------------------------------------------
# incremental state (local search, ties, runner-up)
# ------------------------------------------------------------------------------------------


class _State:
    """An assignment under construction with an incrementally maintained total."""

    def __init__(self, ix: _Indexed, alive: Sequence[bool]) -> None:
        self.ix = ix
        self.alive = alive
        self.owner = [-1] * len(ix.nodes)
        self.chosen: set[int] = set()
        self.prod: list[list[int]] = [[] for _ in ix.values]
        self.want: list[dict[int, int]] = [{} for _ in ix.values]
        self.vcost = [0.0] * len(ix.values)
        self.vbad = [False] * len(ix.values)
        self.cost = 0.0
        self.conv_sum = 0.0
        self.nbad = 0
        self.uncovered = len(ix.nodes)
        for v, lay in ix.gin.items():
            self.prod[v].append(lay)
        for v, lay in ix.gout.items():
            self.want[v][lay] = self.want[v].get(lay, 0) + 1
            self._refresh(v)

    @property
    def total(self) -> float:
        return self.cost + self.conv_sum

    @property
    def score(self) -> tuple[int, float]:
        """(violations, total): lexicographic, so any feasible plan beats an infeasible one."""
        return (self.nbad + self.uncovered, self.total)

    def _refresh(self, v: int) -> None:
        ix = self.ix
        bad, cost = False, 0.0
        wants = [d for d, k in self.want[v].items() if k > 0]
        if wants:
            if len(self.prod[v]) != 1:
                bad = True
            else:
                s = self.prod[v][0]
                for d in wants:
                    c = ix.conv(v, s, d)
                    if c is None:
                        bad = True
                        break
                    cost += c
        elif len(self.prod[v]) > 1:
            bad = True
        if bad:
            cost = 0.0
        self.conv_sum += cost - self.vcost[v]
        self.nbad += int(bad) - int(self.vbad[v])
        self.vcost[v], self.vbad[v] = cost, bad

    def add(self, c: int) -> None:
        ix = self.ix
        self.chosen.add(c)
        for n in ix.ch_nodes[c]:
            if self.owner[n] != -1:
                raise AssertionError("node already covered")
            self.owner[n] = c
        self.uncovered -= len(ix.ch_nodes[c])
        self.cost += ix.ch_cost[c]
        for v, lay in ix.ch_out[c]:
            self.prod[v].append(lay)
            self._refresh(v)
        for v, d in ix.ch_in[c]:
            self.want[v][d] = self.want[v].get(d, 0) + 1
            self._refresh(v)

    def remove(self, c: int) -> None:
        ix = self.ix
        self.chosen.discard(c)
        for n in ix.ch_nodes[c]:
            self.owner[n] = -1
        self.uncovered += len(ix.ch_nodes[c])
        self.cost -= ix.ch_cost[c]
        for v, lay in ix.ch_out[c]:
            self.prod[v].remove(lay)
            self._refresh(v)
        for v, d in ix.ch_in[c]:
            self.want[v][d] -= 1
            self._refresh(v)

    def free(self, c: int) -> bool:
        return all(self.owner[n] == -1 for n in self.ix.ch_nodes[c])

    def fill(self, nodes: Iterable[int]) -> list[int]:
        """Cover each uncovered node of ``nodes`` (in order) greedily: the choice, among those
        whose nodes are all uncovered, with the best (violations, delta / nodes covered)."""
        added = []
        for n in nodes:
            if self.owner[n] != -1:
                continue
            base = self.score
            best: tuple[int, float, int] | None = None
            for c in self.ix.cover[n]:
                if not self.alive[c] or not self.free(c):
                    continue
                self.add(c)
                bad, tot = self.score
                self.remove(c)
                key = (bad - base[0] + len(self.ix.ch_nodes[c]), (tot - base[1]) / len(self.ix.ch_nodes[c]), c)
                if best is None or key < best:
                    best = key
            if best is None:
                continue
            self.add(best[2])
            added.append(best[2])
        return added

    def insert(self, c: int) -> tuple[list[int], list[int]]:
        """Put ``c`` in, take out what it overlaps, re-cover the displaced nodes greedily.
        Returns (removed, added) for :meth:`undo`."""
        ix = self.ix
        removed = sorted({self.owner[n] for n in ix.ch_nodes[c] if self.owner[n] != -1})
        displaced: set[int] = set()
        for r in removed:
            self.remove(r)
            displaced.update(ix.ch_nodes[r])
        self.add(c)
        added = [c, *self.fill(sorted(displaced))]
        return removed, added

    def undo(self, removed: Sequence[int], added: Sequence[int]) -> None:
        for a in reversed(added):
            self.remove(a)
        for r in removed:
            self.add(r)


def _eps(total: float) -> float:
    return _REL_EPS * max(abs(total), 1e-300)


def _improve(state: _State, deadline: float) -> None:
    """Iterated improvement by insert moves until no move improves or the deadline passes."""
    ix = state.ix
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        for c in range(len(ix.choices)):
            if not state.alive[c] or c in state.chosen:
                continue
            before = state.score
            removed, added = state.insert(c)
            after = state.score
            if after[0] < before[0] or (after[0] == before[0] and after[1] < before[1] - _eps(before[1])):
                improved = True
            else:
                state.undo(removed, added)
            if time.perf_counter() >= deadline:
                break


def _fallback(ix: _Indexed, fr: _Frontier, deadline: float,
              seeds: Mapping[str, Sequence[int]]) -> tuple[_State, str]:
    """The best of the ``seeds`` (HiGHS's incumbent, an earlier beam search), a beam-search
    frontier DP (when none was run and the DP's order holds) and the greedy forward pass,
    improved by insert moves until the deadline. Returns (state, which start won)."""
    starts: list[tuple[_State, str]] = []
    for which, picked in seeds.items():
        state = _state(ix, fr.alive, picked)
        state.fill(range(len(ix.nodes)))
        starts.append((state, which))
    if "beam" not in seeds and fr.ok:
        beam = _beam(ix, fr, time.perf_counter() + 0.5 * (deadline - time.perf_counter()))
        if beam is not None:
            starts.append((_state(ix, fr.alive, beam), "beam"))
    greedy = _State(ix, fr.alive)
    greedy.fill(range(len(ix.nodes)))
    starts.append((greedy, "greedy"))
    best, which = min(starts, key=lambda sw: sw[0].score)
    _improve(best, deadline)
    return best, which


def _beam(ix: _Indexed, fr: _Frontier, deadline: float) -> list[int] | None:
    """A beam-search frontier DP as wide as the time to ``deadline`` allows."""
    return _dp(ix, fr, deadline, 0, beam=_beam_width(fr, deadline - time.perf_counter()))


def _beam_width(fr: _Frontier, seconds: float) -> int:
    """Beam width that a DP can afford in ``seconds``: each kept state tries about every choice
    once over the whole graph, at about 15 us a transition."""
    transitions_per_state = len(fr.cs) or 1
    return max(1, min(_BEAM_MAX, int(seconds / (transitions_per_state * 15e-6))))


def _break_ties(state: _State) -> list[tuple[str, str]]:
    """Swap chosen choices for higher-priority ones covering the same nodes when the total does
    not get worse by more than ``max(noise)`` of the pair (module docstring)."""
    ix = state.ix
    same: dict[tuple[int, ...], list[int]] = {}
    for c in range(len(ix.choices)):
        if state.alive[c]:
            same.setdefault(ix.ch_nodes[c], []).append(c)
    swaps = []
    changed = True
    while changed:
        changed = False
        for c in sorted(state.chosen, key=lambda c: ix.ch_nodes[c]):
            if c not in state.chosen:
                continue
            mine = ix.choices[c]
            better = sorted((o for o in same[ix.ch_nodes[c]] if ix.choices[o].priority > mine.priority),
                            key=lambda o: (-ix.choices[o].priority, ix.ch_cost[o], o))
            for o in better:
                before = state.score
                state.remove(c)
                state.add(o)
                after = state.score
                tol = max(mine.noise, ix.choices[o].noise) + _eps(before[1])
                if after[0] <= before[0] and after[1] - before[1] <= tol:
                    swaps.append((mine.id, ix.choices[o].id))
                    changed = True
                    break
                state.remove(o)
                state.add(c)
    return swaps


def _runner_up(state: _State, deadline: float) -> dict[str, tuple[str, float]]:
    """node -> (choice id, total) of the best insert move putting another choice on it."""
    ix = state.ix
    out: dict[int, tuple[float, int]] = {}
    for c in range(len(ix.choices)):
        if not state.alive[c] or c in state.chosen:
            continue
        if time.perf_counter() >= deadline:
            break
        removed, added = state.insert(c)
        bad, total = state.score
        state.undo(removed, added)
        if bad:
            continue
        for n in ix.ch_nodes[c]:
            if n not in out or (total, c) < out[n]:
                out[n] = (total, c)
    return {ix.nodes[n]: (ix.choices[c].id, t) for n, (t, c) in sorted(out.items())}


# ------------------------------------------------------------------------------------------
# entry points
# ------------------------------------------------------------------------------------------


def optimize(
    problem: Problem,
    *,
    time_limit_s: float = 2.0,
    method: str = "auto",
    runner_up: bool = True,
    max_dp_states: int = DP_MAX_STATES,
) -> Solution:
    """Choose one :class:`Choice` per node minimising choice costs plus conversion costs.

    ``method="auto"`` tries the exact frontier DP (up to ``max_dp_states`` states per step and
    75 % of ``time_limit_s``), then the exact MILP (HiGHS) within the time left, then the
    fallback (``optimal=False``); see the module docstring. ``"dp"`` (raises
    :class:`OptimizeError` when the DP does not apply or gives up), ``"milp"`` (still falls back)
    or ``"greedy"`` (the fallback alone) force a method. Ties within noise then go to the higher
    priority. With ``runner_up`` the solution lists, per node, the best alternative found by one
    insert move. Raises :class:`ProblemError` for a malformed problem and
    :class:`InfeasibleError` when no plan exists.

    Example::

        problem = Problem(nodes=["conv"], choices=[
            Choice("Conv.std@conv", ("conv",), (("x", "std"),), (("y", "std"),), cost=2e-3),
            Choice("Conv.blk@conv", ("conv",), (("x", "blk"),), (("y", "blk"),), cost=1e-3)],
            graph_inputs={"x": "std"}, graph_outputs={"y": "std"},
            conversion_cost=lambda value, src, dst: 2e-4)
        optimize(problem).total  # 1e-3 + 2 conversions of 2e-4 = 1.4e-3
    """
    if method not in ("auto", "dp", "milp", "greedy"):
        raise ValueError(f"method must be 'auto', 'dp', 'milp' or 'greedy', received {method!r}")
    t0 = time.perf_counter()
    deadline = t0 + time_limit_s
    ix = _Indexed(problem)
    alive = _prune(ix)
    fr = _Frontier(ix, _cheapest_of_equals(ix, alive))
    picked: Iterable[int] | None = None
    seeds: dict[str, list[int]] = {}
    if method in ("auto", "dp"):
        dp_deadline = t0 + (time_limit_s if method == "dp" else _DP_SHARE * time_limit_s)
        picked = _dp(ix, fr, dp_deadline, max_dp_states)
        used, optimal, status = "dp", True, "optimal (frontier dynamic programming)"
        if picked is None and method == "dp":
            raise OptimizeError(
                "dp does not apply: a producer runs after a reader of its value (fused region), a value "
                f"has producers sharing no node, or the frontier exceeds {max_dp_states} states / the time limit")
        if picked is None and fr.ok:  # too wide for the exact DP: a beam search seeds the fallback
            now = time.perf_counter()
            beam = _beam(ix, fr, now + min(_BEAM_SHARE * time_limit_s, 0.5 * (deadline - now)))
            seeds.update({"beam": beam} if beam is not None else {})
    if picked is None and method == "greedy":
        found, which = _fallback(ix, fr, deadline, seeds)
        picked, used, optimal = found.chosen, "greedy", False
        status = f"fallback requested: {_FALLBACK_NAMES[which]} + insert-move local search"
    elif picked is None:
        picked, used, optimal, status = _solve_milp(ix, fr, deadline, seeds)
    state = _state(ix, alive, picked)
    if state.score[0]:
        raise InfeasibleError(f"no feasible assignment found ({status})")
    swaps = _break_ties(state)
    ranking = _runner_up(state, max(deadline, time.perf_counter() + 0.05 * time_limit_s)) if runner_up else {}
    sol = _solution(ix, state.chosen, used, optimal, status)
    sol.tie_swaps, sol.runner_up = swaps, ranking
    sol.solve_s = time.perf_counter() - t0
    return sol


_FALLBACK_NAMES = {"milp": "HiGHS incumbent", "beam": "beam-search DP", "greedy": "greedy forward pass"}


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


def _state(ix: _Indexed, alive: Sequence[bool], picked: Iterable[int]) -> _State:
    state = _State(ix, alive)
    for c in picked:
        state.add(c)
    return state


def _solve_milp(ix: _Indexed, fr: _Frontier, deadline: float,
                seeds: dict[str, list[int]]) -> tuple[list[int], str, bool, str]:
    """MILP, and the fallback when it fails or stops without a proven optimum:
    (chosen, method, optimal, status)."""
    picked, optimal, status = _milp(ix, fr.alive, deadline)
    if picked is not None and optimal and _state(ix, fr.alive, picked).score[0] == 0:
        return picked, "milp", True, "optimal (HiGHS)"
    if picked is not None:
        seeds = {**seeds, "milp": picked}
    found, which = _fallback(ix, fr, max(deadline, time.perf_counter() + 0.05), seeds)
    used = "milp" if which == "milp" else "greedy"
    return sorted(found.chosen), used, False, f"{status}; fallback: {_FALLBACK_NAMES[which]} + insert-move local search"


def brute_force(problem: Problem) -> Solution:
    """Exhaustive enumeration of every exact cover (tests only). Raises :class:`OptimizeError`
    when the product of the per-node choice counts exceeds :data:`BRUTE_FORCE_LIMIT`, and
    :class:`InfeasibleError` when no assignment is feasible."""
    t0 = time.perf_counter()
    ix = _Indexed(problem)
    bound = math.prod(len(cs) for cs in ix.cover)
    if bound > BRUTE_FORCE_LIMIT:
        raise OptimizeError(f"brute_force: up to {bound} assignments, more than {BRUTE_FORCE_LIMIT}")
    best: tuple[float, list[int]] | None = None
    owner = [-1] * len(ix.nodes)
    picked: list[int] = []

    def visit(n: int) -> None:
        nonlocal best
        while n < len(ix.nodes) and owner[n] != -1:
            n += 1
        if n == len(ix.nodes):
            try:
                total, _ = _evaluate(ix, picked)
            except InfeasibleError:
                return
            if best is None or total < best[0]:
                best = (total, list(picked))
            return
        for c in ix.cover[n]:
            if any(owner[m] != -1 for m in ix.ch_nodes[c]):
                continue
            for m in ix.ch_nodes[c]:
                owner[m] = c
            picked.append(c)
            visit(n + 1)
            picked.pop()
            for m in ix.ch_nodes[c]:
                owner[m] = -1

    visit(0)
    if best is None:
        raise InfeasibleError("brute_force: no feasible assignment")
    sol = _solution(ix, best[1], "brute_force", True, "optimal (exhaustive)")
    sol.solve_s = time.perf_counter() - t0
    return sol


__all__ = [
    "BRUTE_FORCE_LIMIT",
    "DP_MAX_STATES",
    "METHODS",
    "Choice",
    "Conversion",
    "InfeasibleError",
    "OptimizeError",
    "Problem",
    "ProblemError",
    "Solution",
    "brute_force",
    "evaluate",
    "optimize",
]
