"""Token generation over HTTP for the decoder models of the repository (issue 53): the generate
extension of KServe's REST protocol, token ids in and out.

A served model is a decoder when :func:`dispatch.generation.decoder_io.read_decoder` accepts its
file (exported with its key/value cache). For each one the server answers:

- ``POST /v2/models/NAME/generate``: ``{"input_ids": [ids], "parameters": {"max_tokens": N,
  "temperature", "top_k", "top_p", "seed", "stop_token_ids": [ids], "do_sample"}}`` gives
  ``{"model_name", "output_ids": [ids], "finish_reason": "length" | "stop", "timings"}``;
- ``POST /v2/models/NAME/generate_stream``: the same request, answered with Server-Sent Events:
  one ``data: {"token_id": T, "index": I}`` event per token as it is generated, then a last
  event with ``finish_reason``, ``output_ids`` and ``timings`` (``"error"`` and the message
  when the model failed mid-way).

Greedy unless ``do_sample`` is true, or ``temperature`` (> 0; 0 is greedy), ``top_k`` or
``top_p`` is given: then sampled as :class:`~dispatch.generation.sampling.Sampler` does, seeded
by ``seed`` (the same seed, the same tokens). A token of ``stop_token_ids`` ends the generation
and is the last one returned, as :meth:`dispatch.session.Session.generate` does. Text needs a
tokenizer, which the project does not ship: a ``text_input`` is refused (400) asking for ids.

Each decoder has a :class:`GenerationPool`: at most :data:`POOL_SIZE` generations run at once,
each on a :class:`~dispatch.generation.generate.Generator` of the pool (built once, the first
before the server answers, then reused: the model is compiled once per pool slot, never per
request) in a worker thread of the pool, never on the event loop; more requests wait for a slot,
up to the model's ``max_queue`` admitted (503 beyond). The generator runs the stored generation
plan (``opdispatch tune MODEL --generate N``: :func:`tuner.generation.tune_generate.
stored_generation_plan`) when there is one for this machine, else the untuned default step way;
the model's metadata says which (``parameters.generate_plan``, ``generate_ways``). A client that
disconnects mid-stream stops its generation: the route checks ``request.is_disconnected()``
between tokens, and the worker checks the request's cancel flag before each step.

Nothing here imports the server framework at module level; :func:`add_generate_routes` adds the
two routes to the framework's FastAPI application through FastAPI's public API.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dispatch.generation.decoder_io import DecoderIO
from dispatch.generation.generate import Generator
from dispatch.generation.sampling import Sampler
from tuner.serve import metrics

logger = logging.getLogger(__name__)

#: generations of one model running at once (its generators; more requests wait)
POOL_SIZE = 2
#: the positions (prompt plus new tokens) one generation holds at most
CAPACITY = 1024
#: the new tokens of a request that names no ``max_tokens``
DEFAULT_MAX_TOKENS = 16
#: the request's keys, and its parameters' keys
REQUEST_KEYS = ("input_ids", "parameters", "id")
PARAMETER_KEYS = ("max_tokens", "temperature", "top_k", "top_p", "seed", "stop_token_ids",
                  "do_sample")
EXPECTED = ('a JSON object {"input_ids": [token ids], "parameters": {"max_tokens": N, '
            '"temperature": T, "top_k": K, "top_p": P, "seed": S, "stop_token_ids": [ids]}}')


class BadRequest(ValueError):
    """The client's mistake (HTTP 400); the message names what was received and expected."""


class Unavailable(RuntimeError):
    """The model cannot take the request now (HTTP 503): not ready, queue full, stopping."""


