"""Plan integrity: tampered plans are rejected with a clear PlanError before anything runs.

Every plan, given, stored or tuned, passes ``dispatch.plan_check.validate_plan`` when its
executor is built. The tests tamper with a valid plan in one way each and check the message
names the step and what was expected, and that no implementation was built or run.
"""

from __future__ import annotations

import copy
import json
import sqlite3

import numpy as np
import pytest

from dispatch import Plan, Session
from dispatch.errors import PlanError, PlanNotFoundError
from dispatch.executor import Executor
from dispatch.plan_check import validate_plan
from dispatch.registry import ImplTable
from tests.builders import small_cnn
from tests.fakes import registry_with_fake
from tuner.store import PlanStore
from tuner.tune import plan_key

#: every build and call of the spy implementation (test double), as ("build"|"run", node)
SPY: list[tuple[str, str]] = []


@pytest.fixture(scope="module")
def reg():
    """A fresh registry with the fake backend and a spying numpy Relu (test double)."""
    registry = registry_with_fake()
    table = ImplTable("numpy")

    @table.register("Relu", "spy")
    def _spy(node):
        """A correct Relu that records that it was built and run (test double)."""
        SPY.append(("build", node.name))

        def run(x):
            SPY.append(("run", node.name))
            return np.maximum(x, 0)

        return run

    registry.add_table(table)
    return registry


@pytest.fixture()
def sess(reg):
    """A numpy session whose Relus run the spy."""
    base = Session(small_cnn(), registry=reg, backends=["numpy"], store=False)
    overrides = {n.name: "Relu.numpy.spy" for n in base.graph.nodes if n.op_type == "Relu"}
    s = Session(small_cnn(), registry=reg, backends=["numpy"], store=False, overrides=overrides)
    SPY.clear()
    return s


def _x(seed=0):
    return np.random.default_rng(seed).standard_normal((1, 3, 16, 16)).astype(np.float32)


def _tampered(sess, edit) -> Plan:
    plan = copy.deepcopy(sess.plan)
    edit(plan)
    return plan


def _idx(plan: Plan, op: str) -> int:
    return next(k for k, s in enumerate(plan.steps) if s.op == op)


def _rejected(sess, plan: Plan, match: str) -> PlanError:
    """``plan`` is rejected by validate_plan, by a Session given it (object and JSON), and
    nothing of it is built or run."""
    with pytest.raises(PlanError, match=match) as info:
        validate_plan(plan, sess.graph, sess.registry)
    for given in (plan, plan.to_json()):
        with pytest.raises(PlanError, match=match):
            Session(small_cnn(), registry=sess.registry, backends=["numpy"], store=False, plan=given)
    with pytest.raises(PlanError, match=match):
        Executor(sess.graph, plan, sess.registry)
    assert SPY == [], "a rejected plan must never be built nor run"
    return info.value


def test_the_untampered_plan_passes_and_runs(sess):
    validate_plan(sess.plan, sess.graph, sess.registry)
    again = Session(small_cnn(), registry=sess.registry, backends=["numpy"], store=False,
                    plan=sess.plan.to_json())
    ref = Session(small_cnn(), registry=sess.registry, backends=["numpy"], store=False)
    np.testing.assert_allclose(again.run(None, {"x": _x()})[0], ref.run(None, {"x": _x()})[0], rtol=1e-6)
    assert ("run", "Relu_3") in SPY


def test_unknown_implementation(sess):
    def edit(p):
        p.steps[0].impl = "Conv.numpy.evil"

    err = _rejected(sess, _tampered(sess, edit),
                    r"step 0 \(Conv_1, Conv\.numpy\.evil\): unknown implementation")
    assert "Conv.numpy.im2col" in str(err)  # lists what was expected


def test_implementation_of_another_backend(sess):
    def edit(p):
        p.steps[_idx(p, "Relu")].backend = "fake"

    _rejected(sess, _tampered(sess, edit),
              r"names backend 'fake', but Relu\.numpy\.spy belongs to backend 'numpy'")


def test_implementation_of_another_op(sess):
    def edit(p):
        p.steps[_idx(p, "Relu")].impl = "Softmax.numpy.stable"

    _rejected(sess, _tampered(sess, edit), r"the nodes are 'Relu'.*implements 'Softmax'")


