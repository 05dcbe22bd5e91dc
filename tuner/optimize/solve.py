"""The entry point :func:`optimize`: checks and prunes the problem, then picks the method
(frontier DP, MILP, fallback) by ``method`` and the time limit, and finishes every answer with
the tie-break and the runner-up scan (see :mod:`tuner.optimize`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from tuner.optimize.dp import DP_MAX_STATES, _beam, _dp, _Frontier
from tuner.optimize.indexed import _cheapest_of_equals, _Indexed, _prune, _solution
from tuner.optimize.local import _break_ties, _fallback, _runner_up, _state
from tuner.optimize.milp import _milp
from tuner.optimize.problem import InfeasibleError, OptimizeError, Problem, Solution

#: share of the time limit for the exact DP (it gives up early when its pace projects past it)
_DP_SHARE = 0.75
#: share of the time limit (at most half of what is left) for the beam search run when the
#: exact DP is too wide
_BEAM_SHARE = 0.25


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
    fallback (``optimal=False``); see :mod:`tuner.optimize`. ``"dp"`` (raises
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
                "dp does not apply: a producer runs after a reader of its value (fused region), "
                f"a value has producers sharing no node, or the frontier exceeds {max_dp_states} states "
                "/ the time limit")
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
    return (sorted(found.chosen), used, False,
            f"{status}; fallback: {_FALLBACK_NAMES[which]} + insert-move local search")
