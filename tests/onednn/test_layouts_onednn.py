"""oneDNN layouts: every registered oneDNN layout round-trips through its converters, the
physical shapes match the reorders', the shared activation layouts are byte-identical to the
native backend's, and the reorder binding validates its input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatch.registry import STANDARD
from impls.onednn import layouts as lay
from impls.onednn._module import onednn
from tests.onednn.support import registry

ONEDNN_LAYOUTS = sorted(n for n, layout in registry().layouts.layouts.items()
                        if layout.backend == "onednn" or n in lay.SHARED)


def _shapes(rank: int):
    if rank == 2:
        return st.tuples(st.integers(1, 70), st.integers(1, 70))
    return st.tuples(st.integers(1, 3), st.integers(1, 37), st.integers(1, 6), st.integers(1, 6))


@pytest.mark.parametrize("name", ONEDNN_LAYOUTS)
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_round_trip_through_the_standard_layout(name, data):
    reg = registry()
    layout = reg.layouts.layout(name)
    shape = data.draw(_shapes(layout.rank))
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    (to,) = reg.layouts.path(STANDARD, name, shape, np.float32)
    phys = to(x, shape)
    assert phys.shape == layout.stored_shape(shape)
    (back,) = reg.layouts.path(name, STANDARD, shape, np.float32)
    np.testing.assert_array_equal(back(phys, shape), x)


def _tag_of(name: str) -> str:
    for tag, layout in lay.ACTIVATIONS.items():
        if layout == name:
            return tag
    return name.removeprefix(lay.PREFIX)


@pytest.mark.parametrize("name", [n for n in ONEDNN_LAYOUTS if n != STANDARD])
def test_onednn_reorders_round_trip_for_every_layout(name):
    """The oneDNN reorders themselves (not the registry's cheapest converters, which may be
    the native backend's) for every layout, padding zero."""
    layout = registry().layouts.layout(name)
    shape = (2, 20, 3, 5) if layout.rank == 4 else (37, 70)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    tag = _tag_of(name)
    dims = lay.view_dims(tag, shape)
    phys = onednn().reorder(x, list(dims), lay.PLAIN[len(dims)], tag)
    assert phys.shape == layout.stored_shape(shape)
    assert np.count_nonzero(phys) == np.count_nonzero(x)  # padding is zero
    back = onednn().reorder(phys, list(dims), tag, lay.PLAIN[len(dims)]).reshape(shape)
    np.testing.assert_array_equal(back, x)


@settings(max_examples=30, deadline=None)
@given(shape=_shapes(4), name=st.sampled_from(lay.SHARED))
def test_shared_activation_layouts_are_byte_identical_to_natives(shape, name):
    """oneDNN's acdb / aBcd8b / aBcd16b are the native backend's nhwc / nchw8c / nchw16c."""
    native = pytest.importorskip("_opdispatch_native")
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    mine = onednn().reorder(x, list(shape), "abcd", lay.activation_tag(name))
    theirs = native.nchw_to_nhwc(x) if name == "nhwc" else native.nchw_to_blocked(x, int(name[4:-1]))
    assert mine.shape == theirs.shape
    np.testing.assert_array_equal(mine, theirs)


def test_blocked_by_4_matches_numpy():
    x = np.random.default_rng(3).standard_normal((2, 7, 3, 4)).astype(np.float32)
    padded = np.zeros((2, 8, 3, 4), np.float32)
    padded[:, :7] = x
    want = padded.reshape(2, 2, 4, 3, 4).transpose(0, 1, 3, 4, 2)
    (to,) = registry().layouts.path(STANDARD, "dnnl:aBcd4b", x.shape, np.float32)
    np.testing.assert_array_equal(to(x, x.shape), want)


def test_depthwise_view_of_weights():
    """A 5-letter tag on a rank-4 conv weight (M, C/g, KH, KW) is the grouped view
    (M, 1, C/g, KH, KW): Abcde16a is then M blocked by 16 innermost."""
    w = np.random.default_rng(4).standard_normal((20, 1, 3, 3)).astype(np.float32)
    (to,) = registry().layouts.path(STANDARD, "dnnl:Abcde16a", w.shape, np.float32)
    phys = to(w, w.shape)
    assert phys.shape == (2, 1, 1, 3, 3, 16)
    padded = np.zeros((32, 3, 3), np.float32)
    padded[:20] = w[:, 0]
    np.testing.assert_array_equal(phys.reshape(2, 3, 3, 16),
                                  padded.reshape(2, 16, 3, 3).transpose(0, 2, 3, 1))


def test_matmul_weight_names_swap_with_the_transpose():
    """BA16a64b over (K, N) is AB16b64a over (N, K): the same bytes."""
    from impls.onednn.gemm import swap_dims

    b = np.random.default_rng(5).standard_normal((37, 70)).astype(np.float32)  # (K, N)
    kn = onednn().reorder(b, [37, 70], "ab", "BA16a64b")
    nk = onednn().reorder(np.ascontiguousarray(b.T), [70, 37], "ab", swap_dims("BA16a64b"))
    np.testing.assert_array_equal(kn, nk)


def test_every_declared_tag_is_known_to_the_module():
    """Every declared format is one the module names (oneDNN 3.x: all of them; 2.x: all but
    the 3.x-only ones, which are then not registered)."""
    known = set(onednn().known_tags())
    only_3x = set() if onednn().dnnl_version()[0] >= 3 else set(lay.ONLY_3X)
    for tags in (lay.ACTIVATIONS, lay.CONV_WEIGHTS, lay.DEPTHWISE_WEIGHTS, lay.MATMUL_WEIGHTS):
        assert set(tags) - only_3x <= known, set(tags) - only_3x - known
    registered = set(registry().layouts.layouts)
    for tag in only_3x:
        assert lay.layout_name(tag) not in registered


def test_the_avx2_brgemm_weight_formats_of_onednn_3_round_trip():
    """oneDNN 3.x's AVX2 brgconv weights (Acdb24a: out channels blocked by 24, zero-padded) and
    brdgmm depthwise weights (decbA8a over the grouped view) through their registered layouts."""
    if onednn().dnnl_version()[0] < 3:
        pytest.skip("oneDNN 2.x has no Acdb24a / decbA8a")
    reg = registry()
    rng = np.random.default_rng(11)
    for name, shape in (("dnnl:Acdb24a", (50, 7, 3, 3)), ("dnnl:decbA8a", (13, 1, 3, 3))):
        w = rng.standard_normal(shape).astype(np.float32)
        (to,) = reg.layouts.path("std", name, w.shape, np.float32)
        (back,) = reg.layouts.path(name, "std", w.shape, np.float32)
        phys = to(w, w.shape)
        assert phys.shape == reg.layouts.layout(name).physical_shape(w.shape)
        np.testing.assert_array_equal(back(phys, w.shape), w)
    phys = reg.layouts.path("std", "dnnl:Acdb24a", (50, 7, 3, 3), np.float32)[0](
        rng.standard_normal((50, 7, 3, 3)).astype(np.float32), (50, 7, 3, 3))
    assert phys.shape == (3, 3, 3, 7, 24)  # M 50 padded to 72 = 3 x 24, then KH, KW, C


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda m: m.reorder(np.zeros((1, 3, 2, 2)), [1, 3, 2, 2], "abcd", "acdb"), "float32"),
        (lambda m: m.reorder(np.zeros((1, 3, 2, 2), np.float32), [1, 3, 2, 2], "abcd", "nChw16c"),
         "unknown oneDNN format tag"),
        (lambda m: m.reorder(np.zeros((1, 3, 2, 2), np.float32), [1, 3, 2], "abcd", "acdb"), "rank-4"),
        (lambda m: m.reorder(np.zeros((1, 3, 2, 3), np.float32), [1, 3, 2, 2], "abcd", "acdb"), "elements"),
        (lambda m: m.reorder(np.zeros((1, 3, 4, 2), np.float32)[:, :, ::2], [1, 3, 2, 2], "abcd", "acdb"),
         "C-contiguous"),
        (lambda m: m.reorder(np.zeros((0, 3, 2, 2), np.float32), [0, 3, 2, 2], "abcd", "acdb"), ">= 1"),
        (lambda m: m.set_num_threads(-1), ">= 1"),
    ],
)
def test_bad_input_raises_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call(onednn())
