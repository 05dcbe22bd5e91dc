"""The numpy reference LSTM, GRU and RNN (impls/numpy/recurrent.py) against onnxruntime.

Every case builds one ONNX node, runs the numpy backend's reference implementation of it on a
:class:`dispatch.graph.Node` whose values have no static shape (dtype only: everything is
decided from the arrays), and compares every output (shape, dtype, values within rtol 1e-5,
atol 1e-6 for float32) with onnxruntime's CPU kernels on the same node. The cases cover, for
each op, every direction, with and without B, initial states, sequence_lens of unequal
lengths (zero included), peepholes and input_forget (LSTM), linear_before_reset 0 and 1
(GRU), clip, non-default activation lists with alpha / beta (every activation name), batch 1
and 3, hidden 1 and 16, and opsets 7, 14 and 22.

Weights are drawn with the usual 1/sqrt(fan-in) scale: float32 rounding then stays ~1e-7
through the recurrence on both sides (with weights ~N(0, 0.5) the RNN's tanh recurrence
drifts to 1e-6 from a float64 result in either implementation).

Where onnxruntime is not an oracle, the test says so and uses another:

- ``layout=1``: onnxruntime refuses it ("Batchwise recurrent operations (layout == 1) are not
  supported"), so the layout-1 node is compared with onnxruntime on the equivalent layout-0
  node (inputs and outputs transposed), and, where onnx's ReferenceEvaluator applies (it
  ignores sequence_lens, clip and activations), with the ReferenceEvaluator on the layout-1
  node itself.
- float64: onnxruntime's LSTM / GRU / RNN take float32 only; float64 compares with onnx's
  ReferenceEvaluator (cases without sequence_lens, clip or activations, which it ignores).
- float16: neither runs it; the float16 result is the float32 computation rounded once.
- activation parameters left to their defaults: onnxruntime defaults ThresholdedRelu's alpha
  and Affine's alpha / beta to 0, the ONNX operators (whose defaults the spec names) to 1 and
  1 / 0; those cases compare with onnxruntime given the ONNX defaults explicitly.
"""

from __future__ import annotations

import itertools
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper

from dispatch.graph import Node
from dispatch.registry import Implementation, Registry
from impls.numpy.backend import NumpyBackend
from layouts.registry import LayoutRegistry
from layouts.standard import standard_layout
from tests.support import make_node

ort = pytest.importorskip("onnxruntime")

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
N_OUTPUTS = {"LSTM": 3, "GRU": 2, "RNN": 2}
N_INPUTS = {"LSTM": 8, "GRU": 6, "RNN": 6}
INPUT_NAMES = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")
OUTPUT_NAMES = ("Y", "Y_h", "Y_c")
DIRECTIONS = ("forward", "reverse", "bidirectional")
OPS = ("LSTM", "GRU", "RNN")
SEQ, INPUT = 5, 4
RTOL, ATOL = 1e-5, 1e-6


def numpy_registry() -> Registry:
    """A registry holding the numpy backend only (its kernels as the backend wraps them)."""
    reg = Registry(layouts=LayoutRegistry())
    reg.layouts.add_layout(standard_layout())
    NumpyBackend().register(reg)
    return reg


REG = numpy_registry()


# -- cases -----------------------------------------------------------------------------------


@dataclass
class Case:
    op: str
    id: str
    inputs: list[np.ndarray | None]
    attrs: dict[str, Any] = field(default_factory=dict)
    opset: int = 14

    @property
    def n_outputs(self) -> int:
        return N_OUTPUTS[self.op]


