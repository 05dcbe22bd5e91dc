"""numpy reference kernels of ONNX's recurrent operators: LSTM, GRU and RNN (opsets 7 to 22).

One driver runs all three. The input projection ``X @ W^T + biases`` is one matmul over every
time step and every direction; the recurrence loops over time only, with the directions
stacked on a leading axis (a bidirectional node runs both directions in the same loop, the
reverse one over its sequences read backwards). Everything is decided from the arrays at run
time (sequence length, batch, input and hidden sizes), so the kernels also run nodes whose
values have no static shape.

Semantics (the ONNX operator docs; onnxruntime's CPU kernels where the docs leave a gap):

- Gate orders: LSTM ``i, o, f, c`` (peepholes ``P``: ``i, o, f``), GRU ``z, r, h``; ``B`` holds
  ``Wb`` then ``Rb``. LSTM: ``C = f * C' + i * g(.)``, ``o`` peeks at the new ``C``,
  ``H = o * h(C)``; ``input_forget=1`` couples the gates, ``f = 1 - i``. GRU:
  ``H = (1 - z) * h~ + z * H'``; ``linear_before_reset=1`` applies ``r`` after the recurrent
  product and its bias, ``h~ = g(Xt Wh^T + r * (H' Rh^T + Rbh) + Wbh)``.
- ``clip`` bounds every activation's input (biases and peepholes included) to
  ``[-clip, clip]``; the cell state itself is not clipped before ``h``.
- ``activations``: ``N`` names per direction (LSTM 3, GRU 2, RNN 1), ``2N`` for
  ``bidirectional`` (forward first), case-insensitive. ``activation_alpha`` /
  ``activation_beta`` are consumed in the order of the activations, each activation taking
  only the parameters it uses (Affine, ScaledTanh, HardSigmoid: alpha and beta; LeakyRelu,
  ThresholdedRelu, Elu: alpha); a missing value takes the default of the ONNX operator of that
  name (LeakyRelu 0.01, HardSigmoid 0.2 / 0.5, Elu 1, ThresholdedRelu 1, Affine 1 / 0).
  ScaledTanh has none, so it needs both values. ThresholdedRelu is ``x if x > alpha else 0``
  (the ThresholdedRelu operator's and onnxruntime's form).
- ``sequence_lens``: a sequence of length ``L`` runs steps ``0 .. L-1`` (the reverse direction
  ``L-1 .. 0``); ``Y`` is zero past ``L``; ``Y_h`` / ``Y_c`` are the states at the last step
  run (the forward direction's step ``L-1``, the reverse direction's step 0); a sequence of
  length 0 has zero ``Y_h`` / ``Y_c`` (onnxruntime's result; not ``initial_h``).
- ``layout=1`` (opset 14+): ``X`` is ``[batch, seq, input]``, ``initial_h`` / ``initial_c`` /
  ``Y_h`` / ``Y_c`` are ``[batch, num_directions, hidden]``, ``Y`` is
  ``[batch, seq, num_directions, hidden]``.

float16 computes in float32 and rounds back once; float32 and float64 compute in their own
dtype. ``supports()`` refuses (with the reason) opsets before 7 (``output_sequence``), an
unknown direction or activation, an activation list of the wrong length, ScaledTanh without
both alpha and beta, a non-positive ``clip``, a ``layout`` other than 0 / 1 (or set before
opset 14), more outputs than the operator has, and dtypes numpy has no type for (bfloat16).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dispatch.graph import Node
from dispatch.registry import Priority
from impls.numpy.misc import FLOAT_TYPES, INT_TYPES, check_dtypes, first_reason
from impls.numpy.table import impls

Kernel = Callable[..., Any]
Act = Callable[[np.ndarray], np.ndarray]

#: gates per operator (rows of W / R are ``gates * hidden_size``)
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
#: activation functions per direction
N_ACTIVATIONS = {"LSTM": 3, "GRU": 2, "RNN": 1}
DEFAULT_ACTIVATIONS = {
    "LSTM": ("Sigmoid", "Tanh", "Tanh"),
    "GRU": ("Sigmoid", "Tanh"),
    "RNN": ("Tanh",),
}
#: the ONNX input names, in order (LSTM has all eight; GRU and RNN the first six)
INPUT_NAMES = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")
#: the outputs of each operator
N_OUTPUTS = {"LSTM": 3, "GRU": 2, "RNN": 2}
DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}


def _f32(v: float) -> float:
    """``v`` as the float32 value an ONNX float attribute stores."""
    return float(np.float32(v))


#: lower-case activation name -> (default alpha, default beta); ``None``: the activation does
#: not take that parameter; ``math.nan``: it takes it but ONNX gives no default
ACTIVATION_PARAMS: dict[str, tuple[float | None, float | None]] = {
    "relu": (None, None),
    "tanh": (None, None),
    "sigmoid": (None, None),
    "affine": (_f32(1.0), _f32(0.0)),
    "leakyrelu": (_f32(0.01), None),
    "thresholdedrelu": (_f32(1.0), None),
    "scaledtanh": (math.nan, math.nan),
    "hardsigmoid": (_f32(0.2), _f32(0.5)),
    "elu": (_f32(1.0), None),
    "softsign": (None, None),
    "softplus": (None, None),
}
ACTIVATION_NAMES = (
    "Relu, Tanh, Sigmoid, Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, "
    "Softsign, Softplus"
)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # exp(-x) overflows to inf for x < -88 (float32): 1 / inf is the right 0
    return 1.0 / (1.0 + np.exp(-x))


def _activation(name: str, alpha: float | None, beta: float | None) -> Act:
    """The function ``name`` (lower case) with its parameters bound."""
    if name == "relu":
        return lambda x: np.maximum(x, 0)
    if name == "tanh":
        return np.tanh
    if name == "sigmoid":
        return _sigmoid
    if name == "affine":
        return lambda x: x * alpha + beta
    if name == "leakyrelu":
        return lambda x: np.where(x >= 0, x, x * alpha)
    if name == "thresholdedrelu":
        return lambda x: np.where(x > alpha, x, 0).astype(x.dtype, copy=False)
    if name == "scaledtanh":
        return lambda x: np.tanh(x * beta) * alpha
    if name == "hardsigmoid":
        return lambda x: np.clip(x * alpha + beta, 0, 1)
    if name == "elu":
        return lambda x: np.where(x >= 0, x, np.expm1(x) * alpha)
    if name == "softsign":
        return lambda x: x / (1 + np.abs(x))
    if name == "softplus":
        return lambda x: np.logaddexp(0, x).astype(x.dtype, copy=False)
    raise ValueError(f"unknown activation {name!r}")


# -- attributes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _ActSpec:
    name: str
    alpha: float | None
    beta: float | None


@dataclass(frozen=True)
class _Config:
    """A node's attributes, checked and resolved."""

    op: str
    num_directions: int
    reverse_first: bool  # direction == "reverse"
    hidden_size: int | None
    #: per activation slot (f, g, h / f, g / f): one spec per direction
    activations: tuple[tuple[_ActSpec, ...], ...]
    clip: float | None
    layout: int
    input_forget: bool
    linear_before_reset: bool


