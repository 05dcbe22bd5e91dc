"""Tuning for throughput (issue 30): a plan tuned at a concurrency stores its serving
configuration under the objective ``throughput@n=N``, round-trips the store and bundles, and a
Session from the store serves it on its streams; a p99 bound no configuration meets is an
error naming the best p99 found; the command line tunes and measures under load.

Nothing here asserts a speed: which configuration wins is the machine's answer. The checks are
what was measured, stored and reported."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from dispatch import Session
from dispatch.errors import PlanNotFoundError
from dispatch.serving import ServingConfig
from tests.builders import small_cnn
from tuner.store import PlanStore
from tuner.throughput.load import closed_loop_rate, run_load
from tuner.throughput.stage import serving_candidates
from tuner.tune import TuneOptions, TuningError, tune

BUDGET_S = 12


def _opts(**kw) -> TuneOptions:
    base = dict(budget_s=BUDGET_S, top_k=2, validate_runs=3, per_candidate_cap_s=0.05,
                progress=False, objective="throughput", concurrency=2)
    base.update(kw)
    return TuneOptions(**base)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    p = tmp_path_factory.mktemp("throughput") / "small.onnx"
    p.write_bytes(small_cnn().SerializeToString())
    return str(p)


@pytest.fixture(scope="module")
def tuned(model, tmp_path_factory):
    store = str(tmp_path_factory.mktemp("throughput-store") / "plans.sqlite")
    result = tune(model, store=store, options=_opts())
    return store, result


def test_a_throughput_plan_records_its_serving_configuration_and_the_evidence(tuned):
    _, result = tuned
    assert result.key.objective == "throughput@n=2"
    config = result.plan.serving_config()
    assert isinstance(config, ServingConfig) and config.concurrency == 2
    evidence = result.plan.provenance["throughput"]
    measured = [t for t in evidence["trials"] if t["throughput"] is not None]
    assert measured, evidence["trials"]
    # the latency set-up (one executor called from every thread) is always among them
    assert any(t["config"]["mode"] == "shared" and t["config"]["streams"] == 1
               and t["config"]["threads"] == 0 for t in measured)
    assert evidence["winner"]["config"] == config.to_dict()
    assert evidence["final"]["concurrency"] == 2 and evidence["final"]["requests"] > 0
    summary = result.summary()
    assert "serving configurations at concurrency 2" in summary
    assert "winner under load (validated at concurrency 2)" in summary
    assert "why: " in summary


def test_a_session_from_the_store_serves_the_throughput_plan(tuned, model):
    store, result = tuned
    sess = Session(model, store=store, objective="throughput@n=2", require_plan=True)
    assert sess.plan_source == "store" and sess.plan.serving == result.plan.serving
    config = sess.plan.serving_config()
    assert (sess.runner is not sess.executor) == config.concurrent  # a pool of its streams
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)
    alone = sess.run(None, {"x": x})[0]
    got = []
    threads = [threading.Thread(target=lambda: got.append(sess.run(None, {"x": x})[0]))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 4 and all(np.array_equal(g, alone) for g in got)


def test_the_throughput_plan_is_kept_apart_from_the_latency_plan(tuned, model):
    store, _ = tuned
    # a bare "throughput" is the concurrency of one request per configured thread
    from dispatch.blas import configured_threads

    if configured_threads() == 2:
        assert Session(model, store=store, objective="throughput").plan_source == "store"
    with pytest.raises(PlanNotFoundError, match=r"objective: throughput@n=2 -> throughput@n=3"):
        Session(model, store=store, objective="throughput@n=3", require_plan=True)
    with pytest.raises(PlanNotFoundError):
        Session(model, store=store, objective="latency", require_plan=True)


def test_a_throughput_plan_round_trips_a_bundle(tuned, model, tmp_path):
    store, result = tuned
    with PlanStore(store) as src:
        bundle = json.loads(json.dumps(src.export_plans([result.plan_id])))
    other = str(tmp_path / "other.sqlite")
    with PlanStore(other) as dst:
        dst.import_plans(bundle)
    sess = Session(model, store=other, objective="throughput@n=2", require_plan=True)
    assert sess.plan.serving == result.plan.serving
    assert sess.plan.provenance["throughput"] == result.plan.provenance["throughput"]


def test_a_p99_bound_no_configuration_meets_names_the_best_p99_found(model, tmp_path):
    with pytest.raises(TuningError, match=r"no plan meets the p99 bound of 0\.001 ms at "
                                          r"concurrency 2: the best p99 found is [0-9.]+ ms \("):
        tune(model, store=str(tmp_path / "p.sqlite"), options=_opts(max_latency_ms=0.001))


def test_session_tune_with_a_throughput_objective(model, tmp_path):
    sess = Session(model, store=str(tmp_path / "s.sqlite"), objective="throughput@n=2,p99=10000")
    result = sess.tune(budget_s=BUDGET_S, top_k=2, validate_runs=3, per_candidate_cap_s=0.05)
    assert result.key.objective == "throughput@n=2,p99=10000"
    assert sess.plan.serving_config() is not None and sess.plan_source == "tuned"
    assert result.plan.provenance["throughput"]["max_latency_ms"] == 10000


def test_serving_candidates_start_with_the_latency_set_up():
    plan = Session(small_cnn(), backends=["onnxruntime"], store=False).plan
    one = serving_candidates(plan, 1, 2)
    assert one == [ServingConfig("shared", 1, 0, 1, 1)]
    four = serving_candidates(plan, 4, 2)
    assert four[0] == ServingConfig("shared", 1, 0, 4, 4)
    assert ServingConfig("streams", 2, 1, 2, 4) in four  # the cores split between two streams
    assert ServingConfig("streams", 4, 1, 4, 4) in four  # more streams than cores
    assert ServingConfig("shared", 1, 1, 4, 4) in four  # one onnxruntime session, 1 thread
    assert len(set(four)) == len(four)
    eight = serving_candidates(plan, 8, 2)  # a stream per request as well as 2 per core
    assert {ServingConfig("streams", 4, 1, 4, 8), ServingConfig("streams", 8, 1, 8, 8)} <= set(eight)
    assert ServingConfig("streams", 64, 1, 64, 64) not in serving_candidates(plan, 64, 2)


def test_a_stream_per_request_is_among_the_likeliest_up_to_two_per_core():
    """onnxruntime's "N x 1" (a one-thread stream per request in flight) was the best library
    set-up on six of ten models at N = 4 on 2 AVX2 cores: it is measured among the first."""
    from tuner.throughput import stage as tp

    assert tp._priority(ServingConfig("streams", 4, 1, 4, 4), 2) == 0
    assert tp._priority(ServingConfig("streams", 2, 1, 2, 4), 2) == 0
    assert tp._priority(ServingConfig("streams", 8, 1, 8, 8), 2) == 2  # 4 per core: the rest
    assert tp._priority(ServingConfig("shared", 1, 0, 4, 4), 2) == 1


def test_plans_much_slower_than_the_fastest_are_not_served_unless_a_librarys_own():
    """A plan over MAX_SLOWDOWN times the fastest one request at a time gets no serving
    trials (its time goes to the likely winners), except the fastest plan wholly on a library
    with pools of its own (onnxruntime, OpenVINO), whose settings are what the stage tunes."""
    from tuner.throughput import stage as tp
    from tuner.tune_types import PlanCandidate

    sets = {"numpy": ["numpy"], "native": ["native", "numpy"], "onednn": ["onednn", "numpy"],
            "onnxruntime": ["onnxruntime"], "openvino": ["openvino"]}
    latency = {"numpy": 1.0, "native": 1.4, "onednn": 1.0 * tp.MAX_SLOWDOWN + 0.1,
               "onnxruntime": 3.0, "openvino": 4.0}
    cands = []
    for label, backends in sets.items():
        pc = PlanCandidate(label, Session(small_cnn(), backends=backends, store=False).plan, None)
        pc.latency_ms = latency[label]
        cands.append(pc)
    signatures = {tuple((s.impl, tuple(s.nodes)) for s in pc.plan.steps) for pc in cands}
    assert len(signatures) == len(cands)  # five distinct plans
    chosen = [pc.label for pc in tp._contenders(cands, 5)]
    assert chosen == ["numpy", "onnxruntime", "openvino", "native"]  # "onednn" over the ratio
    assert [pc.label for pc in tp._contenders(cands, 2)] == ["numpy", "onnxruntime"]


def test_plans_take_turns_so_a_short_budget_measures_each_plans_likeliest_first(monkeypatch):
    """The order of measurement (fakes in place of the loads: the thing under test is the order):
    the fastest plan's latency set-up, then each plan's likeliest configuration in turn
    (OpenVINO's throughput hint first in its plan's turn), then each one's second, and so on."""
    from tuner.throughput import stage as tp
    from tuner.throughput.load import LoadResult
    from tuner.tune_types import PlanCandidate

    sessions = {b: Session(small_cnn(), backends=[b], store=False) for b in ("onnxruntime", "openvino")}
    plans = [PlanCandidate(b, s.plan, None) for b, s in sessions.items()]
    plans[0].latency_ms, plans[1].latency_ms = 1.0, 1.1
    stage = tp.ThroughputStage(sessions["openvino"].graph, None, {}, [], 4, None, time.monotonic() + 60, None)
    stage.cores = 2
    seen = []

    def fake_load(plan, config, window):
        seen.append((min(plan.backends_used()), config.label()))
        return LoadResult(4, 10, window, 10.0, 1.0, 1.0, 1.0, 1.0)

    monkeypatch.setattr(stage, "_load", fake_load)
    monkeypatch.setattr(tp, "CONFIRM", 0)
    stage.measure(plans)
    hint = ServingConfig("shared", 2, 0, 4, 4).label()
    assert seen[:4] == [("onnxruntime", ServingConfig("shared", 1, 0, 4, 4).label()),
                        ("onnxruntime", ServingConfig("streams", 2, 1, 2, 4).label()),
                        ("openvino", hint),
                        ("onnxruntime", ServingConfig("streams", 4, 1, 4, 4).label())]
    assert len(seen) == len(stage.trials)


