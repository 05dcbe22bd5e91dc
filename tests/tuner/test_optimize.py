"""The conversion-aware graph optimiser (tuner/optimize.py) against brute-force enumeration.

Every problem here comes from a FAKE problem generator: made-up graphs (chains, in-trees, DAGs
with multi-consumer values, multi-output nodes, fused pairs, fused regions exposing an inner
value) with deterministic made-up costs drawn by hypothesis or written by hand. Nothing is
measured; there are no timing assertions.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import tuner.optimize as opt
from tuner.optimize import (
    Choice,
    InfeasibleError,
    OptimizeError,
    Problem,
    ProblemError,
    Solution,
    brute_force,
    evaluate,
    optimize,
)

LAYOUTS = ("std", "a", "b", "c")
TOL = 1e-9

# ------------------------------------------------------------------------------------------
# FAKE problem generator
# ------------------------------------------------------------------------------------------


def _conversion_table(draw, layouts):
    """(src, dst) -> base cost or None (impossible); std <-> anything always exists, as in the
    layout registry, other direct pairs may be missing."""
    table = {}
    for s in layouts:
        for d in layouts:
            if s == d:
                continue
            through_std = "std" in (s, d)
            if not through_std and draw(st.booleans()):
                table[(s, d)] = None
            elif draw(st.integers(0, 9)) == 0:
                table[(s, d)] = None  # occasionally even a std converter is missing
            else:
                table[(s, d)] = draw(st.integers(1, 8)) / 4
    return table


def _conversion_cost(table, size):
    def cost(value: str, src: str, dst: str) -> float | None:
        base = table[(src, dst)]
        return None if base is None else base * size[value]
    return cost


@st.composite
def fake_problems(draw, shape: str, max_nodes: int = 6, fused: bool = True):
    """A FAKE problem: ``shape`` is "chain", "tree" (every value read by at most one node) or
    "dag" (values with several readers, residual joins, multi-output nodes, fused regions that
    expose an inner value). Costs are small multiples of 1/4 so exact ties happen."""
    n = draw(st.integers(1, max_nodes))
    layouts = LAYOUTS[: draw(st.integers(2, 4))]
    size = {"x0": 1.0}
    graph_inputs = {"x0": "std"}
    readers: dict[str, list[int]] = {"x0": []}
    node_inputs, node_outputs = [], []
    open_values = ["x0"]  # tree: values nobody reads yet
    for i in range(n):
        if shape == "chain":
            ins = [node_outputs[-1][0] if i else "x0"]
        elif shape == "tree":
            k = draw(st.integers(1, 2))
            ins = []
            for _ in range(k):
                if not open_values or draw(st.integers(0, 4)) == 0:
                    x = f"x{len(graph_inputs)}"
                    graph_inputs[x], size[x], readers[x] = "std", 1.0, []
                    open_values.append(x)
                ins.append(open_values.pop(draw(st.integers(0, len(open_values) - 1))))
        else:
            pool = sorted(readers)
            ins = sorted(set(draw(st.lists(st.sampled_from(pool), min_size=1, max_size=2))))
        outs = [f"v{i}"]
        if shape == "dag" and draw(st.integers(0, 5)) == 0:
            outs.append(f"v{i}b")
        for v in outs:
            size[v] = draw(st.integers(1, 4)) / 2
            readers[v] = []
            open_values.append(v)
        for v in ins:
            readers[v].append(i)
        node_inputs.append(ins)
        node_outputs.append(outs)
    if shape == "tree":
        graph_outputs = {v: "std" for v in open_values if v.startswith("v")}
    else:
        graph_outputs = {node_outputs[-1][0]: draw(st.sampled_from(layouts))}
        if shape == "dag":
            for v in draw(st.lists(st.sampled_from(sorted(size)), max_size=2)):
                if v.startswith("v"):
                    graph_outputs[v] = "std"
    nodes = [f"n{i}" for i in range(n)]
    choices: list[Choice] = []
    for i in range(n):
        for k in range(draw(st.integers(1, 3))):
            choices.append(Choice(
                id=f"n{i}.impl{k}", nodes=(nodes[i],),
                inputs=tuple((v, draw(st.sampled_from(layouts))) for v in node_inputs[i]),
                outputs=tuple((v, draw(st.sampled_from(layouts))) for v in node_outputs[i]),
                cost=draw(st.integers(0, 12)) / 4, priority=draw(st.integers(0, 2))))
    if fused:
        choices += _fused_pairs(draw, nodes, node_inputs, node_outputs, readers, graph_outputs,
                                layouts, shape)
    table = _conversion_table(draw, layouts)
    return Problem(nodes=nodes, choices=choices, graph_inputs=graph_inputs,
                   graph_outputs=graph_outputs, conversion_cost=_conversion_cost(table, size))


def _fused_pairs(draw, nodes, node_inputs, node_outputs, readers, graph_outputs, layouts, shape):
    """Fused choices over (i, j) where j reads i's first output. The region exposes i's outputs
    that another node reads or that are graph outputs (DAGs only; chains and trees hide the
    inner value). Regions with a path i -> k -> j outside them (not convex) are not generated."""
    producer = {v: i for i, outs in enumerate(node_outputs) for v in outs}
    ancestors: list[set[int]] = []
    for j in range(len(nodes)):
        anc = set()
        for v in node_inputs[j]:
            if v in producer:
                anc |= {producer[v]} | ancestors[producer[v]]
        ancestors.append(anc)
    out = []
    for i in range(len(nodes)):
        inner = node_outputs[i][0]
        for j in sorted(set(readers[inner])):
            others = {r for v in node_outputs[i] for r in readers[v] if r != j}
            visible = [v for v in node_outputs[i]
                       if any(r != j for r in readers[v]) or v in graph_outputs]
            if others & ancestors[j] or (inner in visible and shape != "dag") or not draw(st.booleans()):
                continue
            lay = draw(st.sampled_from(layouts))
            ins = [*node_inputs[i], *(v for v in node_inputs[j] if v not in node_outputs[i])]
            outs = [*node_outputs[j], *visible]
            out.append(Choice(
                id=f"fused.n{i}+n{j}", nodes=(nodes[i], nodes[j]),
                inputs=tuple((v, lay) for v in dict.fromkeys(ins)),
                outputs=tuple((v, lay) for v in dict.fromkeys(outs)),
                cost=draw(st.integers(0, 16)) / 4, priority=draw(st.integers(0, 2))))
    return out


# ------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------


def assert_valid(problem: Problem, sol: Solution) -> None:
    """The solution covers every node once with the problem's choices, and its total and
    conversions are what evaluate() computes for its choices."""
    assert set(sol.choices) == set(problem.nodes)
    for node, c in sol.choices.items():
        assert node in c.nodes
        assert c in problem.choices
    total, conversions = evaluate(problem, sol.chosen)
    assert math.isclose(total, sol.total, rel_tol=0, abs_tol=TOL)
    assert sorted(conversions) == sorted(sol.conversions)
    assert len({(c.value, c.dst) for c in sol.conversions}) == len(sol.conversions)


#: a time limit no small problem reaches, even on a loaded machine: the default (2 s) is a
#: production budget, and a test must not turn into a timing assertion under CPU contention
GENEROUS_S = 120.0


def check_against_brute_force(problem: Problem, **kw) -> Solution | None:
    kw.setdefault("time_limit_s", GENEROUS_S)
    try:
        expect = brute_force(problem)
    except InfeasibleError:
        with pytest.raises(InfeasibleError):
            optimize(problem, **kw)
        return None
    sol = optimize(problem, **kw)
    assert_valid(problem, sol)
    assert sol.optimal
    assert sol.total == pytest.approx(expect.total, abs=TOL, rel=0)
    return sol


SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    derandomize=True)


def std_problem(nodes, choices, outputs, conv=None, inputs=None):
    """A hand-written FAKE problem: graph input x in std, outputs required in std."""
    return Problem(nodes=list(nodes), choices=list(choices), graph_inputs=inputs or {"x": "std"},
                   graph_outputs=dict.fromkeys(outputs, "std"),
                   conversion_cost=conv or (lambda v, s, d: 1.0))


def ch(cid, nodes, ins, outs, cost, priority=0, noise=0.0):
    return Choice(cid, tuple(nodes), tuple(ins), tuple(outs), cost, priority, noise)


# ------------------------------------------------------------------------------------------
# property tests against brute force
# ------------------------------------------------------------------------------------------


@SETTINGS
@given(fake_problems("chain"), st.sampled_from(["auto", "milp"]))
def test_chains_match_brute_force(problem, method):
    sol = check_against_brute_force(problem, method=method)
    if sol is not None and method == "auto":
        assert sol.method == "dp"


@SETTINGS
@given(fake_problems("tree"), st.sampled_from(["auto", "milp"]))
def test_trees_match_brute_force(problem, method):
    sol = check_against_brute_force(problem, method=method)
    if sol is not None and method == "auto":
        assert sol.method == "dp"


@settings(SETTINGS, max_examples=250)
@given(fake_problems("dag"), st.sampled_from(["auto", "milp"]))
def test_dags_match_brute_force(problem, method):
    sol = check_against_brute_force(problem, method=method)
    if sol is not None:
        assert sol.method in ("dp", "milp")


@SETTINGS
@given(fake_problems("dag"))
def test_dp_and_milp_agree_when_the_dp_applies(problem):
    try:
        dp = optimize(problem, method="dp", time_limit_s=GENEROUS_S)
    except OptimizeError:
        assume(False)
        return
    milp = optimize(problem, method="milp", time_limit_s=GENEROUS_S)
    assert dp.method == "dp" and milp.method == "milp"
    assert dp.total == pytest.approx(milp.total, abs=TOL, rel=0)


@SETTINGS
@given(fake_problems("dag"))
def test_fallback_gives_a_valid_plan_no_better_than_the_optimum(problem):
    try:
        expect = brute_force(problem)
    except InfeasibleError:
        assume(False)
        return
    try:
        sol = optimize(problem, method="greedy")
    except InfeasibleError:
        return  # a heuristic may miss a feasible plan when conversions are missing
    assert_valid(problem, sol)
    assert sol.method == "greedy" and not sol.optimal
    assert sol.total >= expect.total - TOL


def test_dp_and_milp_agree_on_long_chains():
    """A 60-node FAKE chain (too long for brute force) with fused pairs."""
    layouts = ("std", "a", "b")
    nodes = [f"n{i}" for i in range(60)]
    choices = []
    for i, node in enumerate(nodes):
        src = f"v{i - 1}" if i else "x"
        for k, lay in enumerate(layouts):
            choices.append(ch(f"{node}.{lay}", [node], [(src, lay)], [(f"v{i}", lay)],
                              1 + (i * 7 + k * 3) % 5 / 2))
        if i and i % 3 == 0:
            choices.append(ch(f"f{i}", [nodes[i - 1], node], [(f"v{i - 2}" if i > 1 else "x", "a")],
                              [(f"v{i}", "a")], 2.5))
    conv = lambda v, s, d: None if (s, d) == ("a", "b") else 0.5 + int(v[1:] or 0) % 3 / 4  # noqa: E731
    problem = std_problem(nodes, choices, [f"v{len(nodes) - 1}"], conv)
    dp = optimize(problem, method="dp", time_limit_s=GENEROUS_S)
    milp = optimize(problem, method="milp", time_limit_s=GENEROUS_S)
    assert dp.method == "dp" and milp.method == "milp" and milp.optimal
    assert dp.total == pytest.approx(milp.total, abs=TOL, rel=0)
    assert_valid(problem, dp)
    assert_valid(problem, milp)


def test_frontier_cap_hands_over_to_the_milp():
    problem = _diamond_problem()
    sol = optimize(problem, max_dp_states=0)
    assert sol.method == "milp" and sol.optimal
    assert sol.total == pytest.approx(brute_force(problem).total)


# ------------------------------------------------------------------------------------------
# conversions
# ------------------------------------------------------------------------------------------


def _diamond_problem(consumer_layouts=("std", "std")):
    """x -> p (only in "blk") -> two readers r1, r2 (only in the given layouts) -> join."""
    conv = {("blk", "std"): 3.0, ("std", "blk"): 3.0, ("blk", "nhwc"): 2.0, ("nhwc", "std"): 1.0,
            ("std", "nhwc"): 1.0, ("nhwc", "blk"): None}
    choices = [
        ch("p.blk", ["p"], [("x", "blk")], [("v", "blk")], 1.0),
        ch("r1", ["r1"], [("v", consumer_layouts[0])], [("a", "std")], 1.0),
        ch("r2", ["r2"], [("v", consumer_layouts[1])], [("b", "std")], 1.0),
        ch("join", ["join"], [("a", "std"), ("b", "std")], [("y", "std")], 1.0),
    ]
    return std_problem(["p", "r1", "r2", "join"], choices, ["y"], lambda v, s, d: conv[(s, d)])


@pytest.mark.parametrize("method", ["auto", "milp", "greedy"])
def test_a_conversion_shared_by_two_readers_is_paid_once(method):
    problem = _diamond_problem()
    sol = optimize(problem, method=method)
    # x std->blk (3) once, v blk->std (3) once although r1 and r2 both read it
    assert sorted(sol.conversions) == [("v", "blk", "std", 3.0), ("x", "std", "blk", 3.0)]
    assert sol.total == pytest.approx(4 * 1.0 + 3.0 + 3.0)
    assert brute_force(problem).total == pytest.approx(sol.total)


@pytest.mark.parametrize("method", ["auto", "milp"])
def test_readers_wanting_different_layouts_pay_one_conversion_each(method):
    sol = optimize(_diamond_problem(("std", "nhwc")), method=method)
    assert sorted((c.value, c.dst) for c in sol.conversions) == [("v", "nhwc"), ("v", "std"), ("x", "blk")]
    assert sol.total == pytest.approx(4.0 + 3.0 + 3.0 + 2.0)


@pytest.mark.parametrize("method", ["auto", "milp"])
def test_graph_output_is_delivered_in_the_required_layout(method):
    choices = [ch("fast", ["n"], [("x", "std")], [("y", "blk")], 1.0),
               ch("slow", ["n"], [("x", "std")], [("y", "std")], 2.5)]
    conv = lambda v, s, d: 1.0 if (s, d) == ("blk", "std") else None  # noqa: E731
    sol = optimize(std_problem(["n"], choices, ["y"], conv), method=method)
    assert sol.choices["n"].id == "fast" and sol.conversions == [("y", "blk", "std", 1.0)]
    assert sol.total == 2.0


def test_a_conversion_avoided_by_a_slower_choice():
    """The per-node cheapest plan converts twice; the optimum stays in one layout."""
    choices = [ch("a.std", ["a"], [("x", "std")], [("v", "std")], 1.0),
               ch("a.blk", ["a"], [("x", "blk")], [("v", "blk")], 0.5),
               ch("b.std", ["b"], [("v", "std")], [("y", "std")], 1.0),
               ch("b.blk", ["b"], [("v", "blk")], [("y", "blk")], 0.9)]
    sol = optimize(std_problem(["a", "b"], choices, ["y"], lambda v, s, d: 1.0))
    assert [c.id for c in sol.chosen] == ["a.std", "b.std"] and sol.conversions == []


def test_fused_choice_covers_its_nodes_once():
    choices = [ch("a", ["a"], [("x", "std")], [("v", "std")], 1.0),
               ch("b", ["b"], [("v", "std")], [("y", "std")], 1.0),
               ch("ab", ["a", "b"], [("x", "std")], [("y", "std")], 1.5)]
    problem = std_problem(["a", "b"], choices, ["y"])
    for method in ("auto", "milp", "greedy"):
        sol = optimize(problem, method=method)
        assert sol.choices["a"].id == sol.choices["b"].id == "ab"
        assert [c.id for c in sol.chosen] == ["ab"] and sol.total == 1.5


def test_fused_region_that_hides_a_value_another_node_reads_is_not_chosen():
    """ab hides v, but c reads v: taking ab would leave c without its input."""
    choices = [ch("a", ["a"], [("x", "std")], [("v", "std")], 1.0),
               ch("b", ["b"], [("v", "std")], [("w", "std")], 1.0),
               ch("ab", ["a", "b"], [("x", "std")], [("w", "std")], 0.1),
               ch("c", ["c"], [("v", "std"), ("w", "std")], [("y", "std")], 1.0)]
    problem = std_problem(["a", "b", "c"], choices, ["y"])
    for method in ("auto", "milp", "greedy"):
        sol = optimize(problem, method=method)
        assert [c.id for c in sol.chosen] == ["a", "b", "c"]


def test_region_exposing_an_inner_value_read_before_it_ends_uses_the_milp():
    """Fused {a, c} exposes v, which b reads; b sits between a and c in the node order, so the
    DP's order does not hold and the MILP decides (the plan is still executable: b after ac)."""
    choices = [ch("a", ["a"], [("x", "std")], [("v", "std")], 2.0),
               ch("b", ["b"], [("v", "std")], [("u", "std")], 1.0),
               ch("c", ["c"], [("v", "std")], [("w", "std")], 2.0),
               ch("ac", ["a", "c"], [("x", "std")], [("v", "std"), ("w", "std")], 1.0),
               ch("d", ["d"], [("u", "std"), ("w", "std")], [("y", "std")], 1.0)]
    problem = std_problem(["a", "b", "c", "d"], choices, ["y"])
    with pytest.raises(OptimizeError, match="dp does not apply"):
        optimize(problem, method="dp")
    sol = optimize(problem)
    assert sol.method == "milp" and [c.id for c in sol.chosen] == ["ac", "b", "d"]
    assert sol.total == pytest.approx(brute_force(problem).total)


