"""Layout converter bandwidth on ResNet-50 activation shapes, side by side with a plain
parallel copy of the same bytes (the native module's `copy`): nchw <-> nchw16c and
nchw <-> nhwc. GB/s counts the bytes read plus the bytes written."""

from __future__ import annotations

import numpy as np
import pytest

from dispatch.registry import STANDARD

SHAPES = [(1, 64, 112, 112), (1, 256, 56, 56), (1, 512, 28, 28), (1, 1024, 14, 14), (1, 2048, 7, 7)]
PAIRS = [(STANDARD, "nchw16c"), ("nchw16c", STANDARD), (STANDARD, "nhwc"), ("nhwc", STANDARD),
         ("nhwc", "nchw16c")]


def _ids(shape):
    return "x".join(map(str, shape[1:]))


@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_copy(benchmark, shape):
    from impls.native._module import native

    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    benchmark.group = f"layout {_ids(shape)}"
    benchmark.extra_info["bytes"] = 2.0 * x.nbytes
    benchmark.pedantic(native().copy, args=(x,), warmup_rounds=3, rounds=30)


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}->{p[1]}")
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_convert(benchmark, shape, pair):
    from dispatch.backend import load_registry

    reg = load_registry()
    src, dst = pair
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    for conv in reg.layouts.path(STANDARD, src, shape, np.float32):
        x = conv(x, shape)
    (conv,) = reg.layouts.path(src, dst, shape, np.float32)
    out = conv(x, shape)
    benchmark.group = f"layout {_ids(shape)}"
    benchmark.extra_info["bytes"] = float(x.nbytes + out.nbytes)
    benchmark.pedantic(conv, args=(x, shape), warmup_rounds=3, rounds=30)