def make_inputs(
    op: str,
    direction: str,
    batch: int,
    hidden: int,
    *,
    bias: bool = False,
    initial: bool = False,
    lens: list[int] | None = None,
    peepholes: bool = False,
    x_scale: float = 1.0,
    seq: int = SEQ,
    key: Any = None,
) -> list[np.ndarray | None]:
    """X, W, R and the optional inputs asked for (``None`` where absent), float32, in the
    layout-0 shapes."""
    rng = np.random.default_rng(
        [len(op), OPS.index(op), DIRECTIONS.index(direction), batch, hidden, seq,
         int(bias), int(initial), int(peepholes), *(lens or []), int(x_scale * 10),
         *(key or [])]
    )
    nd = 2 if direction == "bidirectional" else 1
    g = GATES[op]

    def rand(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    ins: list[np.ndarray | None] = [None] * N_INPUTS[op]
    ins[0] = rand(seq, batch, INPUT, scale=x_scale)
    ins[1] = rand(nd, g * hidden, INPUT, scale=1 / np.sqrt(INPUT))
    ins[2] = rand(nd, g * hidden, hidden, scale=1 / np.sqrt(hidden))
    if bias:
        ins[3] = rand(nd, 2 * g * hidden, scale=0.5)
    if lens is not None:
        ins[4] = np.array(lens, dtype=np.int32)
    if initial:
        ins[5] = rand(nd, batch, hidden, scale=0.5)
        if op == "LSTM":
            ins[6] = rand(nd, batch, hidden, scale=0.5)
    if peepholes:
        ins[7] = rand(nd, 3 * hidden, scale=0.5)
    return ins


def _unequal_lengths(batch: int) -> list[int]:
    return [SEQ, 2, SEQ - 1][:batch] if batch > 1 else [SEQ - 2]


#: feature set -> make_inputs options (``lens`` True: unequal lengths for the batch)
FEATURES: dict[str, dict[str, Any]] = {
    "plain": {},
    "bias": {"bias": True},
    "initial": {"bias": True, "initial": True},
    "lens": {"bias": True, "initial": True, "lens": True},
}
LSTM_FEATURES: dict[str, dict[str, Any]] = {
    "peepholes": {"bias": True, "peepholes": True},
    "all": {"bias": True, "initial": True, "lens": True, "peepholes": True},
}


def _matrix() -> list[Case]:
    cases = []
    for op in OPS:
        feats = {**FEATURES, **(LSTM_FEATURES if op == "LSTM" else {})}
        lbrs = (0, 1) if op == "GRU" else (None,)
        for direction, batch, hidden, (fname, opts), lbr in itertools.product(
            DIRECTIONS, (1, 3), (1, 16), feats.items(), lbrs
        ):
            opts = dict(opts)
            if opts.pop("lens", False):
                opts["lens"] = _unequal_lengths(batch)
            attrs: dict[str, Any] = {"hidden_size": hidden, "direction": direction}
            name = f"{op}-{direction}-b{batch}-h{hidden}-{fname}"
            if lbr is not None:
                attrs["linear_before_reset"] = lbr
                name += f"-lbr{lbr}"
            cases.append(Case(op, name, make_inputs(op, direction, batch, hidden, **opts), attrs))
    return cases


MATRIX = _matrix()


# -- running ---------------------------------------------------------------------------------


def _names(op: str, inputs: list[np.ndarray | None]) -> list[str]:
    names = [INPUT_NAMES[i] if a is not None else "" for i, a in enumerate(inputs)]
    while names and not names[-1]:
        names.pop()
    return names


def build_model(
    op: str,
    inputs: list[np.ndarray | None],
    attrs: dict[str, Any],
    opset: int,
    outputs: list[str] | None = None,
    *,
    dims: dict[int, str] | None = None,
) -> onnx.ModelProto:
    """A one-node model of ``op`` (``outputs``: the node's output names, "" for an absent one;
    ``dims``: input-0 axes to declare symbolic)."""
    names = _names(op, inputs)
    outputs = list(OUTPUT_NAMES[: N_OUTPUTS[op]]) if outputs is None else outputs
    node = helper.make_node(op, names, outputs, **attrs)
    vis = []
    for i, (n, a) in enumerate(zip(names, inputs)):
        if n:
            shape: list[Any] = list(a.shape)
            if i == 0 and dims:
                for axis, sym in dims.items():
                    shape[axis] = sym
            vis.append(helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), shape))
    dtype = helper.np_dtype_to_tensor_dtype(inputs[0].dtype)
    outs = [helper.make_tensor_value_info(o, dtype, None) for o in outputs if o]
    graph = helper.make_graph([node], "g", vis, outs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _feeds(op: str, inputs: list[np.ndarray | None]) -> dict[str, np.ndarray]:
    return {n: a for n, a in zip(_names(op, inputs), inputs) if n}


def onnxruntime_outputs(
    op: str, inputs: list[np.ndarray | None], attrs: dict[str, Any], opset: int = 14
) -> list[np.ndarray]:
    model = build_model(op, inputs, attrs, opset)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(sess.run(None, _feeds(op, inputs)))


def reference_outputs(
    op: str, inputs: list[np.ndarray | None], attrs: dict[str, Any], opset: int = 14
) -> list[np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    model = build_model(op, inputs, attrs, opset)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return list(ReferenceEvaluator(model).run(None, _feeds(op, inputs)))


def numpy_node(
    op: str, inputs: list[np.ndarray | None], attrs: dict[str, Any], opset: int = 14,
    *, dynamic: bool = True,
) -> Node:
    node, _ = make_node(op, inputs, attrs, n_outputs=N_OUTPUTS[op], opset=opset)
    if dynamic:
        for v in [*node.inputs, *node.outputs]:
            if v is not None:
                v.shape = None
    return node


def reference_impl(node: Node) -> Implementation:
    impl = REG.reference_impl(node)
    reasons = {i.name: i.supports(node) for i in REG.impls_for(node.op_type)}
    assert impl is not None, f"no numpy implementation accepts the node: {reasons}"
    assert impl.backend == "numpy"
    return impl


def numpy_outputs(
    op: str, inputs: list[np.ndarray | None], attrs: dict[str, Any], opset: int = 14,
    *, dynamic: bool = True,
) -> list[np.ndarray]:
    node = numpy_node(op, inputs, attrs, opset, dynamic=dynamic)
    out = reference_impl(node).build(node)(*inputs)
    return list(out) if isinstance(out, tuple | list) else [out]


def assert_outputs(got: list[np.ndarray], want: list[np.ndarray], what: str,
                   rtol: float = RTOL, atol: float = ATOL) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} outputs, expected {len(want)}"
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        name = f"{what} {OUTPUT_NAMES[k]}"
        w = np.asarray(w)
        assert isinstance(g, np.ndarray), f"{name}: {type(g).__name__}"
        assert g.dtype == w.dtype, f"{name}: dtype {g.dtype}, expected {w.dtype}"
        assert g.shape == w.shape, f"{name}: shape {g.shape}, expected {w.shape}"
        assert g.flags.c_contiguous, f"{name}: not row-major contiguous"
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=name)


