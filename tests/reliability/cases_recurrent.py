"""Edge cases of the recurrent operators LSTM, GRU and RNN (issue 31: silero-vad's decoder),
registered into :data:`~tests.reliability.numerics_cases.BUILDERS` when
:mod:`tests.reliability.cases_index` imports this module."""

from __future__ import annotations

from tests.reliability.numerics_cases import Build, Case, builder

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
N_OUT = {"LSTM": 3, "GRU": 2, "RNN": 2}
#: (seq, batch, input, hidden) per edge kind
SHAPES = {
    "1x1": [(1, 1, 1, 1), (3, 1, 1, 2)],
    "odd_channels": [(3, 2, 7, 17), (2, 1, 3, 1)],
    "batch3": [(4, 3, 5, 8)],
}
VALUE_SHAPES = [(4, 2, 5, 6)]

#: documented differences (the format of test_edge_numerics' DIFFERENCES)
DIFFERENCES: dict[tuple[str, str, str], tuple[dict, str]] = {
    ("Region.onnxruntime.session*", "LSTM|GRU", "nonfinite"): (
        {"rtol": 1e-3, "atol": 1e-4, "any_where_nan": True},
        "onnxruntime's LSTM and GRU give finite values where a NaN or an infinity reached the "
        "state (the reference propagates NaN, as onnx's ReferenceEvaluator does): its "
        "activations clamp their inputs, which drops NaN",
    ),
}


@builder("LSTM", "GRU", "RNN")
def recurrent_cases(op: str, edge: str) -> list[Case]:
    g = GATES[op]
    out = []
    for seq, batch, inp, hid in SHAPES.get(edge, VALUE_SHAPES):
        for direction in ("forward", "bidirectional"):
            nd = 2 if direction == "bidirectional" else 1
            b = Build(op, edge, f"s{seq}b{batch}i{inp}h{hid}_{direction}")
            x = b.x((seq, batch, inp))
            ins = [x, b.w((nd, g * hid, inp)), b.w((nd, g * hid, hid)), b.w((nd, 2 * g * hid))]
            # no sequence_lens: the harness checks the numpy reference against onnx's
            # ReferenceEvaluator, which ignores it (tests/numpy/test_recurrent.py covers it)
            ins += ["", b.w((nd, batch, hid))]
            if op == "LSTM":  # peepholes in the bidirectional cases only (OpenVINO refuses them)
                ins += [b.w((nd, batch, hid))]
                if direction == "bidirectional":
                    ins += [b.w((nd, 3 * hid))]
            attrs = {"hidden_size": hid, "direction": direction}
            if op == "GRU":
                attrs["linear_before_reset"] = 1 if direction == "bidirectional" else 0
            outs = b.op_(op, ins, N_OUT[op], **attrs)
            out.append(b.done(*outs))
    return out
