"""The exporter corpus (issue 14): twenty transformers architectures with tiny random-weight
configs, each exported by torch's TorchScript exporter (``dynamo=False``) and its dynamo
exporter (``dynamo=True``), committed in tests/models/corpus/ (bench/models/corpus_export.py
writes them; bench/models/README.md lists them). Every file loads, runs its default plan and
its native/numpy plan, and matches onnxruntime on every output (rtol 1e-3, atol 1e-4 of the
largest reference magnitude).

Text models have symbolic ``batch`` and ``sequence`` dimensions, given concrete values here
(batch 2, sequence 7, from the file's metadata); token ids are drawn below the vocabulary
size and attention masks end with zeros, as written in the file's ``metadata_props``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from bench.models.corpus import ARCHS, EXPORTERS, feeds_for, file_name
from dispatch import Session
from dispatch.backend import load_registry

ort = pytest.importorskip("onnxruntime")

CORPUS = Path(__file__).resolve().parent / "corpus"
FILES = sorted(CORPUS.glob("*.onnx"))
#: the committed corpus stays small (issue 14: a few MB in all)
MAX_TOTAL_BYTES = 8 * 2**20
#: file stem -> why it fails today (pytest.mark.xfail(strict=True): fixing it fails the test
#: until the entry is removed)
XFAIL: dict[str, str] = {}


def _param(path: Path):
    marks = [pytest.mark.xfail(strict=True, reason=XFAIL[path.stem])] if path.stem in XFAIL else []
    return pytest.param(path, id=path.stem, marks=marks)


PARAMS = [_param(p) for p in FILES]


def _reference(path: Path, feeds: dict[str, np.ndarray]) -> tuple[list[str], list[np.ndarray]]:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return [o.name for o in sess.get_outputs()], sess.run(None, feeds)


def _check(path: Path, backends: list[str] | None, dims: dict[str, int] | None = None) -> None:
    shapes, feeds = feeds_for(path, dims=dims)
    sess = Session(str(path), input_shapes=shapes, store=False, backends=backends)
    got = sess.run(None, feeds)
    names, ref = _reference(path, feeds)
    assert [o.name for o in sess.get_outputs()] == names
    assert len(got) == len(ref) >= 1
    for name, g, r in zip(names, got, ref):
        assert g.shape == r.shape and g.dtype == r.dtype, (name, g.shape, r.shape, g.dtype, r.dtype)
        assert np.all(np.isfinite(r)) and np.std(r) > 0, f"{name}: degenerate reference output"
        scale = float(np.max(np.abs(r)))
        np.testing.assert_allclose(g, r, rtol=1e-3, atol=1e-4 * scale, err_msg=f"output {name!r}")


def _kernel_backends() -> list[str]:
    reg = load_registry()
    native = reg.backends.get("native")
    return (["native"] if native is not None and native.available else []) + ["numpy"]


def test_the_corpus_is_complete_and_small():
    """Every (architecture, exporter) pair that exports is committed, weights inside, and the
    whole corpus stays within a few MB."""
    want = {file_name(a.name, e) for a in ARCHS.values() for e in EXPORTERS if e not in a.broken}
    have = {p.name for p in FILES}
    assert want <= have, f"missing from {CORPUS}: {sorted(want - have)}"
    assert len(ARCHS) >= 20
    total = sum(p.stat().st_size for p in FILES)
    assert total <= MAX_TOTAL_BYTES, f"the corpus holds {total:,} bytes"
    for p in FILES:
        model = onnx.load(str(p), load_external_data=False)
        assert not any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


@pytest.mark.parametrize("path", PARAMS)
def test_default_plan_matches_onnxruntime(path):
    _check(path, None)


@pytest.mark.parametrize("path", PARAMS)
def test_kernel_plan_matches_onnxruntime(path):
    """The plan of opdispatch's own kernels (native, numpy for the rest): no onnxruntime
    region, so every operator of the export runs on an implementation of this project."""
    _check(path, _kernel_backends())



TEXT = [p for p in PARAMS if ARCHS[p.values[0].stem.rsplit("_", 1)[0]].family == "text"]


@pytest.mark.parametrize("path", TEXT)
def test_text_models_serve_other_shapes(path):
    """One file, symbolic batch and sequence, loaded for another shape (batch 3, sequence 11)."""
    _check(path, _kernel_backends(), {"batch": 3, "sequence": 11})


#: tuned here (each a few seconds): the Swin of issue 14, a dynamo decoder, a TF-padded CNN,
#: a segmentation model with Resize; bench/models/corpus_check.py tunes every file
TUNED = {
    "swin_torchscript": None,
    "gpt2_dynamo": None,
    "efficientnet_dynamo": None,
    "segformer_torchscript": None,
    # token_type_ids index a 2-row embedding: the tuner's random integers stay inside it
    # (tuner/index_bounds.py)
    "bert_torchscript": None,
    "albert_dynamo": None,
}


def _tuned_param(stem: str):
    why = TUNED[stem]
    return pytest.param(stem, id=stem, marks=[pytest.mark.xfail(strict=True, reason=why)] if why else [])


@pytest.mark.slow
@pytest.mark.parametrize("stem", [_tuned_param(s) for s in TUNED])
def test_tuned_plan_matches_onnxruntime(stem, tmp_path):
    path = CORPUS / f"{stem}.onnx"
    shapes, feeds = feeds_for(path)
    sess = Session(str(path), input_shapes=shapes, store=str(tmp_path / "plans.sqlite"))
    sess.tune(budget_s=1, progress=False)
    got = sess.run(None, feeds)
    _, ref = _reference(path, feeds)
    for g, r in zip(got, ref, strict=True):
        scale = float(np.max(np.abs(r)))
        np.testing.assert_allclose(g, r, rtol=1e-3, atol=1e-4 * scale)