def _resolve_activations(
    op: str, names: Sequence[str], alphas: Sequence[float], betas: Sequence[float]
) -> list[_ActSpec] | str:
    """The activation specs of ``names`` with alpha / beta consumed in order, or a reason."""
    specs = []
    ia = ib = 0
    for raw in names:
        name = str(raw).lower()
        if name not in ACTIVATION_PARAMS:
            return f"{op} activation {raw!r} is not one of {ACTIVATION_NAMES}"
        da, db = ACTIVATION_PARAMS[name]
        alpha = beta = None
        if da is not None:
            if ia < len(alphas):
                alpha, ia = float(alphas[ia]), ia + 1
            else:
                alpha = da
        if db is not None:
            if ib < len(betas):
                beta, ib = float(betas[ib]), ib + 1
            else:
                beta = db
        if (alpha is not None and math.isnan(alpha)) or (beta is not None and math.isnan(beta)):
            return (
                f"{op} activation {raw!r} needs both activation_alpha and activation_beta "
                f"values (ONNX defines no default for them); activation_alpha={list(alphas)}, "
                f"activation_beta={list(betas)} run out before it"
            )
        specs.append(_ActSpec(name, alpha, beta))
    return specs


def _config(node: Node) -> _Config | str:
    """The node's resolved attributes, or the reason they are not supported."""
    op = node.op_type
    if node.opset < 7:
        return (
            f"{op} before opset 7 (output_sequence attribute) is not supported; "
            f"received opset {node.opset}"
        )
    direction = node.attr("direction", "forward")
    if direction not in DIRECTIONS:
        return (
            f"{op} direction {direction!r} is not one of 'forward', 'reverse', 'bidirectional'"
        )
    nd = DIRECTIONS[direction]
    n = N_ACTIVATIONS[op]
    names = node.attr("activations")
    if names is None:
        names = list(DEFAULT_ACTIVATIONS[op]) * nd
    elif len(names) != n * nd:
        return (
            f"{op} with direction={direction!r} needs {n * nd} activations ({n} per direction); "
            f"received {len(names)}: {list(names)}"
        )
    specs = _resolve_activations(
        op, names, node.attr("activation_alpha") or [], node.attr("activation_beta") or []
    )
    if isinstance(specs, str):
        return specs
    clip = node.attr("clip")
    if clip is not None:
        clip = float(clip)
        if not clip > 0:
            return f"{op} clip must be a positive threshold; received {clip}"
    layout = int(node.attr("layout", 0))
    if layout not in (0, 1):
        return f"{op} layout must be 0 or 1; received {layout}"
    if layout and node.opset < 14:
        return f"{op} layout=1 exists from opset 14; the node is opset {node.opset}"
    hidden = node.attr("hidden_size")
    if hidden is not None and int(hidden) < 0:
        return f"{op} hidden_size must be >= 0; received {hidden}"
    return _Config(
        op=op,
        num_directions=nd,
        reverse_first=direction == "reverse",
        hidden_size=None if hidden is None else int(hidden),
        activations=tuple(tuple(specs[d * n + k] for d in range(nd)) for k in range(n)),
        clip=clip,
        layout=layout,
        input_forget=op == "LSTM" and bool(int(node.attr("input_forget", 0))),
        linear_before_reset=op == "GRU" and bool(int(node.attr("linear_before_reset", 0))),
    )