# ------------------------------------------------------------------------------------------
# ties within noise
# ------------------------------------------------------------------------------------------


def _tie_problem(fast_noise, slow_noise, slow_cost=1.01, slow_layout="std"):
    choices = [ch("fast", ["n"], [("x", "std")], [("y", "std")], 1.0, priority=0, noise=fast_noise),
               ch("pref", ["n"], [("x", slow_layout)], [("y", "std")], slow_cost, priority=5,
                  noise=slow_noise)]
    return std_problem(["n"], choices, ["y"], lambda v, s, d: 0.5)


@pytest.mark.parametrize("method", ["auto", "milp", "greedy"])
def test_tie_within_noise_goes_to_the_higher_priority(method):
    sol = optimize(_tie_problem(0.02, 0.0), method=method)
    assert sol.choices["n"].id == "pref"
    assert sol.tie_swaps == [("fast", "pref")]
    assert sol.total == pytest.approx(1.01)


def test_difference_beyond_noise_keeps_the_cheaper():
    sol = optimize(_tie_problem(0.001, 0.002))
    assert sol.choices["n"].id == "fast" and sol.tie_swaps == []


def test_exact_tie_goes_to_the_higher_priority():
    sol = optimize(_tie_problem(0.0, 0.0, slow_cost=1.0))
    assert sol.choices["n"].id == "pref"


