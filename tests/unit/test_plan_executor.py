"""The heuristic planner and the executor: layouts, conversions, reasons, JSON, liveness.

Uses the FAKE backend of tests/fakes.py (numpy-implemented layouts, no speed claims) so the
planner is tested without native code; tests/native/ repeats the routing test with the real
native layouts.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from dispatch import Plan, Session
from dispatch.errors import FeedError, KernelError, PlanError, UnsupportedOpError
from tests.builders import ModelBuilder, small_cnn
from tests.fakes import registry_with_fake


@pytest.fixture(scope="module")
def reg():
    return registry_with_fake()


def _x(shape=(1, 3, 16, 16), seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_default_plan_uses_first_backend_in_order(reg):
    sess = Session(small_cnn(), backends=["numpy"], registry=reg)
    assert set(sess.plan.backends_used()) == {"numpy"}
    assert sess.plan.conversions == []
    step = sess.plan.step_for(sess.graph.nodes[0].name)
    assert step.impl.startswith("Conv.numpy.") and "first backend" in step.why


def _fake_overrides(sess_graph, layout):
    return {n.name: f"{n.op_type}.fake.{layout}" for n in sess_graph.nodes if n.op_type in ("Relu", "Add")}


@pytest.mark.parametrize("layout", ["tcl", "blk4"])
def test_plan_through_other_layouts_matches_numpy(reg, layout):
    base = Session(small_cnn(), backends=["numpy"], registry=reg)
    forced = Session(small_cnn(), backends=["numpy", "fake"], registry=reg,
                     overrides=_fake_overrides(base.graph, layout))
    assert forced.plan.backends_used()["fake"] == 4
    runtime = [c for c in forced.plan.conversions if not c.at_build]
    assert runtime, "routing through another layout must insert converters"
    # one conversion per (tensor, target layout), however many consumers
    keys = [(c.value, c.dst) for c in forced.plan.conversions]
    assert len(keys) == len(set(keys))
    x = _x()
    np.testing.assert_allclose(forced.run(None, {"x": x})[0], base.run(None, {"x": x})[0],
                               rtol=1e-5, atol=1e-6)


def test_shared_conversion_for_two_consumers(reg):
    b = ModelBuilder()
    x = b.input("x", [1, 5, 4, 4])
    r = b.op("Relu", [x], name="r")
    a1 = b.op("Relu", [r], name="a1")
    a2 = b.op("Relu", [r], name="a2")
    b.output(b.op("Add", [a1, a2], name="sum"))
    over = {"a1": "Relu.fake.blk4", "a2": "Relu.fake.blk4", "sum": "Add.fake.blk4"}
    sess = Session(b.build(), backends=["numpy", "fake"], registry=reg, overrides=over)
    to_blk = [c for c in sess.plan.conversions if c.value == r and c.dst == "blk4"]
    assert len(to_blk) == 1 and sorted(to_blk[0].consumers) == ["a1", "a2"]
    out_conv = [c for c in sess.plan.conversions if c.consumers == ["<graph output>"]]
    assert len(out_conv) == 1 and out_conv[0].dst == "std"
    xin = _x((1, 5, 4, 4))
    expect = 2 * np.maximum(xin, 0)
    np.testing.assert_allclose(sess.run(None, {"x": xin})[0], expect, rtol=1e-6)


def test_heuristic_prefers_no_conversion_within_backend(reg):
    sess = Session(small_cnn(), backends=["fake", "numpy"], registry=reg)
    # fake only has non-standard layouts: its Relu after a numpy Conv costs a conversion, but the
    # backend order puts fake first, so it wins and the reason is recorded
    relu = next(n for n in sess.graph.nodes if n.op_type == "Relu")
    step = sess.plan.step_for(relu.name)
    assert step.backend == "fake"
    assert any("numpy" in r.impl and "not tried" in r.reason for r in step.rejected)
    lost = [r for r in step.rejected if r.backend == "fake"]
    assert lost and all(r.reason.startswith(("lost", "unsupported")) for r in lost)


def test_rejections_record_reasons(reg):
    b = ModelBuilder()
    x = b.input("x", [4, 6])  # rank 2: the fake rank-4 layouts cannot hold it
    b.output(b.op("Relu", [x], name="r"))
    sess = Session(b.build(), backends=["fake", "numpy"], registry=reg)
    step = sess.plan.step_for("r")
    assert step.backend == "numpy"
    reasons = {r.impl: r.reason for r in step.rejected}
    assert "rank-4" in reasons["Relu.fake.tcl"]


def test_plan_json_round_trip_and_reuse(reg):
    base = Session(small_cnn(), backends=["numpy"], registry=reg)
    over = _fake_overrides(base.graph, "blk4")
    s1 = Session(small_cnn(), backends=["numpy", "fake"], registry=reg, overrides=over)
    text = s1.plan.to_json()
    json.loads(text)  # plain JSON
    again = Plan.from_json(text)
    assert again == s1.plan
    s2 = Session(small_cnn(), registry=reg, plan=text)
    x = _x()
    np.testing.assert_array_equal(s1.run(None, {"x": x})[0], s2.run(None, {"x": x})[0])


def test_malformed_plans_are_rejected(reg):
    with pytest.raises(PlanError, match="must be JSON"):
        Plan.from_json("{not json")
    with pytest.raises(PlanError, match="format version 99"):
        Plan.from_json('{"version": 99, "graph": "g", "steps": [], "conversions": []}')
    good = Session(small_cnn(), backends=["numpy"], registry=reg).plan
    bad = good.to_dict()
    bad["steps"] = bad["steps"][1:]
    with pytest.raises(PlanError, match="nodes without a step"):
        Session(small_cnn(), registry=reg, plan=Plan.from_dict(bad))
    bad = good.to_dict()
    bad["steps"][0]["impl"] = "Conv.numpy.nonexistent"
    with pytest.raises(Exception, match="unknown implementation 'Conv.numpy.nonexistent'"):
        Session(small_cnn(), registry=reg, plan=Plan.from_dict(bad))


def test_override_errors(reg):
    with pytest.raises(PlanError, match="not in the graph"):
        Session(small_cnn(), registry=reg, overrides={"nope": "Relu.numpy.default"})
    b = ModelBuilder()
    x = b.input("x", [4, 6])
    b.output(b.op("Relu", [x], name="r"))
    with pytest.raises(PlanError, match="cannot run node 'r'.*rank-4"):
        Session(b.build(), backends=["numpy", "fake"], registry=reg, overrides={"r": "Relu.fake.blk4"})


def test_unsupported_ops_are_all_listed(reg):
    b = ModelBuilder()
    x = b.input("x", [2, 2])
    b.output(b.op("Det", [x]))
    b.output(b.op("MaxRoiPool", [x, x], pooled_shape=[1, 1]))
    with pytest.raises(UnsupportedOpError,
                       match=r"no allowed backend implements: .*Det.*MaxRoiPool.*backends found: .*numpy"):
        Session(b.build(), backends=["numpy"], registry=reg)


def test_liveness_releases_intermediates(reg):
    sess = Session(small_cnn(), backends=["numpy"], registry=reg)
    ex = sess.executor
    freed = sum(len(c.free) for c in ex.calls)
    assert freed >= len(ex.calls) - 2
    assert 0 < ex.memory.peak_bytes < sum(v.nbytes for v in sess.graph.values.values() if not v.is_const)


def test_kernel_failure_names_node_impl_backend(reg, monkeypatch):
    sess = Session(small_cnn(), backends=["numpy"], registry=reg)
    call = next(c for c in sess.executor.calls if c.kind == "kernel" and "Relu" in c.impl)

    def boom(*a):
        raise RuntimeError("kaput")

    monkeypatch.setattr(call, "fn", boom)
    with pytest.raises(KernelError, match=rf"node '{call.label}': implementation {call.impl} "
                                          r"\(backend numpy\) raised RuntimeError: kaput"):
        sess.run(None, {"x": _x()})


def test_feed_errors(reg):
    sess = Session(small_cnn(), backends=["numpy"], registry=reg)
    with pytest.raises(FeedError, match=r"unknown input name\(s\) \['y'\].*missing input\(s\) \['x'\]"
                                        r".*expects x: float32 \[1, 3, 16, 16\]"):
        sess.run(None, {"y": _x()})
    with pytest.raises(FeedError, match=r"received shape \[1, 3, 8, 8\], expected \[1, 3, 16, 16\]"):
        sess.run(None, {"x": _x((1, 3, 8, 8))})
    with pytest.raises(FeedError, match="received dtype float64, expected float32"):
        sess.run(None, {"x": _x().astype(np.float64)})
    with pytest.raises(FeedError, match="unknown output name"):
        sess.run(["nope"], {"x": _x()})
    info = sess.get_inputs()[0]
    assert (info.name, info.shape, info.type) == ("x", [1, 3, 16, 16], "tensor(float)")


def test_feeds_checked_once_are_checked_again_when_they_change(reg):
    """After a run, feeds of the same names, dtypes and shapes skip the checks
    (Session._checked_feeds); anything else is checked in full again."""
    sess = Session(small_cnn(), backends=["numpy"], registry=reg)
    (want,) = sess.run(None, {"x": _x()})
    assert sess._checked_feeds is not None
    (again,) = sess.run(None, {"x": _x()})
    np.testing.assert_array_equal(again, want)
    with pytest.raises(FeedError, match="received dtype float64, expected float32"):
        sess.run(None, {"x": _x().astype(np.float64)})
    with pytest.raises(FeedError, match=r"received shape \[1, 3, 8, 8\]"):
        sess.run(None, {"x": _x((1, 3, 8, 8))})
    with pytest.raises(FeedError, match="masked array"):
        sess.run(None, {"x": np.ma.masked_array(_x(), mask=False)})
    with pytest.raises(FeedError, match=r"unknown input name\(s\) \['y'\]"):
        sess.run(None, {"x": _x(), "y": _x()})
    with pytest.raises(FeedError, match="unknown output name"):
        sess.run(["nope"], {"x": _x()})
    (last,) = sess.run(None, {"x": _x()})
    np.testing.assert_array_equal(last, want)
