"""The OpenVINO subgraph backend: every op it accepts, as a single-node region, and its regions
(blocks, stages, whole light models) against the numpy reference through the tuner's own check;
the ops and dtypes it refuses, with their reasons; dtypes and output ownership; concurrent
runs; a mixed heuristic plan; discovery, availability and version.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
import threading

import numpy as np
import pytest

from impls.region_quirks import OPENVINO_AVX512_REFUSED, has_avx512

pytest.importorskip("openvino", reason="openvino is not installed (pip install 'opdispatch[openvino]')")

from dispatch import Session
from dispatch.backend import load_registry
from dispatch.compare import MODEL_TOLERANCE, check_outputs
from dispatch.fusion import REGION_OP, FusedNode
from dispatch.heuristic import heuristic_plan
from dispatch.onnx_import import import_model
from dispatch.zoo import light_model
from impls.openvino.backend import OpenVinoBackend
from impls.openvino.region import UNSUPPORTED_OPS, build_region, node_reason, propose
from impls.regions import _cut_points
from tests.builders import ModelBuilder, small_cnn
from tests.reliability.numerics_cases import cases
from tests.support import make_node
from tuner.candidates import enumerate_candidates
from tuner.fingerprint import software_fingerprint
from tuner.measure import measure_candidate

IMPL = "Region.openvino.compiled"
#: cases per op key (of the odd-channel edge kind: ordinary values, shapes off the blocks)
CASES_PER_OP = 2


@pytest.fixture(scope="module")
def reg():
    return load_registry()


def _measure(reg, cand) -> str | None:
    return measure_candidate(reg, cand, time_cap_s=0.01, warmup=0, min_repeats=1).error


def _ov_candidates(reg, graph):
    cands = enumerate_candidates(graph, reg, ["numpy", "openvino"])
    return [c for c in cands.candidates if c.impl.backend == "openvino"]


def _ov_rejections(reg, graph) -> dict[str, list[str]]:
    """node -> why OpenVINO's region implementation was rejected for it (the tuner's record)."""
    cands = enumerate_candidates(graph, reg, ["numpy", "openvino"])
    return {node: [r.reason for r in rs if r.impl == IMPL] for node, rs in cands.rejected.items()}


def _op_keys() -> list[str]:
    reg = load_registry()
    return sorted({i.op for i in reg.implementations if i.backend == "numpy" and not i.is_region})


def test_the_region_implementation_is_registered(reg):
    impl = reg.impl(IMPL)
    assert impl.backend == "openvino" and impl.is_region and impl.op == REGION_OP


@pytest.mark.parametrize("op", _op_keys())
def test_every_op_it_accepts_matches_the_reference(reg, op):
    """Each node of the op's cases is a single-node OpenVINO region that matches the numpy
    reference within the op tolerance (the tuner's check), or the tuner records why OpenVINO
    refused it; an op of ``UNSUPPORTED_OPS`` is refused on every case."""
    ran = dynamic = 0
    for case in cases(op, "odd_channels")[:CASES_PER_OP]:
        graph = import_model(case.model)
        ov = _ov_candidates(reg, graph)
        singles = {c.nodes[0] for c in ov if len(c.nodes) == 1}
        rejected = _ov_rejections(reg, graph)
        for node in graph.nodes:
            if node.name not in singles:
                why = rejected.get(node.name, [])
                assert any("openvino" in r.lower() for r in why), (
                    f"{node.name} neither offered to OpenVINO nor refused with a reason")
                # OpenVINO regions hold static shapes only: a node whose output the data
                # sizes (NonZero, Unique, a Loop's scan outputs) is refused for that
                dynamic += any("known only at run time" in r for r in why)
        for cand in ov:
            error = _measure(reg, cand)
            assert error is None, (case.id, cand.id, error)
            ran += 1
    if op in UNSUPPORTED_OPS or (op in OPENVINO_AVX512_REFUSED and has_avx512()):
        assert not ran, f"{op} is listed as never offered to OpenVINO but a case ran"
        return
    assert ran or dynamic, f"no {op} case ran on OpenVINO"


def _single(op, inputs, attrs=None, *, opset=17, n_outputs=1, const=(), shapes, dtypes):
    node, _ = make_node(op, inputs, attrs, opset=opset, n_outputs=n_outputs, const_inputs=const,
                        output_shapes=shapes, output_dtypes=dtypes)
    return node


def _region(node) -> FusedNode:
    ins = [v for v in node.inputs if v is not None and not v.is_const]
    return FusedNode(name=node.name, op_type=REGION_OP, inputs=ins, outputs=list(node.outputs),
                     attrs={}, domain="", opset=node.opset, nodes=[node])


F = np.zeros((2, 4, 5, 6), np.float32)
REFUSED = {
    "int64 arithmetic": (_single("Add", [np.zeros(3, np.int64)] * 2, shapes=[(3,)], dtypes=[np.int64]),
                         "int32"),
    "float64": (_single("Relu", [np.zeros(3)], shapes=[(3,)], dtypes=[np.float64]), "float32"),
    "uint8 arithmetic": (_single("Sub", [np.zeros(3, np.uint8)] * 2, shapes=[(3,)], dtypes=[np.uint8]),
                         "saturating"),
    "int32 comparison": (_single("Less", [np.zeros(3, np.int32)] * 2, shapes=[(3,)], dtypes=[bool]),
                         "float32"),
    "empty indices": (_single("Gather", [np.zeros((4, 3), np.float32), np.zeros(0, np.int64)],
                              shapes=[(0, 3)], dtypes=[np.float32]), "empty"),
    "empty expand": (_single("Expand", [np.zeros((1, 3), np.float32), np.array([0, 3], np.int64)], const=(1,),
                             shapes=[(0, 3)], dtypes=[np.float32]), "empty"),
    "strings": (_single("Identity", [np.array(["a"], object)], shapes=[(1,)], dtypes=[object]), "object"),
    "softmax opset 11": (_single("Softmax", [F], {"axis": 1}, opset=11, shapes=[F.shape],
                                 dtypes=[np.float32]), "2-D"),
    "even LRN": (_single("LRN", [F], {"size": 2}, shapes=[F.shape], dtypes=[np.float32]), "even"),
    "reduce axes attribute": (_single("ReduceLogSumExp", [F], {"axes": [1]}, opset=13, shapes=[(2, 1, 5, 6)],
                                      dtypes=[np.float32]), "axes attribute"),
    "pad wrap": (_single("Pad", [F, np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)], {"mode": "wrap"}, opset=19,
                         const=(1,), shapes=[(2, 4, 7, 8)], dtypes=[np.float32]), "wrap"),
    "pad run-time value": (_single("Pad", [F, np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), np.float32(2)],
                                   opset=13, const=(1,), shapes=[(2, 4, 7, 8)], dtypes=[np.float32]),
                           "constant"),
    "float mod": (_single("Mod", [F, F], {"fmod": 1}, shapes=[F.shape], dtypes=[np.float32]), "trunc"),
    "bitshift": (_single("BitShift", [np.zeros(3, np.uint32)] * 2, {"direction": "RIGHT"}, opset=11,
                         shapes=[(3,)], dtypes=[np.uint32]), "never offered"),
    "maxpool column-major indices": (_single("MaxPool", [F], {"kernel_shape": [2, 2], "storage_order": 1},
                                             opset=12, n_outputs=2, shapes=[(2, 4, 4, 5)] * 2,
                                             dtypes=[np.float32, np.int64]), "storage_order"),
}


@pytest.mark.parametrize("what", REFUSED)
def test_what_openvino_does_differently_is_refused_with_a_reason(what):
    node, words = REFUSED[what]
    why = node_reason(node)
    assert why is not None and words in why, why


def test_softmax_before_opset_13_is_accepted_where_the_coercion_changes_nothing():
    x = np.zeros((1, 10, 1, 1), np.float32)  # squeezenet's head
    node = _single("Softmax", [x], {"axis": 1}, opset=11, shapes=[x.shape], dtypes=[np.float32])
    assert node_reason(node) is None


def test_int64_indices_in_and_out_keep_their_dtype_and_values():
    """Gather's run-time int64 indices and MaxPool's int64 indices are accepted (valid indices
    fit in int32) and come back as int64, float32 stays float32."""
    data = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    idx = np.array([[4, -1], [0, 2]], np.int64)
    gather = _single("Gather", [data, idx], {"axis": 0}, shapes=[(2, 2, 3)], dtypes=[np.float32])
    assert node_reason(gather) is None
    (y,) = build_region(_region(gather))(data, idx)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, data[idx])
    x = np.random.default_rng(1).standard_normal((1, 2, 4, 4)).astype(np.float32)
    pool = _single("MaxPool", [x], {"kernel_shape": [2, 2], "strides": [2, 2]}, opset=12, n_outputs=2,
                   shapes=[(1, 2, 2, 2)] * 2, dtypes=[np.float32, np.int64])
    assert node_reason(pool) is None
    values, indices = build_region(_region(pool))(x)
    assert values.dtype == np.float32 and indices.dtype == np.int64
    np.testing.assert_array_equal(x.ravel()[indices], values)


def test_outputs_of_one_run_survive_the_next():
    """OpenVINO reuses an infer request's output buffers; the region copies its outputs out,
    so a returned array is the caller's and never changes."""
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    run = build_region(_region(_single("Relu", [x], shapes=[x.shape], dtypes=[np.float32])))
    first = run(x)[0]
    kept = first.copy()
    second = run(-x)[0]
    np.testing.assert_array_equal(first, kept)
    assert first.flags.owndata and not np.shares_memory(first, second)


@pytest.fixture(scope="module")
def squeezenet_graph(reg):
    return Session(light_model("squeezenet", seed=0), backends=["numpy"], registry=reg, store=False).graph


def test_block_stage_and_whole_regions_match_the_reference(reg, squeezenet_graph):
    """Every multi-node region proposed on squeezenet (fire modules, stages, the whole graph)
    matches the reference within the tuner's tolerance."""
    cands = [c for c in _ov_candidates(reg, squeezenet_graph) if len(c.nodes) > 1]
    sizes = sorted({len(c.nodes) for c in cands})
    assert sizes[-1] == len(squeezenet_graph.nodes) and len(sizes) >= 3, sizes
    for cand in cands:
        assert _measure(reg, cand) is None, cand.id


def test_proposals_are_contiguous_with_blocks_at_cut_points(reg):
    graph = Session(light_model("resnet50", seed=0), backends=["numpy"], registry=reg, store=False).graph
    index = {n.name: k for k, n in enumerate(graph.nodes)}
    regions = propose(graph)
    assert len({tuple(r) for r in regions}) == len(regions), "a region is proposed twice"
    for r in regions:
        ks = [index[n] for n in r]
        assert ks == list(range(ks[0], ks[-1] + 1)), "not a contiguous range"
    assert len(_cut_points(graph)) >= 16
    sizes = {len(r) for r in regions}
    assert {1, len(graph.nodes)} <= sizes and len(sizes) >= 4, sorted(sizes)
    # one bottleneck block (between two cut points) as its own region, against the reference
    cuts = _cut_points(graph)
    block = [n.name for n in graph.nodes[cuts[1] + 1: cuts[2] + 1]]
    assert block in regions
    cand = next(c for c in _ov_candidates(reg, graph) if list(c.nodes) == block)
    assert _measure(reg, cand) is None


@pytest.mark.parametrize("name", ["resnet50", "squeezenet", "inception_v1"])
def test_a_whole_light_model_as_one_region_matches_numpy(reg, name):
    model = light_model(name, seed=1)
    ov = Session(model, backends=["openvino"], registry=reg, store=False)
    assert ov.plan.backends_used() == {"openvino": len(ov.graph.nodes)}
    assert [s.op for s in ov.plan.steps] == [REGION_OP]
    ref = Session(model, backends=["numpy"], registry=reg, store=False)
    x = np.random.default_rng(0).standard_normal(ref.get_inputs()[0].shape).astype(np.float32)
    feeds = {ref.get_inputs()[0].name: x}
    got, want = ov.run(None, feeds), ref.run(None, feeds)
    assert got[0].dtype == np.float32
    assert check_outputs(got, want, ov.graph.nodes, MODEL_TOLERANCE) is None


def _mixed_model():
    """Conv-Relu, an LRN OpenVINO refuses (even size), Conv-Relu-GlobalAveragePool."""
    rng = np.random.default_rng(3)
    b = ModelBuilder(17, "mixed")
    x = b.input("x", [1, 3, 12, 12])
    h = b.op("Relu", [b.op("Conv", [x, b.const(rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32))],
                           pads=[1, 1, 1, 1])])
    h = b.op("LRN", [h], size=2, alpha=1e-3, beta=0.75, bias=1.0)
    h = b.op("Relu", [b.op("Conv", [h, b.const(rng.normal(0, 0.3, (4, 8, 3, 3)).astype(np.float32))],
                           pads=[1, 1, 1, 1])])
    b.output(b.op("GlobalAveragePool", [h]))
    return b.build()