def test_tie_break_counts_the_conversions_a_swap_forces():
    """pref is within noise on its own cost but needs x in "blk": +0.5 of conversion."""
    sol = optimize(_tie_problem(0.02, 0.02, slow_layout="blk"))
    assert sol.choices["n"].id == "fast" and sol.tie_swaps == []


def test_tie_break_on_a_chain_keeps_the_total_within_the_noise():
    nodes = [f"n{i}" for i in range(5)]
    choices = []
    for i, node in enumerate(nodes):
        src = f"v{i - 1}" if i else "x"
        choices.append(ch(f"{node}.fast", [node], [(src, "std")], [(f"v{i}", "std")], 1.0, 0, 0.05))
        choices.append(ch(f"{node}.pref", [node], [(src, "std")], [(f"v{i}", "std")], 1.03, 1, 0.05))
    sol = optimize(std_problem(nodes, choices, ["v4"]))
    assert all(c.id.endswith(".pref") for c in sol.chosen)
    assert sol.total <= 5.0 + 5 * 0.05


# ------------------------------------------------------------------------------------------
# fallback
# ------------------------------------------------------------------------------------------


def _fake_dag(n=30):
    """A FAKE residual DAG: blocks of conv -> relu -> add(block input) in three layouts."""
    layouts = ("std", "a", "b")
    nodes, choices = [], []
    cur = "x"
    for i in range(n):
        kind = ("conv", "relu", "add")[i % 3]
        node, out = f"{kind}{i}", f"v{i}"
        ins = [cur] if kind != "add" else [cur, f"v{i - 3}" if i >= 3 else "x"]
        for k, lay in enumerate(layouts):
            choices.append(ch(f"{node}.{lay}", [node], [(v, lay) for v in dict.fromkeys(ins)], [(out, lay)],
                              1 + ((i * 5 + k * 7) % 11) / 5))
        nodes.append(node)
        cur = out
    conv = lambda v, s, d: None if (s, d) == ("a", "b") else 0.4 + (len(v) % 3) / 5  # noqa: E731
    return std_problem(nodes, choices, [cur], conv)


