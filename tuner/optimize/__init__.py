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

Modules
-------
:mod:`~tuner.optimize.problem` (data types and errors), :mod:`~tuner.optimize.indexed` (the
checked indexed form, evaluation, pruning), :mod:`~tuner.optimize.dp` (method 1 and the beam
search), :mod:`~tuner.optimize.milp` (method 2), :mod:`~tuner.optimize.local` (the fallback,
ties, runner-up), :mod:`~tuner.optimize.solve` (:func:`optimize`); :func:`brute_force` lives
here, so that tests can lower :data:`BRUTE_FORCE_LIMIT` on this package.
"""

from __future__ import annotations

import math
import time

from tuner.optimize.dp import DP_MAX_STATES
from tuner.optimize.indexed import _evaluate, _Indexed, _solution, evaluate
from tuner.optimize.problem import (
    METHODS,
    Choice,
    Conversion,
    ConversionCost,
    InfeasibleError,
    OptimizeError,
    Problem,
    ProblemError,
    Solution,
)
from tuner.optimize.solve import optimize

#: brute_force refuses problems with more candidate assignments than this
BRUTE_FORCE_LIMIT = 1_000_000


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
    "ConversionCost",
    "InfeasibleError",
    "OptimizeError",
    "Problem",
    "ProblemError",
    "Solution",
    "brute_force",
    "evaluate",
    "optimize",
]
