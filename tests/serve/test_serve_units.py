"""Unit tests of the serving package, without a server process or Ray: the model repository
(:mod:`tuner.serve.repository`), the dynamic batcher (:mod:`tuner.serve.batcher`), a model
runner on a real model with its untuned plan (:mod:`tuner.serve.runner`), the body limit
middleware of the HTTP server (:class:`tuner.serve.server.BodyLimit`, driven as ASGI) and the
user errors of ``opdispatch serve``.

Neither ``kserve`` nor ``tritonclient.grpc`` is imported here (their gRPC messages cannot load in
one process, and the live-server tests import Triton's client): ``tuner.serve.server`` imports
the framework only inside its functions.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import REGISTRY

import dispatch
from dispatch.errors import ArgumentError
from tests.serve.conftest import BERT, BERT_INPUTS, CNN, SEQ, THROUGHPUT, bert_feeds, cnn_feeds
from tuner.serve.batcher import DynamicBatcher, Queued, cut
from tuner.serve.repository import (
    SETTING_KEYS,
    ModelSpec,
    ServeSettings,
    discover,
    settings_from,
)
from tuner.serve.runner import InvalidRequest, ModelRunner, ModelUnavailable, Overloaded
from tuner.serve.server import BodyLimit

REPO_ROOT = Path(__file__).resolve().parents[2]
_names = itertools.count()


def unique(prefix: str) -> str:
    """A model name no other test uses (the Prometheus registry is shared by the process)."""
    return f"unit-{prefix}-{next(_names)}"


# -- repository ------------------------------------------------------------------------------


def _model(path: Path) -> Path:
    """A small ONNX file at ``path`` (discover reads no model: any file would do)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(CNN, path)
    return path


def _config(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.toml"
    path.write_text(text)
    return path


def test_a_model_file_is_served_under_its_stem_with_the_base_settings(tmp_path):
    model = _model(tmp_path / "resnet.onnx")
    base = ServeSettings(objective="throughput", max_queue=8)
    (spec,) = discover([model], base)
    assert spec.name == "resnet"
    assert spec.path == model
    assert spec.version is None
    assert spec.settings.objective == "throughput@n=2"  # canonicalised
    assert spec.settings.max_queue == 8


def test_a_repository_serves_the_highest_numbered_version(tmp_path):
    repo = tmp_path / "models"
    for version in ("1", "2", "10"):
        _model(repo / "cnn" / version / "model.onnx")
    (repo / "cnn" / "11").mkdir()  # a version folder without a model is not a version
    _model(repo / "plain" / "model.onnx")
    _model(repo / "single" / "exported.onnx")
    _model(repo / ".hidden" / "model.onnx")
    specs = {s.name: s for s in discover([repo], ServeSettings())}
    assert sorted(specs) == ["cnn", "plain", "single"]
    assert specs["cnn"].version == "10"  # numbers, not strings: 10 > 2
    assert specs["cnn"].path == repo / "cnn" / "10" / "model.onnx"
    assert specs["plain"].version is None
    assert specs["plain"].path == repo / "plain" / "model.onnx"
    assert specs["single"].path == repo / "single" / "exported.onnx"


def test_a_model_folder_given_directly_is_one_model(tmp_path):
    folder = tmp_path / "bert"
    _model(folder / "3" / "model.onnx")
    (spec,) = discover([folder], ServeSettings())
    assert (spec.name, spec.version) == ("bert", "3")


def test_a_model_folder_with_a_single_onnx_file_given_directly_is_one_model(tmp_path):
    folder = tmp_path / "resnet"
    model = _model(folder / "exported.onnx")
    (spec,) = discover([folder], ServeSettings())
    assert (spec.name, spec.path) == ("resnet", model)


def test_config_toml_settings_are_applied_and_checked(tmp_path):
    repo = tmp_path / "models"
    _model(repo / "bert" / "model.onnx")
    _config(repo / "bert", f"""
objective = "throughput"
shapes = {{ input_ids = [1, {SEQ}], attention_mask = [1, {SEQ}] }}
max_batch_size = 4
max_queue_delay_ms = 150
tune_budget_s = 5
allow_untuned = true
""")
    _model(repo / "cnn" / "model.onnx")
    specs = {s.name: s for s in discover([repo], ServeSettings(max_queue=8))}
    bert = specs["bert"].settings
    assert bert.objective == "throughput@n=2"
    assert bert.shapes == {"input_ids": (1, SEQ), "attention_mask": (1, SEQ)}
    assert all(isinstance(dims, tuple) for dims in bert.shapes.values())
    assert bert.max_batch_size == 4
    assert bert.max_queue_delay_ms == 150.0
    assert isinstance(bert.max_queue_delay_ms, float)
    assert bert.tune_budget_s == 5
    assert bert.allow_untuned is True
    assert bert.max_queue == 8  # not in the file: the command line's
    assert specs["cnn"].settings == ServeSettings(max_queue=8)  # no config.toml


def test_accuracy_and_data_name_the_plan_by_the_data_digest(tmp_path):
    """``accuracy`` and ``data`` (relative to the model's folder in config.toml) become the
    objective's accuracy part, as ``opdispatch tune --accuracy --data`` keyed the plan."""
    from dispatch.objective import AccuracyTarget
    from tuner.accuracy.data import data_digest

    _model(tmp_path / "m" / "model.onnx")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "m" / "samples.npz", x=rng.random((8, 3, 32, 32), dtype=np.float32))
    digest = data_digest(str(tmp_path / "m" / "samples.npz"))
    _config(tmp_path / "m", 'objective = "throughput@n=4"\naccuracy = "cosine:0.999"\ndata = "samples.npz"\n')
    (spec,) = discover([tmp_path / "m"], ServeSettings())
    assert spec.settings.objective == f"throughput@n=4+{AccuracyTarget('cosine', 0.999, digest)}"
    assert spec.settings.accuracy is None and spec.settings.data is None  # now in the objective
    base = settings_from({"objective": "latency+nonstrict-nan", "accuracy": "max-rel:0.01",
                          "data": str(tmp_path / "m" / "samples.npz")})
    assert base.objective == f"latency+{AccuracyTarget('max-rel', 0.01, digest)}+nonstrict-nan"
    assert base.checked("again") == base  # checked twice: the same
    with pytest.raises(ArgumentError, match="accuracy and data go together"):
        settings_from({"accuracy": "cosine:0.999"})
    with pytest.raises(ArgumentError, match="the serve settings: accuracy: .*nowhere.npz"):
        settings_from({"accuracy": "cosine:0.999", "data": str(tmp_path / "nowhere.npz")})
    with pytest.raises(ArgumentError, match="the serve settings: accuracy: "):
        settings_from({"accuracy": "cosine:2", "data": str(tmp_path / "m" / "samples.npz")})


