"""Run-time faults: ``Session(on_error="raise"|"fallback")``.

A test-double Relu registered for backend "numpy" raises whenever it runs; it is forced onto
one node with ``overrides``. With "raise" the KernelError names the node, implementation and
backend; with "fallback" the failing step is re-run on the reference implementations of its
nodes (or, when that cannot answer, the whole run on the numpy reference plan), the fault is
recorded and a RuntimeWarning is issued once per implementation. The faulty kernels and
converters here are test doubles wrapping or replacing real ones.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

from dispatch import Session
from dispatch.backend import load_registry
from dispatch.errors import ArgumentError, KernelError
from dispatch.plan import Plan
from dispatch.registry import ImplTable
from dispatch.session import Fault
from tests.builders import small_cnn

FAULTY = "Relu.numpy.faulty"



#: the native-first plan (blocked layouts, fused steps, run-time converters) these tests fault
NATIVE_FIRST = ["native", "numpy"]

def _with_raising_relu(variant: str):
    """A fresh registry copy with ``Relu.numpy.<variant>``, a Relu that builds fine and
    raises when run (test double)."""
    registry = load_registry(fresh=True)
    table = ImplTable("numpy")

    @table.register("Relu", variant)
    def _faulty(node):
        def run(x):
            raise RuntimeError("simulated kernel fault")

        return run

    registry.add_table(table)
    return registry


@pytest.fixture(scope="module")
def reg():
    return _with_raising_relu("faulty")


@pytest.fixture(scope="module")
def relu(reg):
    graph = Session(small_cnn(), registry=reg, backends=["numpy"], store=False).graph
    return next(n.name for n in graph.nodes if n.op_type == "Relu")


def _x(seed=0):
    return np.random.default_rng(seed).standard_normal((1, 3, 16, 16)).astype(np.float32)


def _session(reg, relu, **kw):
    return Session(small_cnn(), registry=reg, backends=["numpy"], store=False,
                   overrides={relu: FAULTY}, **kw)


def _expected(reg):
    return Session(small_cnn(), registry=reg, backends=["numpy"], store=False).run(None, {"x": _x()})


def test_raise_is_the_default_and_names_node_impl_backend(reg, relu):
    sess = _session(reg, relu)
    assert sess.on_error == "raise"
    with pytest.raises(KernelError) as info:
        sess.run(None, {"x": _x()})
    msg = str(info.value)
    assert relu in msg and FAULTY in msg and "backend numpy" in msg
    assert "RuntimeError: simulated kernel fault" in msg
    assert (info.value.node, info.value.impl, info.value.backend) == (relu, FAULTY, "numpy")
    assert sess.faults == []


def test_explicit_raise(reg, relu):
    with pytest.raises(KernelError, match="simulated kernel fault"):
        _session(reg, relu, on_error="raise").run(None, {"x": _x()})


def test_fallback_returns_correct_outputs_and_records_the_fault(reg, relu):
    sess = _session(reg, relu, on_error="fallback")
    with pytest.warns(RuntimeWarning, match=rf"{FAULTY} \(backend numpy\) failed on node '{relu}'"):
        out = sess.run(None, {"x": _x()})
    np.testing.assert_allclose(out[0], _expected(reg)[0], rtol=1e-5, atol=1e-6)
    assert len(sess.faults) == 1
    fault = sess.faults[0]
    assert isinstance(fault, Fault)
    assert (fault.node, fault.implementation, fault.backend) == (relu, FAULTY, "numpy")
    assert "simulated kernel fault" in fault.error and fault.time > 0
    assert fault.recovery == "reference implementation"
    # the session's plan is unchanged: the fault is recovered from per run
    assert sess.plan.step_for(relu).impl == FAULTY


def test_fallback_warns_once_per_implementation(reg, relu):
    sess = _session(reg, relu, on_error="fallback")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = sess.run(None, {"x": _x()})
        second = sess.run(None, {"x": _x()})
    assert len([w for w in caught if issubclass(w.category, RuntimeWarning)]) == 1
    assert len(sess.faults) == 2
    np.testing.assert_array_equal(first[0], second[0])


def test_fallback_honours_output_names(reg, relu):
    sess = _session(reg, relu, on_error="fallback")
    name = sess.get_outputs()[0].name
    with pytest.warns(RuntimeWarning):
        out = sess.run([name], {"x": _x()})
    assert len(out) == 1 and out[0].shape == (1, 5)


def test_unknown_on_error_mode(reg):
    with pytest.raises(ArgumentError,
                       match=r"on_error must be one of 'raise', 'fallback', received 'ignore'"):
        Session(small_cnn(), registry=reg, store=False, on_error="ignore")


# -- per-step recovery: the failing step alone runs on the reference ------------------------


def _faulty_copy(registry, name: str, *, fail_every: int = 1):
    """Register a copy of implementation ``name`` (same backend, op, pattern, layouts and
    supports) whose kernel raises on every ``fail_every``-th call (a test double), and return
    the copy's name."""
    impl = registry.impl(name)
    copy_name = f"{name}.faulty{fail_every}"
    if copy_name in {i.name for i in registry.implementations}:
        return copy_name

    def build(node, _inner=impl.build):
        kernel = _inner(node)
        calls = [0]

        def run(*args):
            calls[0] += 1
            if calls[0] % fail_every == 0:
                raise MemoryError("simulated allocation failure")
            return kernel(*args)

        return run

    registry.add_impl(dataclasses.replace(impl, name=copy_name, build=build))
    return copy_name


