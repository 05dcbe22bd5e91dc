"""``opdispatch serve --ray``: a model as a Ray Serve deployment of two replicas on a local Ray
cluster started by the test, behind the Open Inference Protocol front; a replica killed under
load loses no request beyond those in flight on it, and is replaced."""

from __future__ import annotations

import importlib.util
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import dispatch
from tests.serve.conftest import BERT, BERT_INPUTS, CNN, SEQ, bert_feeds, cnn_feeds, live_server

if importlib.util.find_spec("ray") is None:
    pytest.skip("Ray Serve (the ray extra) is not installed", allow_module_level=True)

httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

#: Ray Serve's own models use pydantic's deprecated Field arguments (Ray 2.60)
pytestmark = pytest.mark.filterwarnings(
    "ignore:Using extra keyword arguments on `Field`:DeprecationWarning")

MODEL = BERT.stem
#: client threads of the load, each with one request in flight at a time
LOAD_THREADS = 4
#: the load's bounds: requests per thread and seconds
LOAD_REQUESTS, LOAD_SECONDS = 150, 25.0


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def _replicas() -> dict[str, int]:
    """The model's live replica actors: id -> pid (from the GCS: the state API needs the
    dashboard, which the test cluster does without)."""
    from ray._private import state

    return {actor_id: info["Pid"] for actor_id, info in state.actors().items()
            if info["State"] == "ALIVE" and info["ActorClassName"].startswith("ServeReplica:")
            and MODEL in info["ActorClassName"]}


def _ready(client) -> bool:
    try:
        return client.is_model_ready(MODEL)
    except Exception:  # the front is up before the deployment: keep asking
        return False


def _inputs(feeds):
    inputs = []
    for name, array in feeds.items():
        tensor = httpclient.InferInput(name, list(array.shape), "INT64")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def test_two_replicas_survive_a_killed_replica(ray_cluster, tuned_store, tmp_path):
    from ray import serve

    shapes = [arg for name in BERT_INPUTS for arg in ("--shape", f"{name}=1x{SEQ}")]
    args = [str(BERT), "--store", tuned_store, *shapes, "--ray", "--ray-address", ray_cluster,
            "--replicas", "2", "--replica-cpus", "0.5", "--grpc-port", "0"]
    with live_server(args, tmp_path, ready_timeout=240) as live:
        client = httpclient.InferenceServerClient(live.http_url, network_timeout=60)
        deadline = time.monotonic() + 180
        while not _ready(client):
            assert time.monotonic() < deadline, live.log.read_text()[-4000:]
            time.sleep(0.5)
        metadata = client.get_model_metadata(MODEL)["parameters"]
        assert metadata["plan_source"] == "store" and metadata["replica_pid"] > 0
        want = dispatch.Session(str(BERT), store=tuned_store, require_plan=True).run(
            ["pooler_output"], bert_feeds(0))[0]
        assert len(_replicas()) == 2

        outcomes: list[str] = []
        lock = threading.Lock()
        stop_at = time.monotonic() + LOAD_SECONDS

        def load(thread: int) -> None:
            own = httpclient.InferenceServerClient(live.http_url, network_timeout=60)
            for _ in range(LOAD_REQUESTS):
                if time.monotonic() > stop_at:
                    return
                try:
                    result = own.infer(MODEL, _inputs(bert_feeds(0)))
                    ok = np.allclose(result.as_numpy("pooler_output"), want, rtol=1e-4,
                                     atol=1e-5)
                    outcome = "ok" if ok else "wrong"
                except InferenceServerException as exc:
                    outcome = "timeout" if "timed out" in str(exc).lower() else "error"
                except Exception as exc:  # the connection itself failed: an error the client saw
                    outcome = "timeout" if "timed out" in str(exc).lower() else "error"
                    own = httpclient.InferenceServerClient(live.http_url, network_timeout=60)
                with lock:
                    outcomes.append(outcome)

        with ThreadPoolExecutor(LOAD_THREADS) as pool:
            futures = [pool.submit(load, t) for t in range(LOAD_THREADS)]
            time.sleep(3.0)
            victim, pid = next(iter(_replicas().items()))
            os.kill(pid, signal.SIGKILL)  # a replica's process dies, as in a crash
            for f in futures:
                f.result()

        assert outcomes.count("wrong") == 0
        assert outcomes.count("timeout") == 0, "a request was lost (no answer, no error)"
        errors = outcomes.count("error")
        # a request whose replica died is sent again to the replica left (tuner.serve.ray_app):
        # at most the requests in flight when it died can fail, and only if no retry found it
        assert errors <= LOAD_THREADS, (f"{errors} requests failed: more than were in flight "
                                        f"({LOAD_THREADS} at most)")
        assert outcomes.count("ok") > errors

        deadline = time.monotonic() + 120
        while True:
            status = serve.status().applications[MODEL].deployments[MODEL]
            running = status.replica_states.get("RUNNING", 0)
            alive = [a for a in _replicas() if a != victim]
            if running == 2 and len(alive) == 2:
                break
            assert time.monotonic() < deadline, f"the replica was not replaced: {status}"
            time.sleep(1.0)
        result = client.infer(MODEL, _inputs(bert_feeds(0)))
        np.testing.assert_allclose(result.as_numpy("pooler_output"), want, rtol=1e-4, atol=1e-5)
        assert live.stop() == 0


def test_fleet_tune_gathers_one_plan_per_node_kind(ray_cluster, tmp_path):
    from tuner.fingerprint import hardware_digest, hardware_fingerprint
    from tuner.fleet import fleet_tune
    from tuner.store import PlanStore

    bundle, kinds = fleet_tune(CNN, budget_s=4, cpus=0.5)
    here = hardware_digest(hardware_fingerprint())
    assert [k.digest for k in kinds] == [here]  # one machine: one kind of node
    assert len(bundle["plans"]) == 1
    assert hardware_digest(bundle["plans"][0]["key"]["hardware"]) == here
    store = str(tmp_path / "plans.sqlite")
    with PlanStore(store) as plans:
        plans.import_plans(bundle)
    sess = dispatch.Session(str(CNN), store=store, require_plan=True)
    assert sess.plan_source == "store"
    (out,) = sess.run(["pooler_output"], cnn_feeds(0))
    assert out.shape == (2, 64, 1, 1)
