"""``opdispatch serve`` over a shape range (issue 51): a model served with ``shapes = { x = [1,
"1..64", 8] }`` (config.toml) or ``--shape x=1x1..64x8`` answers every shape inside the range on
its range plan, equal to onnxruntime's own run, refuses a shape outside it with a 400 naming
the range, and says the range and its buckets in its metadata; malformed ranges are errors
saying what was received and what is expected; the dynamic batcher of a range model groups
only requests of the same shapes.

The model is built here: ``x`` float32 ``[batch, seq, 8]`` -> MatMul by a constant 8x8 -> Relu
-> ``y``, tuned over its ranges in a store of the test's own (a second or so each).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dispatch.errors import ArgumentError
from tests.serve.conftest import live_server
from tuner.cli.serve import serve_shapes
from tuner.serve.repository import ModelSpec, ServeSettings, discover, settings_from
from tuner.serve.runner import InvalidRequest, ModelRunner

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

#: the range served (batch 1, any length from 1 to 64) and, for the batcher, one over batch too
RANGE = {"x": [1, "1..64", 8]}
RANGE_TEXT = "x=1x1..64x8"
BATCH_RANGE = {"x": ["1..4", "1..64", 8]}
CONFIG = 'shapes = { x = [1, "1..64", 8] }\n'
#: lengths inside the range (both ends among them) and outside it
INSIDE = (1, 2, 7, 33, 64)
OUTSIDE = (65, 100)
_names = itertools.count()


def unique(prefix: str) -> str:
    """A model name no other test uses (the Prometheus registry is shared by the process)."""
    return f"range-{prefix}-{next(_names)}"


def _tiny_model(path: Path) -> Path:
    from onnx import TensorProto, helper, numpy_helper

    weight = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "tiny_ranges",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 8])],
        [numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The model and a store holding its range plans (batch 1, and batch 1..4)."""
    from tuner.shapes.tune_range import tune_range

    root = tmp_path_factory.mktemp("ranges")
    model = _tiny_model(root / "tiny.onnx")
    store = str(root / "plans.sqlite")
    # every available backend, as the server's sessions look plans up with (a plan tuned with
    # backends=["onnxruntime"] is stored under that software and found only by sessions
    # restricted to it, which opdispatch serve does not offer)
    for spec in (RANGE, BATCH_RANGE):
        result = tune_range(str(model), spec, store=store, budget_s=4)
        assert result.plan_id is not None, result.store_error
    return model, store


def feeds(length: int, batch: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed * 1000 + length)
    return {"x": rng.standard_normal((batch, length, 8)).astype(np.float32)}


def reference(model: Path, x: dict[str, np.ndarray]) -> np.ndarray:
    """onnxruntime's own run of the model."""
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return session.run(None, x)[0]


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# -- settings ---------------------------------------------------------------------------------


def test_config_toml_ranges_parse(tmp_path):
    _tiny_model(tmp_path / "repo" / "tiny" / "model.onnx")
    (tmp_path / "repo" / "tiny" / "config.toml").write_text(
        'shapes = { x = [1, "1..64", 8], mask = ["1", " 2..16 "] }\n')
    (spec,) = discover([tmp_path / "repo"], ServeSettings())
    assert spec.settings.shapes == {"x": (1, "1..64", 8), "mask": (1, "2..16")}


def test_command_line_ranges_parse():
    assert serve_shapes(["x=1x1..64x8"]) == RANGE
    assert serve_shapes(["x=1x16x8"]) == {"x": [1, 16, 8]}
    settings = settings_from({"shapes": serve_shapes(["x=1x1..64x8"])})
    assert settings.shapes == {"x": (1, "1..64", 8)}


@pytest.mark.parametrize("dim", ["5..2", "a..b", "1..", "..4", "-1..4", "1..99999999"])
def test_a_malformed_range_is_an_error_saying_what_was_received_and_expected(tmp_path, dim):
    _tiny_model(tmp_path / "m" / "model.onnx")
    config = tmp_path / "m" / "config.toml"
    config.write_text(f'shapes = {{ x = [1, "{dim}", 8] }}\n')
    with pytest.raises(ArgumentError) as info:
        discover([tmp_path / "m"], ServeSettings())
    message = str(info.value)
    assert message.startswith(f"{config}: shapes.x")
    assert "an inclusive range LO..HI like 1..512" in message
    assert f"received {dim!r}" in message
    with pytest.raises(ArgumentError, match=r"the serve settings: shapes\.x: .*received"):
        settings_from({"shapes": serve_shapes([f"x=1x{dim}x8"])})


