"""Native layout converters against numpy, through the layout registry, and their errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatch.registry import STANDARD
from impls.native._module import native
from tests.native.support import registry

LAYOUTS = ("nhwc", "nchw8c", "nchw16c")

shapes = st.tuples(
    st.integers(1, 3), st.integers(1, 37), st.integers(1, 9), st.integers(1, 9)
)


def numpy_layout(x: np.ndarray, layout: str) -> np.ndarray:
    """An independent numpy definition of each layout's physical array."""
    if layout == "nhwc":
        return x.transpose(0, 2, 3, 1)
    block = 8 if layout == "nchw8c" else 16
    n, c, h, w = x.shape
    cb = -(-c // block)
    padded = np.zeros((n, cb * block, h, w), x.dtype)
    padded[:, :c] = x
    return padded.reshape(n, cb, block, h, w).transpose(0, 1, 3, 4, 2)


@settings(max_examples=40, deadline=None)
@given(shape=shapes, layout=st.sampled_from(LAYOUTS))
def test_from_standard_matches_numpy_and_round_trips(shape, layout):
    reg = registry()
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    (to,) = reg.layouts.path(STANDARD, layout, shape, np.float32)
    phys = to(x, shape)
    np.testing.assert_array_equal(phys, numpy_layout(x, layout))
    assert phys.shape == reg.layouts.layout(layout).stored_shape(shape)
    (back,) = reg.layouts.path(layout, STANDARD, shape, np.float32)
    np.testing.assert_array_equal(back(phys, shape), x)


@settings(max_examples=40, deadline=None)
@given(shape=shapes, pair=st.sampled_from([(a, b) for a in LAYOUTS for b in LAYOUTS if a != b]))
def test_every_path_between_native_layouts_is_exact(shape, pair):
    reg = registry()
    src, dst = pair
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    arr = numpy_layout(x, src).copy()
    for conv in reg.layouts.path(src, dst, shape, np.float32):
        arr = conv(arr, shape)
    np.testing.assert_array_equal(arr, numpy_layout(x, dst))


def test_direct_converters_are_preferred_over_two_steps():
    reg = registry()
    for a, b in (("nhwc", "nchw16c"), ("nchw16c", "nhwc"), ("nhwc", "nchw8c")):
        chain = reg.layouts.path(a, b, (1, 64, 56, 56), np.float32)
        assert len(chain) == 1 and chain[0].direct, [c.name for c in chain]


def test_non_contiguous_input_is_converted_correctly():
    reg = registry()
    base = np.random.default_rng(2).standard_normal((2, 5, 6, 19)).astype(np.float32)
    x = base.transpose(0, 3, 1, 2)  # logical (2, 19, 5, 6), not contiguous
    (to,) = reg.layouts.path(STANDARD, "nchw16c", x.shape, np.float32)
    np.testing.assert_array_equal(to(x, x.shape), numpy_layout(np.ascontiguousarray(x), "nchw16c"))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda m: m.nchw_to_blocked(np.zeros((1, 3, 2, 2), np.float64), 16), "float32"),
        (lambda m: m.nchw_to_blocked(np.zeros((1, 3, 2), np.float32), 16), "rank-4"),
        (lambda m: m.nchw_to_blocked(np.zeros((1, 3, 2, 2), np.float32), 4), "block must be 8 or 16"),
        (lambda m: m.blocked_to_nchw(np.zeros((1, 1, 2, 2, 16), np.float32), [1, 17, 2, 2], 16),
         "expected shape"),
        (lambda m: m.nchw_to_nhwc(np.zeros((1, 3, 4, 4), np.float32)[:, :, ::2]), "C-contiguous"),
        (lambda m: m.blocked_to_nhwc(np.zeros((1, 1, 2, 2, 16), np.float32), [1, 3, 2], 16),
         r"\(N, C, H, W\)"),
    ],
)
def test_bad_input_raises_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call(native())


def test_zero_block_tail_clears_only_the_padding():
    m = native()
    x = np.ones((2, 2, 3, 3, 8), np.float32)
    m.zero_block_tail(x, [2, 13, 3, 3], 8)
    assert x[:, 1, :, :, 5:].sum() == 0 and x[:, 1, :, :, :5].min() == 1 and x[:, 0].min() == 1


def test_module_reports_build_and_cpu():
    m = native()
    assert len(m.build_id) == 16
    assert m.isa() in m.supported_isas()
    assert m.num_threads() >= 1
    with pytest.raises(ValueError, match="known: generic"):
        m.set_isa("sse9")
    with pytest.raises(ValueError, match=">= 1"):
        m.set_num_threads(0)