def test_a_heuristic_plan_mixes_openvino_regions_with_numpy_and_matches(reg):
    model = _mixed_model()
    sess = Session(model, backends=["openvino", "numpy"], registry=reg, store=False)
    plan = heuristic_plan(sess.graph, reg, ["openvino", "numpy"])
    assert [(s.nodes, s.impl) for s in plan.steps] == [(s.nodes, s.impl) for s in sess.plan.steps]
    assert [(s.op, s.backend) for s in plan.steps] == [
        (REGION_OP, "openvino"), ("LRN", "numpy"), (REGION_OP, "openvino")]
    lrn = plan.steps[1].nodes[0]
    assert any("size is even" in r for r in _ov_rejections(reg, sess.graph)[lrn])  # the tuner's record
    ref = Session(model, backends=["numpy"], registry=reg, store=False)
    x = np.random.default_rng(0).standard_normal((1, 3, 12, 12)).astype(np.float32)
    got, want = sess.run(None, {"x": x}), ref.run(None, {"x": x})
    assert check_outputs(got, want, sess.graph.nodes, MODEL_TOLERANCE) is None


def test_concurrent_runs_give_the_sequential_outputs(reg):
    """One compiled region serves several threads, each through its own infer request."""
    sess = Session(small_cnn(), backends=["openvino"], registry=reg, store=False)
    assert [s.op for s in sess.plan.steps] == [REGION_OP]
    rng = np.random.default_rng(0)
    feeds = [rng.standard_normal((1, 3, 16, 16)).astype(np.float32) for _ in range(4)]
    expected = [sess.run(None, {"x": f})[0] for f in feeds]
    errors: list[str] = []
    start = threading.Barrier(len(feeds))

    def worker(k: int) -> None:
        start.wait()
        for _ in range(20):
            (y,) = sess.run(None, {"x": feeds[k]})
            if not np.allclose(y, expected[k], rtol=1e-6, atol=1e-7):
                errors.append(f"thread {k}: max error {np.abs(y - expected[k]).max():.3g}")
                return

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(len(feeds))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors


