"""Method 1 of :mod:`tuner.optimize`: the frontier dynamic programme over the nodes in
topological order (:class:`_Frontier` holds its static tables and says whether it is exact on
a problem; :func:`_dp` runs it, exact or as the fallback's beam search via :func:`_beam`),
with its state domination and pace checks.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from tuner.optimize.indexed import _Indexed
from tuner.optimize.problem import InfeasibleError

#: the frontier DP gives up (and the MILP takes over) when a step has more states than this
DP_MAX_STATES = 5_000
#: steps over which the DP measures its pace
_DP_WINDOW = 16
#: widest beam of the fallback's beam-search DP (the time left usually allows less)
_BEAM_MAX = 256


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

    Exact (``beam=None``): None when not applicable (:mod:`tuner.optimize`), when a step has more
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


def _dp_moves(ix: _Indexed, fr: _Frontier, i: int, key: _DPKey,
              cost: float) -> Iterator[tuple[_DPKey, float, int]]:
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


def _dp_write(ix: _Indexed, fr: _Frontier, c: int, values: dict[int, tuple[int, int]],
              cost: float) -> float | None:
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


def _beam(ix: _Indexed, fr: _Frontier, deadline: float) -> list[int] | None:
    """A beam-search frontier DP as wide as the time to ``deadline`` allows."""
    return _dp(ix, fr, deadline, 0, beam=_beam_width(fr, deadline - time.perf_counter()))


def _beam_width(fr: _Frontier, seconds: float) -> int:
    """Beam width that a DP can afford in ``seconds``: each kept state tries about every choice
    once over the whole graph, at about 15 us a transition."""
    transitions_per_state = len(fr.cs) or 1
    return max(1, min(_BEAM_MAX, int(seconds / (transitions_per_state * 15e-6))))
