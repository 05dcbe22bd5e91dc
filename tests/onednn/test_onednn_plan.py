"""The oneDNN backend in plans: its status and version, its reason when the module is absent,
threads, plans forced through oneDNN's layouts matching the all-numpy plan (a small CNN, and
squeezenet / resnet50), and oneDNN and native kernels chained in a shared layout without any
converter between them."""

from __future__ import annotations

import os
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
from tuner.fingerprint import PlanKey, software_fingerprint


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
    assert "onednn-devel-cpu-gomp" in reason and "apt-get install libdnnl-dev" in reason


def test_broken_module_gives_the_reason(monkeypatch):
    def fail(name):
        raise ImportError("libdnnl.so.2: cannot open shared object file")

    monkeypatch.setattr(_module, "_module", None)
    monkeypatch.setattr(_module, "_error", None)
    monkeypatch.setattr(_module.importlib, "import_module", fail)
    reason = OneDnnBackend().availability()
    assert "does not load" in reason and "libdnnl.so.2" in reason
    assert "pip install onednn-cpu-gomp" in reason


def test_the_library_is_loaded_from_the_runtime_distribution_when_the_rpath_misses(monkeypatch):
    """An install whose RPATH does not reach libdnnl.so.3 (e.g. pip --target): the library is
    loaded from the installed onednn-cpu-gomp and the import retried."""
    calls = []
    real = _module.importlib.import_module

    def first_fails(name):
        calls.append(name)
        if len(calls) == 1:
            raise ImportError("libdnnl.so.3: cannot open shared object file")
        return real(name)

    monkeypatch.setattr(_module, "_module", None)
    monkeypatch.setattr(_module, "_error", None)
    monkeypatch.setattr(_module.importlib, "import_module", first_fails)
    loaded = []
    monkeypatch.setattr(_module, "preload_runtime", lambda: loaded.append(1) or "libdnnl.so.3")
    assert _module.load() is not None and _module.error() is None
    assert calls == [_module.MODULE, _module.MODULE] and loaded == [1]


def test_software_fingerprint_has_the_onednn_version_and_invalidates_other_versions():
    """The oneDNN version loaded at run time is in the software fingerprint: a plan tuned with
    oneDNN 2.6 is not used under 3.x, and the reason names both versions."""
    reg = registry()
    sw = software_fingerprint(reg)
    version = sw["backends"]["onednn"]
    major, minor, patch, _ = _module.onednn().dnnl_version()
    assert version.startswith(f"oneDNN {major}.{minor}.{patch} (build "), version
    old = {**sw, "backends": {**sw["backends"], "onednn": "oneDNN 2.6.3 (build 0123456789abcdef)"}}

    def key(software):
        return PlanKey(model="m", inputs="i", hardware={"threads": 1}, software=software,
                       objective="latency")

    assert key(old).digest() != key(sw).digest()
    assert key(old).explain_difference(key(sw)) == [
        f"onednn: oneDNN 2.6.3 (build 0123456789abcdef) -> {version}"]


def _mapped_libdnnl() -> list[str]:
    with open("/proc/self/maps") as f:
        return sorted({line.split()[-1] for line in f if "libdnnl.so" in line})


@pytest.mark.skipif(os.environ.get("OPDISPATCH_EXPECT_ONEDNN") != "pypi",
                    reason="OPDISPATCH_EXPECT_ONEDNN=pypi (set by .ci/run) checks the pip install")
def test_a_pip_install_runs_onednn_3_from_pypi():
    """What every pip user gets (.ci/run sets OPDISPATCH_EXPECT_ONEDNN=pypi): oneDNN 3.x, the
    libdnnl.so.3 of the installed onednn-cpu-gomp, no other libdnnl in the process."""
    from importlib import metadata

    assert _module.onednn().dnnl_version()[0] == 3
    dist = metadata.distribution(_module.RUNTIME_DISTRIBUTION)
    shipped = {os.path.realpath(str(dist.locate_file(f))) for f in dist.files or ()
               if f.name.startswith("libdnnl.so")}
    mapped = _mapped_libdnnl()
    assert mapped and {os.path.realpath(p) for p in mapped} <= shipped, (mapped, shipped)


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