def test_fallback_when_the_milp_raises(monkeypatch):
    import scipy.optimize

    def broken(*args, **kwargs):
        raise RuntimeError("HiGHS crashed (simulated)")

    monkeypatch.setattr(scipy.optimize, "milp", broken)
    problem = _fake_dag()
    sol = optimize(problem, method="milp")
    assert_valid(problem, sol)
    assert sol.method == "greedy" and sol.optimal is False
    assert "milp raised RuntimeError" in sol.status
    monkeypatch.undo()
    assert sol.total >= optimize(problem, method="milp").total - TOL


def test_fallback_polishes_the_milp_incumbent_at_the_time_limit(monkeypatch):
    """HiGHS stops at its time limit with a feasible incumbent: the answer is valid, flagged not
    optimal, and at least as good as the incumbent."""
    import scipy.optimize

    problem = _fake_dag()
    real = scipy.optimize.milp

    def slow(c, *args, **kwargs):
        res = real(c, *args, **kwargs)
        res.status, res.message = 1, "Time limit reached. (simulated)"
        return res

    monkeypatch.setattr(scipy.optimize, "milp", slow)
    sol = optimize(problem, method="milp")
    assert_valid(problem, sol)
    assert sol.optimal is False and "Time limit reached" in sol.status
    monkeypatch.undo()
    assert sol.total == pytest.approx(optimize(problem, method="milp").total, abs=TOL)