def test_an_unknown_config_key_lists_the_known_keys(tmp_path):
    _model(tmp_path / "m" / "model.onnx")
    config = _config(tmp_path / "m", "max_batch = 4\n")
    with pytest.raises(ArgumentError) as info:
        discover([tmp_path / "m"], ServeSettings())
    message = str(info.value)
    assert str(config) in message
    assert "unknown key(s) max_batch" in message
    for key in SETTING_KEYS:
        assert key in message


def test_a_config_that_is_not_toml_is_an_error_naming_the_file(tmp_path):
    _model(tmp_path / "m" / "model.onnx")
    config = _config(tmp_path / "m", "max_batch_size = = 4\n")
    with pytest.raises(ArgumentError, match="not valid TOML") as info:
        discover([tmp_path / "m"], ServeSettings())
    assert str(config) in str(info.value)


@pytest.mark.parametrize(("text", "expected"), [
    ("max_batch_size = 0", "max_batch_size must be an integer >= 1, received 0"),
    ("max_batch_size = 2.5", "max_batch_size must be an integer >= 1"),
    ("max_queue = 0", "max_queue must be an integer >= 1"),
    ("max_queue_delay_ms = -1", "max_queue_delay_ms must be a number of milliseconds"),
    ("max_queue_delay_ms = 20000", "from 0 to 10000"),
    ("tune_budget_s = 0", "tune_budget_s must be a positive number of seconds"),
    ('allow_untuned = "yes"', "allow_untuned must be true or false"),
    ("shapes = [1, 8]", "shapes must be a table of input name = [dims]"),
    ("shapes = { input_ids = [1, 0] }", "shapes.input_ids must be a list of positive integers"),
    ("shapes = { input_ids = [] }", "shapes.input_ids must be a list of positive integers"),
    ('shapes = { input_ids = "1x8" }', "shapes.input_ids must be a list of positive integers"),
    ("shapes = { input_ids = [1, true] }", "shapes.input_ids must be a list of positive"),
    ('objective = "fastest"', "objective: unknown objective 'fastest'"),
    ('objective = "throughput@4"', "objective: objective 'throughput@4'"),
])
def test_a_bad_config_value_is_an_error_naming_the_file_and_key(tmp_path, text, expected):
    _model(tmp_path / "m" / "model.onnx")
    config = _config(tmp_path / "m", text + "\n")
    with pytest.raises(ArgumentError) as info:
        discover([tmp_path / "m"], ServeSettings())
    assert str(info.value).startswith(f"{config}: ")
    assert expected in str(info.value)


