"""Plans that route tensors through the native layouts and converters give the outputs of the
all-numpy plan: on a small CNN with forced layouts, and on real architectures with the
default (native first) plan."""

from __future__ import annotations

import numpy as np
import pytest

from dispatch import Session
from dispatch.zoo import light_model
from tests.builders import small_cnn
from tests.native.support import registry

LAYOUTS = ("nhwc", "nchw8c", "nchw16c")


def _x(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_forced_native_layouts_match_numpy(layout):
    reg = registry()
    base = Session(small_cnn(), backends=["numpy"], registry=reg)
    over = {}
    for n in base.graph.nodes:
        if n.op_type == "Relu":
            over[n.name] = f"Relu.native.{layout}"
        elif n.op_type == "Add":
            over[n.name] = f"Add.native.{layout}_same"
    assert len(over) == 4
    sess = Session(small_cnn(), backends=["native", "numpy"], registry=reg, overrides=over)
    used = {s.impl for s in sess.plan.steps}
    assert {f"Relu.native.{layout}", f"Add.native.{layout}_same"} <= used
    chains = [c for c in sess.plan.conversions if not c.at_build]
    assert chains and all(c.chain for c in chains)
    assert any(layout in (c.src, c.dst) for c in chains)
    # one conversion per (tensor, target layout)
    keys = [(c.value, c.dst) for c in sess.plan.conversions]
    assert len(keys) == len(set(keys))
    x = _x((1, 3, 16, 16))
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], base.run(None, {"x": x})[0],
                               rtol=1e-5, atol=1e-6)


def test_mixed_native_layouts_use_direct_converters():
    """Relu in nhwc feeding an Add in nchw16c: the plan converts nhwc -> nchw16c directly."""
    reg = registry()
    base = Session(small_cnn(), backends=["numpy"], registry=reg)
    relus = [n.name for n in base.graph.nodes if n.op_type == "Relu"]
    add = next(n.name for n in base.graph.nodes if n.op_type == "Add")
    over = {relus[0]: "Relu.native.nhwc", relus[1]: "Relu.native.nhwc", add: "Add.native.nchw16c_same"}
    sess = Session(small_cnn(), backends=["native", "numpy"], registry=reg, overrides=over)
    direct = [c for c in sess.plan.conversions if c.src == "nhwc" and c.dst == "nchw16c"]
    assert direct and all(len(c.chain) == 1 for c in direct)
    x = _x((1, 3, 16, 16), 1)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], base.run(None, {"x": x})[0],
                               rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["squeezenet", "resnet50"])
def test_native_first_plan_matches_numpy_on_real_architectures(name):
    reg = registry()
    model = light_model(name, seed=0)
    native = Session(model, backends=["native", "numpy"], registry=reg)
    assert native.plan.backends_used().get("native", 0) > 0
    numpy_only = Session(model, backends=["numpy"], registry=reg)
    feeds = {i.name: _x(i.shape, 2) for i in native.get_inputs()}
    for a, b in zip(native.run(None, feeds), numpy_only.run(None, feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)