# -- against onnxruntime ---------------------------------------------------------------------


@pytest.mark.parametrize("c", MATRIX, ids=[c.id for c in MATRIX])
def test_matches_onnxruntime(c: Case) -> None:
    """Directions x batch 1 / 3 x hidden 1 / 16 x (no B, B, initial states, unequal
    sequence_lens, peepholes for LSTM) x linear_before_reset 0 / 1 for GRU."""
    want = onnxruntime_outputs(c.op, c.inputs, c.attrs, c.opset)
    assert_outputs(numpy_outputs(c.op, c.inputs, c.attrs, c.opset), want, c.id)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_zero_and_full_lengths_match_onnxruntime(op: str, direction: str) -> None:
    """A sequence of length 0 gives zero Y and zero Y_h / Y_c (onnxruntime's result, not the
    initial state); lengths 1 and SEQ next to it run as usual."""
    ins = make_inputs(op, direction, 4, 3, bias=True, initial=True, lens=[0, SEQ, 1, 3],
                      peepholes=op == "LSTM")
    attrs = {"hidden_size": 3, "direction": direction}
    got = numpy_outputs(op, ins, attrs)
    assert_outputs(got, onnxruntime_outputs(op, ins, attrs), f"{op} {direction}")
    assert not np.any(got[0][:, :, 0]) and not np.any(got[1][:, 0])


@pytest.mark.parametrize("op", OPS)
def test_equal_lengths_equal_no_lengths(op: str) -> None:
    ins = make_inputs(op, "bidirectional", 3, 4, bias=True, initial=True)
    attrs = {"hidden_size": 4, "direction": "bidirectional"}
    with_lens = list(ins)
    with_lens[4] = np.full(3, SEQ, np.int32)
    assert_outputs(numpy_outputs(op, with_lens, attrs), numpy_outputs(op, ins, attrs), op,
                   rtol=0, atol=0)