def test_bad_command_line_settings_are_an_error(tmp_path):
    model = _model(tmp_path / "m.onnx")
    with pytest.raises(ArgumentError, match="the command line: max_queue must be an integer"):
        discover([model], ServeSettings(max_queue=0))
    with pytest.raises(ArgumentError, match="the serve settings: max_batch_size"):
        settings_from({"max_batch_size": 0})
    assert settings_from({"objective": None, "max_queue": 3}) == ServeSettings(max_queue=3)


def test_a_missing_path_is_an_error(tmp_path):
    missing = tmp_path / "nowhere.onnx"
    with pytest.raises(ArgumentError, match="no such model file or repository folder") as info:
        discover([missing], ServeSettings())
    assert str(missing) in str(info.value)
    with pytest.raises(ArgumentError, match="nothing to serve"):
        discover([], ServeSettings())


def test_an_empty_repository_is_an_error(tmp_path):
    repo = tmp_path / "models"
    repo.mkdir()
    with pytest.raises(ArgumentError, match="an empty model repository") as info:
        discover([repo], ServeSettings())
    assert str(repo) in str(info.value)


def test_a_folder_with_two_onnx_files_and_no_model_onnx_is_an_error(tmp_path):
    repo = tmp_path / "models"
    _model(repo / "m" / "a.onnx")
    _model(repo / "m" / "b.onnx")
    with pytest.raises(ArgumentError) as info:
        discover([repo], ServeSettings())
    message = str(info.value)
    assert message.startswith(f"{repo / 'm'}: ")
    assert "found a.onnx, b.onnx" in message
    assert "model.onnx" in message


def test_two_models_of_the_same_name_are_an_error(tmp_path):
    first = _model(tmp_path / "a" / "cnn.onnx")
    second = _model(tmp_path / "b" / "cnn.onnx")
    repo = tmp_path / "models"
    _model(repo / "cnn" / "model.onnx")
    with pytest.raises(ArgumentError, match="two models would be served under the same name: "
                       "cnn$"):
        discover([first, second], ServeSettings())
    with pytest.raises(ArgumentError, match="same name: cnn$"):
        discover([repo, first], ServeSettings())


# -- batcher ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("count", "sizes", "groups"), [
    (7, [1, 2, 4], [4, 2, 1]),
    (3, [4], [1, 1, 1]),
    (3, [1, 2, 4], [2, 1]),
    (8, [2, 4], [4, 4]),
    (5, [], [1, 1, 1, 1, 1]),
    (0, [1, 2], []),
])
def test_cut_forms_the_largest_allowed_groups_first(count, sizes, groups):
    assert cut(count, sizes) == groups


class FakeRuns:
    """A ``run_group`` that records each group and answers each request with its ``x``."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.groups: list[list[Queued]] = []
        self.error = error

    @property
    def sizes(self) -> list[int]:
        return [len(g) for g in self.groups]

    async def __call__(self, group: Sequence[Queued]) -> None:
        self.groups.append(list(group))
        await asyncio.sleep(0)
        if self.error is not None:
            raise self.error
        for item in group:
            item.future.set_result(item.feeds["x"])


class Timers:
    """The loop's ``call_later`` recorded instead of scheduled: a test fires them itself."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.calls: list[tuple[float, Callable[..., None], tuple[Any, ...]]] = []
        loop.call_later = self._call_later  # type: ignore[method-assign]

    def _call_later(self, delay: float, callback: Callable[..., None], *args: Any) -> None:
        self.calls.append((delay, callback, args))

    def fire(self, index: int) -> None:
        _, callback, args = self.calls[index]
        callback(*args)


def feed(value: float, shape: tuple[int, ...] = (1, 4), dtype: Any = np.float32
         ) -> dict[str, np.ndarray]:
    return {"x": np.full(shape, value, dtype=dtype)}


