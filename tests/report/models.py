"""Models for the report tests: a transformer-style encoder block built with ModelBuilder."""

from __future__ import annotations

import numpy as np
import onnx

from tests.builders import ModelBuilder


def transformer_block(seq: int = 8, hidden: int = 32, ffn: int = 64, seed: int = 0) -> onnx.ModelProto:
    """One pre-norm encoder block: LayerNormalization, single-head attention (MatMul, Transpose,
    Mul, Softmax), residual Adds and an Erf-GELU feed-forward (Div, Erf, Add, Mul); input
    ``x`` of shape ``[1, seq, hidden]``."""
    rng = np.random.default_rng(seed)
    b = ModelBuilder(17, "transformer_block")

    def w(*shape: int) -> str:
        return b.const(rng.normal(0, 1 / np.sqrt(shape[0]), shape).astype(np.float32))

    def vec(n: int, mean: float = 0.0) -> str:
        return b.const((mean + rng.normal(0, 0.1, n)).astype(np.float32))

    x = b.input("x", [1, seq, hidden])
    h = b.op("LayerNormalization", [x, vec(hidden, 1.0), vec(hidden)], axis=-1, epsilon=1e-5)
    q = b.op("Add", [b.op("MatMul", [h, w(hidden, hidden)]), vec(hidden)])
    k = b.op("MatMul", [h, w(hidden, hidden)])
    v = b.op("MatMul", [h, w(hidden, hidden)])
    kt = b.op("Transpose", [k], perm=[0, 2, 1])
    scores = b.op("Mul", [b.op("MatMul", [q, kt]), b.const(np.array(1 / np.sqrt(hidden), np.float32))])
    attn = b.op("Softmax", [scores], axis=-1)
    o = b.op("MatMul", [b.op("MatMul", [attn, v]), w(hidden, hidden)])
    r = b.op("Add", [x, o])
    h2 = b.op("LayerNormalization", [r, vec(hidden, 1.0), vec(hidden)], axis=-1, epsilon=1e-5)
    f = b.op("Add", [b.op("MatMul", [h2, w(hidden, ffn)]), vec(ffn)])
    erf = b.op("Erf", [b.op("Div", [f, b.const(np.array(np.sqrt(2.0), np.float32))])])
    gelu = b.op("Mul", [b.op("Mul", [f, b.op("Add", [erf, b.const(np.array(1.0, np.float32))])]),
                        b.const(np.array(0.5, np.float32))])
    f2 = b.op("Add", [b.op("MatMul", [gelu, w(ffn, hidden)]), vec(hidden)])
    y = b.op("Add", [r, f2])
    b.output(y)
    return b.build()