def _plan_with(session, impl: str, faulty: str):
    """``session``'s plan with every step of ``impl`` switched to ``faulty``."""
    data = session.plan.to_dict()
    hits = 0
    for step in data["steps"]:
        if step["impl"] == impl:
            step["impl"] = faulty
            hits += 1
    assert hits, f"{impl} is not in the plan"
    return Plan.from_dict(data)


@pytest.fixture
def fresh():
    return load_registry(fresh=True)


def test_a_blocked_layout_step_is_rerun_alone_on_the_reference(fresh):
    """A fused native Conv+Relu reading and writing nchw8c (weights packed OIhw8i8o) fails:
    its inputs go back to the standard layout, Conv and Relu run on numpy, the output is
    converted to nchw8c for the native Add that reads it, and every other step runs as
    planned."""
    base = Session(small_cnn(), registry=fresh, store=False, backends=NATIVE_FIRST)
    step = next(s for s in base.plan.steps if s.op == "Conv+Relu" and s.layouts_in[0] != "std")
    assert step.layouts_out == ["nchw8c"]
    faulty = _faulty_copy(fresh, step.impl)
    sess = Session(small_cnn(), registry=fresh, store=False, backends=NATIVE_FIRST, on_error="fallback",
                   plan=_plan_with(base, step.impl, faulty))
    with pytest.warns(RuntimeWarning, match="running its nodes on the reference implementation"):
        out = sess.run(None, {"x": _x()})
    np.testing.assert_allclose(out[0], base.run(None, {"x": _x()})[0], rtol=1e-5, atol=1e-6)
    (fault,) = sess.faults
    assert fault.implementation == faulty and fault.backend == "native"
    assert fault.recovery == "reference implementation" and "MemoryError" in fault.error
    recovered = sess.executor.fallback_call(
        next(k for k, c in enumerate(sess.executor.calls) if c.impl == faulty))
    assert recovered.backend == "numpy"
    assert recovered.impl.split(" > ")[0].startswith("Conv.numpy")
    # the other steps kept their implementations (a per-step, not a whole-run, fallback)
    assert [c.impl for c in sess.executor.calls if c.impl != faulty] == \
        [c.impl for c in base.executor.calls if c.impl != step.impl]