def run(test: Callable[[], Awaitable[None]]) -> None:
    """Run an async test, bounded so that a request never dispatched fails instead of hanging."""

    async def bounded() -> None:
        await asyncio.wait_for(test(), timeout=30)

    asyncio.run(bounded())


async def _settle() -> None:
    """Let the dispatched groups run."""
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_full_queue_is_dispatched_at_once():
    async def test() -> None:
        runs = FakeRuns()
        batcher = DynamicBatcher(runs, [2, 4], max_delay_s=3600)  # the delay never expires
        futures = [batcher.submit(feed(i)) for i in range(4)]
        assert runs.sizes == []  # dispatched: its group runs on the next turn of the loop
        assert batcher.pending() == 0
        results = await asyncio.gather(*futures)
        assert runs.sizes == [4]
        assert [float(r[0, 0]) for r in results] == [0, 1, 2, 3]

    run(test)


def test_a_queue_not_full_is_dispatched_after_the_delay():
    async def test() -> None:
        runs = FakeRuns()
        loop = asyncio.get_running_loop()
        timers = Timers(loop)
        batcher = DynamicBatcher(runs, [1, 2, 4], max_delay_s=0.25)
        futures = [batcher.submit(feed(i)) for i in range(3)]
        assert [t[0] for t in timers.calls] == [0.25]  # one timer: the first request's
        await _settle()
        assert runs.sizes == [] and batcher.pending() == 3
        timers.fire(0)
        await asyncio.gather(*futures)
        assert runs.sizes == [2, 1]  # no plan for 3: 2 + 1
        assert batcher.pending() == 0

    run(test)


def test_a_real_timer_dispatches_a_lone_request():
    async def test() -> None:
        runs = FakeRuns()
        batcher = DynamicBatcher(runs, [4], max_delay_s=0.001)
        result = await batcher.submit(feed(7))
        assert float(result[0, 0]) == 7
        assert runs.sizes == [1]

    run(test)


def test_different_signatures_never_share_a_group():
    async def test() -> None:
        runs = FakeRuns()
        batcher = DynamicBatcher(runs, [2], max_delay_s=3600)
        futures = [batcher.submit(feed(1, (1, 4))), batcher.submit(feed(2, (1, 5))),
                   batcher.submit(feed(3, (1, 4), np.float64)),
                   batcher.submit(feed(4, (1, 4))), batcher.submit(feed(5, (1, 5)))]
        assert batcher.pending() == 1  # the float64 request waits alone
        await asyncio.gather(futures[0], futures[1], futures[3], futures[4])
        assert sorted(runs.sizes) == [2, 2]
        for group in runs.groups:
            assert len({(i.feeds["x"].shape, i.feeds["x"].dtype) for i in group}) == 1
        assert sorted(float(i.feeds["x"][0, 0]) for g in runs.groups for i in g) == [1, 2, 4, 5]
        await batcher.drain()
        assert float((await futures[2])[0, 0]) == 3

    run(test)


def test_the_timer_of_a_queue_dispatched_full_does_not_cut_the_next_queue_short():
    async def test() -> None:
        runs = FakeRuns()
        timers = Timers(asyncio.get_running_loop())
        batcher = DynamicBatcher(runs, [2], max_delay_s=0.25)
        first = [batcher.submit(feed(1)), batcher.submit(feed(2))]  # full: dispatched
        await asyncio.gather(*first)
        late = batcher.submit(feed(3))  # a new queue, with a timer of its own
        assert len(timers.calls) == 2
        timers.fire(0)  # the first queue's timer: that queue is gone
        await _settle()
        assert runs.sizes == [2] and not late.done() and batcher.pending() == 1
        timers.fire(1)  # its own
        assert float((await late)[0, 0]) == 3
        assert runs.sizes == [2, 1]
        timers.fire(1)  # fired again once its queue is gone: nothing to do
        await _settle()
        assert runs.sizes == [2, 1]

    run(test)


def test_drain_dispatches_every_pending_queue_and_waits_for_them():
    async def test() -> None:
        runs = FakeRuns()
        batcher = DynamicBatcher(runs, [1, 4], max_delay_s=3600)
        futures = [batcher.submit(feed(i)) for i in range(3)]
        other = batcher.submit(feed(9, (1, 2)))
        assert batcher.pending() == 4
        await batcher.drain()
        assert batcher.pending() == 0
        assert all(f.done() for f in [*futures, other])
        assert sorted(runs.sizes) == [1, 1, 1, 1]  # 3 and no plan for 2 or 3: 1 + 1 + 1

    run(test)