def _clip_cases() -> list[Case]:
    cases = []
    for op, direction in itertools.product(OPS, DIRECTIONS):
        for lbr in (0, 1) if op == "GRU" else (None,):
            ins = make_inputs(op, direction, 3, 5, bias=True, initial=True, x_scale=4.0,
                              lens=[SEQ, 3, 1], peepholes=op == "LSTM")
            attrs: dict[str, Any] = {"hidden_size": 5, "direction": direction, "clip": 0.6}
            name = f"{op}-{direction}-clip"
            if lbr is not None:
                attrs["linear_before_reset"] = lbr
                name += f"-lbr{lbr}"
            cases.append(Case(op, name, ins, attrs))
    return cases


CLIP = _clip_cases()


@pytest.mark.parametrize("c", CLIP, ids=[c.id for c in CLIP])
def test_clip_matches_onnxruntime(c: Case) -> None:
    """clip bounds every activation's input (the inputs are large enough that it bites);
    the cell state is not clipped before h."""
    want = onnxruntime_outputs(c.op, c.inputs, c.attrs)
    got = numpy_outputs(c.op, c.inputs, c.attrs)
    assert_outputs(got, want, c.id)
    unclipped = {k: v for k, v in c.attrs.items() if k != "clip"}
    assert not np.allclose(numpy_outputs(c.op, c.inputs, unclipped)[0], got[0], atol=1e-3)


#: (op, activations of one direction, alpha, beta): together every activation name per op
ACTIVATION_LISTS: list[tuple[str, list[str], list[float], list[float]]] = [
    ("LSTM", ["HardSigmoid", "LeakyRelu", "Softsign"], [0.3, 0.05], [0.4]),
    ("LSTM", ["Sigmoid", "Elu", "ScaledTanh"], [0.9, 0.7], [1.3]),
    ("LSTM", ["Sigmoid", "Affine", "ThresholdedRelu"], [0.8, 0.1], [0.2]),
    ("LSTM", ["sigmoid", "Relu", "Softplus"], [], []),
    ("LSTM", ["Sigmoid", "Tanh", "Tanh"], [], []),
    ("GRU", ["HardSigmoid", "Softsign"], [0.25], [0.45]),
    ("GRU", ["Sigmoid", "Relu"], [], []),
    ("GRU", ["Sigmoid", "LeakyRelu"], [0.2], []),
    ("GRU", ["Sigmoid", "ScaledTanh"], [1.5], [0.6]),
    ("GRU", ["Sigmoid", "Elu"], [0.5], []),
    ("GRU", ["Sigmoid", "Affine"], [0.7], [-0.1]),
    ("GRU", ["Sigmoid", "ThresholdedRelu"], [0.1], []),
    ("GRU", ["Sigmoid", "Softplus"], [], []),
    ("GRU", ["Tanh", "Sigmoid"], [], []),
    ("RNN", ["Relu"], [], []),
    ("RNN", ["Sigmoid"], [], []),
    ("RNN", ["Affine"], [0.6], [0.1]),
    ("RNN", ["LeakyRelu"], [0.1], []),
    ("RNN", ["ThresholdedRelu"], [0.2], []),
    ("RNN", ["ScaledTanh"], [0.9], [1.2]),
    ("RNN", ["HardSigmoid"], [0.3], [0.4]),
    ("RNN", ["Elu"], [0.8], []),
    ("RNN", ["Softsign"], [], []),
    ("RNN", ["Softplus"], [], []),
    ("RNN", ["Tanh"], [], []),
]


