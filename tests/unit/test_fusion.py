"""Fused (multi-node) candidates: chain matching, planning and execution.

Uses the FAKE backend (tests/fakes.py), whose ``Add+Relu.fake.tcl`` pattern is implemented in
numpy; no speed claims."""

from __future__ import annotations

import numpy as np
import pytest

from dispatch import Session
from dispatch.errors import PlanError, RegistryError
from dispatch.fusion import fuse, match_chain
from dispatch.plan import Plan
from dispatch.registry import ImplTable
from tests.builders import ModelBuilder
from tests.fakes import registry_with_fake


@pytest.fixture(scope="module")
def reg():
    return registry_with_fake()


def _residual(extra_consumer: bool = False, add_is_output: bool = False):
    b = ModelBuilder()
    x = b.input("x", [1, 6, 4, 4])
    r = b.op("Relu", [x], name="r")
    a = b.op("Add", [x, r], name="add")
    y = b.op("Relu", [a], name="relu2")
    b.output(y)
    if extra_consumer:
        b.output(b.op("Relu", [a], name="other"))
    if add_is_output:
        b.output(a)
    return b.build()


def test_fused_pattern_is_planned_and_runs(reg):
    sess = Session(_residual(), backends=["fake", "numpy"], registry=reg)
    step = sess.plan.step_for("add")
    assert step.impl == "Add+Relu.fake.tcl" and step.nodes == ["add", "relu2"]
    assert step is sess.plan.step_for("relu2")
    assert any(r.impl == "Add.fake.tcl" and "fused" in r.reason for r in step.rejected)
    x = np.random.default_rng(0).standard_normal((1, 6, 4, 4)).astype(np.float32)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, np.maximum(x + np.maximum(x, 0), 0), rtol=1e-6)
    again = Session(_residual(), backends=["fake", "numpy"], registry=reg,
                    plan=Plan.from_json(sess.plan.to_json()))
    np.testing.assert_allclose(again.run(None, {"x": x})[0], y)


@pytest.mark.parametrize("kwargs", [{"extra_consumer": True}, {"add_is_output": True}])
def test_no_fusion_when_the_intermediate_is_needed_elsewhere(reg, kwargs):
    sess = Session(_residual(**kwargs), backends=["fake", "numpy"], registry=reg)
    assert sess.plan.step_for("add").nodes == ["add"]


def test_override_pins_a_node_out_of_patterns(reg):
    sess = Session(_residual(), backends=["fake", "numpy"], registry=reg,
                   overrides={"relu2": "Relu.fake.tcl"})
    assert sess.plan.step_for("add").nodes == ["add"]


def test_fused_node_inputs_follow_the_documented_order(reg):
    g = Session(_residual(), backends=["numpy"], registry=reg).graph
    consumers = g.consumers()
    add = g.node("add")
    chain = match_chain(add, ("Add", "Relu"), consumers, {v.name for v in g.outputs})
    fused = fuse(chain)
    assert [v.name for v in fused.inputs] == [v.name for v in add.inputs]
    assert fused.outputs == g.node("relu2").outputs and fused.op_type == "Add+Relu"
    assert match_chain(add, ("Add", "Sigmoid"), consumers, set()) is None


def test_tampered_multi_node_step_is_rejected(reg):
    sess = Session(_residual(), backends=["fake", "numpy"], registry=reg)
    data = sess.plan.to_dict()
    step = next(s for s in data["steps"] if len(s["nodes"]) == 2)
    step["nodes"] = ["r", "add"]
    with pytest.raises(PlanError):
        Session(_residual(), backends=["fake", "numpy"], registry=reg, plan=Plan.from_dict(data))


def test_pattern_needs_two_ops():
    with pytest.raises(RegistryError, match="at least two"):
        ImplTable("t").register_pattern(("Relu",), "x")


def test_fused_step_runs_after_the_producers_of_its_later_inputs(reg):
    """Sigmoid+Add at node 'a' reads 'b', which comes after 'a' in topological order."""
    b = ModelBuilder()
    x = b.input("x", [1, 5, 3, 3])
    ra = b.op("Sigmoid", [x], name="a")
    neg = b.op("Neg", [x], name="n")
    rb = b.op("Relu", [neg], name="b")
    b.output(b.op("Add", [ra, rb], name="add"))
    sess = Session(b.build(), backends=["fake", "numpy"], registry=reg)
    names = [s.nodes for s in sess.plan.steps]
    assert ["a", "add"] in names and names.index(["a", "add"]) > names.index(["b"])
    xin = np.random.default_rng(1).standard_normal((1, 5, 3, 3)).astype(np.float32)
    expect = 1 / (1 + np.exp(-xin)) + np.maximum(-xin, 0)
    np.testing.assert_allclose(sess.run(None, {"x": xin})[0], expect, rtol=1e-5)