def test_an_exception_of_run_group_reaches_every_future_of_the_group():
    async def test() -> None:
        runs = FakeRuns(error=ValueError("the backend fell over"))
        batcher = DynamicBatcher(runs, [3], max_delay_s=3600)
        futures = [batcher.submit(feed(i)) for i in range(3)]
        results = await asyncio.gather(*futures, return_exceptions=True)
        assert runs.sizes == [3]
        assert all(isinstance(r, ValueError) and str(r) == "the backend fell over"
                   for r in results)

    run(test)


def test_a_cancelled_run_group_fails_its_futures_instead_of_leaving_them_waiting():
    async def test() -> None:
        runs = FakeRuns(error=asyncio.CancelledError())
        batcher = DynamicBatcher(runs, [2], max_delay_s=3600)
        futures = [batcher.submit(feed(i)) for i in range(2)]
        results = await asyncio.gather(*futures, return_exceptions=True)
        assert all(isinstance(r, RuntimeError) and "the batch was cancelled" in str(r)
                   for r in results)

    run(test)


# -- runner ----------------------------------------------------------------------------------


def requests(name: str, outcome: str) -> float:
    return REGISTRY.get_sample_value("opdispatch_requests_total",
                                     {"model": name, "outcome": outcome}) or 0.0


def gauge(metric: str, name: str) -> float | None:
    return REGISTRY.get_sample_value(metric, {"model": name})


def make_runner(path: Path, store: Path, prefix: str, **settings: Any) -> ModelRunner:
    spec = ModelSpec(unique(prefix), path, ServeSettings(**settings).checked("test"))
    return ModelRunner(spec, str(store))


@pytest.fixture
def store(tmp_path) -> Path:
    """A store path of the test's own: nothing is read from the user's store."""
    return tmp_path / "plans.sqlite"


@pytest.fixture
def cnn(store) -> Iterator[ModelRunner]:
    runner = make_runner(CNN, store, "cnn", allow_untuned=True)
    assert runner.load(), runner.reason
    yield runner
    asyncio.run(runner.drain(grace_s=5))


def test_an_untuned_static_model_is_ready_with_its_metadata(cnn):
    assert cnn.ready and cnn.reason == ""
    assert gauge("opdispatch_model_ready", cnn.name) == 1
    assert [(i.name, i.dtype, i.shape) for i in cnn.inputs] == [
        ("pixel_values", np.dtype(np.float32), [2, 3, 32, 32])]
    assert [o.name for o in cnn.outputs] == ["last_hidden_state", "pooler_output"]
    assert all(o.dtype == np.float32 and o.shape and -1 not in o.shape for o in cnn.outputs)
    assert cnn.plan_info["untuned"] is True
    assert cnn.plan_info["plan_source"] == "heuristic"
    assert cnn.plan_info["shapes"] == {"pixel_values": [2, 3, 32, 32]}
    assert cnn.batch_sizes == [1]


def test_every_request_thread_of_a_throughput_plan_ran_it_before_the_model_is_ready(
        tuned_store):
    runner = make_runner(CNN, Path(tuned_store), "cnn-streams", objective=THROUGHPUT)
    assert runner.load(), runner.reason
    assert runner.workers == runner.plan_info["serving"]["requests"] > 1
    # one thread each, all of the pool's: none makes its library state under load
    assert len(set(runner.warm_threads)) == runner.workers
    outputs = asyncio.run(runner.infer(cnn_feeds(1)))
    (want,) = dispatch.Session(str(CNN), store=tuned_store, objective=THROUGHPUT,
                               require_plan=True).run(["pooler_output"], cnn_feeds(1))
    np.testing.assert_array_equal(outputs["pooler_output"], want)
    asyncio.run(runner.drain(grace_s=5))


def test_symbolic_dimensions_are_minus_one_in_the_metadata(store):
    runner = make_runner(BERT, store, "bert-meta", allow_untuned=True)
    assert runner.load(), runner.reason
    assert [(i.name, i.shape) for i in runner.inputs] == [(n, [-1, -1]) for n in BERT_INPUTS]
    assert all(i.dtype == np.int64 for i in runner.inputs)
    shapes = {o.name: o.shape for o in runner.outputs}
    assert shapes["last_hidden_state"][:2] == [-1, -1] and shapes["last_hidden_state"][2] > 0
    assert shapes["pooler_output"][0] == -1
    assert runner.plan_info["plan_source"] == "deferred"
    asyncio.run(runner.drain(grace_s=5))


