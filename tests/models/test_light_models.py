"""The nine light architectures shipped in the onnx package, with seeded random weights
substituted for their ConstantOfShape generators, run through ``Session`` (default backends,
untuned plan) and compared with onnxruntime on the logits (final Softmax dropped)."""

from __future__ import annotations

import numpy as np
import pytest

from dispatch import Session
from dispatch.zoo import LIGHT_MODELS, drop_final_softmax, light_model

ort = pytest.importorskip("onnxruntime")


def _reference(model, feeds):
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


@pytest.mark.slow
@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_matches_onnxruntime(name):
    model = drop_final_softmax(light_model(name, seed=7))
    sess = Session(model)
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.standard_normal(i.shape).astype(i.dtype) for i in sess.get_inputs()}
    got = sess.run(None, feeds)
    ref = _reference(model, feeds)
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.shape == r.shape and g.dtype == r.dtype
        assert np.all(np.isfinite(r)) and np.std(r) > 0, "degenerate reference output"
        scale = float(np.max(np.abs(r)))
        np.testing.assert_allclose(g, r, rtol=1e-3, atol=1e-4 * scale)
