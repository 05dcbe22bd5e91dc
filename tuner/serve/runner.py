"""One served model: its stored plan loaded and run once, requests admitted up to a bound,
grouped by the dynamic batcher, run on the plan's streams, and counted.

:class:`ModelRunner` knows nothing of HTTP or gRPC: it takes numpy feeds and gives numpy
outputs, and says what went wrong with the exceptions below, which the protocol layer
(:mod:`tuner.serve.oip_model`) turns into status codes:

- :class:`InvalidRequest`: the client's mistake (an unknown or missing input, a wrong dtype or
  shape, an input shape no plan is stored for): HTTP 400 / gRPC INVALID_ARGUMENT;
- :class:`Overloaded`: the bounded queue is full, or the model is shutting down: 503 /
  UNAVAILABLE, to be retried;
- :class:`ModelUnavailable`: the model is not ready (no plan for this machine, ...), with why.

Readiness: a model is ready once the plan stored for this machine, for each shape it serves,
was loaded and ran once on zeros. Without one it is not ready, and :attr:`ModelRunner.reason`
says why (``allow_untuned`` serves the untuned plan instead, and the metadata says so).

Shape ranges (issue 51): served shapes with a range (``shapes = { input_ids = [1, "1..512"] }``,
``--shape input_ids=1x1..512``) serve every shape inside the range on the range plan stored for
exactly that range (``opdispatch tune MODEL --shape input_ids=1x1..512``): the model is ready once
that plan was loaded, its ways built and the model run at the range's smallest and largest
shapes; a request outside the range is the client's mistake (400, naming the served range).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from dispatch.errors import ArgumentError, FeedError, OpDispatchError, PlanNotFoundError
from dispatch.executor import BACKEND_SECONDS
from dispatch.feeds import check_declared_feeds
from dispatch.input_shapes import format_shapes
from dispatch.session_batch import batch_dimension
from dispatch.shape_range import ShapeRange, has_range
from tuner.serve import metrics
from tuner.serve.batcher import DynamicBatcher, Queued
from tuner.serve.repository import ModelSpec

#: requests a plan without a serving configuration (a latency plan, a range plan) runs at once:
#: as ``Session.run`` runs them, each on its caller's thread (its executor and the libraries'
#: sessions take concurrent runs). Run one at a time, MiniLM's range plan served 16 clients of
#: mixed lengths at 0.59x its in-process rate from 16 threads (AMD EPYC, 2 cores, the load
#: generator on the same cores; a MobileNetV2 latency plan at 0.52x on another machine); 16 at
#: once: bench/README.md, "Mixed-shape traffic". More requests wait in the queue
#: (``max_queue``).
LATENCY_WORKERS = 16


class ServeError(OpDispatchError):
    """A request the model could not answer (subclasses say whose fault it is)."""


class InvalidRequest(ServeError):
    """The request itself is wrong: names, dtypes, shapes (HTTP 400)."""


class Overloaded(ServeError):
    """The model's queue is full, or it is draining for shutdown (HTTP 503: retry)."""


class ModelUnavailable(ServeError):
    """The model is not ready; the message says why (HTTP 503)."""


#: candidate batch sizes probed for a stored plan (besides ``max_batch_size`` itself)
_PROBED_SIZES = (2, 4, 8, 16, 32, 64)
#: how long a request thread waits for the others to start when they are warmed at load
_WARM_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class TensorInfo:
    """An input or output as the metadata endpoint shows it (``-1``: a symbolic dimension;
    ``shape`` ``None``: the rank is unknown)."""

    name: str
    dtype: np.dtype
    shape: list[int] | None


