"""numpy reference of onnxruntime's ``DynamicQuantizeLSTM`` (domain ``com.microsoft``, issue 52):
the LSTM that ``quantize_dynamic`` writes (schema: :mod:`dispatch.contrib_schemas_quantized`).

W (D, I, 4H) and R (D, H, 4H) are uint8 or int8 (the transposes of ONNX LSTM's), with
``W_scale`` / ``R_scale`` and ``W_zero_point`` / ``R_zero_point`` per direction (D,) or per
column (D, 4H). onnxruntime quantizes the float operands of both products as it runs, as
:func:`quantize_rows` does: X (every step of a direction at once) and, at every step, the
hidden state of the batch, each to uint8 with the range widened to hold 0, ``scale = (max -
min) / 255`` (1 where the range is 0), the zero point and the values rounded half to even.
The integer products are exact; each is rescaled by ``a_scale * w_scale`` (float32) and the
gates are then those of ONNX's LSTM (:mod:`impls.numpy.recurrent`: gate order i, o, f, c,
bias ``Wb + Rb``, peepholes P, clip, input_forget, the activations), in float32.

This is what onnxruntime computes on one thread (measured with onnxruntime 1.32: within 3e-7).
With several threads onnxruntime splits the batch between them for the hidden state's product
and quantizes each share on its own (2 threads, batch 2: each row alone, within 3e-7 again), so
its result depends on its thread count. Tolerance (dispatch.compare: 3e-2): a hidden value
quantized one step apart (another range, or float32 gates an ulp apart, onnxruntime's sigmoid
and tanh being MLAS approximations) changes the gates by that step times a row of |R - R_zero|
* R_scale, carried through the recurrence: measured up to 1.24e-2 (an output of 0.099; batch 3,
2 threads, 6 steps).

Not covered (refused, so that the node runs on onnxruntime): ``sequence_lens`` (onnxruntime's
range of X and of the hidden states then includes the padded steps in its own order), a
scale or zero point of another shape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dispatch.graph import Node
from dispatch.registry import Priority
from impls.numpy.contrib_activations import MS_DOMAIN
from impls.numpy.misc import check_dtypes, first_reason
from impls.numpy.recurrent import DEFAULT_ACTIVATIONS, _activation, _resolve_activations
from impls.numpy.table import impls

Kernel = Callable[..., Any]

DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}


def quantize_rows(a: np.ndarray) -> tuple[np.ndarray, np.float32, int]:
    """float32 ``a`` quantized to uint8 per tensor as onnxruntime's recurrent kernels do
    (GetQuantizationParameter, then MLAS's QuantizeLinear): (q as int64, scale, zero point).
    Where ``a`` holds NaN or +-inf, or its range overflows float32, it has no quantization: the
    scale is NaN (the products, and so the LSTM's outputs, NaN)."""
    a = np.asarray(a, np.float32)
    with np.errstate(all="ignore"):
        lo = np.float32(min(float(np.min(a, initial=0.0)), 0.0))
        hi = np.float32(max(float(np.max(a, initial=0.0)), 0.0))
        scale = np.float32(1.0) if hi == lo else np.float32((hi - lo) / np.float32(255.0))
    if not (np.isfinite(scale) and np.isfinite(lo) and np.isfinite(hi)) or np.isnan(a).any():
        return np.zeros(a.shape, np.int64), np.float32(np.nan), 0
    zero = int(np.rint(np.clip(np.float32(0.0) - lo / scale, 0.0, 255.0)))
    with np.errstate(invalid="ignore"):
        q = np.clip(np.rint(np.clip(a / scale, -zero, 255 - zero)) + zero, 0, 255)
    return np.nan_to_num(q, nan=zero).astype(np.int64), scale, zero


def quantized_product(a: np.ndarray, w: np.ndarray, w_scale: np.ndarray, w_zero: np.ndarray) -> np.ndarray:
    """``a`` (float32, rows of K) times the quantized ``w`` (K, N): ``a`` quantized by
    :func:`quantize_rows`, the exact integer product rescaled by ``a_scale * w_scale`` in float32."""
    q, scale, zero = quantize_rows(a)
    acc = np.matmul(q - zero, w.astype(np.int64) - w_zero.astype(np.int64).reshape(-1))
    multiplier = (scale * w_scale.astype(np.float32)).reshape(-1)
    with np.errstate(invalid="ignore"):
        return (acc.astype(np.float32) * multiplier).astype(np.float32)


def _lstm_reason(node: Node) -> str | None:
    direction = node.attr("direction", "forward")
    if direction not in DIRECTIONS:
        return f"DynamicQuantizeLSTM with direction={direction!r}: supported are {', '.join(DIRECTIONS)}"
    if node.input(4) is not None:
        return ("DynamicQuantizeLSTM with sequence_lens: not supported (every sequence the full length is; "
                "onnxruntime's quantization ranges then include the padded steps)")
    nd = DIRECTIONS[direction]
    for k, name in ((1, "W"), (2, "R")):
        s = node.input(k).shape if node.input(k) is not None else None
        if s is not None and (len(s) != 3 or s[0] != nd):
            return (f"DynamicQuantizeLSTM with {name} of shape {list(s)}: supported is ({nd}, rows, "
                    f"4 * hidden)")
    for k, name in ((8, "W_scale"), (9, "W_zero_point"), (10, "R_scale"), (11, "R_zero_point")):
        s = node.input(k).shape if node.input(k) is not None else None
        if s is not None and not (tuple(s) == (nd,) or (len(s) == 2 and s[0] == nd)):
            return (f"DynamicQuantizeLSTM with {name} of shape {list(s)}: supported are ({nd},) (per "
                    f"direction) and ({nd}, 4 * hidden) (per column)")
    names = node.attr("activations")
    if names is not None:
        if len(names) != 3 * nd:
            return f"DynamicQuantizeLSTM with {len(names)} activations: {nd} direction(s) need {3 * nd}"
        specs = _resolve_activations("DynamicQuantizeLSTM", names, node.attr("activation_alpha") or [],
                                     node.attr("activation_beta") or [])
        if isinstance(specs, str):
            return specs
    return None


def _supports_lstm(node: Node) -> str | None:
    return first_reason(check_dtypes(node, frozenset({"float32"}), (0, 3, 5, 6, 7, 8, 10), same=True),
                        check_dtypes(node, frozenset({"uint8", "int8"}), (1, 9), same=True),
                        check_dtypes(node, frozenset({"uint8", "int8"}), (2, 11), same=True),
                        _lstm_reason(node))


def _activations(node: Node, nd: int) -> list[tuple[Callable[[np.ndarray], np.ndarray], ...]]:
    """(f, g, h) of each direction."""
    names = node.attr("activations") or list(DEFAULT_ACTIVATIONS["LSTM"]) * nd
    specs = _resolve_activations("DynamicQuantizeLSTM", names, node.attr("activation_alpha") or [],
                                 node.attr("activation_beta") or [])
    if isinstance(specs, str):
        raise ValueError(specs)
    fns = [_activation(s.name, s.alpha, s.beta) for s in specs]
    return [tuple(fns[3 * d:3 * d + 3]) for d in range(nd)]


@impls.register("DynamicQuantizeLSTM", "ms_timeloop", domain=MS_DOMAIN, priority=Priority.DEFAULT,
                supports=_supports_lstm)
def ms_dynamic_quantize_lstm(node: Node) -> Kernel:
    """com.microsoft DynamicQuantizeLSTM: X and the hidden state quantized to uint8 as it runs,
    times the quantized W and R, the LSTM cell of every step in float32."""
    direction = node.attr("direction", "forward")
    nd = DIRECTIONS[direction]
    acts = _activations(node, nd)
    clip = node.attr("clip")
    clip_at = None if clip is None else np.float32(clip)
    input_forget = bool(int(node.attr("input_forget", 0)))
    n_out = len(node.outputs)

    def clipped(v: np.ndarray) -> np.ndarray:
        return v if clip_at is None else np.clip(v, -clip_at, clip_at)

    def run(x: np.ndarray, w: np.ndarray, r: np.ndarray, b: np.ndarray | None = None,
            lens: np.ndarray | None = None, h0: np.ndarray | None = None, c0: np.ndarray | None = None,
            p: np.ndarray | None = None, w_scale: np.ndarray | None = None, w_zero: np.ndarray | None = None,
            r_scale: np.ndarray | None = None, r_zero: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
        seq, batch, _ = x.shape
        hid = r.shape[1]
        y = np.zeros((seq, nd, batch, hid), np.float32)
        y_h = np.zeros((nd, batch, hid), np.float32)
        y_c = np.zeros((nd, batch, hid), np.float32)
        for d in range(nd):
            reverse = direction == "reverse" or d == 1
            xs = x[::-1] if reverse else x
            ws, wz = np.asarray(w_scale)[d], np.asarray(w_zero)[d]
            rs, rz = np.asarray(r_scale)[d], np.asarray(r_zero)[d]
            xw = quantized_product(xs.reshape(seq * batch, -1), w[d], ws, wz).reshape(seq, batch, 4 * hid)
            bias = None if b is None else (b[d, :4 * hid] + b[d, 4 * hid:]).astype(np.float32)
            h = np.zeros((batch, hid), np.float32) if h0 is None else h0[d].astype(np.float32)
            c = np.zeros((batch, hid), np.float32) if c0 is None else c0[d].astype(np.float32)
            pi = po = pf = None
            if p is not None:
                pi, po, pf = (p[d, k * hid:(k + 1) * hid].astype(np.float32) for k in range(3))
            f, g, hact = acts[d]
            for t in range(seq):
                gates = xw[t] + quantized_product(h, r[d], rs, rz)
                if bias is not None:
                    gates = gates + bias
                gi, go = gates[:, :hid], gates[:, hid:2 * hid]
                gf, gc = gates[:, 2 * hid:3 * hid], gates[:, 3 * hid:]
                if pi is not None:
                    gi = gi + pi * c
                i = f(clipped(gi))
                fg = 1 - i if input_forget else f(clipped(gf + pf * c if pf is not None else gf))
                c = (fg * c + i * g(clipped(gc))).astype(np.float32)
                o = f(clipped(go + po * c if po is not None else go))
                h = (o * hact(c)).astype(np.float32)
                y[seq - 1 - t if reverse else t, d] = h
            y_h[d], y_c[d] = h, c
        return tuple(np.ascontiguousarray(o) for o in (y, y_h, y_c)[:n_out])

    return run