def _activation_cases() -> list[Case]:
    cases = []
    for k, (op, acts, alpha, beta) in enumerate(ACTIVATION_LISTS):
        for direction in DIRECTIONS:
            attrs: dict[str, Any] = {"hidden_size": 4, "direction": direction}
            if direction == "bidirectional":
                # the backward direction takes the next list of the same op (other functions)
                nxt = next(e for e in ACTIVATION_LISTS[k + 1 :] + ACTIVATION_LISTS if e[0] == op
                           and e[1] != acts)
                acts2, alpha2, beta2 = nxt[1], nxt[2], nxt[3]
                attrs["activations"] = acts + acts2
                alpha, beta = alpha + alpha2, beta + beta2
            else:
                attrs["activations"] = acts
            if alpha:
                attrs["activation_alpha"] = alpha
            if beta:
                attrs["activation_beta"] = beta
            ins = make_inputs(op, direction, 3, 4, bias=True, initial=True, lens=[SEQ, 2, 4],
                              peepholes=op == "LSTM", key=[k])
            cases.append(Case(op, f"{op}-{direction}-{'-'.join(attrs['activations'])}", ins,
                              attrs))
    return cases


ACTIVATIONS = _activation_cases()


@pytest.mark.parametrize("c", ACTIVATIONS, ids=[c.id for c in ACTIVATIONS])
def test_activations_match_onnxruntime(c: Case) -> None:
    """Non-default activation lists, alpha / beta consumed in the order of the activations
    (each taking only the parameters it uses); bidirectional nodes use other functions
    backwards."""
    want = onnxruntime_outputs(c.op, c.inputs, c.attrs)
    assert_outputs(numpy_outputs(c.op, c.inputs, c.attrs), want, c.id)


@pytest.mark.parametrize(
    ("acts", "given", "explicit"),
    [
        # onnxruntime's defaults are the ONNX operators' here: compared as they are
        (["LeakyRelu"], {}, {}),
        (["HardSigmoid"], {}, {}),
        (["Elu"], {}, {}),
        # onnxruntime defaults these to 0; the spec names the ONNX operators' defaults:
        # compared with onnxruntime given those (ThresholdedRelu alpha 1, Affine 1 / 0)
        (["ThresholdedRelu"], {}, {"activation_alpha": [1.0]}),
        (["Affine"], {}, {"activation_alpha": [1.0], "activation_beta": [0.0]}),
        # the list runs out: the second activation takes its default
        (["LeakyRelu", "Elu"], {"activation_alpha": [0.2]}, {"activation_alpha": [0.2, 1.0]}),
    ],
    ids=["leakyrelu", "hardsigmoid", "elu", "thresholdedrelu", "affine", "partial"],
)
def test_activation_parameter_defaults(acts: list[str], given: dict, explicit: dict) -> None:
    direction = "bidirectional" if len(acts) == 2 else "forward"
    ins = make_inputs("RNN", direction, 3, 4, bias=True, initial=True, x_scale=2.0)
    attrs = {"hidden_size": 4, "direction": direction, "activations": acts}
    want = onnxruntime_outputs("RNN", ins, {**attrs, **explicit})
    assert_outputs(numpy_outputs("RNN", ins, {**attrs, **given}), want, "-".join(acts))


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("peepholes", [False, True], ids=["nopeep", "peep"])
def test_lstm_input_forget_matches_onnxruntime(direction: str, peepholes: bool) -> None:
    ins = make_inputs("LSTM", direction, 3, 16, bias=True, initial=True, lens=[4, SEQ, 1],
                      peepholes=peepholes)
    attrs = {"hidden_size": 16, "direction": direction, "input_forget": 1}
    want = onnxruntime_outputs("LSTM", ins, attrs)
    got = numpy_outputs("LSTM", ins, attrs)
    assert_outputs(got, want, f"input_forget {direction}")
    coupled = numpy_outputs("LSTM", ins, {**attrs, "input_forget": 0})
    assert not np.allclose(coupled[0], got[0], atol=1e-3)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("opset", [7, 14, 22])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_opsets_match_onnxruntime(op: str, opset: int, direction: str) -> None:
    ins = make_inputs(op, direction, 3, 6, bias=True, initial=True, lens=[3, SEQ, 2],
                      peepholes=op == "LSTM")
    attrs: dict[str, Any] = {"hidden_size": 6, "direction": direction}
    if op == "GRU":
        attrs["linear_before_reset"] = 1
    want = onnxruntime_outputs(op, ins, attrs, opset)
    assert_outputs(numpy_outputs(op, ins, attrs, opset), want, f"{op} opset {opset}")


