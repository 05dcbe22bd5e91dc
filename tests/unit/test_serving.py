"""A plan's serving configuration (issue 30): the throughput objective in plan keys, the
configuration's JSON form, a Session serving a plan from several threads (outputs identical to
one thread's, for a plan of each backend kind), the streams' back-pressure and fairness, and
the library settings a stream is built with. Nothing here is timed."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from dispatch import Session
from dispatch.errors import ArgumentError, PlanError, PlanNotFoundError
from dispatch.objective import Objective
from dispatch.plan import Plan
from dispatch.serving import ServingConfig, build_settings, building
from dispatch.stream_pool import StreamPool
from tests.builders import small_cnn

# -- the objective --------------------------------------------------------------------------


@pytest.mark.parametrize(("given", "target", "canonical"), [
    ("throughput@n=4", (4, None), "throughput@n=4"),
    ("throughput@n=4,p99=50", (4, 50.0), "throughput@n=4,p99=50"),
    ("throughput@n=8,p99=7.5+nonstrict-nan", (8, 7.5), "throughput@n=8,p99=7.5+nonstrict-nan"),
])
def test_throughput_objectives_parse_and_round_trip(given, target, canonical):
    parsed = Objective.parse(given)
    assert (parsed.name, parsed.memory_cap) == ("throughput", None)
    assert (parsed.concurrency, parsed.p99_ms) == target
    assert str(parsed.resolved()) == canonical
    assert str(Objective("throughput", nonstrict_nan=given.endswith("+nonstrict-nan"),
                         concurrency=target[0], p99_ms=target[1])) == canonical


def test_a_bare_throughput_objective_names_the_configured_threads():
    from dispatch.blas import configured_threads

    assert str(Objective.parse("throughput").resolved()) == f"throughput@n={configured_threads()}"
    latency = Objective.parse("latency")
    assert not latency.is_throughput and str(latency.resolved()) == "latency"


@pytest.mark.parametrize("bad", ["throughput@n=0", "throughput@n=x", "throughput@x=1",
                                 "throughput@n=4,n=5", "throughput@p99=-1", "throughput@p99=inf",
                                 "throughput@cap=5", "throughput@n=4,", "throughput@n=100000"])
def test_malformed_throughput_objectives_say_what_is_expected(bad):
    with pytest.raises(ArgumentError, match=r"throughput@n=N,p99=MS") as err:
        Objective.parse(bad)
    assert repr(bad) in str(err.value)


def test_concurrency_goes_with_the_throughput_objective_only():
    with pytest.raises(ArgumentError, match="throughput objective"):
        Objective("latency", concurrency=4)
    with pytest.raises(ArgumentError, match="throughput objective"):
        Objective("memory", p99_ms=50)


@pytest.mark.parametrize(("objective", "flags"), [
    ("latency", ""),
    ("memory", " --objective memory"),
    ("latency@cap=1000", " --memory-cap 1000"),
    ("throughput@n=4,p99=50", " --objective throughput --concurrency 4 --max-latency-ms 50"),
    ("latency+nonstrict-nan", " --allow-nonstrict-nan"),
])
def test_tune_flags_spell_the_objective_for_the_cli(objective, flags):
    assert Objective.parse(objective).tune_flags() == flags


def test_a_missing_throughput_plan_says_how_to_tune_one(tmp_path):
    with pytest.raises(PlanNotFoundError, match="--objective throughput --concurrency 2 --store"):
        Session(small_cnn(), store=str(tmp_path / "plans.sqlite"), objective="throughput@n=2",
                require_plan=True)


# -- the configuration's JSON form ------------------------------------------------------------


def _plan(backends=("onnxruntime",), **serving) -> Plan:
    plan = Session(small_cnn(), backends=list(backends), store=False).plan
    if serving:
        plan.serving = ServingConfig(**serving).to_dict()
    return plan


def test_a_plan_round_trips_its_serving_configuration_through_json():
    plan = _plan(mode="streams", streams=2, threads=1, requests=2, concurrency=4)
    back = Plan.from_json(plan.to_json())
    assert back.serving == plan.serving
    assert back.serving_config() == ServingConfig("streams", 2, 1, 2, 4)
    assert "serving: 2 streams x 1 thread (tuned for 4 requests in flight)" in back.describe()
    old = plan.to_dict()
    del old["serving"]  # plans stored before the field existed
    assert Plan.from_dict(old).serving is None


@pytest.mark.parametrize(("edit", "message"), [
    (lambda s: {**s, "mode": "turbo"}, "mode must be one of streams, shared, received 'turbo'"),
    (lambda s: {**s, "streams": 0}, "streams must be a positive integer, received 0"),
    (lambda s: {**s, "threads": -1}, "threads must be a non-negative integer"),
    (lambda s: {**s, "requests": 3}, r"requests \(3\) must equal streams \(2\)"),
    (lambda s: {**s, "batch": True}, "batch must be null or a positive integer"),
    (lambda s: {**s, "colour": "red"}, r"unknown field\(s\) \['colour'\]"),
    (lambda s: [1], r"field .serving. must be dict or null, received \[1\]"),
])
def test_a_malformed_serving_configuration_is_refused_with_what_was_received(edit, message):
    data = _plan(mode="streams", streams=2, threads=1, requests=2, concurrency=4).to_dict()
    data["serving"] = edit(data["serving"])
    with pytest.raises(PlanError, match=message):
        Plan.from_dict(data)


def test_a_fallback_plan_has_no_serving_configuration():
    outer = _plan().to_dict()
    outer["nonfinite_fallback"] = _plan(mode="streams", streams=2, threads=1, requests=2,
                                        concurrency=2).to_dict()
    with pytest.raises(PlanError, match="fallback plan has no serving configuration"):
        Plan.from_dict(outer)


# -- serving from several threads ----------------------------------------------------------

CONFIGS = {
    "2 streams x 1 thread": dict(mode="streams", streams=2, threads=1, requests=2, concurrency=4),
    "4 streams x 1 thread": dict(mode="streams", streams=4, threads=1, requests=4, concurrency=4),
    "shared by 4, 1 thread": dict(mode="shared", streams=1, threads=1, requests=4, concurrency=4),
    "shared, library streams": dict(mode="shared", streams=2, threads=0, requests=4, concurrency=4),
}
BACKENDS = [("numpy",), ("native", "numpy"), ("onnxruntime",), ("openvino", "numpy"),
            ("onednn", "numpy")]


def _inputs(n: int) -> list[np.ndarray]:
    return [np.random.default_rng(k).standard_normal((1, 3, 16, 16)).astype(np.float32)
            for k in range(n)]


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("backends", BACKENDS, ids=lambda b: b[0])
def test_threads_on_one_session_get_what_one_thread_gets(backends, config):
    """A served plan of each backend kind, run from 4 threads at once (5 requests each, every
    request its own input), gives exactly the outputs the same session gives them one at a
    time, and matches the latency plan within the model tolerance."""
    from dispatch.compare import MODEL_TOLERANCE, check_outputs

    session = Session(small_cnn(), backends=list(backends), store=False)
    if backends[0] not in session.plan.backends_used():
        pytest.skip(f"backend {backends[0]} is not available here")
    served = Session(small_cnn(), backends=list(backends), store=False,
                     plan=_plan(backends, **CONFIGS[config]))
    assert isinstance(served.runner, StreamPool)
    xs = _inputs(20)
    alone = [served.run(None, {"x": x})[0] for x in xs]
    got: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def worker(k: int) -> None:
        start.wait()
        try:
            for j in range(k, len(xs), 4):
                got[j] = served.run(None, {"x": xs[j]})[0]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for j, x in enumerate(xs):
        assert np.array_equal(got[j], alone[j]), f"request {j} differs from its single-thread run"
        assert check_outputs([alone[j]], session.run(None, {"x": x}), [], tol=MODEL_TOLERANCE) is None


def test_a_streams_plan_builds_one_executor_per_stream_with_its_threads():
    served = Session(small_cnn(), backends=["native", "numpy"], store=False,
                     plan=_plan(("native", "numpy"), **CONFIGS["2 streams x 1 thread"]))
    pool = served.runner
    assert len(pool) == 2 and pool.executors[0] is served.executor
    assert pool.executors[0] is not pool.executors[1]
    assert all(ex.threads.openmp == 1 for ex in pool.executors)


def test_onnxruntime_streams_are_sessions_of_their_thread_count():
    pytest.importorskip("onnxruntime")
    served = Session(small_cnn(), backends=["onnxruntime"], store=False,
                     plan=_plan(**CONFIGS["2 streams x 1 thread"]))
    for ex in served.runner.executors:
        run = ex.calls[0].fn
        session = next(c.cell_contents for c in run.__closure__
                       if type(c.cell_contents).__name__ == "InferenceSession")
        assert session.get_session_options().intra_op_num_threads == 1


def test_openvino_regions_compile_with_the_throughput_hint_in_shared_mode():
    pytest.importorskip("openvino")
    from impls.openvino.region import compile_config

    assert compile_config()["PERFORMANCE_HINT"] == "LATENCY" and build_settings() is None
    with building(ServingConfig(**CONFIGS["shared, library streams"])):
        config = compile_config()
    assert config["PERFORMANCE_HINT"] == "THROUGHPUT" and config["NUM_STREAMS"] == "2"
    with building(ServingConfig(**CONFIGS["2 streams x 1 thread"])):
        config = compile_config()
    assert config["PERFORMANCE_HINT"] == "LATENCY" and config["INFERENCE_NUM_THREADS"] == 1
    # streams sharing the cores are not pinned: each compiled model would pin its thread to
    # the first core, every stream onto the same one (half the throughput, measured)
    assert config["ENABLE_CPU_PINNING"] is False
    assert "ENABLE_CPU_PINNING" not in compile_config()  # a latency plan: OpenVINO's default
    assert build_settings() is None  # nothing left in force after the block


# -- the pool: back-pressure and order ------------------------------------------------------


class _CountingExecutor:
    """A stand-in executor (not the thing under test: the pool is) that records how many runs
    are inside it at once and in what order requests entered."""

    def __init__(self, log: list, lock: threading.Lock, state: dict) -> None:
        self.log, self.lock, self.state = log, lock, state

    def run(self, feeds, names=None, *, timings=None, on_fault=None):
        with self.lock:
            self.state["in"] += 1
            self.state["max"] = max(self.state["max"], self.state["in"])
            self.log.append(feeds["k"])
        time.sleep(0.01)
        with self.lock:
            self.state["in"] -= 1
        return [feeds["k"]]


@pytest.mark.parametrize(("mode", "streams", "requests"), [("streams", 2, 2), ("shared", 1, 3)])
def test_the_pool_runs_at_most_its_requests_at_once(mode, streams, requests):
    log: list = []
    lock = threading.Lock()
    state = {"in": 0, "max": 0}
    executors = [_CountingExecutor(log, lock, state) for _ in range(streams)]
    pool = StreamPool(executors, ServingConfig(mode, streams, 1, requests, 8))  # type: ignore[arg-type]
    out: list = []
    threads = [threading.Thread(target=lambda k=k: out.append(pool.run({"k": k})[0]))
               for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(out) == list(range(8))
    assert state["max"] == requests


def test_waiting_requests_are_served_first_come_first_served():
    log: list = []
    lock = threading.Lock()
    state = {"in": 0, "max": 0}
    pool = StreamPool([_CountingExecutor(log, lock, state)],
                      ServingConfig("streams", 1, 1, 1, 4))  # type: ignore[list-item]
    first = pool._take()  # the one stream is busy
    order = []
    threads = []
    for k in range(4):  # queue up one after another
        t = threading.Thread(target=lambda k=k: order.append(pool.run({"k": k})[0]))
        t.start()
        threads.append(t)
        deadline = time.monotonic() + 5
        while len(pool._waiting) < k + 1 and time.monotonic() < deadline:
            time.sleep(0.001)
    pool._give_back(first)
    for t in threads:
        t.join()
    assert log == [0, 1, 2, 3]


# -- several requests in one call -----------------------------------------------------------


def _batch_model(batch="batch"):
    import onnx
    from onnx import TensorProto, helper

    w = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
        "batched", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])],
        [onnx.numpy_helper.from_array(w, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_run_batch_concatenates_requests_along_a_symbolic_batch_and_splits_them_back():
    sess = Session(_batch_model(), store=False)
    xs = [np.random.default_rng(k).standard_normal((n, 4)).astype(np.float32)
          for k, n in enumerate([1, 1, 2])]
    got = sess.run_batch([{"x": x} for x in xs])
    for x, out in zip(xs, got):
        assert isinstance(out, list) and np.allclose(out[0], sess.run(None, {"x": x})[0])
        assert out[0].shape == (x.shape[0], 3)
    # one run at the batch of all four rows: its shape was planned
    assert (("x", (4, 4)),) in sess.planned_shapes()


def test_a_bad_request_fails_alone_in_its_batch():
    sess = Session(_batch_model(), store=False)
    good = np.ones((1, 4), np.float32)
    got = sess.run_batch([{"x": good}, {"x": np.ones((1, 5), np.float32)},
                          {"x": good.astype(np.float64)}, "not a dict", {"x": good}])
    assert isinstance(got[0], list) and isinstance(got[4], list)
    assert np.array_equal(got[0][0], got[4][0])
    assert "dimension 1 is 5, but the model fixes it to 4" in str(got[1])
    assert "float64" in str(got[2]) and "float32" in str(got[2])
    assert "a feed dict is expected, received str" in str(got[3])
    with pytest.raises(ArgumentError, match="sequence of feed dicts, received dict"):
        sess.run_batch({"x": good})


def test_a_fixed_batch_model_is_never_re_batched():
    sess = Session(_batch_model(batch=1), store=False)
    x = np.ones((1, 4), np.float32)
    got = sess.run_batch([{"x": x}, {"x": 2 * x}])
    assert [g[0].shape for g in got] == [(1, 3), (1, 3)]
    assert np.allclose(got[1][0], 2 * got[0][0])
