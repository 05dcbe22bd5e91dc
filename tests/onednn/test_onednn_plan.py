"""The oneDNN backend in plans: its status and version, its reason when the module is absent,
threads, plans forced through oneDNN's layouts matching the all-numpy plan (a small CNN, and
squeezenet / resnet50), and oneDNN and native kernels chained in a shared layout without any
converter between them."""

from __future__ import annotations

import re

import numpy as np
import pytest

from dispatch import Session
from dispatch.config import Config
from dispatch.zoo import light_model
from impls.onednn import _module
from impls.onednn.backend import OneDnnBackend
from tests.builders import small_cnn
from tests.onednn.support import registry


def _x(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_backend_is_available_with_its_version():
    st = registry().backends["onednn"]
    assert st.available, st.reason
    assert re.fullmatch(r"oneDNN \d+\.\d+\.\d+ \(build [0-9a-f]{16}\)", st.version), st.version
    assert st.implementations > 100
    assert "dnnl:Acdb64a" in st.layouts and "dnnl:BA16a64b" in st.layouts


def test_missing_module_gives_the_reason(monkeypatch):
    monkeypatch.setattr(_module, "_module", None)
    monkeypatch.setattr(_module, "_error", None)
    monkeypatch.setattr(_module.importlib.util, "find_spec", lambda name: None)
    reason = OneDnnBackend().availability()
    assert reason is not None
    assert "oneDNN was not found at build time" in reason
    assert "apt-get install libdnnl-dev" in reason


def test_broken_module_gives_the_reason(monkeypatch):
    def fail(name):
        raise ImportError("libdnnl.so.2: cannot open shared object file")

    monkeypatch.setattr(_module, "_module", None)
    monkeypatch.setattr(_module, "_error", None)
    monkeypatch.setattr(_module.importlib, "import_module", fail)
    reason = OneDnnBackend().availability()
    assert "does not load" in reason and "libdnnl.so.2" in reason


def test_configure_sets_threads():
    mod = _module.onednn()
    before = mod.num_threads()
    try:
        OneDnnBackend().configure(Config(threads=1))
        assert mod.num_threads() == 1
        # a primitive runs with it (OpenMP's setting is applied on the executing thread)
        x = _x((1, 8, 6, 6))
        sess = Session(small_cnn(), backends=["onednn", "numpy"], registry=registry(), store=False)
        sess.run(None, {"x": _x((1, 3, 16, 16))})
        assert x is not None
    finally:
        mod.set_num_threads(before)


def _compare(model, feeds, reg, rtol=1e-4, atol=1e-5):
    base = Session(model, backends=["numpy"], registry=reg, store=False)
    sess = Session(model, backends=["onednn", "numpy"], registry=reg, store=False)
    for a, b in zip(sess.run(None, feeds), base.run(None, feeds)):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    return sess


def test_small_cnn_plan_through_onednn_matches_numpy():
    reg = registry()
    sess = _compare(small_cnn(), {"x": _x((1, 3, 16, 16))}, reg)
    used = {s.impl.split(".")[0] for s in sess.plan.steps if s.backend == "onednn"}
    assert {"Conv", "Gemm", "GlobalAveragePool"} <= {u.split("+")[0] for u in used}, sess.plan.describe()


def test_onednn_and_native_share_nhwc_without_a_converter():
    """A oneDNN convolution writing nhwc feeds a native Relu in nhwc directly: no conversion
    of that tensor is planned (the layouts are the same bytes)."""
    reg = registry()
    if not reg.backends.get("native") or not reg.backends["native"].available:
        pytest.skip("the native backend is not available")
    base = Session(small_cnn(), backends=["numpy"], registry=reg, store=False)
    convs = [n for n in base.graph.nodes if n.op_type == "Conv"]
    relus = [n for n in base.graph.nodes if n.op_type == "Relu"]
    conv = convs[-1]
    relu = next(r for r in relus if r.inputs[0].name == conv.outputs[0].name)
    impl = reg.impl("Conv.onednn.any")
    out_layout = impl.output_layouts(conv)[0]
    if f"Relu.native.{out_layout}" not in {i.name for i in reg.implementations}:
        pytest.skip(f"oneDNN chose {out_layout}, which no native Relu takes")
    over = {conv.name: "Conv.onednn.any", relu.name: f"Relu.native.{out_layout}"}
    sess = Session(small_cnn(), backends=["onednn", "native", "numpy"], registry=reg,
                   overrides=over, store=False)
    assert not [c for c in sess.plan.conversions if c.value == conv.outputs[0].name], sess.plan.describe()
    x = _x((1, 3, 16, 16), 1)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], base.run(None, {"x": x})[0],
                               rtol=1e-4, atol=1e-5)


def test_weights_are_converted_when_the_plan_is_built():
    reg = registry()
    sess = Session(small_cnn(), backends=["onednn", "numpy"], registry=reg, store=False)
    weight_convs = [c for c in sess.plan.conversions if c.dst.startswith("dnnl:")]
    assert weight_convs and all(c.at_build for c in weight_convs), sess.plan.describe()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["squeezenet", "resnet50"])
def test_onednn_plan_matches_numpy_on_real_architectures(name):
    reg = registry()
    model = light_model(name, seed=0)
    sess = Session(model, backends=["onednn", "numpy"], registry=reg, store=False)
    used = sess.plan.backends_used()
    assert used.get("onednn", 0) > used.get("numpy", 0), used
    layouts = {lay for s in sess.plan.steps if s.backend == "onednn" for lay in s.layouts_in}
    assert any(lay != "std" for lay in layouts), layouts
    base = Session(model, backends=["numpy"], registry=reg, store=False)
    feeds = {i.name: _x(i.shape, 2) for i in sess.get_inputs()}
    for a, b in zip(sess.run(None, feeds), base.run(None, feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)


def test_without_the_native_backend_onednn_registers_the_shared_layouts():
    """With no native backend, oneDNN registers nhwc / nchw8c / nchw16c itself (oneDNN
    reorders as converters), and plans through them still match numpy."""
    from dispatch.backend import _activate
    from dispatch.registry import Registry
    from impls.numpy.backend import NumpyBackend
    from layouts.registry import LayoutRegistry
    from layouts.standard import standard_layout

    reg = Registry(layouts=LayoutRegistry())
    reg.layouts.add_layout(standard_layout())
    _activate(reg, NumpyBackend, "test")
    _activate(reg, OneDnnBackend, "test")
    assert reg.backends["onednn"].available, reg.backends["onednn"].reason
    for name in ("nhwc", "nchw8c", "nchw16c"):
        assert reg.layouts.layout(name).backend == "onednn"
        x = _x((2, 20, 3, 5))
        (to,) = reg.layouts.path("std", name, x.shape, np.float32)
        (back,) = reg.layouts.path(name, "std", x.shape, np.float32)
        np.testing.assert_array_equal(back(to(x, x.shape), x.shape), x)
    _compare(small_cnn(), {"x": _x((1, 3, 16, 16))}, reg)