def test_wrong_layout(sess):
    def edit(p):
        p.steps[_idx(p, "Relu")].layouts_in = ["tcl"]

    _rejected(sess, _tampered(sess, edit), r"layouts_in \['tcl'\]; Relu\.numpy\.spy declares \['std'\]")


def test_missing_node(sess):
    def edit(p):
        del p.steps[_idx(p, "Softmax")]

    _rejected(sess, _tampered(sess, edit), r"nodes without a step: \['Softmax_11'\]")


def test_edited_node_list(sess):
    def edit(p):
        p.steps[_idx(p, "Relu")].nodes = ["Relu_99"]

    _rejected(sess, _tampered(sess, edit), r"steps name nodes not in the graph: \['Relu_99'\]")


def test_node_swapped_for_another_op(sess):
    def edit(p):
        a, b = _idx(p, "Relu"), _idx(p, "Softmax")
        p.steps[a].nodes, p.steps[b].nodes = p.steps[b].nodes, p.steps[a].nodes

    _rejected(sess, _tampered(sess, edit), r"the nodes are 'Softmax', the step says op 'Relu'")


def test_duplicate_node(sess):
    def edit(p):
        p.steps.append(copy.deepcopy(p.steps[_idx(p, "Relu")]))

    _rejected(sess, _tampered(sess, edit), r"covered by more than one step: \['Relu_3'\]")


def test_plan_for_another_graph(sess):
    def edit(p):
        p.graph = "other_model"

    _rejected(sess, _tampered(sess, edit), r"for graph 'other_model'; expected graph 'small_cnn'")


def test_region_implementation_on_a_node_step(sess):
    if not sess.registry.regions():
        pytest.skip("no region implementation registered")
    region = sess.registry.regions()[0]

    def edit(p):
        step = p.steps[_idx(p, "Relu")]
        step.impl, step.backend = region.name, region.backend

    _rejected(sess, _tampered(sess, edit), r"op 'Relu' with a region implementation; expected op 'Region'")


def test_fused_step_not_a_chain_of_its_pattern(reg):
    base = Session(small_cnn(), registry=reg, backends=["numpy"], store=False)
    add = next(n.name for n in base.graph.nodes if n.op_type == "Add")
    fused = Session(small_cnn(), registry=reg, backends=["fake", "numpy"], store=False)
    k = next(k for k, s in enumerate(fused.plan.steps) if add in s.nodes)
    assert fused.plan.steps[k].impl == "Add+Relu.fake.tcl"
    plan = copy.deepcopy(fused.plan)
    plan.steps[k].nodes.reverse()
    SPY.clear()
    _rejected(fused, plan, r"cannot form one step|not a chain")


def test_conversion_chain_must_lead_from_src_to_dst(reg):
    base = Session(small_cnn(), registry=reg, backends=["numpy"], store=False)
    overrides = {n.name: f"{n.op_type}.fake.tcl" for n in base.graph.nodes if n.op_type in ("Relu", "Add")}
    forced = Session(small_cnn(), registry=reg, backends=["numpy", "fake"], store=False, overrides=overrides)
    k, conv = next((k, c) for k, c in enumerate(forced.plan.conversions) if c.src == "std" and c.dst == "tcl")
    back = next(c for c in forced.plan.conversions if c.src == "tcl" and c.dst == "std")

    wrong = copy.deepcopy(forced.plan)
    wrong.conversions[k].chain = list(back.chain)  # a converter the other way round
    SPY.clear()
    _rejected(forced, wrong, rf"conversion {k} \('{conv.value}' std->tcl\): converter .* goes tcl->std; "
                             r"expected one from 'std'")

    unknown = copy.deepcopy(forced.plan)
    unknown.conversions[k].chain = ["std->tcl.evil"]
    _rejected(forced, unknown, rf"conversion {k} .*unknown converter 'std->tcl\.evil'")

    empty = copy.deepcopy(forced.plan)
    empty.conversions[k].chain = []
    _rejected(forced, empty, r"chain must be a non-empty list of converter names")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[]", r"must be a JSON object, received list"),
        ('"plan"', r"must be a JSON object, received str"),
        ('{"version": 1, "graph": "g", "steps": {}, "conversions": []}', r"'steps' must be list"),
        ('{"version": 1, "graph": "g", "steps": [], "conversions": [], "code": "import os"}',
         r"unknown field\(s\) \['code'\]"),
        ('{"version": 1, "graph": "g", "steps": [[1]], "conversions": []}',
         r"plan step 0 must be a JSON object"),
        ('{"version": 1, "graph": "g", "conversions": [], "steps": [{"nodes": ["a"], "op": "Relu",'
         ' "impl": {"py/object": "os.system"}, "backend": "numpy", "layouts_in": [], "layouts_out": []}]}',
         r"plan step 0: field 'impl' must be str"),
        ('{"version": 1, "graph": "g", "conversions": [], "steps": [{"nodes": [1], "op": "Relu",'
         ' "impl": "x", "backend": "numpy", "layouts_in": [], "layouts_out": []}]}',
         r"field 'nodes' must be a list of strings"),
        ('{"version": 1, "graph": "g", "steps": [], "conversions": [{"value": "v"}]}',
         r"plan conversion 0: .*missing field\(s\) \['chain', 'consumers', 'dst', 'src'\]"),
        ('{"version": 2, "graph": "g", "steps": [], "conversions": []}', r"version 2 is not supported"),
    ],
)
def test_plans_hold_data_only(text, match):
    with pytest.raises(PlanError, match=match):
        Plan.from_json(text)