@dataclass(frozen=True)
class GenerateRequest:
    """One checked request."""

    input_ids: list[int]
    max_tokens: int
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)
    request_id: Any = None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _ids(value: Any, what: str, vocab: int) -> list[int]:
    """``value`` as token ids of the vocabulary (a list of integers; one row ``[[...]]`` too)."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], list):
        value = value[0]  # batch 1 as [[ids]]
    if not isinstance(value, list) or not all(_is_int(v) for v in value):
        raise BadRequest(f"{what} must be a list of integer token ids, received "
                         f"{json.dumps(value)[:200]}")
    outside = sorted({v for v in value if not 0 <= v < vocab})
    if outside:
        raise BadRequest(f"{what} holds token ids outside the vocabulary 0..{vocab - 1}: "
                         f"{', '.join(map(str, outside[:10]))}" + (" ..." if len(outside) > 10 else ""))
    return list(value)


def parse_request(body: bytes, vocab: int, capacity: int) -> GenerateRequest:
    """The request in ``body`` checked against a decoder of ``vocab`` tokens holding ``capacity``
    positions; :class:`BadRequest` naming what was received and what is expected."""
    try:
        data = json.loads(body or b"null")
    except ValueError as exc:
        raise BadRequest(f"the body is not JSON ({exc}); expected {EXPECTED}") from None
    if not isinstance(data, dict):
        raise BadRequest(f"received a JSON {type(data).__name__}; expected {EXPECTED}")
    if "text_input" in data:
        raise BadRequest("text_input: text needs a tokenizer, which opdispatch does not ship; send "
                         "the prompt's token ids as input_ids (tokenize it on the client) and "
                         "decode output_ids there; expected " + EXPECTED)
    unknown = sorted(set(data) - set(REQUEST_KEYS))
    if unknown:
        raise BadRequest(f"unknown key(s) {', '.join(unknown)}; the keys are "
                         f"{', '.join(REQUEST_KEYS)}: expected {EXPECTED}")
    if "input_ids" not in data:
        raise BadRequest(f"no input_ids; expected {EXPECTED}")
    ids = _ids(data["input_ids"], "input_ids", vocab)
    if not ids:
        raise BadRequest("input_ids is empty: a generation starts from at least one token")
    params = data.get("parameters") or {}
    if not isinstance(params, dict):
        raise BadRequest(f"parameters must be a JSON object, received {json.dumps(params)[:200]}")
    unknown = sorted(set(params) - set(PARAMETER_KEYS))
    if unknown:
        raise BadRequest(f"unknown parameter(s) {', '.join(unknown)}; the parameters are "
                         f"{', '.join(PARAMETER_KEYS)}")
    max_tokens = params.get("max_tokens", DEFAULT_MAX_TOKENS)
    if not _is_int(max_tokens) or max_tokens < 1:
        raise BadRequest(f"max_tokens must be an integer >= 1, received {json.dumps(max_tokens)}")
    if len(ids) + max_tokens > capacity:
        raise BadRequest(f"max_tokens {max_tokens} after a prompt of {len(ids)} tokens needs "
                         f"{len(ids) + max_tokens} positions; a generation holds at most {capacity}"
                         f" (at most {max(capacity - len(ids), 0)} new tokens for this prompt)")
    temperature = params.get("temperature", 1.0)
    if not _is_number(temperature) or temperature < 0:
        raise BadRequest(f"temperature must be a number >= 0 (0: greedy), received "
                         f"{json.dumps(temperature)}")
    top_k = params.get("top_k", 0)
    if not _is_int(top_k) or top_k < 0:
        raise BadRequest(f"top_k must be an integer >= 0 (0: every token), received {json.dumps(top_k)}")
    top_p = params.get("top_p", 1.0)
    if not _is_number(top_p) or not 0 < top_p <= 1:
        raise BadRequest(f"top_p must be a number in (0, 1], received {json.dumps(top_p)}")
    seed = params.get("seed")
    if seed is not None and (not _is_int(seed) or seed < 0):
        raise BadRequest(f"seed must be an integer >= 0, received {json.dumps(seed)}")
    stops = _ids(params.get("stop_token_ids", []), "stop_token_ids", vocab)
    do_sample = params.get("do_sample")
    if do_sample is not None and not isinstance(do_sample, bool):
        raise BadRequest(f"do_sample must be true or false, received {json.dumps(do_sample)}")
    if do_sample is None:
        do_sample = any(k in params for k in ("temperature", "top_k", "top_p")) and temperature != 0
    if do_sample and temperature == 0:
        raise BadRequest("do_sample with temperature 0: sampling needs a temperature > 0 "
                         "(temperature 0 is greedy)")
    return GenerateRequest(ids, max_tokens, do_sample, float(temperature) if do_sample else 1.0,
                           top_k, float(top_p), seed, frozenset(stops), data.get("id"))


def generate_tokens(gen: Generator, request: GenerateRequest, emit: Callable[[int], None],
                    cancelled: threading.Event) -> tuple[str, dict[str, float]]:
    """Run ``request`` on ``gen`` (in a worker thread), calling ``emit`` with each token as it is
    chosen; stops before the next step once ``cancelled`` is set. The loop of
    :meth:`~dispatch.generation.generate.Generator.generate` (same sampler, same order): the same
    tokens. Returns the finish reason (``"length"``, ``"stop"``, ``"cancelled"``) and timings."""
    sampler = Sampler(do_sample=request.do_sample, temperature=request.temperature,
                      top_k=request.top_k, top_p=request.top_p, seed=request.seed)
    t0 = time.perf_counter()
    logits = gen.prefill(request.input_ids)
    t_prompt = time.perf_counter()
    t_first = t_prompt
    reason, count = "length", 0
    for i in range(request.max_tokens):
        if cancelled.is_set():
            reason = "cancelled"
            break
        token = int(sampler.choose(logits[0, -1]))
        emit(token)
        count += 1
        if i == 0:
            t_first = time.perf_counter()
        if token in request.stop_token_ids:
            reason = "stop"
            break
        if i + 1 < request.max_tokens:
            logits = gen.step([token])
    t_end = time.perf_counter()
    steps = max(count - 1, 0)
    return reason, {"prompt_ms": round((t_prompt - t0) * 1e3, 3),
                    "first_token_ms": round((t_first - t0) * 1e3, 3),
                    "total_ms": round((t_end - t0) * 1e3, 3),
                    "tokens": count,
                    "tokens_per_s": round(steps / (t_end - t_first), 2) if steps and t_end > t_first
                    else None}


class Job:
    """One admitted generation as the event loop sees it: the tokens and the end arrive on a
    queue from the worker thread; :meth:`cancel` stops the worker before its next step."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
        self.cancelled = threading.Event()

    def post(self, *item: Any) -> None:
        """From the worker thread: hand ``item`` to the loop (a loop already closed: cancel)."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:
            self.cancelled.set()

    def cancel(self) -> None:
        self.cancelled.set()

    async def events(self) -> AsyncIterator[tuple[Any, ...]]:
        """``("token", id)`` per token, then ``("end", reason, timings)`` or ``("error", msg)``."""
        while True:
            item = await self.queue.get()
            yield item
            if item[0] != "token":
                return


class GenerationPool:
    """The generators of one decoder model (see the module docstring).

    Args:
        name: the served model's name.
        io: the decoder's signature.
        make: builds one generator holding ``capacity`` positions (the stored plan's ways, or
            the default way).
        info: what the model's metadata says about generation (the ways, where they came from).
        size: generators, and generations running at once.
        capacity: positions (prompt plus new tokens) a generation holds at most.
        max_queue: generations admitted at once, waiting or running (503 beyond).
    """

    def __init__(self, name: str, io: DecoderIO, make: Callable[[], Generator], info: Mapping[str, Any],
                 *, size: int = POOL_SIZE, capacity: int = CAPACITY, max_queue: int = 64) -> None:
        self.name = name
        self.io = io
        self.make = make
        self.info = dict(info)
        self.size = size
        self.capacity = capacity
        self.max_queue = max(max_queue, size)
        self.ready = False
        self.reason = "not loaded yet"
        self._idle: list[Generator] = []
        self._lock = threading.Lock()
        self._admitted = 0
        self._stopping = False
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=size, thread_name_prefix=f"opdispatch-generate-{name}")

    def load(self) -> bool:
        """Build the first generator and run a one-token prompt on it; never raises (a pool that
        cannot generate is not ready and :attr:`reason` says why)."""
        try:
            gen = self.make()
            gen.prefill([0])
            gen.reset()
            self._idle.append(gen)
            self.ready, self.reason = True, ""
        except Exception as exc:
            logger.exception("model %s: its generator could not be built", self.name)
            self.ready, self.reason = False, f"{type(exc).__name__}: {exc}"
        return self.ready

    def describe(self) -> dict[str, Any]:
        """The model metadata's generation parameters."""
        return {"generate": True, "generate_ready": self.ready, "generate_reason": self.reason,
                **self.info, "generate_capacity": self.capacity, "generate_concurrency": self.size,
                "generate_routes": [f"/v2/models/{self.name}/generate",
                                    f"/v2/models/{self.name}/generate_stream"]}

    def stop_admitting(self) -> None:
        self._stopping = True

    def close(self) -> None:
        """Stop the worker threads (generations still waiting are dropped)."""
        self._stopping = True
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _lease(self) -> Generator:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return self.make()  # at most `size` worker threads: at most `size` generators

    def _release(self, gen: Generator) -> None:
        gen.reset()
        with self._lock:
            self._idle.append(gen)

    def start(self, request: GenerateRequest) -> Job:
        """Admit ``request`` and queue it for a worker thread; :class:`Unavailable` when the
        model is not ready, stopping, or has ``max_queue`` generations admitted."""
        if not self.ready:
            raise Unavailable(f"model {self.name!r} cannot generate: {self.reason}")
        if self._stopping:
            raise Unavailable(f"model {self.name!r} is shutting down")
        with self._lock:
            if self._admitted >= self.max_queue:
                raise Unavailable(f"model {self.name!r} has {self._admitted} generations admitted "
                                  f"(max_queue {self.max_queue}); retry later")
            self._admitted += 1
        job = Job(asyncio.get_running_loop())
        queued = time.perf_counter()
        try:
            self._executor.submit(self._work, job, request, queued)
        except RuntimeError:  # the executor was shut down
            with self._lock:
                self._admitted -= 1
            raise Unavailable(f"model {self.name!r} is shutting down") from None
        return job

    def _work(self, job: Job, request: GenerateRequest, queued: float) -> None:
        """One generation, in a worker thread: every outcome ends with an ``end`` or ``error``."""
        gen: Generator | None = None
        reason = "error"
        try:
            queue_ms = round((time.perf_counter() - queued) * 1e3, 3)
            if job.cancelled.is_set():  # the client left while it waited
                reason = "cancelled"
                job.post("end", reason, {"queue_ms": queue_ms, "tokens": 0})
                return
            gen = self._lease()
            reason, timings = generate_tokens(gen, request, lambda t: job.post("token", t),
                                              job.cancelled)
            metrics.GENERATED_TOKENS.labels(self.name).inc(timings["tokens"])
            job.post("end", reason, {"queue_ms": queue_ms, **timings})
        except Exception as exc:  # the model failed: the client hears why, the server goes on
            logger.exception("model %s failed a generation", self.name)
            job.post("error", f"{type(exc).__name__}: {exc}")
        finally:
            metrics.GENERATIONS.labels(self.name, reason).inc()
            if gen is not None:
                self._release(gen)
            with self._lock:
                self._admitted -= 1


