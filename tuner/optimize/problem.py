"""The optimiser's public data types and errors: a :class:`Problem` (nodes in topological
order, the :class:`Choice` s that can run them, graph inputs/outputs and their layouts, the
conversion cost callback), the :class:`Solution` it answers with (chosen choices,
:class:`Conversion` s paid, totals, method and status), and the :class:`OptimizeError` family.
The problem and the methods that solve it are described in :mod:`tuner.optimize`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from dispatch.errors import OpDispatchError

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
        priority: higher wins ties (see :mod:`tuner.optimize`).
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
