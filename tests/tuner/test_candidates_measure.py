"""Candidate enumeration and measurement: signatures, fused candidates, the reference check
that rejects wrong implementations, and converter timing.

The FAKE backend of tests/fakes.py supplies non-standard layouts and an Add+Relu pattern; it is
a test double with numpy kernels, not a real backend."""

from __future__ import annotations

import numpy as np
import pytest

from dispatch import Session
from dispatch.registry import STANDARD, ImplTable, Priority
from tests.builders import ModelBuilder, small_cnn
from tests.fakes import registry_with_fake
from tuner.candidates import enumerate_candidates, signature
from tuner.measure import check_outputs, measure_candidate, measure_conversion, time_calls


@pytest.fixture(scope="module")
def reg():
    return registry_with_fake()


def _residual():
    b = ModelBuilder()
    x = b.input("x", [1, 6, 4, 4])
    r = b.op("Relu", [x], name="r")
    a = b.op("Add", [x, r], name="add")
    b.output(b.op("Relu", [a], name="relu2"))
    return b.build()


def test_every_supporting_implementation_is_a_candidate(reg):
    sess = Session(small_cnn(), backends=["numpy"], registry=reg)
    cs = enumerate_candidates(sess.graph, reg, ["numpy", "fake"])
    for node in sess.graph.nodes:
        names = {c.impl.name for c in cs.for_node(node.name)}
        expect = {i.name for i in reg.impls_for(node.key_op, ["numpy", "fake"]) if i.supports(node) is None}
        assert expect <= names or node.op_type in ("Add",), (node.name, names, expect)
        assert names, node.name


def test_fused_candidates_and_rejections_are_recorded(reg):
    sess = Session(_residual(), backends=["numpy"], registry=reg)
    cs = enumerate_candidates(sess.graph, reg, ["numpy", "fake"])
    fused = [c for c in cs.candidates if c.fused]
    assert [c.id for c in fused] == ["Add+Relu.fake.tcl@add+relu2"]
    assert fused[0] in cs.for_node("relu2")
    b = ModelBuilder()
    x = b.input("x", [4, 6])
    b.output(b.op("Relu", [x], name="r"))
    g = Session(b.build(), backends=["numpy"], registry=reg).graph
    rej = enumerate_candidates(g, reg, ["numpy", "fake"]).rejected["r"]
    assert any(r.impl == "Relu.fake.tcl" and "rank-4" in r.reason for r in rej)


def test_signatures_dedupe_equal_layers_and_ignore_weight_values(reg):
    def model(seed):
        rng = np.random.default_rng(seed)
        b = ModelBuilder()
        x = b.input("x", [1, 4, 8, 8])
        w = b.const(rng.standard_normal((4, 4, 3, 3)).astype(np.float32))
        c1 = b.op("Conv", [x, w], name="c1", pads=[1, 1, 1, 1])
        c2 = b.op("Conv", [c1, b.const(rng.standard_normal((4, 4, 3, 3)).astype(np.float32))],
                  name="c2", pads=[1, 1, 1, 1])
        c3 = b.op("Conv", [c2, w], name="c3", strides=[2, 2])
        b.output(c3)
        return b.build()

    g1 = Session(model(0), backends=["numpy"], registry=reg).graph
    g2 = Session(model(1), backends=["numpy"], registry=reg).graph
    impl = reg.impl("Conv.numpy.im2col")
    sig = {n.name: signature(impl, n, ("std",) * 2, ("std",)) for n in g1.nodes}
    assert sig["c1"] == sig["c2"] != sig["c3"]
    assert sig == {n.name: signature(impl, n, ("std",) * 2, ("std",)) for n in g2.nodes}
    assert sig["c1"] != signature(reg.impl("Conv.numpy.direct"), g1.node("c1"), ("std",) * 2, ("std",))


def test_measurement_checks_against_the_reference(reg):
    sess = Session(_residual(), backends=["numpy"], registry=reg)
    cs = enumerate_candidates(sess.graph, reg, ["numpy", "fake"])
    for c in cs.candidates:
        m = measure_candidate(reg, c, max_repeats=5)
        assert m.ok, (c.id, m.error)
        assert m.median_s > 0 and m.samples >= 5


def test_a_wrong_implementation_is_rejected_with_its_error(reg):
    table = ImplTable("numpy")

    @table.register("Relu", "wrong", priority=Priority.PREFERRED)
    def _wrong(node):
        """A deliberately wrong Relu (test double)."""
        return lambda x: np.maximum(x, 0) + 0.5

    @table.register("Relu", "crash", priority=Priority.PREFERRED)
    def _crash(node):
        """A Relu that raises (test double)."""
        def run(x):
            raise RuntimeError("boom")
        return run

    local = registry_with_fake()
    local.add_table(table)
    sess = Session(_residual(), backends=["numpy"], registry=local)
    cs = enumerate_candidates(sess.graph, local, ["numpy"])
    by_impl = {c.impl.name: measure_candidate(local, c) for c in cs.for_node("r")}
    assert by_impl["Relu.numpy.wrong"].error.startswith("wrong result")
    assert "boom" in by_impl["Relu.numpy.crash"].error
    assert by_impl["Relu.numpy.maximum"].ok


def test_check_outputs_reports_shape_dtype_and_error():
    ref = [np.ones((2, 2), np.float32)]
    assert check_outputs([np.ones((2, 2), np.float32)], ref, []) is None
    assert "float64" in check_outputs([np.ones((2, 2))], ref, [])
    assert "max abs error" in check_outputs([np.full((2, 2), 1.1, np.float32)], ref, [])
    assert check_outputs([np.array([np.nan], np.float32)], [np.array([np.nan], np.float32)], []) is None


def test_conversion_timing(reg):
    chain = reg.layouts.path(STANDARD, "blk4", (1, 6, 4, 4), np.float32)
    m = measure_conversion(reg, chain, (1, 6, 4, 4), np.float32, max_repeats=7)
    assert m.ok and m.samples >= 5
    assert measure_conversion(reg, (), (1,), np.float32).median_s == 0.0


def test_time_calls_stops_at_the_repeat_cap():
    calls = []
    m = time_calls(lambda: calls.append(1), warmup=3, min_repeats=4, max_repeats=9, ci_target=0.0,
                   time_cap_s=100)
    assert m.samples == 9 and len(calls) == 12
