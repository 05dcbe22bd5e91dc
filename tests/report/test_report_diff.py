"""``opdispatch plans diff``: two plans of the small CNN tuned with different backend sets
(numpy alone, numpy and native) into one store; the diff lists exactly the nodes whose step
differs, says why, and gives the time deltas; the same through exported files."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dispatch.plan import Plan
from tests.builders import small_cnn
from tests.report.conftest import options
from tuner.report import PlanSide, diff_plans
from tuner.store import PlanStore
from tuner.tune import tune


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def two_plans(tmp_path_factory, reg):
    path = tmp_path_factory.mktemp("diff") / "plans.sqlite"
    with PlanStore(path) as store:
        a = tune(small_cnn(), store=store, registry=reg, options=options(20.0, backends=["numpy"]))
        b = tune(small_cnn(), store=store, registry=reg,
                 options=options(20.0, backends=["numpy", "native"]))
    return path, a, b


def expected_changes(a: Plan, b: Plan) -> list[str]:
    """Nodes whose step (implementation, layouts, nodes covered) differs, computed here."""
    sa = {n: s for s in a.steps for n in s.nodes}
    sb = {n: s for s in b.steps for n in s.nodes}

    def what(s):
        return (s.impl, s.backend, tuple(s.layouts_in), tuple(s.layouts_out), frozenset(s.nodes))

    return [n for n in sa if what(sa[n]) != what(sb[n])]


def test_diff_lists_exactly_the_nodes_that_differ(two_plans):
    _path, a, b = two_plans
    expected = expected_changes(a.plan, b.plan)
    assert expected, "numpy-only and numpy+native plans should differ somewhere"
    assert len(expected) < len(a.plan.steps) + 10
    d = diff_plans(PlanSide(a.plan, "A", a.key, a.latency_ms), PlanSide(b.plan, "B", b.key, b.latency_ms))
    assert d.changed_nodes == expected
    rows = d.rows.set_index("node")
    for n in expected:
        r = rows.loc[n]
        assert r["a_backend"] == "numpy"
        assert r["a_impl"] == a.plan.step_for(n).impl and r["b_impl"] == b.plan.step_for(n).impl
        if r["b_backend"] == "native":
            assert "native was not among A's backends" in r["why"]
        sa, sb = a.plan.step_for(n), b.plan.step_for(n)
        if sa.nodes[0] == n and sb.nodes[0] == n:
            assert r["delta_ms"] == pytest.approx(sb.cost_ms - sa.cost_ms)
    assert any("native: not used ->" in c for c in d.key_changes)
    # a plan against itself: nothing changed
    assert diff_plans(a.plan, a.plan).changed_nodes == []


def test_plans_diff_command(two_plans, tmp_path):
    path, a, b = two_plans
    expected = expected_changes(a.plan, b.plan)
    res = cli("plans", "diff", str(a.plan_id), str(b.plan_id), "--store", str(path),
              "--format", "json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["changed_nodes"] == expected
    assert [r["node"] for r in data["rows"]] == expected
    res = cli("plans", "diff", str(a.plan_id), str(b.plan_id), "--store", str(path))
    assert res.returncode == 0, res.stderr
    text = res.stdout
    n_nodes = sum(len(s.nodes) for s in a.plan.steps)
    assert f"{len(expected)} of {n_nodes} node(s) changed" in text
    table = text.split("\n\n")[1].splitlines()[2:]
    assert [ln.split()[0] for ln in table if ln.strip()] == expected
    # through files: a bundle with both plans (#ID picks one) and a bare plan JSON
    bundle = tmp_path / "bundle.json"
    assert cli("plans", "export", "-o", str(bundle), "--store", str(path)).returncode == 0
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(a.plan.to_json())
    res = cli("plans", "diff", str(plan_file), f"{bundle}#{b.plan_id}", "--format", "json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["changed_nodes"] == expected
    res = cli("plans", "diff", str(bundle), str(plan_file))
    assert res.returncode == 2 and "holds 2 plans" in res.stderr and "Traceback" not in res.stderr
    res = cli("plans", "diff", str(a.plan_id), "42", "--store", str(path))
    assert res.returncode == 2 and "no plan with id 42" in res.stderr