def test_tiny_time_limit_still_gives_a_valid_plan():
    problem = _fake_dag(60)
    sol = optimize(problem, time_limit_s=1e-6, max_dp_states=0)
    assert_valid(problem, sol)
    if not sol.optimal:
        assert sol.method in ("milp", "greedy")


# ------------------------------------------------------------------------------------------
# errors
# ------------------------------------------------------------------------------------------


def test_uncovered_node_is_an_error():
    problem = std_problem(["a", "b"], [ch("a", ["a"], [("x", "std")], [("y", "std")], 1.0)], ["y"])
    with pytest.raises(ProblemError, match=r"no choice covers node\(s\) \['b'\]"):
        optimize(problem)


def test_choice_naming_an_unknown_node_is_an_error():
    problem = std_problem(["a"], [ch("a", ["a", "ghost"], [("x", "std")], [("y", "std")], 1.0)], ["y"])
    with pytest.raises(ProblemError, match=r"'a' names unknown node\(s\) \['ghost'\]; known nodes: a"):
        optimize(problem)


def test_duplicate_choice_id_is_an_error():
    c = ch("a", ["a"], [("x", "std")], [("y", "std")], 1.0)
    with pytest.raises(ProblemError, match="used twice"):
        optimize(std_problem(["a"], [c, replace(c, cost=2.0)], ["y"]))