def _static_shape_reason(node: Node, cfg: _Config) -> str | None:
    """Reason why the static shapes (where known) cannot fit, or ``None``."""
    op, g = cfg.op, GATES[cfg.op]
    for i, name in ((0, "X"), (1, "W"), (2, "R")):
        shape = node.input(i).shape
        if shape is not None and len(shape) != 3:
            return f"{op} needs a 3-D {name}; received shape {list(shape)}"
    for i in (1, 2):
        shape = node.input(i).shape
        if shape is not None and shape[0] != cfg.num_directions:
            return (
                f"{op} {INPUT_NAMES[i]} has {shape[0]} directions (shape {list(shape)}); "
                f"direction={node.attr('direction', 'forward')!r} needs {cfg.num_directions}"
            )
    r = node.input(2).shape
    if r is not None:
        hidden = r[2]
        if r[1] != g * hidden:
            return f"{op} R of shape {list(r)} is not [num_directions, {g}*hidden, hidden]"
        if cfg.hidden_size is not None and hidden != cfg.hidden_size:
            return f"{op} hidden_size={cfg.hidden_size} but R has shape {list(r)}"
    return None


def _supports(node: Node) -> str | None:
    op = node.op_type
    for i in range(3):
        if node.input(i) is None:
            return f"{op} needs input {INPUT_NAMES[i]}; it is absent"
    if len(node.inputs) > len(INPUT_NAMES[: 8 if op == "LSTM" else 6]):
        return f"{op} takes at most {8 if op == 'LSTM' else 6} inputs; received {len(node.inputs)}"
    if len(node.outputs) > N_OUTPUTS[op]:
        return f"{op} has at most {N_OUTPUTS[op]} outputs; received {len(node.outputs)}"
    float_inputs = (0, 1, 2, 3, 5, 6, 7) if op == "LSTM" else (0, 1, 2, 3, 5)
    reason = first_reason(
        check_dtypes(node, FLOAT_TYPES, float_inputs, same=True),
        check_dtypes(node, INT_TYPES, (4,)),
    )
    if reason:
        return reason
    cfg = _config(node)
    if isinstance(cfg, str):
        return cfg
    return _static_shape_reason(node, cfg)


