"""Run-time faults: ``Session(on_error="raise"|"fallback")``.

A test-double Relu registered for backend "numpy" raises whenever it runs; it is forced onto
one node with ``overrides``. With "raise" the KernelError names the node, implementation and
backend; with "fallback" the run is answered by the numpy reference plan, the fault is
recorded and a RuntimeWarning is issued once per implementation.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from dispatch import Session
from dispatch.backend import load_registry
from dispatch.errors import ArgumentError, KernelError
from dispatch.registry import ImplTable
from dispatch.session import Fault
from tests.builders import small_cnn

FAULTY = "Relu.numpy.faulty"


@pytest.fixture(scope="module")
def reg():
    """A fresh registry copy with a Relu that raises at run time (test double)."""
    registry = load_registry(fresh=True)
    table = ImplTable("numpy")

    @table.register("Relu", "faulty")
    def _faulty(node):
        """A Relu that builds fine and raises when run (test double)."""

        def run(x):
            raise RuntimeError("simulated kernel fault")

        return run

    registry.add_table(table)
    return registry


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
    with pytest.raises(ArgumentError, match=r"on_error must be one of 'raise', 'fallback', received 'ignore'"):
        Session(small_cnn(), registry=reg, store=False, on_error="ignore")