@pytest.mark.parametrize("op", OPS)
def test_absent_hidden_size_is_read_from_r(op: str) -> None:
    ins = make_inputs(op, "forward", 3, 7, bias=True)
    want = onnxruntime_outputs(op, ins, {"hidden_size": 7})
    assert_outputs(numpy_outputs(op, ins, {}), want, op)


# -- layout 1 --------------------------------------------------------------------------------


def _to_layout1(op: str, inputs: list[np.ndarray | None]) -> list[np.ndarray | None]:
    out = list(inputs)
    out[0] = np.ascontiguousarray(inputs[0].transpose(1, 0, 2))
    for i in (5, 6):
        if i < len(out) and out[i] is not None:
            out[i] = np.ascontiguousarray(out[i].transpose(1, 0, 2))
    return out


def _from_layout0(outputs: list[np.ndarray]) -> list[np.ndarray]:
    """Layout-0 outputs in layout 1: Y (seq, nd, batch, hid) -> (batch, seq, nd, hid);
    Y_h / Y_c (nd, batch, hid) -> (batch, nd, hid)."""
    y, *states = outputs
    return [np.ascontiguousarray(y.transpose(2, 0, 1, 3))] + [
        np.ascontiguousarray(s.transpose(1, 0, 2)) for s in states
    ]


def _layout_cases() -> list[Case]:
    cases = []
    for op, direction, batch in itertools.product(OPS, DIRECTIONS, (1, 3)):
        for feat in ("plain", "initial", "lens"):
            lens = _unequal_lengths(batch) if feat == "lens" else None
            ins = make_inputs(op, direction, batch, 5, bias=feat != "plain",
                              initial=feat != "plain", lens=lens,
                              peepholes=op == "LSTM" and feat != "plain")
            attrs: dict[str, Any] = {"hidden_size": 5, "direction": direction}
            if op == "GRU":
                attrs["linear_before_reset"] = batch == 3
            cases.append(Case(op, f"{op}-{direction}-b{batch}-{feat}", ins, attrs))
    return cases


LAYOUT = _layout_cases()


@pytest.mark.parametrize("c", LAYOUT, ids=[c.id for c in LAYOUT])
def test_layout_1(c: Case) -> None:
    """onnxruntime refuses layout=1, so the oracle is onnxruntime on the layout-0 node with
    the inputs and outputs transposed; onnx's ReferenceEvaluator (which handles layout but
    ignores sequence_lens) checks the layout-1 node itself where no sequence_lens is given."""
    ins1 = _to_layout1(c.op, c.inputs)
    attrs1 = {**c.attrs, "layout": 1}
    got = numpy_outputs(c.op, ins1, attrs1)
    want = _from_layout0(onnxruntime_outputs(c.op, c.inputs, c.attrs))
    assert_outputs(got, want, f"{c.id} vs onnxruntime layout 0")
    if c.inputs[4] is None:
        assert_outputs(got, reference_outputs(c.op, ins1, attrs1), f"{c.id} vs onnx reference")


# -- other dtypes ----------------------------------------------------------------------------


def _as(inputs: list[np.ndarray | None], dtype: Any) -> list[np.ndarray | None]:
    return [None if a is None else a if a.dtype.kind == "i" else a.astype(dtype) for a in inputs]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("layout", [0, 1])
def test_float64_matches_onnx_reference(op: str, direction: str, layout: int) -> None:
    """onnxruntime runs these ops in float32 only: float64 (computed in float64) compares
    with onnx's ReferenceEvaluator, B / initial states / peepholes given (it ignores
    sequence_lens, clip and activations, so none is)."""
    ins = make_inputs(op, direction, 3, 6, bias=True, initial=True, peepholes=op == "LSTM")
    attrs: dict[str, Any] = {"hidden_size": 6, "direction": direction}
    if op == "GRU":
        attrs["linear_before_reset"] = layout
    if layout:
        ins, attrs = _to_layout1(op, ins), {**attrs, "layout": 1}
    ins64 = _as(ins, np.float64)
    want = reference_outputs(op, ins64, attrs)
    assert_outputs(numpy_outputs(op, ins64, attrs), want, f"{op} float64", rtol=1e-12, atol=1e-13)
    # and onnx's reference agrees with the float32 matrix's oracle on the same node
    assert_outputs(numpy_outputs(op, ins, attrs), [w.astype(np.float32) for w in want],
                   f"{op} float32 vs float64")


