"""Serving beyond one machine: each model as a Ray Serve deployment (replicas across a Ray
cluster, autoscaled on their queues), behind the same Open Inference Protocol front.

``opdispatch serve MODELS --ray [--ray-address ADDR] [--replicas N | --max-replicas M]``:

- every model becomes a deployment of :class:`ModelReplica` replicas. A replica is an
  :class:`~tuner.serve.oip_model.OpdispatchModel` (the same model class the single-machine
  server runs): it loads the plan stored for *its* node's hardware and runs it once before it
  answers;
- plans reach the nodes through a store every node reads (``--store`` on a shared file system)
  or as a bundle (``--bundle plans.json``, written by ``opdispatch plans export`` or
  ``opdispatch plans fleet-tune``): each replica imports it into a store of its own;
- a replica on a node whose hardware has no plan is not ready and says why (the model's
  readiness and metadata carry the reason and the node), or tunes first when the model's
  settings give ``tune_budget_s``;
- the front is ``kserve``'s ``ModelServer`` with one ``RayModel`` per deployment: requests go
  to the deployment's handle, which routes them to a replica. When a replica dies, the
  requests that were running or queued on it are sent again (inference has no side effect),
  a few times within a few seconds, to the replicas left, while Ray Serve replaces it; only a
  request that finds no live replica in that time is reported to its client as an error.

``ray`` is imported only here (the ``ray`` extra).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tuner.serve.repository import ModelSpec, ServeSettings


def _spec_dict(spec: ModelSpec) -> dict[str, Any]:
    return {"name": spec.name, "path": str(spec.path), "version": spec.version,
            "settings": {**asdict(spec.settings), "shapes": {k: list(v) for k, v in
                                                            spec.settings.shapes.items()}}}


def _spec_from(data: dict[str, Any]) -> ModelSpec:
    settings = ServeSettings(**data["settings"]).checked(f"model {data['name']}")
    return ModelSpec(data["name"], Path(data["path"]), settings, data["version"])


def local_store(bundle: str, store: str | None) -> str:
    """A store of this replica's own holding the plans of ``bundle`` (and those of ``store``
    when one is given: it is copied, never written)."""
    import json
    import shutil

    from tuner.store import PlanStore

    folder = tempfile.mkdtemp(prefix="opdispatch-replica-")
    path = os.path.join(folder, "plans.sqlite")
    if store and os.path.exists(store):
        shutil.copyfile(store, path)
    with PlanStore(path) as plans:
        plans.import_plans(json.loads(Path(bundle).read_text()))
    return path


class ModelReplica:
    """What each Ray Serve replica of a model runs (see the module docstring)."""

    def __init__(self, spec: dict[str, Any], store: str | None, bundle: str | None) -> None:
        from tuner.serve.oip_model import OpdispatchModel
        from tuner.serve.runner import ModelRunner

        if bundle:
            store = local_store(bundle, store)
        self.model = OpdispatchModel(ModelRunner(_spec_from(spec), store))
        self.model.load()

    async def __call__(self, body: Any, headers: dict[str, str] | None = None,
                       verb: Any = None) -> Any:
        from kserve.model import InferenceVerb

        return await self.model(body, headers=headers, verb=verb or InferenceVerb.PREDICT)

    def load(self) -> bool:
        return self.model.ready

    async def describe(self) -> dict[str, Any]:
        from tuner.serve.oip_model import describe_runner

        described = describe_runner(self.model.runner)
        described["plan"]["node"] = socket.gethostname()
        described["plan"]["replica_pid"] = os.getpid()
        return described

    def get_input_types(self) -> list[dict[str, Any]]:
        return self.model.get_input_types()

    def get_output_types(self) -> list[dict[str, Any]]:
        return self.model.get_output_types()


#: how many times a request whose replica died is sent again, pausing RETRY_PAUSE_S x attempt
REPLICA_RETRIES = 4
RETRY_PAUSE_S = 0.25


def _ray_model(name: str, handle: Any) -> Any:
    """kserve's ``RayModel`` for a deployment, its readiness and metadata asked of a replica."""
    from kserve.ray import RayModel

    class ServedOnRay(RayModel):
        #: how long a replica's answer to "are you ready" is reused (every request asks)
        CACHE_S = 1.0

        _described: tuple[float, dict[str, Any]] | None = None

        async def __call__(self, body: Any, headers: dict[str, str] | None = None,
                           verb: Any = None) -> Any:
            from ray.exceptions import RayActorError, RayTaskError

            for attempt in range(REPLICA_RETRIES + 1):
                try:
                    return await self._handle.remote(body, headers=headers)
                except RayTaskError as exc:  # the replica's own error (400, 503, ...), unwrapped
                    cause = getattr(exc, "cause", None)
                    if isinstance(cause, Exception):
                        raise cause from None
                    raise
                except RayActorError:  # its replica died before answering: another runs it
                    if attempt == REPLICA_RETRIES:
                        raise
                    # the router may still pick the dead replica until the controller says so
                    await asyncio.sleep(RETRY_PAUSE_S * (attempt + 1))
            raise AssertionError("unreachable")

        async def healthy(self) -> bool:
            return bool((await self.describe())["ready"])

        async def describe(self) -> dict[str, Any]:
            now = time.monotonic()
            if self._described is None or now - self._described[0] > self.CACHE_S:
                self._described = (now, await self._handle.describe.remote())
            return self._described[1]

    return ServedOnRay(name, handle)