def _stored_plan_generator(spec: Any, store: str | None, io: DecoderIO, capacity: int
                           ) -> tuple[Callable[[], Generator], dict[str, Any]]:
    """How the pool of ``spec``'s decoder builds a generator: the stored generation plan's ways
    when there is one, else the default step way; and what the metadata says of it."""
    from dispatch.backend import load_registry
    from dispatch.config import Config
    from dispatch.generation.planned import planned_generator
    from dispatch.generation.ways import default_step_way

    config = Config.load({"store_path": store})
    registry = load_registry(config.plugin_path or None, order=config.backend_order)
    objective = str(spec.settings.objective)
    objective = objective if objective.startswith("latency") else "latency"
    try:
        from tuner.generation.tune_generate import stored_generation_plan

        plan, note = stored_generation_plan(str(spec.path), config.store_path, registry, objective)
    except Exception as exc:  # a store that cannot be read: the default way, saying why
        plan, note = None, f"no generation plan read ({type(exc).__name__}: {exc})"
    if plan is not None:
        info = {"generate_plan": note, "generate_ways": {"prompt": plan.prefill.label(),
                                                         "steps": plan.decode.label()},
                "generate_precision": plan.precision}
        return (lambda: planned_generator(str(spec.path), plan, max_length=capacity,
                                          registry=registry, io=io)), info
    way = default_step_way(registry)
    info = {"generate_plan": f"untuned: the default step way {way.name} ({note}; tune it with "
                             f"opdispatch tune {spec.path} --generate N)",
            "generate_ways": {"prompt": way.name, "steps": way.name}}
    return (lambda: Generator(str(spec.path), way, max_length=capacity, io=io)), info