def test_value_read_but_never_produced_is_an_error():
    problem = std_problem(["a"], [ch("a", ["a"], [("ghost", "std")], [("y", "std")], 1.0)], ["y"])
    with pytest.raises(ProblemError, match="'ghost' is read by .* no choice produces it"):
        optimize(problem)


def test_malformed_choices_are_errors():
    own = ch("a", ["a"], [("y", "std")], [("y", "std")], 1.0)
    with pytest.raises(ProblemError, match="reads its own output 'y'"):
        optimize(std_problem(["a"], [own], ["y"]))
    twice = ch("a", ["a"], [("x", "std")], [("y", "std"), ("y", "blk")], 1.0)
    with pytest.raises(ProblemError, match="lists output 'y' twice"):
        optimize(std_problem(["a"], [twice], ["y"]))
    with pytest.raises(ProblemError, match="listed twice"):
        optimize(std_problem(["a", "a"], [ch("a", ["a"], [("x", "std")], [("y", "std")], 1.0)], ["y"]))
    produced_input = ch("a", ["a"], [], [("x", "std")], 1.0)
    with pytest.raises(ProblemError, match="'x' is a graph input but choices"):
        optimize(std_problem(["a"], [produced_input], ["x"]))


def test_bad_costs_are_errors():
    with pytest.raises(ProblemError, match="must be finite"):
        optimize(std_problem(["a"], [ch("a", ["a"], [("x", "std")], [("y", "std")], math.nan)], ["y"]))
    problem = std_problem(["a"], [ch("a", ["a"], [("x", "blk")], [("y", "std")], 1.0)], ["y"],
                          lambda v, s, d: -1.0)
    with pytest.raises(ProblemError, match="negative"):
        optimize(problem)


