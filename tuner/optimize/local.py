"""The incremental assignment state (:class:`_State`: a plan under construction whose total
and violations are kept up to date as choices go in and out) and the local searches built on
it: the fallback of :mod:`tuner.optimize` (best of the seeds, a beam search and a greedy
forward pass, improved by insert moves), the tie-break to higher-priority choices within noise
and the per-node runner-up scan.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence

from tuner.optimize.dp import _beam, _Frontier
from tuner.optimize.indexed import _Indexed

#: relative tolerance below which two totals count as equal (float rounding, not noise)
_REL_EPS = 1e-12


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
                key = (bad - base[0] + len(self.ix.ch_nodes[c]),
                       (tot - base[1]) / len(self.ix.ch_nodes[c]), c)
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


def _break_ties(state: _State) -> list[tuple[str, str]]:
    """Swap chosen choices for higher-priority ones covering the same nodes when the total does
    not get worse by more than ``max(noise)`` of the pair (:mod:`tuner.optimize`)."""
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


def _state(ix: _Indexed, alive: Sequence[bool], picked: Iterable[int]) -> _State:
    state = _State(ix, alive)
    for c in picked:
        state.add(c)
    return state