def generation_pools(runners: Sequence[Any], *, size: int = POOL_SIZE, capacity: int = CAPACITY
                     ) -> tuple[dict[str, GenerationPool], dict[str, str]]:
    """The generation pool of every decoder among ``runners``' models (each loaded: its first
    generator built and run once), and for every other model why it is not a decoder."""
    from dispatch.errors import OpDispatchError
    from dispatch.generation.decoder_io import read_decoder

    pools: dict[str, GenerationPool] = {}
    refused: dict[str, str] = {}
    for runner in runners:
        spec = runner.spec
        try:
            io = read_decoder(str(spec.path))
        except OpDispatchError as exc:
            refused[spec.name] = str(exc)
            continue
        try:
            make, info = _stored_plan_generator(spec, runner.store, io, capacity)
        except OpDispatchError as exc:  # no step way here (neither onnxruntime nor openvino)
            make, info = _refuse(exc), {"generate_plan": str(exc)}
        pool = GenerationPool(spec.name, io, make, info, size=size, capacity=capacity,
                              max_queue=spec.settings.max_queue)
        pool.load()
        pools[spec.name] = pool
    return pools, refused


def _refuse(exc: Exception) -> Callable[[], Generator]:
    def make() -> Generator:
        raise exc

    return make


def _sse(data: Mapping[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def add_generate_routes(app: Any, pools: Mapping[str, GenerationPool], refused: Mapping[str, str]
                        ) -> None:
    """``POST /v2/models/NAME/generate`` and ``.../generate_stream`` on the framework's FastAPI
    application (see the module docstring); ``refused``: ``{model name: why it is not a
    decoder}`` of the other served models (400 with the reason)."""
    from fastapi import Request
    from fastapi.responses import JSONResponse, Response, StreamingResponse

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse(status_code=status, content={"error": message})

    async def admit(request: Request, model_name: str) -> tuple[GenerationPool, Job, GenerateRequest
                                                                ] | Response:
        pool = pools.get(model_name)
        if pool is None:
            if model_name in refused:
                return error(400, f"model {model_name!r} does not generate: {refused[model_name]}")
            return error(404, f"Model with name {model_name} does not exist; served models: "
                              f"{', '.join(sorted({*pools, *refused})) or '(none)'}")
        try:
            checked = parse_request(await request.body(), pool.io.vocab, pool.capacity)
        except BadRequest as exc:
            return error(400, f"model {model_name!r}: {exc}")
        try:
            return pool, pool.start(checked), checked
        except Unavailable as exc:
            return error(503, str(exc))

    def final(pool: GenerationPool, checked: GenerateRequest, reason: str, timings: Any,
              tokens: list[int]) -> dict[str, Any]:
        out: dict[str, Any] = {"model_name": pool.name, "output_ids": tokens,
                               "finish_reason": reason, "timings": timings}
        if checked.request_id is not None:
            out["id"] = checked.request_id
        return out

    async def generate(request: Request, model_name: str) -> Response:
        admitted = await admit(request, model_name)
        if isinstance(admitted, Response):
            return admitted
        pool, job, checked = admitted
        tokens: list[int] = []
        try:
            async for item in job.events():
                if item[0] == "token":
                    tokens.append(item[1])
                elif item[0] == "end":
                    return JSONResponse(final(pool, checked, item[1], item[2], tokens))
                else:
                    return error(500, f"model {model_name!r} failed: {item[1]}")
        finally:
            job.cancel()  # a handler cancelled (shutdown) stops its generation
        return error(500, f"model {model_name!r}: the generation ended without an answer")

    async def generate_stream(request: Request, model_name: str) -> Response:
        admitted = await admit(request, model_name)
        if isinstance(admitted, Response):
            return admitted
        pool, job, checked = admitted

        async def events() -> AsyncIterator[bytes]:
            tokens: list[int] = []
            try:
                async for item in job.events():
                    if item[0] == "token":
                        if await request.is_disconnected():
                            return  # the finally stops the generation
                        yield _sse({"token_id": item[1], "index": len(tokens)})
                        tokens.append(item[1])
                    elif item[0] == "end":
                        yield _sse(final(pool, checked, item[1], item[2], tokens))
                    else:
                        yield _sse({"model_name": pool.name, "finish_reason": "error",
                                    "error": item[1], "output_ids": tokens})
            finally:
                job.cancel()

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    for handler in (generate, generate_stream):
        # FastAPI reads the parameters' types from the annotations: strings here (postponed
        # annotations), which it would look up in this module's globals, where it is not imported
        handler.__annotations__.update({"request": Request, "model_name": str, "return": Response})
    app.add_api_route("/v2/models/{model_name}/generate", generate, methods=["POST"],
                      response_model=None)
    app.add_api_route("/v2/models/{model_name}/generate_stream", generate_stream, methods=["POST"],
                      response_model=None)
