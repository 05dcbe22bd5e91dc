"""onnxruntime regions take the contrib operators onnxruntime runs as defined (issue 52), and
``opdispatch ops`` lists the com.microsoft domain with the backends that run each operator."""

from __future__ import annotations

import argparse
import importlib.util

import numpy as np
import pytest

from dispatch.contrib_schemas import MS_DOMAIN, SCHEMAS
from dispatch.onnx_import import import_model
from tests.numpy.contrib_support import one_node_model, run_ours

RNG = np.random.default_rng(520000)


def rand(*shape: int) -> np.ndarray:
    return np.asarray(RNG.standard_normal(shape), dtype=np.float32)


def test_every_contrib_schema_is_offered_to_onnxruntime_or_refused_with_why():
    from impls.onnxruntime.region import CONTRIB_OPS, CONTRIB_REFUSED

    schemas = {f"{s.domain}::{s.name}" for s in SCHEMAS if s.domain == MS_DOMAIN}
    assert CONTRIB_OPS | set(CONTRIB_REFUSED) == schemas
    assert not CONTRIB_OPS & set(CONTRIB_REFUSED)


@pytest.mark.parametrize("op,inputs,attrs,refused", [
    ("FastGelu", [("X", rand(2, 8)), ("bias", rand(8))], {}, None),
    ("FusedMatMul", [("A", rand(2, 4, 5)), ("B", rand(5, 6))], {"alpha": 2.0}, None),
    ("FusedMatMul", [("A", rand(5, 4)), ("B", rand(5))], {"transA": 1}, "reads A untransposed"),
    ("BiasSplitGelu", [("X", rand(1, 2, 8)), ("bias", rand(8))], {}, "CUDA only"),
    ("QOrderedMatMul", [("X", rand(2, 8))], {}, "not a standard ONNX domain"),
])
def test_onnxruntime_node_reasons(op, inputs, attrs, refused):
    from impls.onnxruntime.region import node_reason

    graph = import_model(one_node_model(op, inputs, ["Y"], attrs))
    why = node_reason(graph.nodes[0])
    if refused is None:
        assert why is None
    else:
        assert why is not None and refused in why


def test_a_refused_contrib_node_runs_on_the_reference_in_a_default_session():
    a, b = rand(2, 5, 4), rand(5)
    model = one_node_model("FusedMatMul", [("A", a), ("B", b)], ["Y"], {"transA": 1})
    (y,) = run_ours(model, {"A": a, "B": b}, backends=None)
    np.testing.assert_allclose(y, np.swapaxes(a, -1, -2) @ b, rtol=1e-5, atol=1e-5)


def test_ops_lists_the_contrib_domain(capsys):
    from tuner.cli.commands import cmd_ops

    assert cmd_ops(argparse.Namespace(op=["FastGelu", "BiasSplitGelu", "SimplifiedLayerNormalization"],
                                      verbose=True, plugin_path=None)) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith(("com.", "Simpl"))}
    assert "numpy: 1" in rows["com.microsoft::FastGelu"] and "onnxruntime" in rows["com.microsoft::FastGelu"]
    assert rows["com.microsoft::BiasSplitGelu"].split()[-1] == "-"
    assert "onnxruntime" in rows["SimplifiedLayerNormalization"]
    assert "1 operator(s) of ONNX's default domain" in out and "2 of domain com.microsoft" in out
    assert "onnxruntime: com.microsoft::BiasSplitGelu: never offered to onnxruntime, which runs " in out
    if importlib.util.find_spec("openvino") is not None:
        assert "openvino" in rows["com.microsoft::FastGelu"]
        assert "openvino: com.microsoft::BiasSplitGelu: never offered to OpenVINO: its ONNX front end" in out


def test_a_contrib_model_from_the_graph_cache_builds_its_regions(tmp_path):
    """A second process reads the imported graph from the graph cache (onnx's schemas of the
    contrib operators were registered by the first one only): its onnxruntime region, which
    onnx's checker checks, still builds."""
    import os
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    import onnx

    from tests.numpy.test_contrib_schemas import bert_block

    root = str(Path(__file__).resolve().parents[2])
    path = tmp_path / "block.onnx"
    onnx.save(bert_block()[0], str(path))
    env = dict(os.environ, OPDISPATCH_GRAPH_CACHE=str(tmp_path / "graphs"), OPDISPATCH_COMPILED_CACHE="off",
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    child = textwrap.dedent("""
        import sys
        import numpy as np
        from dispatch import Session
        sess = Session(sys.argv[1], store=False, backends=["onnxruntime", "numpy"])
        out = sess.run(None, {i.name: np.ones(i.shape, i.dtype) for i in sess.get_inputs()})
        print(sess.graph_cached, sorted(sess.plan.backends_used()), round(float(out[0].sum()), 3))
    """)
    runs = [subprocess.run([sys.executable, "-c", child, str(path)], env=env, cwd=root,
                           capture_output=True, text=True, check=True).stdout.split()
            for _ in range(2)]
    assert runs[0][1:] == runs[1][1:] and runs[1][:2] == ["True", "['onnxruntime']"], runs


@pytest.mark.parametrize("axis", [-1, -2, 1, 2])
def test_simplified_layer_norm_in_an_openvino_session(axis):
    """OpenVINO converts the default-domain SimplifiedLayerNormalization with a negative axis
    only: a non-negative one runs on the reference."""
    pytest.importorskip("openvino")
    from dispatch import Session

    x = rand(2, 3, 8)
    scale = rand(*x.shape[axis % 3:])
    model = one_node_model("SimplifiedLayerNormalization", [("X", x), ("scale", scale)], ["Y"],
                           {"axis": axis}, domain="")
    sess = Session(model, store=False, backends=["openvino", "numpy"])
    want = "Region.openvino.compiled" if axis < 0 else "SimplifiedLayerNormalization.numpy.float64"
    assert [s.impl for s in sess.plan.steps] == [want]
    (y,) = sess.run(None, {"X": x, "scale": scale})
    (ref,) = run_ours(model, {"X": x, "scale": scale})
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def test_a_model_of_contrib_ops_in_an_openvino_session():
    """OpenVINO's regions take the contrib activations and normalizations its front end converts
    (all of the BERT-like block's: FusedMatMul, SkipLayerNormalization with its four outputs,
    BiasGelu, FastGelu, QuickGelu, Gelu, SkipSimplifiedLayerNormalization), and the plan matches
    onnxruntime on the file."""
    pytest.importorskip("openvino")
    ort = pytest.importorskip("onnxruntime")
    from dispatch import Session
    from tests.numpy.test_contrib_schemas import bert_block

    model, feeds = bert_block()
    sess = Session(model, store=False, backends=["openvino", "numpy"])
    # (the import names an unnamed node OP_INDEX)
    on_openvino = {n.rsplit("_", 1)[0] for s in sess.plan.steps if s.backend == "openvino" for n in s.nodes}
    contrib = {n.op_type for n in model.graph.node if n.domain == MS_DOMAIN}
    assert len(contrib) == 7 and contrib <= on_openvino, sess.plan.steps
    ours = sess.run(None, feeds)
    theirs = ort.InferenceSession(model.SerializeToString(),
                                  providers=["CPUExecutionProvider"]).run(None, feeds)
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o, t, rtol=1e-4, atol=1e-4)