def test_infer_equals_session_run_with_the_same_untuned_plan(cnn, store):
    feeds = cnn_feeds(3)
    ok_before = requests(cnn.name, "ok")
    outputs = asyncio.run(cnn.infer(feeds))
    session = dispatch.Session(str(CNN), store=str(store))
    assert session.plan_source == "heuristic"
    want = session.run(None, feeds)
    assert list(outputs) == ["last_hidden_state", "pooler_output"]
    for got, expected in zip(outputs.values(), want):
        np.testing.assert_array_equal(got, expected)
    assert requests(cnn.name, "ok") == ok_before + 1
    assert gauge("opdispatch_requests_in_flight", cnn.name) == 0
    assert gauge("opdispatch_request_seconds_count", cnn.name) == 1
    assert gauge("opdispatch_batch_size_sum", cnn.name) == 1

    only = asyncio.run(cnn.infer(feeds, ["pooler_output"]))
    assert list(only) == ["pooler_output"]
    np.testing.assert_array_equal(only["pooler_output"], want[1])
    assert requests(cnn.name, "ok") == ok_before + 2


@pytest.mark.parametrize(("feeds", "output_names", "expected"), [
    (cnn_feeds(0), ["logits"], ["unknown output(s) ['logits']",
                                "the outputs are ['last_hidden_state', 'pooler_output']"]),
    ({"pixel_values": cnn_feeds(0)["pixel_values"].astype(np.float64)}, None,
     ["input 'pixel_values'", "received dtype float64", "expected float32"]),
    ({"pixel_values": np.zeros((1, 3, 32, 32), np.float32)}, None,
     ["input 'pixel_values'", "received shape [1, 3, 32, 32]", "expected [2, 3, 32, 32]"]),
    ({"pixels": np.zeros((2, 3, 32, 32), np.float32)}, None,
     ["unknown input name(s) ['pixels']", "pixel_values: float32 [2, 3, 32, 32]"]),
])
def test_a_bad_request_is_an_invalid_request_saying_what_is_expected(cnn, feeds, output_names,
                                                                      expected):
    invalid_before = requests(cnn.name, "invalid")
    with pytest.raises(InvalidRequest) as info:
        asyncio.run(cnn.infer(feeds, output_names))
    message = str(info.value)
    assert message.startswith(f"model {cnn.name!r}: ")
    for part in expected:
        assert part in message
    assert requests(cnn.name, "invalid") == invalid_before + 1
    assert requests(cnn.name, "ok") == 0
    assert gauge("opdispatch_requests_in_flight", cnn.name) == 0


def test_a_full_queue_refuses_the_request_over_max_queue(store):
    runner = make_runner(CNN, store, "cnn-queue", allow_untuned=True, max_queue=1)
    assert runner.load(), runner.reason

    async def two() -> list[Any]:
        # the first coroutine is admitted before its first await: the second finds it there
        return await asyncio.gather(runner.infer(cnn_feeds(0)), runner.infer(cnn_feeds(1)),
                                    return_exceptions=True)

    first, second = asyncio.run(two())
    assert isinstance(first, dict), first
    assert isinstance(second, Overloaded)
    assert "max_queue = 1" in str(second) and "retry later" in str(second)
    assert requests(runner.name, "rejected") == 1
    assert requests(runner.name, "ok") == 1
    # the slot is free again
    assert set(asyncio.run(runner.infer(cnn_feeds(2)))) == {"last_hidden_state",
                                                          "pooler_output"}
    asyncio.run(runner.drain(grace_s=5))


def test_a_model_without_a_plan_is_not_ready_and_says_why(store):
    runner = make_runner(CNN, store, "cnn-noplan")
    assert runner.load() is False  # never raises
    assert not runner.ready
    assert "no usable tuned plan" in runner.reason and "tune it" in runner.reason
    assert gauge("opdispatch_model_ready", runner.name) == 0
    with pytest.raises(ModelUnavailable, match="is not ready: no usable tuned plan"):
        asyncio.run(runner.infer(cnn_feeds(0)))


