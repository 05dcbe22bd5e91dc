"""The layout registry: registration rules, cheapest conversion chains, and the fake layouts'
converters against the standard layout."""

from __future__ import annotations

import numpy as np
import pytest

from dispatch.errors import LayoutError
from layouts import STANDARD, Layout, LayoutRegistry, standard_layout
from tests.fakes import from_blk4, from_tcl, tcl_to_blk4, to_blk4, to_tcl


def _reg() -> LayoutRegistry:
    reg = LayoutRegistry()
    reg.add_layout(standard_layout())
    reg.add_layout(Layout("tcl", "cpu", "fake", rank=4), to_standard=from_tcl, from_standard=to_tcl)
    reg.add_layout(Layout("blk4", "cpu", "fake", rank=4), to_standard=from_blk4, from_standard=to_blk4)
    return reg


def test_non_standard_layout_needs_both_converters():
    reg = LayoutRegistry()
    reg.add_layout(standard_layout())
    with pytest.raises(LayoutError, match="must register both"):
        reg.add_layout(Layout("x", "cpu", "b"), to_standard=from_tcl)


def test_duplicate_layout_names_the_first_owner():
    reg = _reg()
    with pytest.raises(LayoutError, match="already registered by backend 'fake'"):
        reg.add_layout(Layout("tcl", "cpu", "other"), to_standard=from_tcl, from_standard=to_tcl)


def test_unknown_layout_lists_known():
    reg = _reg()
    with pytest.raises(LayoutError, match="known layouts: blk4, std, tcl"):
        reg.layout("nchw32c")


def test_path_goes_through_standard_without_shortcut():
    reg = _reg()
    chain = reg.path("tcl", "blk4", (1, 5, 3, 3), np.float32)
    assert [(c.src, c.dst) for c in chain] == [("tcl", STANDARD), (STANDARD, "blk4")]


def test_direct_shortcut_wins_when_cheaper():
    reg = _reg()
    reg.add_converter("tcl", "blk4", tcl_to_blk4, backend="fake")
    chain = reg.path("tcl", "blk4", (1, 5, 3, 3), np.float32)
    assert [(c.src, c.dst) for c in chain] == [("tcl", "blk4")]
    assert chain[0].direct


def test_measured_cost_model_changes_the_path():
    reg = _reg()
    reg.add_converter("tcl", "blk4", tcl_to_blk4, backend="fake")
    reg.set_cost_model(lambda c, shape, dtype: 100.0 if c.direct else 1.0)
    chain = reg.path("tcl", "blk4", (1, 5, 3, 3), np.float32)
    assert len(chain) == 2


def test_rank_restriction_is_enforced():
    reg = _reg()
    with pytest.raises(LayoutError, match="rank-4"):
        reg.path(STANDARD, "tcl", (3, 3), np.float32)


def test_no_path_lists_converters():
    reg = _reg()
    reg.add_layout(Layout("island", "cpu", "x", rank=4), to_standard=from_tcl, from_standard=to_tcl)
    # remove island's edges to make it unreachable
    del reg.converters[("island", STANDARD)]
    del reg.converters[(STANDARD, "island")]
    reg._paths.clear()
    with pytest.raises(LayoutError, match="no converter path"):
        reg.path("tcl", "island", (1, 2, 2, 2), np.float32)


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 5, 3, 7), (1, 8, 4, 4), (3, 13, 1, 2)])
def test_fake_converters_round_trip(shape):
    reg = _reg()
    reg.add_converter("tcl", "blk4", tcl_to_blk4, backend="fake")
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    for lay in ("tcl", "blk4"):
        there = x
        for c in reg.path(STANDARD, lay, shape, x.dtype):
            there = c(there, shape)
        back = there
        for c in reg.path(lay, STANDARD, shape, x.dtype):
            back = c(back, shape)
        np.testing.assert_array_equal(back, x)
    blk = to_blk4(x, shape)
    n, c, h, w = shape
    channels = blk.transpose(0, 1, 4, 2, 3).reshape(n, -1, h, w)
    assert channels.shape[1] % 4 == 0
    assert np.all(channels[:, c:] == 0), "padding channels of a blocked layout must be zero"