def test_infer_requests_are_lent_to_runs_not_kept_per_thread(reg):
    """As many infer requests as runs were ever in flight at once: six threads one after the
    other share one (a request per thread made six, and a plan of N streams called from N
    threads N x N, each first run alone)."""
    sess = Session(small_cnn(), backends=["openvino"], registry=reg, store=False)
    (call,) = [c for c in sess.executor.calls if c.kind == "kernel"]
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    (want,) = sess.run(None, {"x": x})
    got = []
    for _ in range(6):
        t = threading.Thread(target=lambda: got.append(sess.run(None, {"x": x})[0]))
        t.start()
        t.join(timeout=120)
    assert len(call.fn.requests.free) == 1
    assert len(got) == 6 and all(np.array_equal(y, want) for y in got)

    start = threading.Barrier(3)

    def together() -> None:
        start.wait()
        sess.run(None, {"x": x})

    threads = [threading.Thread(target=together) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert 1 <= len(call.fn.requests.free) <= 3  # as many as ran at once, given back


def test_availability_says_how_to_install_when_openvino_is_missing(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name == "openvino" else real(name, *a, **k))
    why = OpenVinoBackend().availability()
    assert why is not None and "not installed" in why and "opdispatch[openvino]" in why
    status = load_registry(fresh=True).backends["openvino"]
    assert not status.available and "opdispatch[openvino]" in (status.reason or "")


def test_version_and_the_software_fingerprint(reg):
    version = OpenVinoBackend().version()
    assert version == f"openvino {importlib.metadata.version('openvino')}"
    assert reg.backends["openvino"].available and reg.backends["openvino"].version == version
    assert software_fingerprint(reg, ["openvino", "numpy"])["backends"]["openvino"] == version
    assert "openvino" not in software_fingerprint(reg, ["numpy"])["backends"]


def test_discovery_does_not_import_openvino():
    code = ("import sys; from dispatch.backend import load_registry; r = load_registry(); "
            "assert 'openvino' in r.available_backends(); "
            "assert 'openvino' not in sys.modules, 'imported at discovery'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