def test_an_intermittent_fault_recovers_only_the_runs_that_fail(fresh):
    base = Session(small_cnn(), registry=fresh, store=False, backends=NATIVE_FIRST)
    impl = next(s.impl for s in base.plan.steps if s.op == "Add")
    sess = Session(small_cnn(), registry=fresh, store=False, backends=NATIVE_FIRST, on_error="fallback",
                   plan=_plan_with(base, impl, _faulty_copy(fresh, impl, fail_every=3)))
    want = base.run(None, {"x": _x()})[0]
    with pytest.warns(RuntimeWarning):
        outs = [sess.run(None, {"x": _x()})[0] for _ in range(7)]
    for out in outs:
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    assert len(sess.faults) == 2  # runs 3 and 6


def test_a_region_step_is_rerun_node_by_node_on_the_reference(fresh):
    pytest.importorskip("onnxruntime")
    base = Session(small_cnn(), registry=fresh, store=False, backends=["onnxruntime", "numpy"])
    (step,) = base.plan.steps
    assert step.op == "Region" and len(step.nodes) == 10
    sess = Session(small_cnn(), registry=fresh, store=False, on_error="fallback",
                   backends=["onnxruntime", "numpy"],
                   plan=_plan_with(base, step.impl, _faulty_copy(fresh, step.impl)))
    with pytest.warns(RuntimeWarning, match="backend onnxruntime"):
        out = sess.run(None, {"x": _x()})
    np.testing.assert_allclose(out[0], _expected(fresh)[0], rtol=1e-4, atol=1e-6)
    assert sess.faults[0].recovery == "reference implementation"
    assert len(sess.executor.fallback_call(0).impl.split(" > ")) == 10


def test_when_the_reference_fails_too_the_error_says_both(reg, relu):
    """The faulty Relu is the only step of its node; if numpy's own Relu is taken away the
    per-step fallback has nothing to run, and the whole-run reference plan (which would use
    the faulty Relu, the only numpy Relu left) fails too: one KernelError says all three."""
    registry = _with_raising_relu("always_faulty")
    for impl in registry.impls_for("Relu", ["numpy"]):
        if impl.name != "Relu.numpy.always_faulty":
            registry._by_op["Relu"].remove(impl)
            del registry._by_name[impl.name]
    sess = Session(small_cnn(), registry=registry, backends=["numpy"], store=False, on_error="fallback")
    with pytest.warns(RuntimeWarning), pytest.raises(KernelError) as info:
        sess.run(None, {"x": _x()})
    msg = str(info.value)
    assert "simulated kernel fault" in msg
    assert "re-running it on the reference implementation failed too" in msg
    assert "no reference implementation supports node" in msg
    assert "the numpy reference plan run as a fallback failed too" in msg
    assert [f.recovery for f in sess.faults] == ["reference plan"]


def test_a_failing_converter_is_answered_by_the_reference_plan(fresh):
    """Converters are not re-run per step (their input and output are the same tensor in
    two layouts): a failing one sends the whole run to the numpy reference plan."""
    base = Session(small_cnn(), registry=fresh, store=False, backends=NATIVE_FIRST)
    run_time = [c for c in base.plan.conversions if not c.at_build]
    assert run_time, "the default plan of small_cnn converts at run time"
    conv = fresh.layouts.converter(run_time[0].chain[0])

    def failing(x, shape):
        raise RuntimeError("simulated converter fault")

    # the fixture's registry is this test's own copy: swap the converter for a failing double
    same = fresh.layouts.converters[(conv.src, conv.dst)]
    same[same.index(conv)] = dataclasses.replace(conv, fn=failing)
    sess = Session(small_cnn(), registry=fresh, store=False, backends=NATIVE_FIRST, on_error="fallback")
    with pytest.warns(RuntimeWarning, match="whole model on the numpy reference plan"):
        out = sess.run(None, {"x": _x()})
    np.testing.assert_allclose(out[0], _expected(fresh)[0], rtol=1e-5, atol=1e-6)
    assert [f.recovery for f in sess.faults] == ["reference plan"]
    assert "converter" in sess.faults[0].error