# -- run-time checks -------------------------------------------------------------------------


def _expect(op: str, name: str, a: np.ndarray, shape: tuple[int, ...], form: str) -> None:
    if a.shape != shape:
        raise ValueError(f"{op} {name} must have shape {form} = {list(shape)}; received {list(a.shape)}")


def _lengths(op: str, lens: np.ndarray | None, seq: int, batch: int) -> np.ndarray | None:
    """The per-sequence lengths as int64, or ``None`` when every sequence is ``seq`` long."""
    if lens is None:
        return None
    lens = np.asarray(lens)
    _expect(op, "sequence_lens", lens, (batch,), "[batch_size]")
    lens = lens.astype(np.int64)
    if lens.size and (lens.min() < 0 or lens.max() > seq):
        raise ValueError(
            f"{op} sequence_lens {lens.tolist()} must lie in [0, seq_length={seq}]"
        )
    if bool(np.all(lens == seq)):
        return None
    return lens


# -- the recurrence --------------------------------------------------------------------------


def _per_direction(specs: tuple[_ActSpec, ...]) -> Act:
    """One function over the stacked directions (axis 0): shared when they agree."""
    fns = [_activation(s.name, s.alpha, s.beta) for s in specs]
    if all(s == specs[0] for s in specs):
        return fns[0]

    def run(x: np.ndarray) -> np.ndarray:
        return np.stack([fn(x[d]) for d, fn in enumerate(fns)])

    return run


def _clipper(clip: float | None) -> Callable[[np.ndarray], np.ndarray]:
    if clip is None:
        return lambda x: x
    return lambda x: np.clip(x, -clip, clip)