def test_symbolic_inputs_without_shapes_are_not_ready_and_say_how_to_give_them(store):
    runner = make_runner(BERT, store, "bert-noshapes")
    assert runner.load() is False
    assert "input 'input_ids' has symbolic dimensions" in runner.reason
    assert "config.toml: shapes = { input_ids = [1, ...] }" in runner.reason
    assert "--shape input_ids=1x..." in runner.reason


def test_shapes_naming_an_unknown_input_are_not_ready(store):
    runner = make_runner(BERT, store, "bert-badshapes", allow_untuned=True,
                         shapes={"input_idz": [1, SEQ]})
    assert runner.load() is False
    assert "shapes names unknown input(s) input_idz" in runner.reason
    assert "input_ids" in runner.reason


def test_batched_requests_are_grouped_and_equal_single_runs(store):
    runner = make_runner(BERT, store, "bert-batch", allow_untuned=True,
                         shapes={n: [1, SEQ] for n in BERT_INPUTS}, max_batch_size=4,
                         max_queue_delay_ms=10_000)
    assert runner.load(), runner.reason
    assert runner.batch_sizes == [1, 2, 4]

    async def four() -> list[dict[str, np.ndarray]]:
        return await asyncio.gather(*(runner.infer(bert_feeds(seed)) for seed in range(4)))

    results = asyncio.run(four())  # a queue of 4 is full: no waiting for the 10 s delay
    assert gauge("opdispatch_batch_size_count", runner.name) == 1
    assert gauge("opdispatch_batch_size_sum", runner.name) == 4
    assert requests(runner.name, "ok") == 4
    session = dispatch.Session(str(BERT), store=str(store))
    for seed, outputs in enumerate(results):
        want = session.run(None, bert_feeds(seed))
        for got, expected in zip(outputs.values(), want):
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    asyncio.run(runner.drain(grace_s=5))


def test_after_drain_requests_are_refused(store):
    runner = make_runner(CNN, store, "cnn-drain", allow_untuned=True)
    assert runner.load(), runner.reason
    asyncio.run(runner.drain(grace_s=5))
    assert not runner.ready and runner.reason == "shut down"
    assert gauge("opdispatch_model_ready", runner.name) == 0
    with pytest.raises((ModelUnavailable, Overloaded), match="shut"):
        asyncio.run(runner.infer(cnn_feeds(0)))


def test_a_draining_model_refuses_new_requests_as_overloaded(store):
    runner = make_runner(CNN, store, "cnn-draining", allow_untuned=True)
    assert runner.load(), runner.reason

    async def drain_while_running() -> tuple[Any, Any]:
        running = asyncio.ensure_future(runner.infer(cnn_feeds(0)))
        await asyncio.sleep(0)  # admitted, running on the model's thread
        draining = asyncio.ensure_future(runner.drain(grace_s=30))
        await asyncio.sleep(0)
        with pytest.raises(Overloaded, match="it is shutting down"):
            await runner.infer(cnn_feeds(1))
        await draining
        return await running, runner.ready

    answered, ready = asyncio.run(drain_while_running())
    assert set(answered) == {"last_hidden_state", "pooler_output"}  # answered, not dropped
    assert ready is False
    assert requests(runner.name, "rejected") == 1


# -- body limit --------------------------------------------------------------------------------


class FakeApp:
    """An ASGI application that records what it was called with and reads the whole body."""

    def __init__(self) -> None:
        self.scope: dict | None = None
        self.body = b""
        self.after: dict | None = None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        self.scope = scope
        while True:
            message = await receive()
            self.body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.after = await receive()  # what the server says next (here: a disconnect)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def http_scope(headers: dict[bytes, bytes], method: str = "POST") -> dict:
    return {"type": "http", "method": method, "path": "/v2/models/m/infer",
            "headers": list(headers.items())}


def drive(scope: dict, chunks: Sequence[bytes], max_bytes: int
          ) -> tuple[FakeApp, list[dict], int]:
    """Call ``BodyLimit(app)`` with ``chunks`` as the body; returns the app, what was sent
    and how many body messages were read."""
    app, sent = FakeApp(), []
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
                for i, c in enumerate(chunks)]
    read = 0

    async def receive() -> dict:
        nonlocal read
        if read < len(messages):
            read += 1
            return messages[read - 1]
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(BodyLimit(app, max_bytes)(scope, receive, send))
    return app, sent, read


def _refused(sent: list[dict]) -> str:
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 413
    headers = dict(sent[0]["headers"])
    assert headers[b"content-type"] == b"application/json"
    assert int(headers[b"content-length"]) == len(sent[1]["body"])
    return sent[1]["body"].decode()