def test_infeasible_conversion_names_the_value_and_layouts():
    choices = [ch("a", ["a"], [("x", "std")], [("v", "blk")], 1.0),
               ch("b", ["b"], [("v", "nhwc")], [("y", "std")], 1.0)]
    conv = lambda v, s, d: None if (s, d) == ("blk", "nhwc") else 1.0  # noqa: E731
    with pytest.raises(InfeasibleError, match=r"node 'b' cannot be run.*wants 'v' in 'nhwc'.*\['blk'\]"):
        optimize(std_problem(["a", "b"], choices, ["y"], conv))


def test_undeliverable_graph_output_is_infeasible():
    choices = [ch("a", ["a"], [("x", "std")], [("y", "blk")], 1.0)]
    with pytest.raises(InfeasibleError, match="graph output 'y' in 'blk'.*required 'std'"):
        optimize(std_problem(["a"], choices, ["y"], lambda v, s, d: None))


def test_graph_input_that_is_an_undeliverable_output_is_infeasible():
    problem = Problem([], [], {"x": "std"}, {"x": "blk"}, lambda v, s, d: None)
    with pytest.raises(InfeasibleError, match="graph output 'x' arrives as a graph input in 'std'"):
        optimize(problem)


@pytest.mark.parametrize("method", ["auto", "milp", "greedy"])
def test_graph_without_nodes_pays_its_output_conversion(method):
    problem = Problem([], [], {"x": "std"}, {"x": "blk"}, lambda v, s, d: 2.0)
    sol = optimize(problem, method=method)
    assert sol.total == 2.0 and sol.conversions == [("x", "std", "blk", 2.0)] and sol.choices == {}


def test_infeasible_combination_is_reported_by_every_exact_method():
    """Each choice alone is possible, but no combination is: x must be read in two layouts
    that cannot both be reached."""
    choices = [ch("p1", ["p"], [("x", "std")], [("v", "a")], 1.0),
               ch("p2", ["p"], [("x", "std")], [("v", "b")], 1.0),
               ch("r", ["r"], [("v", "a")], [("y", "std")], 1.0),
               ch("s", ["s"], [("v", "b")], [("z", "std")], 1.0)]
    conv = lambda v, s, d: None if {s, d} == {"a", "b"} else 1.0  # noqa: E731
    problem = std_problem(["p", "r", "s"], choices, ["y", "z"], conv)
    for method in ("auto", "milp"):
        with pytest.raises(InfeasibleError):
            optimize(problem, method=method)
    with pytest.raises(InfeasibleError):
        brute_force(problem)


def test_brute_force_refuses_big_problems(monkeypatch):
    monkeypatch.setattr(opt, "BRUTE_FORCE_LIMIT", 10)
    with pytest.raises(OptimizeError, match="more than 10"):
        brute_force(_fake_dag(9))


def test_unknown_method_is_an_error():
    with pytest.raises(ValueError, match="received 'fast'"):
        optimize(_diamond_problem(), method="fast")


def test_evaluate_rejects_invalid_assignments():
    problem = _diamond_problem()
    with pytest.raises(InfeasibleError, match="not covered"):
        evaluate(problem, ["p.blk", "r1", "r2"])
    with pytest.raises(ProblemError, match="not in the problem"):
        evaluate(problem, ["nope"])


# ------------------------------------------------------------------------------------------
# reports
# ------------------------------------------------------------------------------------------


def test_solution_reports_runner_up_and_parts():
    problem = _fake_dag(12)
    sol = optimize(problem)
    assert sol.total == pytest.approx(sol.choice_cost + sol.conversion_total)
    assert set(sol.runner_up) == set(problem.nodes)
    for node, (cid, total) in sol.runner_up.items():
        assert cid != sol.choices[node].id
        assert total >= sol.total - TOL
    assert sol.solve_s >= 0 and sol.status