def test_a_tampered_stored_plan_is_not_used(reg, sess, tmp_path):
    path = tmp_path / "plans.sqlite"
    store = PlanStore(path)
    key = plan_key(sess.graph, reg, ["numpy"], "latency")
    plan_id = store.put_plan(key, sess.plan)
    store.close()
    good = Session(small_cnn(), registry=reg, backends=["numpy"], store=str(path))
    assert good.plan_source == "store"

    data = json.loads(sess.plan.to_json())
    data["steps"][0]["impl"] = "Conv.numpy.evil"
    db = sqlite3.connect(path)
    with db:
        db.execute("UPDATE plans SET plan_json = ? WHERE id = ?", (json.dumps(data), plan_id))
    db.close()
    SPY.clear()

    fallback = Session(small_cnn(), registry=reg, backends=["numpy"], store=str(path))
    assert fallback.plan_source == "heuristic"
    assert fallback.plan_note.startswith("stored plan not used: PlanError:")
    assert "unknown implementation 'Conv.numpy.evil'" in fallback.plan_note
    assert all(s.impl != "Conv.numpy.evil" for s in fallback.plan.steps)
    assert fallback.run(None, {"x": _x()})[0].shape == (1, 5)

    with pytest.raises(PlanNotFoundError, match=r"unknown implementation 'Conv\.numpy\.evil'") as info:
        Session(small_cnn(), registry=reg, backends=["numpy"], store=str(path), require_plan=True)
    assert any("Conv.numpy.evil" in r for r in info.value.reasons)


def test_an_implementation_that_refuses_its_nodes_is_rejected():
    """A step moved to an implementation whose supports() refuses the node as the graph has
    it (here a 1x1-only Conv on a 3x3 Conv; the same check refuses a plan whose key was
    edited to other input shapes) is rejected with the implementation's own reason."""
    from dispatch.backend import load_registry

    registry = load_registry()
    sess = Session(small_cnn(), registry=registry, backends=["native", "numpy"], store=False)
    plan = copy.deepcopy(sess.plan)
    step = plan.steps[0]
    assert step.nodes[0] == "Conv_1"
    step.nodes, step.op, step.impl = ["Conv_1"], "Conv", "Conv.native.std_1x1"
    step.layouts_in, step.layouts_out = ["std", "std", "std"], ["std"]
    plan.steps.insert(1, copy.deepcopy(sess.plan.steps[0]))
    plan.steps[1].nodes, plan.steps[1].op = ["Relu_3"], "Relu"
    with pytest.raises(PlanError, match=r"Conv\.native\.std_1x1 does not support these nodes as the "
                                        r"graph has them.*needs a 1x1 kernel.*received kernel \[3, 3\]"):
        validate_plan(plan, sess.graph, registry)