def test_a_short_budget_leaves_out_the_least_likely_configurations_not_the_likeliest(monkeypatch):
    """The stage's scheduling alone: each measurement replaced by a sleep of its window (the
    thing under test is which trials the budget keeps, not the figures). With time for a few
    trials of many, the ones measured come first in the stage's priority order and the ones
    left out last."""
    from tuner.throughput import stage as tp
    from tuner.throughput.load import LoadResult
    from tuner.tune_types import PlanCandidate

    sessions = {b: Session(small_cnn(), backends=[b], store=False)
                for b in ("onnxruntime", "openvino", "numpy")}
    plans = [PlanCandidate(b, s.plan, None) for b, s in sessions.items()]
    for k, pc in enumerate(plans):
        pc.latency_ms = 1.0 + k
    graph = sessions["numpy"].graph
    stage = tp.ThroughputStage(graph, None, {}, [], 4, None, time.monotonic() + 60, None)
    stage.cores = 2

    def fake_load(plan, config, window):  # a build of 0.3 s, the warm-up, the window
        stage._builds.append(0.3)
        time.sleep(0.3 + tp.WARMUP_S + window)
        return LoadResult(4, 10, window, 10 / window, 1.0, 1.0, 1.0, 1.0)

    monkeypatch.setattr(stage, "_load", fake_load)
    monkeypatch.setattr(tp, "CONFIRM", 0)
    # room for about four trials at the shortest window besides the reserve
    stage.deadline = time.monotonic() + stage._reserve() + 4 * (tp.MIN_WINDOW_S + tp.WARMUP_S + 0.3) + 0.2
    stage.measure(plans)
    measured = [t for t in stage.trials if t.result is not None]
    skipped = [t for t in stage.trials if t.error == tp.BUDGET_SKIP]
    assert len(stage.trials) >= 8 and 1 <= len(measured) <= 6 and skipped  # (a loaded machine fits fewer)
    baseline = stage.trials[0]
    assert baseline.result is not None  # the latency set-up of the fastest plan, always
    rank = [tp._priority(t.config, 2) for t in stage.trials]
    worst_measured = max(rank[k] for k, t in enumerate(stage.trials)
                         if t.result is not None and t is not baseline)
    assert all(rank[stage.trials.index(t)] >= worst_measured for t in skipped)