def test_a_declared_length_over_the_limit_is_refused_before_the_app_or_the_body():
    scope = http_scope({b"content-type": b"application/json", b"content-length": b"2000"})
    app, sent, read = drive(scope, [b"x" * 2000], max_bytes=1000)
    assert app.scope is None and read == 0
    body = _refused(sent)
    assert "a body of 2000 bytes" in body and "limit of 1000 bytes" in body


def test_a_chunked_body_over_the_limit_is_refused():
    scope = http_scope({b"content-type": b"application/json"})
    app, sent, read = drive(scope, [b"x" * 400] * 5, max_bytes=1000)
    assert app.scope is None
    assert read == 3  # stopped at the chunk that went over
    assert "limit of 1000 bytes" in _refused(sent)


def test_a_body_under_the_limit_reaches_the_app_intact():
    scope = http_scope({b"content-type": b"application/json"})
    chunks = [b'{"inputs": ', b'[{"name": "x"}', b"]}"]
    app, sent, _ = drive(scope, chunks, max_bytes=1000)
    assert app.body == b"".join(chunks)
    assert app.after == {"type": "http.disconnect"}  # later reads go to the server
    assert app.scope == scope
    assert [m.get("status") for m in sent] == [200, None]


def test_a_body_exactly_at_the_limit_is_accepted():
    body = b"y" * 1000
    scope = http_scope({b"content-type": b"application/json", b"content-length": b"1000"})
    app, sent, _ = drive(scope, [body], max_bytes=1000)
    assert app.body == body and sent[0]["status"] == 200


@pytest.mark.parametrize("content_type", [None, b"application/octet-stream", b"text/plain"])
def test_a_post_without_the_binary_header_is_read_as_json(content_type):
    headers = {b"content-length": b"2"}
    if content_type is not None:
        headers[b"content-type"] = content_type
    app, _, _ = drive(http_scope(headers), [b"{}"], max_bytes=1000)
    assert app.scope is not None
    seen = app.scope["headers"]
    assert [v for k, v in seen if k == b"content-type"] == [b"application/json"]
    assert (b"content-length", b"2") in seen
    assert app.body == b"{}"


def test_a_post_with_the_binary_header_keeps_its_content_type():
    headers = {b"content-type": b"application/octet-stream",
               b"inference-header-content-length": b"2", b"content-length": b"6"}
    app, _, _ = drive(http_scope(headers), [b"{}\0\0\0\0"], max_bytes=1000)
    assert app.scope is not None
    assert dict(app.scope["headers"])[b"content-type"] == b"application/octet-stream"
    assert app.body == b"{}\0\0\0\0"


def test_a_json_content_type_with_parameters_is_kept():
    headers = {b"content-type": b"application/json; charset=utf-8"}
    app, _, _ = drive(http_scope(headers), [b"{}"], max_bytes=1000)
    assert dict(app.scope["headers"])[b"content-type"] == b"application/json; charset=utf-8"


def test_a_get_keeps_its_headers_and_other_scopes_pass_through():
    scope = http_scope({}, method="GET")
    app, sent, _ = drive(scope, [b""], max_bytes=10)
    assert app.scope == scope and sent[0]["status"] == 200

    seen: list[dict] = []

    async def lifespan_app(scope: dict, receive: Any, send: Any) -> None:
        seen.append(scope)

    async def nothing() -> dict:
        raise AssertionError("the middleware read a lifespan message")

    asyncio.run(BodyLimit(lifespan_app, 10)({"type": "lifespan"}, nothing, nothing))
    assert seen == [{"type": "lifespan"}]


# -- the command line --------------------------------------------------------------------------


def opdispatch_serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner.cli", "serve", *args],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)


def _one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("opdispatch serve: error: ")
    return lines[0]


def test_serve_a_missing_path_is_a_user_error(tmp_path):
    missing = tmp_path / "nowhere"
    line = _one_error_line(opdispatch_serve(str(missing)))
    assert f"{missing}: no such model file or repository folder" in line


def test_serve_a_repository_with_a_bad_config_is_a_user_error(tmp_path):
    repo = tmp_path / "models"
    _model(repo / "cnn" / "model.onnx")
    config = _config(repo / "cnn", "max_batch_size = 0\n")
    line = _one_error_line(opdispatch_serve(str(repo)))
    assert str(config) in line and "max_batch_size" in line
