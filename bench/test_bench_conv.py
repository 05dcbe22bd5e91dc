"""Per-layer Conv throughput on every distinct Conv of ResNet-50 (batch 1, 224x224), side by
side in one run: every native implementation that supports the layer (kernel only, inputs
already in its layouts; conversions are measured in test_bench_layouts.py), numpy's im2col,
and onnxruntime on a single-node model (std in and out, so it includes any reorder
onnxruntime inserts internally) — plus this machine's GEMM peak (numpy float32 2048x2048
matmul), so that every figure is also a fraction of peak. bench/report.py turns the JSON into
GFLOP/s tables.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from bench.shapes import conv_shapes, single_node_model
from dispatch.registry import STANDARD

SHAPES = conv_shapes("resnet50")
IDS = [s.label.replace(" ", "_") for s in SHAPES]


def _registry():
    from dispatch.backend import load_registry

    return load_registry()


def _x(shape):
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def test_gemm_peak(benchmark):
    """numpy float32 2048x2048 matmul: the machine's practical GEMM peak."""
    benchmark.group = "peak"
    a, b = _x((2048, 2048)), _x((2048, 2048))
    benchmark.extra_info["flops"] = 2.0 * 2048**3
    benchmark.pedantic(np.matmul, args=(a, b), warmup_rounds=1, rounds=7)


def _fastest(benchmark, shape, backend: str) -> None:
    """Benchmark the fastest ``backend`` implementation of the layer (each supporting one is
    timed once briefly; the best is then benchmarked), inputs already in its layouts."""
    import time

    reg = _registry()
    if backend not in reg.available_backends():
        pytest.skip(f"backend {backend} is unavailable: "
                    f"{reg.backends.get(backend) and reg.backends[backend].reason}")
    node = shape.node
    impls = [i for i in reg.impls_for("Conv", [backend]) if i.supports(node) is None]
    if not impls:
        pytest.skip(f"no {backend} implementation supports this layer")
    best = None
    for impl in impls:
        ins = []
        for v, lay in zip(node.inputs, impl.input_layouts(node)):
            if v is None:
                ins.append(None)
                continue
            arr = v.const if v.const is not None else _x(v.shape)
            if lay != STANDARD:
                for conv in reg.layouts.path(STANDARD, lay, v.shape, v.dtype):
                    arr = conv(arr, v.shape)
            ins.append(arr)
        kernel = impl.build(node)
        kernel(*ins)
        t = []
        for _ in range(5):
            t0 = time.perf_counter()
            kernel(*ins)
            t.append(time.perf_counter() - t0)
        med = float(np.median(t))
        if best is None or med < best[0]:
            best = (med, impl, kernel, ins)
    _, impl, kernel, ins = best
    benchmark.group = f"conv {shape.label}"
    benchmark.extra_info.update(flops=shape.flops, impl=impl.name, layouts=list(impl.input_layouts(node)))
    benchmark.pedantic(kernel, args=tuple(ins), warmup_rounds=2, rounds=15)


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_native(benchmark, shape):
    """The fastest native implementation of the layer."""
    _fastest(benchmark, shape, "native")


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_onednn(benchmark, shape):
    """The fastest oneDNN implementation of the layer (primitive created once; kernel only)."""
    _fastest(benchmark, shape, "onednn")


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_numpy_im2col(benchmark, shape):
    reg = _registry()
    impl = reg.impl("Conv.numpy.im2col")
    node = shape.node
    if impl.supports(node) is not None:
        pytest.skip(impl.supports(node))
    kernel = impl.build(node)
    ins = [None if v is None else (v.const if v.const is not None else _x(v.shape)) for v in node.inputs]
    benchmark.group = f"conv {shape.label}"
    benchmark.extra_info["flops"] = shape.flops
    benchmark.pedantic(kernel, args=tuple(ins), warmup_rounds=2, rounds=15)


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_onnxruntime(benchmark, shape):
    ort = pytest.importorskip("onnxruntime")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = len(os.sched_getaffinity(0))
    sess = ort.InferenceSession(single_node_model(shape.node).SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    feeds = {i.name: _x(i.shape) for i in sess.get_inputs()}
    benchmark.group = f"conv {shape.label}"
    benchmark.extra_info["flops"] = shape.flops
    benchmark.pedantic(sess.run, args=(None, feeds), warmup_rounds=2, rounds=15)
