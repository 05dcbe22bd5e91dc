"""The corpus of the tools' output (issue 52): models written by onnxruntime's own tools.

tests/models/tools/make_tools_corpus.py makes them and lists each in
tests/models/tools/manifest.json (tool, settings, inputs, com.microsoft operators): a tiny BERT
and GPT-2 through the transformers optimizer (Attention, EmbedLayerNormalization,
SkipLayerNormalization, BiasGelu, FastGelu), onnxruntime's dynamic quantization (QOperator:
QAttention, QEmbedLayerNormalization, MatMulInteger) and static quantization (QDQ, and
QOperator: QLinearConv, QGemm, QLinearAdd/Mul/Sigmoid/LeakyRelu/Concat/GlobalAveragePool/
Softmax) of those and of a small CNN, MatMulNBits 4-bit weights (block sizes 32 and 128,
symmetric and not; one in the QDQ format of blocked int4 DequantizeLinear), NNCF's QDQ output.

Each committed model loads in a default Session and matches onnxruntime (default session
options, CPU: what a user runs on the same file; int4 QDQ weights fused at accuracy level 0,
float activations, as the file defines them; on a CPU where onnxruntime's uint8 x int8 kernels
saturate, its exact form: tests.numpy.contrib_support.exact_on_this_cpu) on every output,
shapes and dtypes included, for two different seeded inputs; a slow test tunes each on a small
budget and checks the tuned plan against onnxruntime the same way.

Tolerance: :data:`dispatch.compare.MODEL_TOLERANCE` (rtol 1e-3, atol 1e-4 of
max(1, max |reference|)) for every float output; integer outputs exactly. Wider, for the
quantized models only, what the compare module allows a quantized operator
(:data:`dispatch.compare.QUANTIZED_STEPS`: one quantization step, a float32 value computed in
another order falling on the other side of a rounding half): a float output that a
DequantizeLinear makes may differ by that many of its steps (its scale, read from the file).
A statically quantized model is that sensitive to the last bit before each QuantizeLinear;
more than a step is not allowed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from dispatch import Session
from dispatch.compare import MODEL_TOLERANCE, QUANTIZED_STEPS
from impls.onnxruntime.region import QDQ_MATMULNBITS_LEVEL
from tests.models.tools.make_tools_corpus import MAX_COMMITTED_BYTES, make_feeds, operators
from tests.numpy.contrib_support import exact_on_this_cpu

ort = pytest.importorskip("onnxruntime")

TOOLS = Path(__file__).resolve().parent / "tools"
MANIFEST = json.loads((TOOLS / "manifest.json").read_text())
COMMITTED: dict[str, dict[str, Any]] = {k: v for k, v in MANIFEST["models"].items() if v["committed"]}
NAMES = sorted(COMMITTED)
#: the two seeded inputs every model is compared on
SEEDS = (0, 1)
#: known failures, each with its cause (strict: a fix makes the test pass and the mark must go)
DEFAULT_FAILS: dict[str, str] = {}
TUNED_FAILS: dict[str, str] = {**DEFAULT_FAILS}


def _marked(fails: dict[str, str]) -> list:
    return [pytest.param(n, marks=pytest.mark.xfail(reason=fails[n], strict=True)) if n in fails else n
            for n in NAMES]


def _path(name: str) -> Path:
    return TOOLS / COMMITTED[name]["file"]


def _shapes(entry: dict[str, Any]) -> dict[str, list[int]]:
    dims = entry["dims"]
    return {k: [dims[d] if isinstance(d, str) else int(d) for d in v["shape"]]
            for k, v in entry["inputs"].items()}


def _expected(path: Path, feeds: dict[str, np.ndarray]) -> tuple[list[str], list[np.ndarray]]:
    """onnxruntime's outputs on the file (default session options but the accuracy level of the
    MatMulNBits it fuses from int4 QDQ weights), or, on a CPU where its uint8 x int8 kernels
    saturate, on the file with those weights widened to uint8: the exact integer math
    (tests.numpy.contrib_support.exact_on_this_cpu)."""
    model = exact_on_this_cpu(onnx.load(str(path)))
    so = ort.SessionOptions()
    # int4 QDQ MatMuls as the file defines them (float activations), as the regions run them
    # (impls.onnxruntime.region.QDQ_MATMULNBITS_LEVEL), not with activations rounded to int8
    so.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", QDQ_MATMULNBITS_LEVEL)
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return [o.name for o in sess.get_outputs()], sess.run(None, feeds)


def _output_steps(path: Path) -> dict[str, float]:
    """Output name -> the quantization step of the DequantizeLinear that makes it (its largest
    scale), for the outputs a DequantizeLinear with a constant scale makes."""
    model = onnx.load(str(path))
    consts = {t.name: t for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.attribute:
            consts[n.output[0]] = n.attribute[0].t
    steps = {}
    outputs = {o.name for o in model.graph.output}
    for n in model.graph.node:
        if n.op_type == "DequantizeLinear" and n.output[0] in outputs and n.input[1] in consts:
            steps[n.output[0]] = float(np.max(np.abs(numpy_helper.to_array(consts[n.input[1]]))))
    return steps


def _assert_match(got: list[np.ndarray], names: list[str], want: list[np.ndarray], what: str,
                  steps: dict[str, float] | None = None) -> None:
    """Outputs equal in shape and dtype, floats within MODEL_TOLERANCE (plus ``steps``: output
    -> the absolute difference a quantized output may have besides), integers exactly."""
    rtol, atol = MODEL_TOLERANCE
    assert len(got) == len(want) >= 1, what
    for name, g, w in zip(names, got, want):
        g = np.asarray(g)
        assert g.shape == w.shape and g.dtype == w.dtype, (what, name, g.shape, w.shape, g.dtype, w.dtype)
        if w.dtype.kind in "fc":
            assert np.all(np.isfinite(w)), f"{what}: onnxruntime's {name!r} is not finite"
            scale = max(1.0, float(np.max(np.abs(w)))) if w.size else 1.0
            extra = (steps or {}).get(name, 0.0)
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol * scale + extra * 1.0001,
                                       err_msg=f"{what}: {name!r}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"{what}: {name!r}")


def _allowed_steps(name: str) -> dict[str, float]:
    """The quantized model's outputs -> the compare module's quantization steps of each."""
    if not COMMITTED[name]["quantized"]:
        return {}
    n = max(QUANTIZED_STEPS.values(), default=0)
    return {out: n * step for out, step in _output_steps(_path(name)).items()}


def test_the_manifest_lists_every_committed_model():
    """Every .onnx file here is in the manifest, small, weights inside, and the operators the
    manifest records are the file's; the tools' operators are all there."""
    files = {p.name for p in TOOLS.glob("*.onnx")}
    assert files == {e["file"] for e in COMMITTED.values()}
    contrib: set[str] = set()
    for name, entry in COMMITTED.items():
        path = _path(name)
        assert path.stat().st_size <= MAX_COMMITTED_BYTES, name
        ops, ms = operators(path)
        assert (ops, ms) == (entry["operators"], entry["contrib_ops"]), name
        assert entry["tool"] and entry["inputs"], name
        contrib.update(ms)
    assert {"Attention", "EmbedLayerNormalization", "SkipLayerNormalization", "BiasGelu", "FastGelu",
            "QAttention", "QLinearAdd", "QLinearConcat", "QGemm", "MatMulNBits"} <= contrib
    tools = {e["tool"].split(".")[-1] for e in COMMITTED.values()}
    assert {"optimize_model", "quantize_dynamic", "quantize_static", "MatMulNBitsQuantizer"} <= tools


def test_the_two_inputs_differ():
    """The two seeded inputs of each model are not the same (a comparison on two inputs)."""
    for name, entry in COMMITTED.items():
        a, b = (make_feeds(entry["inputs"], entry["dims"], s) for s in SEEDS)
        assert any(not np.array_equal(a[k], b[k]) for k in a), name


@pytest.mark.parametrize("name", _marked(DEFAULT_FAILS))
def test_default_session_matches_onnxruntime(name):
    entry = COMMITTED[name]
    path = _path(name)
    sess = Session(str(path), input_shapes=_shapes(entry), store=False)
    for seed in SEEDS:
        feeds = make_feeds(entry["inputs"], entry["dims"], seed)
        names, want = _expected(path, feeds)
        assert [o.name for o in sess.get_outputs()] == names
        _assert_match(sess.run(None, feeds), names, want, f"{name} seed {seed}", _allowed_steps(name))


@pytest.mark.slow
@pytest.mark.parametrize("name", _marked(TUNED_FAILS))
def test_tuned_plan_matches_onnxruntime(name, tmp_path):
    """Tuned on a small budget (on the corpus's own inputs: ids below the vocabulary), the plan
    reproduces onnxruntime on both inputs."""
    entry = COMMITTED[name]
    path = _path(name)
    feeds = [make_feeds(entry["inputs"], entry["dims"], s) for s in SEEDS]
    sess = Session(str(path), input_shapes=_shapes(entry), store=str(tmp_path / "plans.sqlite"))
    result = sess.tune(budget_s=2, progress=False, inputs=feeds)
    assert result.plan_id is not None
    for seed, feed in zip(SEEDS, feeds):
        names, want = _expected(path, feed)
        _assert_match(sess.run(None, feed), names, want, f"{name} seed {seed} (tuned)",
                      _allowed_steps(name))


@pytest.mark.parametrize("name", ["bert_opt", "bert_opt_dyn_qop"])
def test_an_optimized_bert_tunes_on_random_inputs(name, tmp_path):
    """Without representative inputs the tuner draws random ids: those reaching the embedding
    operators (EmbedLayerNormalization's input_ids, segment_ids and position_ids, and the
    quantized form's) stay inside the table each indexes (tuner/index_bounds.py), so tuning
    runs; the plan then matches onnxruntime on real feeds."""
    from tuner.index_bounds import index_bounds

    entry = COMMITTED[name]
    path = _path(name)
    sess = Session(str(path), input_shapes=_shapes(entry), store=str(tmp_path / "plans.sqlite"))
    embed = next(n for n in sess.graph.nodes if n.op_type.endswith("EmbedLayerNormalization"))
    bounds = index_bounds(sess.graph.nodes)
    assert bounds[embed.input(0).name] == embed.input(2).shape[0]
    assert bounds[embed.input(1).name] == embed.input(4).shape[0]
    assert sess.tune(budget_s=1, progress=False).plan_id is not None
    feeds = make_feeds(entry["inputs"], entry["dims"], SEEDS[0])
    names, want = _expected(path, feeds)
    _assert_match(sess.run(None, feeds), names, want, f"{name} (tuned on random inputs)",
                  _allowed_steps(name))