class _Recurrence:
    """A node's kernel: validates the arrays, projects X, runs the cell over time."""

    def __init__(self, node: Node, cfg: _Config) -> None:
        self.cfg = cfg
        self.n_out = len(node.outputs)
        self.acts = [_per_direction(a) for a in cfg.activations]
        self.clip = _clipper(cfg.clip)

    def __call__(self, *arrays: np.ndarray | None) -> tuple[np.ndarray, ...]:
        cfg, op = self.cfg, self.cfg.op
        args = list(arrays) + [None] * (8 - len(arrays))
        x, w, r, b, lens, h0, c0, p = args[:8]
        if op != "LSTM":
            c0 = p = None
        x, w, r = np.asarray(x), np.asarray(w), np.asarray(r)
        out_dtype = x.dtype
        ct = np.dtype(np.float32) if x.dtype == np.float16 else x.dtype
        if x.ndim != 3:
            raise ValueError(f"{op} X must be 3-D; received shape {list(x.shape)}")
        if cfg.layout:
            x = x.transpose(1, 0, 2)
            h0 = None if h0 is None else np.asarray(h0).transpose(1, 0, 2)
            c0 = None if c0 is None else np.asarray(c0).transpose(1, 0, 2)
        seq, batch, inp = x.shape
        nd, g = cfg.num_directions, GATES[op]
        if r.ndim != 3:
            raise ValueError(f"{op} R must be 3-D; received shape {list(r.shape)}")
        hid = r.shape[2]
        if cfg.hidden_size is not None and hid != cfg.hidden_size:
            raise ValueError(f"{op} hidden_size={cfg.hidden_size} but R has shape {list(r.shape)}")
        state_form = "[num_directions, batch_size, hidden_size]"
        if cfg.layout:
            state_form = "[batch_size, num_directions, hidden_size] (layout=1, here transposed)"
        _expect(op, "W", w, (nd, g * hid, inp), "[num_directions, gates*hidden_size, input_size]")
        _expect(op, "R", r, (nd, g * hid, hid), "[num_directions, gates*hidden_size, hidden_size]")
        if b is not None:
            b = np.asarray(b)
            _expect(op, "B", b, (nd, 2 * g * hid), "[num_directions, 2*gates*hidden_size]")
        for name, s in (("initial_h", h0), ("initial_c", c0)):
            if s is not None:
                _expect(op, name, np.asarray(s), (nd, batch, hid), state_form)
        if p is not None:
            p = np.asarray(p)
            _expect(op, "P", p, (nd, 3 * hid), "[num_directions, 3*hidden_size]")
        lengths = _lengths(op, lens, seq, batch)

        x, w, r = x.astype(ct, copy=False), w.astype(ct, copy=False), r.astype(ct, copy=False)
        h = np.zeros((nd, batch, hid), ct) if h0 is None else np.array(h0, dtype=ct)
        c = None
        if op == "LSTM":
            c = np.zeros((nd, batch, hid), ct) if c0 is None else np.array(c0, dtype=ct)
        bias = None if b is None else b.astype(ct, copy=False)

        # input projection of every step and direction: (nd, seq, batch, g*hid)
        xw = np.matmul(x.reshape(1, seq * batch, inp), w.transpose(0, 2, 1))
        xw = xw.reshape(nd, seq, batch, g * hid)
        rb_h = None
        if bias is not None:
            wb, rb = bias[:, : g * hid], bias[:, g * hid :]
            if cfg.linear_before_reset:  # Rbh stays inside r * (...)
                rb_h = rb[:, 2 * hid :].reshape(nd, 1, hid)
                rb = np.concatenate([rb[:, : 2 * hid], np.zeros_like(rb[:, 2 * hid :])], axis=1)
            xw += (wb + rb).reshape(nd, 1, 1, g * hid)

        # the reverse direction runs each sequence backwards: step t reads time idx[t, b]
        reverse = [cfg.reverse_first] if nd == 1 else [False, True]
        idx = None
        if any(reverse):
            t = np.arange(seq).reshape(seq, 1)
            full = np.full((1, batch), seq) if lengths is None else lengths.reshape(1, batch)
            idx = np.where(t < full, full - 1 - t, t)  # reversal inside the length, else t
            cols = np.arange(batch).reshape(1, batch)
            for d, rev in enumerate(reverse):
                if rev:
                    xw[d] = xw[d][idx, cols]
        xw = np.ascontiguousarray(xw.transpose(1, 0, 2, 3))  # (seq, nd, batch, g*hid)

        rt = np.ascontiguousarray(r.transpose(0, 2, 1))  # (nd, hid, g*hid)
        step = self._cell(op, rt, p, rb_h, hid, ct)
        y = np.zeros((seq, nd, batch, hid), ct)
        steps = seq if lengths is None else int(lengths.max(initial=0))
        full_steps = seq if lengths is None else int(lengths.min(initial=0))
        for t in range(steps):
            h_new, c_new = step(xw[t], h, c)
            if t < full_steps:
                h, c = h_new, c_new
                y[t] = h_new
            else:
                live = (t < lengths).reshape(1, batch, 1)
                h = np.where(live, h_new, h)
                if c is not None:
                    c = np.where(live, c_new, c)
                y[t] = np.where(live, h_new, 0)
        if lengths is not None:  # a sequence of length 0 ends with zero states
            empty = (lengths == 0).reshape(1, batch, 1)
            h = np.where(empty, 0, h).astype(ct, copy=False)
            if c is not None:
                c = np.where(empty, 0, c).astype(ct, copy=False)
        if seq == 0:
            h = np.zeros_like(h)
            c = None if c is None else np.zeros_like(c)
        if idx is not None:
            cols = np.arange(batch).reshape(1, batch)
            for d, rev in enumerate(reverse):
                if rev:
                    y[:, d] = y[:, d][idx, cols]

        outs = [y, h, c]
        if cfg.layout:
            outs = [y.transpose(2, 0, 1, 3), h.transpose(1, 0, 2)]
            outs.append(None if c is None else c.transpose(1, 0, 2))
        return tuple(np.asarray(o, dtype=out_dtype, order="C") for o in outs[: self.n_out])

    def _cell(
        self,
        op: str,
        rt: np.ndarray,
        p: np.ndarray | None,
        rb_h: np.ndarray | None,
        hid: int,
        ct: np.dtype,
    ) -> Callable[..., tuple[np.ndarray, np.ndarray | None]]:
        """``step(xw_t, h, c) -> (h, c)`` for ``op``; ``xw_t`` is (nd, batch, gates*hid)."""
        clip = self.clip
        if op == "RNN":
            f = self.acts[0]

            def rnn(xw_t: np.ndarray, h: np.ndarray, c: None) -> tuple[np.ndarray, None]:
                return f(clip(xw_t + np.matmul(h, rt))), None

            return rnn
        if op == "GRU":
            f, g = self.acts
            rt_zr = np.ascontiguousarray(rt[:, :, : 2 * hid])
            rt_h = np.ascontiguousarray(rt[:, :, 2 * hid :])
            linear = self.cfg.linear_before_reset
            rbh = np.zeros((rt.shape[0], 1, hid), ct) if rb_h is None else rb_h.astype(ct)

            def gru(xw_t: np.ndarray, h: np.ndarray, c: None) -> tuple[np.ndarray, None]:
                if linear:
                    hr = np.matmul(h, rt)
                    zr = f(clip(xw_t[..., : 2 * hid] + hr[..., : 2 * hid]))
                    z, rr = zr[..., :hid], zr[..., hid:]
                    hh = g(clip(xw_t[..., 2 * hid :] + rr * (hr[..., 2 * hid :] + rbh)))
                else:
                    zr = f(clip(xw_t[..., : 2 * hid] + np.matmul(h, rt_zr)))
                    z, rr = zr[..., :hid], zr[..., hid:]
                    hh = g(clip(xw_t[..., 2 * hid :] + np.matmul(rr * h, rt_h)))
                return (1 - z) * hh + z * h, None

            return gru
        f, g, hact = self.acts
        input_forget = self.cfg.input_forget
        pi = po = pf = None
        if p is not None:
            pc = p.astype(ct)
            pi, po, pf = (pc[:, k * hid : (k + 1) * hid].reshape(-1, 1, hid) for k in range(3))

        def lstm(xw_t: np.ndarray, h: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            gates = xw_t + np.matmul(h, rt)
            gi, go = gates[..., :hid], gates[..., hid : 2 * hid]
            gf, gc = gates[..., 2 * hid : 3 * hid], gates[..., 3 * hid :]
            if pi is not None:
                gi = gi + pi * c
            i = f(clip(gi))
            if input_forget:
                fg = 1 - i
            else:
                if pf is not None:
                    gf = gf + pf * c
                fg = f(clip(gf))
            c_new = fg * c + i * g(clip(gc))
            if po is not None:
                go = go + po * c_new
            o = f(clip(go))
            return o * hact(c_new), c_new

        return lstm


def _build(node: Node) -> Kernel:
    cfg = _config(node)
    if isinstance(cfg, str):
        raise ValueError(cfg)
    return _Recurrence(node, cfg)


@impls.register("LSTM", "timeloop", priority=Priority.DEFAULT, supports=_supports)
def lstm_timeloop(node: Node) -> Kernel:
    """LSTM: one matmul projects X for every step and direction; the cell loops over time."""
    return _build(node)


@impls.register("GRU", "timeloop", priority=Priority.DEFAULT, supports=_supports)
def gru_timeloop(node: Node) -> Kernel:
    """GRU: one matmul projects X for every step and direction; the cell loops over time."""
    return _build(node)


@impls.register("RNN", "timeloop", priority=Priority.DEFAULT, supports=_supports)
def rnn_timeloop(node: Node) -> Kernel:
    """RNN: one matmul projects X for every step and direction; the cell loops over time."""
    return _build(node)