def test_a_slow_models_windows_hold_a_few_requests_per_thread():
    """The window a trial is measured in grows with the plan's latency and the concurrency
    (each thread counts about SETTLE_REQUESTS requests even if the plan ran one at a time), up
    to MAX_WINDOW_S; a fast model keeps the short windows."""
    from tuner.throughput import stage as tp
    from tuner.tune_types import PlanCandidate

    plan = Session(small_cnn(), backends=["numpy"], store=False).plan
    stage = tp.ThroughputStage(None, None, {}, [], 4, None, time.monotonic() + 60, None)
    slow, fast, slower = (PlanCandidate(x, plan, None) for x in ("slow", "fast", "slower"))
    slow.latency_ms, fast.latency_ms, slower.latency_ms = 110.0, 4.0, 900.0
    config = ServingConfig("shared", 1, 0, 4, 4)
    assert stage._settle_s(tp.ServingTrial(slow, config)) == pytest.approx(tp.SETTLE_REQUESTS * 4 * 0.11)
    assert stage._settle_s(tp.ServingTrial(fast, config)) < tp.MIN_WINDOW_S
    assert stage._settle_s(tp.ServingTrial(slower, config)) == tp.MAX_WINDOW_S


def test_with_one_request_in_flight_the_plan_is_chosen_on_its_validated_latency(monkeypatch):
    """At concurrency 1 throughput is one over the latency: the stage chooses the plan the
    latency objective would (the validation stage's interleaved timing), whatever one short load
    window each said, and says so; at concurrency 2 the load windows decide. The measurements
    are fakes (the thing under test is the rule, not the figures): the plan validated fastest
    gets the lowest load figure."""
    from tuner.throughput import stage as tp
    from tuner.throughput.load import LoadResult
    from tuner.tune_types import PlanCandidate

    sessions = {b: Session(small_cnn(), backends=[b], store=False) for b in ("onnxruntime", "numpy")}
    plans = [PlanCandidate(b, s.plan, None) for b, s in sessions.items()]
    plans[0].latency_ms, plans[1].latency_ms = 1.0, 1.2  # onnxruntime validated faster (within MAX_SLOWDOWN)
    graph = sessions["numpy"].graph
    for n in (1, 2):
        stage = tp.ThroughputStage(graph, None, {}, [], n, None, time.monotonic() + 60, None)

        def fake_load(plan, config, window, _n=n):
            rate = 50.0 if plan.steps == plans[0].plan.steps else 80.0  # the windows disagree
            return LoadResult(_n, int(rate), 1.0, rate, 1.0, 1.0, 1.0, 1.0)

        monkeypatch.setattr(stage, "_load", fake_load)
        monkeypatch.setattr(tp, "CONFIRM", 0)
        stage.measure(plans)
        win = stage.choose(plans, _opts(concurrency=n))
        if n == 1:
            assert win is plans[0]
            assert "chosen on its validated latency, 1.000 ms" in stage._why(win, stage.best_for(win), None)
        else:
            assert win is plans[1]