class ModelRunner:
    """Serves one model (see the module docstring).

    Args:
        spec: the model, its file and its settings.
        store: the plan store path (``None``: the configured one).
    """

    def __init__(self, spec: ModelSpec, store: str | None = None) -> None:
        self.spec = spec
        self.name = spec.name
        self.store = store
        self.ready = False
        self.reason = "not loaded yet"
        self.session: Any = None
        self.inputs: list[TensorInfo] = []
        self.outputs: list[TensorInfo] = []
        #: what the model's metadata says about its plan (plan id, objective, fingerprint, ...)
        self.plan_info: dict[str, Any] = {}
        self.batch_sizes: list[int] = [1]
        self.workers = 1
        #: the request threads that ran the plan once before the model was ready
        self.warm_threads: list[str] = []
        self._admitted = 0
        self._draining = False
        self._pool: ThreadPoolExecutor | None = None
        self._batcher: DynamicBatcher | None = None
        #: the shape range served (``shapes`` with a ``LO..HI``), else ``None``
        self.shape_range: ShapeRange | None = None

    # -- loading -----------------------------------------------------------------------------
    def load(self) -> bool:
        """Load the plan and run it once per served shape; never raises: a model that cannot
        be served is not ready and :attr:`reason` says why."""
        try:
            self._load()
            self.ready, self.reason = True, ""
        except Exception as exc:
            self.ready = False
            self.reason = str(exc) if isinstance(exc, OpDispatchError) else f"{type(exc).__name__}: {exc}"
        metrics.READY.labels(self.name).set(int(self.ready))
        return self.ready

    def _load(self) -> None:
        settings = self.spec.settings
        if has_range(settings.shapes):
            self._load_range()
            return
        from dispatch.session import Session

        session = Session(str(self.spec.path), store=self.store, objective=settings.objective,
                          require_plan=not settings.allow_untuned)
        self.session = session
        self._describe_io()
        base = self._served_shapes()
        self.plan_info = {"objective": settings.objective, "untuned": settings.allow_untuned,
                          "model_file": str(self.spec.path)}
        if base is None:  # allow_untuned, symbolic inputs, no shapes named: planned per shape
            self.plan_info.update(plan_source="deferred", plan_note=session.plan_note)
        else:
            served = self._warm(base)
            self.plan_info.update(served)
        self._start(base)

    def _describe_io(self) -> None:
        self.inputs = [TensorInfo(d.name, np.dtype(d.dtype),
                                  None if d.dims is None else [-1 if not isinstance(x, int) else x
                                                               for x in d.dims])
                       for d in self.session.declared]
        self.outputs = _declared_outputs(self.spec.path)

    def _start(self, base: Mapping[str, Sequence[int]] | None) -> None:
        """Start the request threads (each runs ``base`` once) and the dynamic batcher."""
        self._pool = ThreadPoolExecutor(max_workers=self.workers,
                                        thread_name_prefix=f"opdispatch-{self.name}")
        if base is not None:
            self._warm_workers(base)
        if len(self.batch_sizes) > 1:
            self._batcher = DynamicBatcher(self._run_group, self.batch_sizes,
                                           self.spec.settings.max_queue_delay_ms / 1000.0)

    # -- shape ranges --------------------------------------------------------------------------
    def _range_session(self) -> Any:
        """The session of the served range: its range plan loaded (``PlanNotFoundError``
        naming the ranges stored when there is none and untuned plans are not allowed; with
        ``tune_budget_s``, the range is tuned first)."""
        from dispatch.session import Session

        settings = self.spec.settings
        spec = {name: list(dims) for name, dims in settings.shapes.items()}

        def open_session() -> Any:
            return Session(str(self.spec.path), store=self.store, objective=settings.objective,
                           input_shapes=spec, require_plan=not settings.allow_untuned)

        try:
            return open_session()
        except PlanNotFoundError:
            if settings.tune_budget_s is None:
                raise
        from tuner.shapes.tune_range import tune_range

        tune_range(str(self.spec.path), spec, store=self.store, budget_s=settings.tune_budget_s,
                   objective=settings.objective)
        return open_session()

    def _load_range(self) -> None:
        """Serve every shape inside the range of the settings' ``shapes``."""
        settings = self.spec.settings
        session = self._range_session()
        self.session = session
        self._describe_io()
        shape_range = ShapeRange.bind(session.declared, settings.shapes)
        small, large = (shape_range.at(point) for point in shape_range.ends())
        for shapes in (small, large):
            self._run_zeros(session, shapes)
        self.shape_range = shape_range
        plan = session.plan
        config = plan.serving_config()
        self.workers = max(1, config.requests) if config is not None else LATENCY_WORKERS
        ranged = plan.range_plan() if session.plan_source == "store" else None
        if ranged is not None and ranged.notes.get("concurrency"):  # a throughput range plan
            self.workers = int(ranged.notes["concurrency"])
        key = self._range_key(shape_range) if ranged is not None else None
        self.plan_info = {
            "objective": settings.objective, "untuned": settings.allow_untuned,
            "model_file": str(self.spec.path),
            "plan_source": session.plan_source,
            "plan_note": session.plan_note,
            "plan_id": key.digest()[:16] if key is not None else None,
            "hardware": _hardware_digest(key),
            "serving": plan.serving,
            "shapes": {k: list(v) for k, v in settings.shapes.items()},
            "shape_range": shape_range.text(),
            "range_axes": shape_range.axes_text(),
            "range_ends": [small, large],
            "concurrency": self.workers,
        }
        if ranged is not None:
            self.plan_info["buckets"] = [{"lo": b.lo, "hi": b.hi, "way": b.way, "why": b.why}
                                         for b in ranged.buckets]
            self.plan_info["range_plan"] = ranged.describe()
        self.batch_sizes = self._range_batch_sizes(shape_range, config)
        self.plan_info["batch_sizes"] = self.batch_sizes
        self._start(small)

    def _range_key(self, shape_range: ShapeRange) -> Any:
        """The store key of the range plan served (its digest is the plan id ``opdispatch
        tune`` prints)."""
        from tuner.shapes.tune_range import range_key

        session = self.session
        try:
            return range_key(session.graph.family, shape_range, session.registry,
                             session._allowed_backends(), str(session.objective))
        except Exception:  # the id is for reports: never a reason not to serve
            return None

    def _range_batch_sizes(self, shape_range: ShapeRange, config: Any) -> list[int]:
        """The batch sizes the dynamic batcher may form for a range: those up to the limit
        that the range holds (its inputs' first dimension ranges over them), when the model
        has a symbolic batch dimension and the range holds batch 1. Only requests of the
        same shapes are grouped (:func:`tuner.serve.batcher.signature`): requests of
        different lengths are never concatenated."""
        limit = self.spec.settings.max_batch_size
        if limit is None:
            limit = (config.batch if config is not None else None) or 1
        if limit <= 1 or batch_dimension(self.session.declared) is None:
            return [1]
        firsts = [dims[0] for _, dims in shape_range.inputs if dims]
        if not firsts or not all(lo <= 1 <= hi for lo, hi in firsts):
            return [1]
        top = min(hi for _, hi in firsts)
        return sorted({1, *(s for s in (*_PROBED_SIZES, limit) if s <= min(limit, top))})

    def _served_shapes(self) -> dict[str, tuple[int, ...]] | None:
        """The input shapes served at batch 1: the settings', else the model's static ones."""
        shapes = dict(self.spec.settings.shapes)
        declared = {d.name: d for d in self.session.declared}
        unknown = sorted(set(shapes) - set(declared))
        if unknown:
            raise ArgumentError(f"shapes names unknown input(s) {', '.join(unknown)}; the "
                                f"inputs are {', '.join(declared)}")
        for name, d in declared.items():
            if name in shapes:
                continue
            if d.dims is not None and all(isinstance(x, int) for x in d.dims):
                shapes[name] = tuple(d.dims)
            elif self.spec.settings.allow_untuned:
                return None
            else:
                dims = ", ".join(str(x) for x in d.dims or ())
                raise ArgumentError(
                    f"input {name!r} has symbolic dimensions [{dims}]: name the shapes to serve "
                    f"(config.toml: shapes = {{ {name} = [1, ...] }}, or --shape {name}=1x...) and "
                    f"tune the model for them")
        return shapes

    def _warm(self, base: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
        """Load the plan of ``base`` (and of each batch size stored), run each once on zeros;
        returns the plan's metadata."""
        settings = self.spec.settings
        try:
            first = self.session.for_shapes(base)
        except PlanNotFoundError:
            if settings.tune_budget_s is None:
                raise
            self._tune(base)
            first = self.session.for_shapes(base)
        self._run_zeros(first, base)
        plan = first.plan
        config = plan.serving_config()
        self.workers = max(1, config.requests) if config is not None else LATENCY_WORKERS
        key = first.plan_key
        info: dict[str, Any] = {
            "plan_source": first.plan_source,
            "plan_note": first.plan_note,
            "plan_id": key.digest()[:16] if key is not None else None,
            "hardware": _hardware_digest(key),
            "serving": plan.serving,
            "shapes": {k: list(v) for k, v in base.items()},
            "concurrency": self.workers,
        }
        sizes = [1]
        limit = settings.max_batch_size  # None: the batch size the plan was tuned with
        if limit is None:
            limit = (config.batch if config is not None else None) or 1
        if (limit > 1 and batch_dimension(self.session.declared) is not None
                and all(s[0] == 1 for s in base.values())):
            for size in sorted({*(s for s in _PROBED_SIZES if s < limit), limit}):
                shapes = {k: (size, *v[1:]) for k, v in base.items()}
                try:
                    sized = self.session.for_shapes(shapes)
                except PlanNotFoundError:
                    continue
                if sized.plan_source == "store" or settings.allow_untuned:
                    self._run_zeros(sized, shapes)
                    sizes.append(size)
        self.batch_sizes = sizes
        info["batch_sizes"] = sizes
        return info

    def _tune(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        """No plan for this machine and ``tune_budget_s`` set: tune ``shapes`` into the store."""
        from dispatch.session import Session

        settings = self.spec.settings
        Session(str(self.spec.path), store=self.store, objective=settings.objective,
                input_shapes=shapes).tune(budget_s=settings.tune_budget_s)
        self.session = Session(str(self.spec.path), store=self.store,
                               objective=settings.objective, require_plan=True)

    def _warm_workers(self, base: Mapping[str, tuple[int, ...]]) -> None:
        """Start every request thread and run the plan on all of them at once, before the
        model is ready: a library's state for a run in flight (an OpenVINO infer request and
        its buffers, one per run at once on each stream) is made when a run first needs it,
        one at a time, so without this the first requests under load wait behind up to
        ``workers`` first runs. Measured on minilm served at 16 in flight (the AVX2 machine):
        a p99 of 2.0 s against a p50 of 0.35 s, the in-process plan's p99 being 0.40 s."""
        assert self._pool is not None
        session = self.session.for_shapes(base)
        # each task waits until all have started, so that each runs on a thread of its own
        started = threading.Barrier(self.workers)

        def warm() -> str:
            started.wait(timeout=_WARM_TIMEOUT_S)
            self._run_zeros(session, base)
            return threading.current_thread().name

        self.warm_threads = [done.result()
                             for done in [self._pool.submit(warm) for _ in range(self.workers)]]

    @staticmethod
    def _run_zeros(session: Any, shapes: Mapping[str, tuple[int, ...]]) -> None:
        feeds = {d.name: np.zeros(shapes[d.name], dtype=d.dtype) for d in session.declared}
        session.run(None, feeds)

    # -- serving -------------------------------------------------------------------------------
    async def infer(self, feeds: Mapping[str, Any],
                    output_names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Run one request; returns ``{output name: array}`` (all outputs, or those named)."""
        if not self.ready:
            raise ModelUnavailable(f"model {self.name!r} is not ready: {self.reason}")
        limit = self.spec.settings.max_queue
        if self._draining or self._admitted >= limit:
            metrics.REQUESTS.labels(self.name, "rejected").inc()
            why = ("it is shutting down" if self._draining else
                   f"{self._admitted} requests are admitted already (max_queue = {limit})")
            raise Overloaded(f"model {self.name!r} cannot take the request now: {why}; retry later")
        self._admitted += 1
        metrics.IN_FLIGHT.labels(self.name).inc()
        admitted_at = time.perf_counter()
        outcome = "failed"
        try:
            checked, names = self._check(feeds, output_names)
            if self._batcher is not None and all(a.shape[:1] == (1,) for a in checked.values()):
                outputs = await self._batcher.submit(checked)
            else:
                loop = asyncio.get_running_loop()
                outputs = await loop.run_in_executor(self._pool, self._run_one, checked,
                                                     admitted_at)
            outcome = "ok"
            by_name = dict(zip((o.name for o in self.outputs), outputs))
            return {n: by_name[n] for n in names}
        except (FeedError, ArgumentError, PlanNotFoundError) as exc:
            outcome = "invalid"
            raise InvalidRequest(f"model {self.name!r}: {exc}") from None
        finally:
            self._admitted -= 1
            metrics.IN_FLIGHT.labels(self.name).dec()
            metrics.REQUESTS.labels(self.name, outcome).inc()
            metrics.REQUEST_SECONDS.labels(self.name).observe(time.perf_counter() - admitted_at)

    def _check(self, feeds: Mapping[str, Any], output_names: Sequence[str] | None
               ) -> tuple[dict[str, np.ndarray], list[str]]:
        checked = check_declared_feeds(self.session.declared, feeds)
        if self.shape_range is not None:
            shapes = tuple((d.name, tuple(checked[d.name].shape)) for d in self.session.declared)
            why = self.shape_range.why_not(shapes)
            if why is not None:
                raise FeedError(f"input shapes {format_shapes(shapes)} lie outside the shape range "
                                f"served, {self.shape_range.text()} ({self.shape_range.axes_text()}): "
                                f"{why}")
        known = [o.name for o in self.outputs]
        if not output_names:
            return checked, known
        unknown = [n for n in output_names if n not in known]
        if unknown:
            raise FeedError(f"unknown output(s) {unknown}; the outputs are {known}")
        return checked, list(output_names)

    def _run_one(self, feeds: Mapping[str, np.ndarray], admitted_at: float) -> list[np.ndarray]:
        metrics.QUEUE_SECONDS.labels(self.name).observe(time.perf_counter() - admitted_at)
        metrics.BATCH_SIZE.labels(self.name).observe(1)
        with _backend_timing(self.name):
            return self.session.run(None, feeds)

    def _run_batch(self, group: Sequence[Queued]) -> list[Any]:
        now = time.perf_counter()
        for item in group:
            metrics.QUEUE_SECONDS.labels(self.name).observe(now - item.queued_at)
        metrics.BATCH_SIZE.labels(self.name).observe(len(group))
        with _backend_timing(self.name):
            return self.session.run_batch([item.feeds for item in group])

    async def _run_group(self, group: Sequence[Queued]) -> None:
        loop = asyncio.get_running_loop()
        results = await loop.run_in_executor(self._pool, self._run_batch, group)
        for item, result in zip(group, results):
            if item.future.done():
                continue
            if isinstance(result, Exception):
                item.future.set_exception(result)
            else:
                item.future.set_result(result)

    def stop_admitting(self) -> None:
        """Refuse new requests from now on (503: shutting down); those admitted go on."""
        self._draining = True

    def close(self) -> None:
        """Release the request threads once the requests in flight are answered."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    async def drain(self, grace_s: float = 30.0) -> None:
        """Stop admitting requests, answer those admitted (up to ``grace_s``), release the
        threads."""
        self.stop_admitting()
        if self._batcher is not None:
            await self._batcher.drain()
        deadline = time.monotonic() + grace_s
        while self._admitted and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=False)
        self.ready = False
        self.reason = "shut down"
        metrics.READY.labels(self.name).set(0)


class _backend_timing:
    """Collect the time of every executor call made inside it, per backend, into the
    ``opdispatch_backend_seconds_total`` counter."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.seconds: dict[str, float] = {}

    def __enter__(self) -> _backend_timing:
        self._token = BACKEND_SECONDS.set(self.seconds)
        return self

    def __exit__(self, *exc: object) -> None:
        BACKEND_SECONDS.reset(self._token)
        for backend, seconds in self.seconds.items():
            metrics.BACKEND_SECONDS.labels(self.model, backend).inc(seconds)


def _hardware_digest(key: Any) -> str | None:
    """The hardware fingerprint's digest of a plan key (what a plan was tuned for)."""
    if key is None:
        return None
    from tuner.fingerprint import hardware_digest

    return hardware_digest(key.hardware)[:16]


def _declared_outputs(path: Any) -> list[TensorInfo]:
    """The model's outputs as its file declares them (symbolic dimensions as -1)."""
    import onnx
    from onnx import helper

    model = onnx.load(str(path), load_external_data=False)
    infos = []
    for out in model.graph.output:
        tensor = out.type.tensor_type
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type))
        shape = ([d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]
                 if tensor.HasField("shape") else None)
        infos.append(TensorInfo(out.name, dtype, shape))
    return infos