@pytest.mark.parametrize("op", OPS)
def test_float16_rounds_the_float32_result(op: str) -> None:
    ins = make_inputs(op, "bidirectional", 3, 4, bias=True, initial=True, lens=[SEQ, 1, 3],
                      peepholes=op == "LSTM")
    ins16 = _as(ins, np.float16)
    attrs = {"hidden_size": 4, "direction": "bidirectional", "clip": 2.0}
    want = [w.astype(np.float16) for w in numpy_outputs(op, _as(ins16, np.float32), attrs)]
    assert_outputs(numpy_outputs(op, ins16, attrs), want, f"{op} float16", rtol=0, atol=0)


# -- static shapes, sessions, absent outputs -------------------------------------------------


@pytest.mark.parametrize("c", MATRIX[::7], ids=[c.id for c in MATRIX[::7]])
def test_static_and_dynamic_nodes_compute_alike(c: Case) -> None:
    static = numpy_outputs(c.op, c.inputs, c.attrs, c.opset, dynamic=False)
    assert_outputs(static, numpy_outputs(c.op, c.inputs, c.attrs, c.opset), c.id, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("op", "outputs"),
    [
        ("LSTM", ["", "Y_h", "Y_c"]),
        ("LSTM", ["Y"]),
        ("LSTM", ["Y", "", "Y_c"]),
        ("GRU", ["", "Y_h"]),
        ("GRU", ["Y"]),
        ("RNN", ["", "Y_h"]),
        ("RNN", ["Y", "Y_h"]),
    ],
    ids=lambda v: v if isinstance(v, str) else "-".join(o or "_" for o in v),
)
@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
def test_session_with_absent_outputs(op: str, outputs: list[str], symbolic: bool) -> None:
    """A numpy-only Session runs the node with some outputs absent ("" in the node), with
    static and with symbolic (sequence, batch) input dimensions."""
    from dispatch import Session

    ins = make_inputs(op, "bidirectional", 3, 5, bias=True, initial=True, lens=[SEQ, 2, 4],
                      peepholes=op == "LSTM")
    attrs = {"hidden_size": 5, "direction": "bidirectional"}
    dims = {0: "seq", 1: "batch"} if symbolic else None
    model = build_model(op, ins, attrs, 14, outputs, dims=dims)
    feeds = _feeds(op, ins)
    sess = Session(model, backends=["numpy"], store=False)
    got = sess.run(None, feeds)
    ort_sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = ort_sess.run(None, feeds)
    assert len(got) == len([o for o in outputs if o])
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.shape == w.shape and g.dtype == w.dtype, k
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


# -- refusals and run-time errors ------------------------------------------------------------


def _refusal(op: str, attrs: dict[str, Any], opset: int = 14, *, inputs: Any = None,
             n_outputs: int | None = None) -> str | None:
    ins = inputs if inputs is not None else make_inputs(op, "forward", 2, 3)
    node, _ = make_node(op, ins, attrs, n_outputs=n_outputs or N_OUTPUTS[op], opset=opset)
    reasons = [i.supports(node) for i in REG.impls_for(op)]
    assert reasons and all(r is not None for r in reasons), reasons
    return reasons[0]


@pytest.mark.parametrize(
    ("op", "attrs", "opset", "needle"),
    [
        ("LSTM", {"direction": "sideways"}, 14, "direction 'sideways'"),
        ("GRU", {"activations": ["Sigmoid"]}, 14, "needs 2 activations"),
        ("LSTM", {"activations": ["Sigmoid", "Tanh", "Tanh"], "direction": "bidirectional"},
         14, "needs 6 activations"),
        ("RNN", {"activations": ["Gelu"]}, 14, "activation 'Gelu' is not one of"),
        ("RNN", {"activations": ["ScaledTanh"], "activation_alpha": [1.0]}, 14,
         "needs both activation_alpha and activation_beta"),
        ("RNN", {"activations": ["ScaledTanh"]}, 14, "ONNX defines no default"),
        ("GRU", {"clip": 0.0}, 14, "clip must be a positive threshold"),
        ("RNN", {"clip": -1.0}, 14, "clip must be a positive threshold"),
        ("LSTM", {"layout": 1}, 7, "layout=1 exists from opset 14"),
        ("GRU", {"layout": 2}, 14, "layout must be 0 or 1"),
        ("RNN", {"hidden_size": 4}, 14, "hidden_size=4 but R has shape"),
    ],
)
def test_supports_refuses_with_a_reason(op: str, attrs: dict, opset: int, needle: str) -> None:
    reason = _refusal(op, attrs, opset)
    assert reason is not None and needle in reason, reason