@pytest.mark.parametrize("dims", [[1, "seq", 8], [1, 1.5, 8], [1, 0, 8], "1x1..64x8"])
def test_a_dimension_neither_a_size_nor_a_range_is_an_error(dims):
    with pytest.raises(ArgumentError) as info:
        settings_from({"shapes": {"x": dims}})
    message = str(info.value)
    assert message.startswith("the serve settings: shapes.x")
    assert "received" in message and ("LO..HI" in message or "1..512" in message)


# -- the runner, in process ---------------------------------------------------------------------


def _runner(model: Path, store: str, **settings: Any) -> ModelRunner:
    runner = ModelRunner(ModelSpec(unique("m"), model, settings_from(settings)), store)
    return runner


def test_a_range_model_answers_every_shape_inside_and_refuses_those_outside(tuned):
    model, store = tuned
    runner = _runner(model, store, shapes=RANGE)
    try:
        assert runner.load(), runner.reason
        info = runner.plan_info
        assert info["plan_source"] == "store" and info["shape_range"] == RANGE_TEXT
        assert info["range_axes"] == "seq 1..64"
        assert info["range_ends"] == [{"x": [1, 1, 8]}, {"x": [1, 64, 8]}]
        assert info["buckets"] and info["buckets"][0]["lo"] == 1
        assert info["buckets"][-1]["hi"] == 64 and len(info["plan_id"]) == 16
        assert info["batch_sizes"] == [1]  # batch 2 is outside the range served

        async def requests() -> None:
            for length in INSIDE:
                x = feeds(length)
                assert_same((await runner.infer(x))["y"], reference(model, x))
            for length in OUTSIDE:
                with pytest.raises(InvalidRequest) as info:
                    await runner.infer(feeds(length))
                assert RANGE_TEXT in str(info.value)
                assert f"dimension 1 is {length}, outside 1..64" in str(info.value)
            with pytest.raises(InvalidRequest, match=f"outside the shape range served, {RANGE_TEXT}"):
                await runner.infer(feeds(8, batch=2))

        asyncio.run(requests())
    finally:
        runner.close()


def test_a_range_not_tuned_is_not_ready_and_names_the_ranges_stored(tuned):
    model, store = tuned
    runner = _runner(model, store, shapes={"x": [1, "1..32", 8]})
    assert not runner.load()
    assert "x=1x1..32x8" in runner.reason and RANGE_TEXT in runner.reason
    assert "opdispatch tune" in runner.reason
    untuned = _runner(model, store, shapes={"x": [1, "1..32", 8]}, allow_untuned=True)
    try:
        assert untuned.load(), untuned.reason
        assert untuned.plan_info["plan_source"] == "heuristic"
        assert untuned.plan_info["shape_range"] == "x=1x1..32x8"

        async def one() -> None:
            x = feeds(20)
            assert_same((await untuned.infer(x))["y"], reference(model, x))
            with pytest.raises(InvalidRequest, match="x=1x1..32x8"):
                await untuned.infer(feeds(40))

        asyncio.run(one())
    finally:
        untuned.close()


def test_the_batcher_of_a_range_model_never_concatenates_different_lengths(tuned):
    model, store = tuned
    runner = _runner(model, store, shapes=BATCH_RANGE, max_batch_size=4,
                     max_queue_delay_ms=200)
    groups: list[list[tuple[int, ...]]] = []
    try:
        assert runner.load(), runner.reason
        assert runner.plan_info["shape_range"] == "x=1..4x1..64x8"
        assert runner.batch_sizes == [1, 2, 4]
        run_batch = runner._run_batch

        def recording(group: Sequence[Any]) -> list[Any]:
            groups.append([item.feeds["x"].shape for item in group])
            return run_batch(group)

        runner._run_batch = recording  # type: ignore[method-assign]
        lengths = [3, 5, 3, 5, 3, 9, 5, 3]

        async def concurrent() -> list[dict[str, np.ndarray]]:
            return await asyncio.gather(*(runner.infer(feeds(n, seed=k))
                                          for k, n in enumerate(lengths)))

        answers = asyncio.run(concurrent())
        for k, (n, answer) in enumerate(zip(lengths, answers)):
            x = feeds(n, seed=k)
            assert_same(answer["y"], reference(model, x))
        assert sum(len(g) for g in groups) == len(lengths)
        assert all(len(set(g)) == 1 for g in groups), groups  # one length per group
        assert any(len(g) > 1 for g in groups), groups  # and the same lengths did meet
    finally:
        runner.close()


