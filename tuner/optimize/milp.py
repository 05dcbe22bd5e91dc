"""Method 2 of :mod:`tuner.optimize`: the integer program in its strong (facility-location)
form, built as sparse rows (:func:`_milp_model`) and solved by HiGHS through
:func:`scipy.optimize.milp` under a share of the time left (:func:`_milp`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from tuner.optimize.indexed import _Indexed
from tuner.optimize.problem import InfeasibleError

#: the objective is scaled so that its largest coefficient is this big before HiGHS sees it
#: (HiGHS stops at an absolute gap of 1e-6, which must be negligible next to the costs)
_MILP_SCALE = 1e6
#: fraction of the time left that HiGHS may use; the rest is kept for the fallback
_MILP_TIME_SHARE = 0.7


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


def _milp_model(ix: _Indexed, alive: Sequence[bool]) -> tuple[list[int], np.ndarray, _Rows]:
    """Objective, integrality, bounds and rows of the strong formulation (:mod:`tuner.optimize`)."""
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