def test_supports_refuses_mismatched_shapes_and_types() -> None:
    ins = make_inputs("LSTM", "forward", 2, 3)
    bidir = make_inputs("LSTM", "bidirectional", 2, 3)
    assert "directions" in _refusal("LSTM", {"direction": "bidirectional"}, inputs=ins)
    assert "directions" in _refusal("LSTM", {}, inputs=bidir)
    x2 = [ins[0][0], *ins[1:]]
    assert "3-D X" in _refusal("LSTM", {}, inputs=x2)
    mixed = [ins[0].astype(np.float64), *ins[1:]]
    assert "one type" in _refusal("LSTM", {}, inputs=mixed)
    ints = [ins[0].astype(np.int32), *ins[1:]]
    assert "dtype int32" in _refusal("LSTM", {}, inputs=ints)
    assert "at most 2 outputs" in _refusal("GRU", {}, inputs=make_inputs("GRU", "forward", 2, 3),
                                           n_outputs=3)


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda ins: ins.__setitem__(1, ins[1][:, :-1]), "W must have shape"),
        (lambda ins: ins.__setitem__(2, ins[2][:, :-1]), "R must have shape"),
        (lambda ins: ins.__setitem__(2, ins[2][:, :, :-1]), "hidden_size=3 but R has shape"),
        (lambda ins: ins.__setitem__(3, np.zeros((1, 5), np.float32)), "B must have shape"),
        (lambda ins: ins.__setitem__(4, np.array([1, SEQ + 1], np.int32)), "sequence_lens"),
        (lambda ins: ins.__setitem__(4, np.array([1], np.int32)), "sequence_lens must have"),
        (lambda ins: ins.__setitem__(5, np.zeros((1, 3, 3), np.float32)), "initial_h must"),
        (lambda ins: ins.__setitem__(6, np.zeros((1, 2, 4), np.float32)), "initial_c must"),
        (lambda ins: ins.__setitem__(7, np.zeros((1, 4), np.float32)), "P must have shape"),
    ],
    ids=["W", "R", "R-hidden", "B", "lens-range", "lens-shape", "initial_h", "initial_c", "P"],
)
def test_dynamic_node_with_inconsistent_arrays_raises(mutate: Any, needle: str) -> None:
    """Without static shapes supports() cannot see a mismatch: the kernel raises a
    ValueError that names the input and the shape it needs."""
    ins = make_inputs("LSTM", "forward", 2, 3, bias=True, initial=True, lens=[SEQ, 2],
                      peepholes=True)
    mutate(ins)
    node = numpy_node("LSTM", ins, {"hidden_size": 3})
    kernel = reference_impl(node).build(node)
    with pytest.raises(ValueError, match=needle):
        kernel(*ins)


def test_empty_sequence_and_batch() -> None:
    """seq_length 0: Y is empty and the states zero (every sequence has length 0); batch 0:
    every output is empty."""
    ins = make_inputs("LSTM", "bidirectional", 2, 3, bias=True, initial=True, seq=0)
    y, yh, yc = numpy_outputs("LSTM", ins, {"direction": "bidirectional"})
    assert y.shape == (0, 2, 2, 3) and not yh.any() and not yc.any()
    ins = make_inputs("GRU", "reverse", 0, 3, bias=True, initial=True)
    y, yh = numpy_outputs("GRU", ins, {"direction": "reverse"})
    assert y.shape == (SEQ, 1, 0, 3) and yh.shape == (1, 0, 3)