def test_closed_loop_rate_is_each_threads_requests_over_their_span():
    # thread 0: 3 requests back to back in 3 s; thread 1: 2 in 2 s, started before a window
    # that a count of completions would have cut at 1.0 (and counted 1.5 of them)
    spans = [[(0.0, 1.0), (1.0, 2.0), (2.0, 3.0)], [(0.5, 1.5), (1.5, 2.5)]]
    assert closed_loop_rate(spans) == pytest.approx(2.0)
    assert closed_loop_rate([[(0.0, 0.5)], []]) is None  # a thread that counted none: unknown
    assert closed_loop_rate([]) is None


def test_the_load_loop_counts_requests_and_errors():
    calls = []
    lock = threading.Lock()

    def call(k: int) -> None:
        time.sleep(0.001)
        with lock:
            calls.append(k)

    result = run_load(call, 3, 5.0, warmup_s=0.0, max_requests=50)
    assert result.requests == 50 and result.concurrency == 3 and result.errors == 0
    assert result.p50_ms <= result.p90_ms <= result.p99_ms and result.throughput > 0
    assert set(calls) == {0, 1, 2}
    assert len(calls) >= 53  # each thread's first request warms it up, uncounted

    def fail(k: int) -> None:
        raise ValueError(f"thread {k} refused")

    bad = run_load(fail, 2, 0.2, warmup_s=0.0)
    assert bad.errors == 2 and bad.requests == 0 and "refused" in (bad.error or "")
    with pytest.raises(ValueError, match="concurrency must be at least 1"):
        run_load(call, 0, 1.0)