def deploy(specs: Sequence[ModelSpec], *, store: str | None = None, bundle: str | None = None,
           replicas: int = 1, max_replicas: int | None = None, replica_cpus: float = 1.0,
           target_ongoing_requests: float = 2.0) -> list[Any]:
    """Deploy each model on Ray Serve (Ray must be initialised); returns their handles.

    ``max_replicas`` > ``replicas`` autoscales between the two on each replica's ongoing
    requests (``target_ongoing_requests``); otherwise ``replicas`` run.
    """
    from ray import serve
    from ray.serve.config import ProxyLocation

    serve.start(proxy_location=ProxyLocation.Disabled)
    handles = []
    for spec in specs:
        options: dict[str, Any] = {
            "name": spec.name, "ray_actor_options": {"num_cpus": replica_cpus},
            "max_ongoing_requests": max(1, spec.settings.max_queue),
            "health_check_period_s": 2.0,
        }
        if max_replicas is not None and max_replicas > replicas:
            options["autoscaling_config"] = {
                "min_replicas": replicas, "max_replicas": max_replicas,
                "target_ongoing_requests": target_ongoing_requests}
        else:
            options["num_replicas"] = replicas
        app = serve.deployment(ModelReplica, **options).bind(_spec_dict(spec), store, bundle)
        handles.append(serve.run(app, name=spec.name, route_prefix=None))
    return handles


def serve_on_ray(specs: Sequence[ModelSpec], *, address: str | None = None,
                 store: str | None = None, bundle: str | None = None, replicas: int = 1,
                 max_replicas: int | None = None, replica_cpus: float = 1.0,
                 host: str = "127.0.0.1", http_port: int = 8080, grpc_port: int | None = 8081,
                 max_body_bytes: int = 64 << 20, grace_s: float = 30.0) -> None:
    """Deploy ``specs`` on the Ray cluster at ``address`` (``None``: a local one started
    here) and serve them over the Open Inference Protocol on ``host`` until SIGTERM. Blocks;
    the deployments are deleted when it returns."""
    import ray
    from ray import serve

    from tuner.serve.server import serve_models

    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    handles = deploy(specs, store=store, bundle=bundle, replicas=replicas,
                     max_replicas=max_replicas, replica_cpus=replica_cpus)
    models = [_ray_model(spec.name, handle) for spec, handle in zip(specs, handles)]
    for model in models:
        model.ready = True  # routable; each replica's own readiness is asked per request
    try:
        serve_models(models, host=host, http_port=http_port, grpc_port=grpc_port,
                     max_body_bytes=max_body_bytes, grace_s=grace_s)
    finally:
        for spec in specs:
            with contextlib.suppress(Exception):  # the cluster may be gone already
                serve.delete(spec.name)
