"""The graph-level optimiser (tuner/optimize/) on generated 1,000-node ResNet-like DAGs.

The problems are FAKE: made-up costs from a seeded generator (no measurement), shaped like a
deep residual network: blocks of conv -> relu -> conv -> add(block input) -> relu, a projection
conv on the skip path every 8 blocks, three layouts (std, nhwc, blk16; no direct nhwc -> blk16
converter), 3-4 single-node choices per node plus fused Conv+Relu and Add+Relu pairs in two
layouts (about 4.2 choices per node, 5 on the fusable ones). The issue's goal: under 2 s.

    python -m pytest bench/test_bench_optimize.py --benchmark-enable -q

``default`` is ``optimize()`` as the tuner calls it (the frontier DP proves the optimum on
these graphs); ``milp`` forces the integer-program path (``max_dp_states=0``), which is what a
DAG too wide for the DP gets. Times, methods and totals land in ``extra_info``.
"""

from __future__ import annotations

import numpy as np
import pytest

from tuner.optimize import Choice, Problem, optimize

LAYOUTS = ("std", "nhwc", "blk16")
CONVERSION = {("std", "nhwc"): 0.3, ("nhwc", "std"): 0.3, ("std", "blk16"): 0.5,
              ("blk16", "std"): 0.4, ("blk16", "nhwc"): 0.6, ("nhwc", "blk16"): None}


class _ResNetLike:
    """Builds the FAKE problem node by node (see the module docstring)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[str] = []
        self.choices: list[Choice] = []
        self.by_id: dict[str, Choice] = {}
        self.size: dict[str, float] = {"x": 1.0}

    def node(self, name: str, op: str, ins: list[str], out: str, size: float) -> None:
        self.nodes.append(name)
        self.size[out] = size
        base = float(self.rng.uniform(1.0, 3.0)) * size * (4.0 if op == "Conv" else 0.3)
        speed = {"std": 1.0, "nhwc": float(self.rng.uniform(0.6, 1.2)),
                 "blk16": float(self.rng.uniform(0.4, 1.1))}
        for lay in LAYOUTS:
            self.add(Choice(f"{op}.{lay}@{name}", (name,), tuple((i, lay) for i in ins), ((out, lay),),
                            base * speed[lay], priority=1 if lay == "std" else 0, noise=0.02 * base))
        if op == "Conv":  # a second standard-layout implementation (another backend)
            self.add(Choice(f"{op}.std_alt@{name}", (name,), tuple((i, "std") for i in ins), ((out, "std"),),
                            base * float(self.rng.uniform(0.8, 1.3)), priority=2, noise=0.02 * base))

    def fused(self, first: str, second: str, ins: list[str], out: str, tag: str) -> None:
        for lay in ("blk16", "nhwc"):
            parts = self.by_id[f"{'Conv' if tag == 'ConvRelu' else 'Add'}.{lay}@{first}"].cost
            parts += self.by_id[f"Relu.{lay}@{second}"].cost
            self.add(Choice(f"{tag}.{lay}@{first}+{second}", (first, second), tuple((i, lay) for i in ins),
                            ((out, lay),), parts * float(self.rng.uniform(0.6, 0.95)), noise=0.02 * parts))

    def add(self, choice: Choice) -> None:
        self.choices.append(choice)
        self.by_id[choice.id] = choice

    def conversion_cost(self, value: str, src: str, dst: str) -> float | None:
        k = CONVERSION[(src, dst)]
        return None if k is None else k * self.size[value]


def resnet_like(n_nodes: int = 1000, seed: int = 0) -> Problem:
    """A FAKE ResNet-like problem with about ``n_nodes`` nodes (see the module docstring)."""
    g = _ResNetLike(seed)
    g.node("stem", "Conv", ["x"], "stem", 1.0)
    cur, size, b = "stem", 1.0, 0
    while len(g.nodes) < n_nodes - 6:
        p, down = f"b{b}", b % 8 == 0 and b > 0
        size = size * 0.5 if down else size
        g.node(f"{p}.conv1", "Conv", [cur], f"{p}.c1", size)
        g.node(f"{p}.relu1", "Relu", [f"{p}.c1"], f"{p}.r1", size)
        g.fused(f"{p}.conv1", f"{p}.relu1", [cur], f"{p}.r1", "ConvRelu")
        g.node(f"{p}.conv2", "Conv", [f"{p}.r1"], f"{p}.c2", size)
        skip = cur
        if down:
            g.node(f"{p}.proj", "Conv", [cur], f"{p}.pj", size)
            skip = f"{p}.pj"
        g.node(f"{p}.add", "Add", [f"{p}.c2", skip], f"{p}.a", size)
        g.node(f"{p}.relu2", "Relu", [f"{p}.a"], f"{p}.out", size)
        g.fused(f"{p}.add", f"{p}.relu2", [f"{p}.c2", skip], f"{p}.out", "AddRelu")
        cur, b = f"{p}.out", b + 1
    return Problem(nodes=g.nodes, choices=g.choices, graph_inputs={"x": "std"},
                   graph_outputs={cur: "std"}, conversion_cost=g.conversion_cost)


@pytest.mark.parametrize("path", ["default", "milp"])
@pytest.mark.parametrize("seed", [0, 1])
def test_optimize_1000_nodes(benchmark, path, seed):
    problem = resnet_like(1000, seed)
    kwargs = {"max_dp_states": 0} if path == "milp" else {}
    solutions = []

    def run():
        solutions.append(optimize(problem, **kwargs))

    benchmark.group = "optimize 1000-node resnet-like"
    benchmark.pedantic(run, warmup_rounds=1, rounds=5, iterations=1)
    last = solutions[-1]
    benchmark.extra_info.update({
        "nodes": len(problem.nodes), "choices": len(problem.choices), "method": last.method,
        "optimal": last.optimal, "total": last.total, "conversions": len(last.conversions),
        "tie_swaps": len(last.tie_swaps), "solve_s": [round(s.solve_s, 4) for s in solutions],
        "status": last.status,
    })
    assert len({round(s.total, 9) for s in solutions if s.optimal}) <= 1  # proven optima agree