def test_requests_that_outlast_the_window_are_measured_from_the_warm_up_not_as_zero():
    """Each thread's first request is its warm-up; when every request outlasts the window, no
    thread counts one, and the figures come from the warm-up requests over their span (a
    slow model on a loaded configuration ranked at 0/s before)."""

    def slow(_k: int) -> None:
        time.sleep(0.3)

    result = run_load(slow, 2, 0.2, warmup_s=0.05)
    assert result.requests == 2 and result.errors == 0
    assert 0 < result.throughput <= 2 / 0.3  # each sleep lasts at least 0.3 s
    assert result.p50_ms >= 300


# -- the command line -----------------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], capture_output=True,
                          text=True, timeout=300)


def test_cli_tunes_for_throughput_and_runs_under_load(model, tmp_path):
    store = str(tmp_path / "cli.sqlite")
    res = cli("tune", model, "--store", store, "--budget", str(BUDGET_S), "--objective",
              "throughput", "--concurrency", "2", "--no-progress")
    assert res.returncode == 0, res.stderr
    assert "objective throughput@n=2" in res.stdout
    assert "serving configurations at concurrency 2" in res.stdout
    res = cli("run", model, "--store", store, "--concurrency", "2", "--duration", "0.5",
              "--require-plan", "--json", "-")
    assert res.returncode == 0, res.stderr
    figures = json.loads(res.stdout)
    assert figures["concurrency"] == 2 and figures["requests"] > 0 and figures["errors"] == 0
    assert "objective throughput@n=2" in figures["what"]
    # no plan at another concurrency: the latency plan runs, and says so
    res = cli("run", model, "--store", store, "--concurrency", "3", "--duration", "0.3")
    assert res.returncode == 0, res.stderr
    assert "no plan stored for objective throughput@n=3" in res.stdout
    assert "inferences/s at concurrency 3" in res.stdout


def test_cli_measures_a_plain_library_under_load(model):
    pytest.importorskip("onnxruntime")
    res = cli("run", model, "--library", "onnxruntime-per-request", "--concurrency", "2",
              "--duration", "0.3")
    assert res.returncode == 0, res.stderr
    assert "plain onnxruntime-per-request" in res.stdout
    assert "inferences/s at concurrency 2" in res.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["tune", "{model}", "--concurrency", "4"],
     "--concurrency and --max-latency-ms go with --objective throughput"),
    (["run", "{model}", "--library", "onnxruntime"], "give --concurrency N too"),
    (["run", "{model}", "--library", "tensorflow", "--concurrency", "2"],
     "unknown --library 'tensorflow'; known set-ups: onnxruntime"),
    (["run", "{model}", "--concurrency", "2", "--runs", "3"], "--runs and --output go with single runs"),
    (["run", "{model}", "--objective", "throughput@n=0"], "objective 'throughput@n=0': expected"),
])
def test_cli_load_user_errors_are_one_line(model, args, message):
    res = cli(*[a.format(model=model) for a in args])
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert message in res.stderr and "Traceback" not in res.stderr