# -- a live server ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tuned, tmp_path_factory):
    """``opdispatch serve``: the model of a repository with its range in config.toml, and the
    same model file given on the command line with ``--shape x=1x1..64x8``."""
    model, store = tuned
    root = tmp_path_factory.mktemp("serve-ranges")
    (root / "repo" / "tiny").mkdir(parents=True)
    shutil.copy(model, root / "repo" / "tiny" / "model.onnx")
    (root / "repo" / "tiny" / "config.toml").write_text(CONFIG)
    shutil.copy(model, root / "tiny_cli.onnx")
    with live_server([str(root / "repo"), str(root / "tiny_cli.onnx"), "--store", store,
                      "--shape", "x=1x1..64x8"], root) as live:
        for name in ("tiny", "tiny_cli"):
            assert live.get(f"/v2/models/{name}/ready")[0] == 200, live.log.read_text()[-4000:]
        yield live


def _json_request(x: np.ndarray) -> bytes:
    return json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape),
                                   "data": x.reshape(-1).tolist()}]}).encode()


@pytest.mark.parametrize("name", ["tiny", "tiny_cli"])
def test_http_answers_every_length_inside_the_range(server, tuned, name):
    model, _ = tuned
    for length in INSIDE:
        x = feeds(length, seed=1)["x"]
        status, body = server.post(f"/v2/models/{name}/infer", _json_request(x))
        assert status == 200, body
        (out,) = json.loads(body)["outputs"]
        assert out["name"] == "y" and out["shape"] == [1, length, 8]
        got = np.asarray(out["data"], np.float32).reshape(out["shape"])
        assert_same(got, reference(model, {"x": x}))


@pytest.mark.parametrize("name", ["tiny", "tiny_cli"])
def test_http_refuses_a_length_outside_the_range_naming_it(server, name):
    for length in OUTSIDE:
        status, body = server.post(f"/v2/models/{name}/infer",
                                   _json_request(feeds(length)["x"]))
        assert status == 400, body
        error = json.loads(body)["error"]
        assert RANGE_TEXT in error and f"dimension 1 is {length}, outside 1..64" in error
    status, body = server.post(f"/v2/models/{name}/infer", _json_request(feeds(4, batch=2)["x"]))
    assert status == 400 and RANGE_TEXT.encode() in body
    # the model goes on answering
    status, _ = server.post(f"/v2/models/{name}/infer", _json_request(feeds(10)["x"]))
    assert status == 200


def test_metadata_says_the_range_and_its_buckets(server):
    status, body = server.get("/v2/models/tiny")
    assert status == 200
    metadata = json.loads(body)
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, -1, 8]}]
    plan = metadata["parameters"]
    assert plan["ready"] is True and plan["plan_source"] == "store"
    assert plan["shape_range"] == RANGE_TEXT and plan["shapes"] == {"x": [1, "1..64", 8]}
    assert plan["buckets"] and {"lo", "hi", "way", "why"} <= set(plan["buckets"][0])
    assert "range x=1x1..64x8" in plan["range_plan"]
    assert b"every shape in x=1x1..64x8" in server.log.read_bytes()


def test_triton_client_answers_a_length_inside_the_range(server, tuned):
    httpclient = pytest.importorskip("tritonclient.http")
    from tritonclient.utils import InferenceServerException

    model, _ = tuned
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.is_model_ready("tiny")
    x = feeds(17, seed=2)["x"]
    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=True)
    result = client.infer("tiny", [tensor])
    assert_same(result.as_numpy("y"), reference(model, {"x": x}))
    outside = feeds(65)["x"]
    tensor = httpclient.InferInput("x", list(outside.shape), "FP32")
    tensor.set_data_from_numpy(outside, binary_data=True)
    with pytest.raises(InferenceServerException) as info:
        client.infer("tiny", [tensor])
    assert info.value.status() == "400" and RANGE_TEXT in str(info.value)
