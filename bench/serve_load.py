"""A bounded load generator for an Open Inference Protocol server on this machine (the serving
bench, bench/test_bench_serve.py, issue 32).

It talks to ``http://127.0.0.1:PORT`` only (any other host is refused: a load generator must
not be pointed at a machine by mistake) with the binary tensor data extension, one client (one
kept-alive connection) per thread: by default Triton's request encoded once by Triton's own
client and re-sent as it is (bench/raw_infer_client.py, which says why: the generator shares
the cores it measures), or Triton's HTTP client for every request (``--client triton``). It
sends random inputs made from the model's metadata (``GET /v2/models/NAME``; a symbolic
dimension, ``-1`` there, takes the shape the caller names).

Two modes, each bounded in time and in requests:

* closed loop (:func:`run_closed`): C threads, each with one request in flight, sending the
  next as soon as the previous one is answered, for a warm-up (not counted) then a window of
  ``duration_s`` seconds or until ``max_requests`` requests completed in it, whichever comes
  first. A request counts when it completes inside the window, wherever it started, and the
  throughput is each thread's counted requests over their span, summed
  (``tuner.throughput.load.closed_loop_rate``, as ``tuner.throughput.load.run_load`` measures,
  so that in-process and served figures compare).
* open loop (:func:`run_open`): requests sent at a fixed rate (one every ``1 / rate`` seconds)
  by a pool of sender threads, whatever the answers take; the latency of a request is counted
  from the time it was due, so a request that waited for a free sender shows the wait (no
  coordinated omission). The figures are those of the requests due inside the window.

Every request's start, end and outcome is recorded (:attr:`LoadReport.records`); the report
gives the throughput (requests completed in the window / the window), the p50/p90/p99 latency
of the successful ones and the errors (all of them, warm-up included, with the first error's
text).

    python bench/serve_load.py --url 127.0.0.1:8080 --model resnet50 --concurrency 4 \\
        --duration 5 --max-requests 10000 --warmup 1 --json -
    python bench/serve_load.py --url 127.0.0.1:8080 --model resnet50 --rate 20 --duration 5
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from tuner.throughput.load import LoadResult, closed_loop_rate, latency_figures

#: the only host a load is sent to
LOOPBACK = "127.0.0.1"
#: the clients a load is sent with (bench/raw_infer_client.py; Triton's HTTP client)
CLIENTS = ("raw", "triton")
#: a thread whose request failed waits this long before the next one (no busy loop on a
#: refused connection)
ERROR_PAUSE_S = 0.01
#: a closed-loop thread stops after this many requests beyond ``max_requests`` (warm-up and
#: failures included): a bound on its loop besides the time
MAX_UNCOUNTED = 200_000


class LoadError(ValueError):
    """The load cannot be run as asked (a host that is not loopback, a missing shape, ...)."""


@dataclass
class Record:
    """One request: when it was due (open loop; its start in a closed loop), sent and answered
    (``time.perf_counter`` seconds), and its outcome (``None``: answered; else the error)."""

    thread: int
    due: float
    start: float
    end: float
    error: str | None = None


@dataclass
class LoadReport(LoadResult):
    """What a load run against a server measured (latencies in milliseconds): the figures of
    every load result (:class:`tuner.throughput.load.LoadResult`) and the serving run's own."""

    mode: str = "closed"
    model: str = ""
    #: the offered rate (open loop), requests per second; ``None`` in a closed loop
    rate: float | None = None
    #: requests sent in all (warm-up included)
    sent: int = 0
    #: open loop: requests sent more than 1 ms after they were due (no sender was free)
    late: int = 0
    warmup_s: float = 0.0
    #: CPU seconds the load generator itself used per second of the window
    client_cpu: float = 0.0
    records: list[Record] = field(default_factory=list, repr=False)

    def to_dict(self, records: bool = False) -> dict[str, Any]:
        """The figures as a dict (the per-request records only when asked)."""
        out = asdict(self)
        if not records:
            out.pop("records")
        return out

    def describe(self) -> str:
        """One line: throughput, latency percentiles, errors."""
        how = (f"{self.rate:.1f} requests/s offered" if self.mode == "open"
               else f"concurrency {self.concurrency}")
        text = (f"{self.model}: {self.throughput:.1f} inferences/s ({how}; {self.requests} "
                f"requests in {self.seconds:.2f} s); latency p50 {self.p50_ms:.2f} ms, "
                f"p90 {self.p90_ms:.2f} ms, p99 {self.p99_ms:.2f} ms; client CPU "
                f"{self.client_cpu:.2f} core(s)")
        if self.late:
            text += f"; {self.late} request(s) sent late"
        if self.errors:
            text += f"; {self.errors} request(s) failed: {self.error}"
        return text


def loopback_url(url: str) -> str:
    """``host:port`` of ``url`` (``127.0.0.1:8080`` or ``http://127.0.0.1:8080``); a host other
    than 127.0.0.1, or a scheme other than http, is refused with :class:`LoadError`."""
    text = url if "://" in url else f"http://{url}"
    parts = urlsplit(text)
    if parts.scheme != "http":
        raise LoadError(f"{url!r}: the load generator speaks plain HTTP to {LOOPBACK} only")
    try:
        port = parts.port
    except ValueError:
        raise LoadError(f"{url!r}: not a valid port") from None
    if parts.hostname != LOOPBACK:
        raise LoadError(f"{url!r}: the load generator sends load to {LOOPBACK} (this machine's "
                        f"loopback) only, not to {parts.hostname!r}")
    if port is None:
        raise LoadError(f"{url!r}: name the port, e.g. {LOOPBACK}:8080")
    if parts.path not in ("", "/") or parts.query:
        raise LoadError(f"{url!r}: give the server's address only ({LOOPBACK}:PORT)")
    return f"{LOOPBACK}:{port}"


def _client(url: str, timeout_s: float) -> Any:
    import tritonclient.http as httpclient

    return httpclient.InferenceServerClient(url, concurrency=1, connection_timeout=timeout_s,
                                            network_timeout=timeout_s)


def metadata(url: str, model: str, timeout_s: float = 60.0) -> dict[str, Any]:
    """``GET /v2/models/MODEL`` of the server at ``url`` (loopback only)."""
    url = loopback_url(url)
    client = _client(url, timeout_s)
    try:
        return client.get_model_metadata(model)
    except Exception as exc:
        raise LoadError(f"cannot read the metadata of model {model!r} at http://{url}: "
                        f"{type(exc).__name__}: {exc}") from None
    finally:
        client.close()


def random_feeds(meta: Mapping[str, Any], shapes: Mapping[str, Sequence[int]] | None = None,
                 seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random inputs for the model's metadata: floats uniform in [0, 1), integers in
    [0, 100) (token ids below any vocabulary size) except inputs whose name holds ``mask``
    (ones), booleans True. ``shapes`` gives the whole shape of an input whose metadata has a
    symbolic (``-1``) dimension (it must agree with the static ones)."""
    from tritonclient.utils import triton_to_np_dtype

    shapes = dict(shapes or {})
    names = [t["name"] for t in meta.get("inputs", [])]
    unknown = sorted(set(shapes) - set(names))
    if unknown:
        raise LoadError(f"shapes name unknown input(s) {unknown}; the model's inputs are {names}")
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for tensor in meta.get("inputs", []):
        name, declared = tensor["name"], [int(d) for d in tensor["shape"]]
        shape = [int(d) for d in shapes.get(name, declared)]
        if len(shape) != len(declared) or any(
                d != -1 and d != s for d, s in zip(declared, shape)) or min(shape, default=1) < 0:
            need = "x".join("N" if d == -1 else str(d) for d in declared)
            raise LoadError(f"input {name!r} has shape {declared} (-1: symbolic): give its "
                            f"shape as {name}={need} with every N a size")
        dtype = triton_to_np_dtype(tensor["datatype"])
        if dtype is None or np.dtype(dtype).kind not in "fiub":
            raise LoadError(f"input {name!r} is {tensor['datatype']}: random inputs are made "
                            f"for numeric and boolean inputs only")
        dtype = np.dtype(dtype)
        if dtype.kind == "f":
            feeds[name] = rng.random(shape, dtype=np.float32).astype(dtype)
        elif dtype.kind == "b" or "mask" in name.lower():
            feeds[name] = np.ones(shape, dtype)
        else:
            feeds[name] = rng.integers(0, 100, shape).astype(dtype)
    return feeds


class _Sender:
    """One thread's client and its encoded request (inputs encoded once, reused)."""

    def __init__(self, url: str, model: str, feeds: Mapping[str, np.ndarray],
                 outputs: Sequence[str], timeout_s: float) -> None:
        import tritonclient.http as httpclient
        from tritonclient.utils import np_to_triton_dtype

        self.model = model
        self.client = _client(url, timeout_s)
        self.inputs = []
        for name, array in feeds.items():
            tensor = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array, binary_data=True)
            self.inputs.append(tensor)
        self.outputs = [httpclient.InferRequestedOutput(n, binary_data=True) for n in outputs]

    def send(self) -> str | None:
        """One request; ``None`` when answered, else the error's text."""
        try:
            self.client.infer(self.model, self.inputs, outputs=self.outputs or None)
        except Exception as exc:  # any failure is an outcome to count, never raised here
            return f"{type(exc).__name__}: {exc}"[:500]
        return None

    def close(self) -> None:
        with contextlib.suppress(Exception):  # a client whose server went away
            self.client.close()


def _check(threads: int, duration_s: float, max_requests: int, warmup_s: float,
           what: str = "concurrency") -> None:
    if not 1 <= threads <= 1024:
        raise LoadError(f"{what} must be in [1, 1024], received {threads}")
    if not 0 < duration_s <= 3600:
        raise LoadError(f"duration must be in (0, 3600] seconds, received {duration_s}")
    if max_requests < 1:
        raise LoadError(f"max_requests must be at least 1, received {max_requests}")
    if not 0 <= warmup_s <= 600:
        raise LoadError(f"warm-up must be in [0, 600] seconds, received {warmup_s}")


def _senders(url: str, model: str, feeds: Mapping[str, np.ndarray] | None,
             shapes: Mapping[str, Sequence[int]] | None, count: int, timeout_s: float,
             seed: int, client: str = "raw",
             requests: Sequence[Mapping[str, np.ndarray]] = ()) -> list[Any]:
    if client not in CLIENTS:
        raise LoadError(f"unknown client {client!r}; the clients are {', '.join(CLIENTS)}")
    url = loopback_url(url)
    meta = metadata(url, model, timeout_s)
    if feeds is None and not requests:
        feeds = random_feeds(meta, shapes, seed)
    outputs = [t["name"] for t in meta.get("outputs", [])]
    if requests:  # mixed shapes: every thread sends them all in turn, from its own offset
        if client != "raw":
            raise LoadError("mixed requests go with the raw client (each encoded once)")
        from bench.raw_infer_client import RawInferClient

        n = len(requests)
        return [RawInferClient(url, model, [requests[(k * n // count + j) % n] for j in range(n)],
                               outputs, timeout_s) for k in range(count)]
    if client == "raw":
        from bench.raw_infer_client import RawInferClient

        return [RawInferClient(url, model, feeds, outputs, timeout_s) for _ in range(count)]
    return [_Sender(url, model, feeds, outputs, timeout_s) for _ in range(count)]


def _report(mode: str, model: str, concurrency: int, rate: float | None,
            records: list[Record], counted: list[Record], window: float, warmup_s: float,
            cpu_s: float, late: int = 0) -> LoadReport:
    ok = np.array([r.end - r.due for r in counted if r.error is None], dtype=np.float64) * 1e3
    failed = [r for r in records if r.error is not None]
    p50, p90, p99, mean = latency_figures(ok)
    window = max(window, 1e-9)
    done = sum(1 for r in counted if r.error is None)
    return LoadReport(mode=mode, model=model, concurrency=concurrency, rate=rate,
                      requests=done, seconds=window, throughput=done / window, p50_ms=p50,
                      p90_ms=p90, p99_ms=p99, mean_ms=mean, errors=len(failed),
                      error=failed[0].error if failed else None, sent=len(records), late=late,
                      warmup_s=warmup_s, client_cpu=cpu_s / window, records=records)


def run_closed(url: str, model: str, concurrency: int, duration_s: float, max_requests: int,
               *, warmup_s: float = 1.0, feeds: Mapping[str, np.ndarray] | None = None,
               shapes: Mapping[str, Sequence[int]] | None = None, timeout_s: float = 60.0,
               seed: int = 0, client: str = "raw",
               requests: Sequence[Mapping[str, np.ndarray]] = ()) -> LoadReport:
    """``concurrency`` threads, one request in flight each, for ``warmup_s`` (not counted) then
    ``duration_s`` seconds or ``max_requests`` requests completed in the window, whichever
    comes first (see the module docstring). ``feeds`` default to :func:`random_feeds` of the
    model's metadata (``shapes`` for its symbolic dimensions); ``requests`` (feeds of mixed
    shapes) are sent by every thread in turn instead, each from its own offset. A thread stops
    at the end of the window; a request then in flight is finished (at most ``timeout_s``)
    and not counted."""
    _check(concurrency, duration_s, max_requests, warmup_s)
    senders = _senders(url, model, feeds, shapes, concurrency, timeout_s, seed, client,
                       requests)
    lock = threading.Lock()
    records: list[list[Record]] = [[] for _ in range(concurrency)]
    state = {"counted": 0}
    done = threading.Event()
    ready = threading.Barrier(concurrency + 1)
    times: dict[str, float] = {}

    def worker(k: int) -> None:
        mine, sender = records[k], senders[k]
        ready.wait()
        start_at = times["start"]
        while not done.is_set() and len(mine) < max_requests + MAX_UNCOUNTED:
            t0 = time.perf_counter()
            error = sender.send()
            t1 = time.perf_counter()
            mine.append(Record(k, t0, t0, t1, error))
            if t1 > times["stop"]:  # completed after the window: not counted
                done.set()
                return
            if error is not None:
                time.sleep(ERROR_PAUSE_S)
            elif t1 >= start_at:
                with lock:
                    state["counted"] += 1
                    if state["counted"] >= max_requests:
                        times["stop"] = t1
                        done.set()
                        return

    threads = [threading.Thread(target=worker, args=(k,), daemon=True, name=f"serve-load-{k}")
               for k in range(concurrency)]
    for t in threads:
        t.start()
    times["start"] = time.perf_counter() + warmup_s
    times["stop"] = times["start"] + duration_s
    ready.wait()
    time.sleep(max(0.0, times["start"] - time.perf_counter()))
    cpu0 = time.process_time()
    done.wait(max(0.0, times["stop"] - time.perf_counter()))
    cpu_s = time.process_time() - cpu0
    deadline = times["start"] + duration_s + timeout_s + 5.0
    for t in threads:
        t.join(max(0.0, deadline - time.perf_counter()))
    done.set()
    hung = sum(t.is_alive() for t in threads)
    for sender in senders:
        sender.close()
    every = sorted((r for mine in records for r in mine), key=lambda r: r.start)
    stop = min(times["stop"], time.perf_counter())
    counted = [r for r in every if times["start"] <= r.end <= stop]
    report = _report("closed", model, concurrency, None, every, counted, stop - times["start"],
                     warmup_s, cpu_s)
    if hung:
        report.errors += hung
        report.error = report.error or f"{hung} thread(s) still waiting after {timeout_s} s"
    rate = closed_loop_rate([[(r.start, r.end) for r in counted if r.thread == k]
                             for k in range(concurrency)])
    if rate is not None and not report.errors:
        report.throughput = rate
    return report


def run_open(url: str, model: str, rate: float, duration_s: float, max_requests: int, *,
             warmup_s: float = 1.0, workers: int = 32,
             feeds: Mapping[str, np.ndarray] | None = None,
             shapes: Mapping[str, Sequence[int]] | None = None, timeout_s: float = 60.0,
             seed: int = 0, client: str = "raw") -> LoadReport:
    """Requests due every ``1 / rate`` seconds for ``warmup_s`` then ``duration_s`` seconds
    (at most ``max_requests`` of them in the window), sent by ``workers`` threads; latencies
    are counted from when each request was due (see the module docstring)."""
    _check(workers, duration_s, max_requests, warmup_s, "workers")
    if not 0 < rate <= 100_000:
        raise LoadError(f"rate must be in (0, 100000] requests per second, received {rate}")
    warm = math.ceil(rate * warmup_s)
    measured = min(max_requests, max(1, math.ceil(rate * duration_s)))
    total = warm + measured
    workers = min(workers, total)
    senders = _senders(url, model, feeds, shapes, workers, timeout_s, seed, client)
    lock = threading.Lock()
    state = {"next": 0}
    records: list[list[Record]] = [[] for _ in range(workers)]
    ready = threading.Barrier(workers + 1)
    times: dict[str, float] = {}

    def worker(k: int) -> None:
        mine, sender = records[k], senders[k]
        ready.wait()
        t0 = times["t0"]
        while True:
            with lock:
                i = state["next"]
                if i >= total:
                    return
                state["next"] = i + 1
            due = t0 + i / rate
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            start = time.perf_counter()
            error = sender.send()
            mine.append(Record(k, due, start, time.perf_counter(), error))

    threads = [threading.Thread(target=worker, args=(k,), daemon=True, name=f"serve-open-{k}")
               for k in range(workers)]
    for t in threads:
        t.start()
    times["t0"] = time.perf_counter() + 0.05
    ready.wait()
    start_at = times["t0"] + warm / rate
    window = measured / rate
    time.sleep(max(0.0, start_at - time.perf_counter()))
    cpu0 = time.process_time()
    time.sleep(max(0.0, start_at + window - time.perf_counter()))
    cpu_s = time.process_time() - cpu0
    deadline = times["t0"] + total / rate + timeout_s + 5.0
    for t in threads:
        t.join(max(0.0, deadline - time.perf_counter()))
    hung = sum(t.is_alive() for t in threads)
    for sender in senders:
        sender.close()
    every = sorted((r for mine in records for r in mine), key=lambda r: r.due)
    counted = [r for r in every if r.due >= start_at - 1e-9]
    report = _report("open", model, workers, rate, every, counted, window, warmup_s, cpu_s,
                     late=sum(1 for r in counted if r.start - r.due > 1e-3))
    # achieved throughput: the window's requests answered, over the window or, when the last
    # of them was answered after it (the server fell behind), until that answer
    end = max((r.end for r in counted if r.error is None), default=start_at + window)
    report.throughput = report.requests / max(window, end - start_at)
    if hung:
        report.errors += hung
        report.error = report.error or f"{hung} sender(s) still waiting after {timeout_s} s"
    return report


def _shape(text: str) -> tuple[str, list[int]]:
    name, sep, dims = text.rpartition("=")
    try:
        if not sep or not name:
            raise ValueError
        return name, [int(d) for d in dims.lower().split("x")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=1x128") from None


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring); returns the exit status (1 when a request
    failed)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help=f"the server, {LOOPBACK}:PORT (loopback only)")
    p.add_argument("--model", required=True, help="the model's name on the server")
    p.add_argument("--concurrency", type=int, default=1,
                   help="closed loop: threads, one request in flight each (default 1)")
    p.add_argument("--rate", type=float, default=None,
                   help="open loop instead: requests per second, sent whatever the answers take")
    p.add_argument("--workers", type=int, default=32,
                   help="open loop: sender threads (default 32)")
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds (default 5)")
    p.add_argument("--max-requests", type=int, default=100_000,
                   help="at most this many requests counted in the window (default 100000)")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds not counted (default 1)")
    p.add_argument("--shape", type=_shape, action="append", default=[], metavar="NAME=1x128",
                   help="the shape of an input with symbolic dimensions")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds one request may take (default 60)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--client", choices=CLIENTS, default="raw",
                   help="raw: Triton's request encoded once, re-sent on a kept-alive "
                        "connection (bench/raw_infer_client.py, the default); triton: "
                        "Triton's HTTP client for every request")
    p.add_argument("--json", default=None, metavar="FILE",
                   help="write the figures as JSON ('-': stdout)")
    p.add_argument("--records", action="store_true",
                   help="with --json: every request's times and outcome too")
    args = p.parse_args(argv)
    shapes = dict(args.shape)
    try:
        if args.rate is not None:
            report = run_open(args.url, args.model, args.rate, args.duration, args.max_requests,
                              warmup_s=args.warmup, workers=args.workers, shapes=shapes,
                              timeout_s=args.timeout, seed=args.seed,
                              client=args.client)
        else:
            report = run_closed(args.url, args.model, args.concurrency, args.duration,
                                args.max_requests, warmup_s=args.warmup, shapes=shapes,
                                timeout_s=args.timeout, seed=args.seed,
                                client=args.client)
    except LoadError as exc:
        print(f"serve_load: error: {exc}", file=sys.stderr)
        return 2
    print(report.describe(), file=sys.stderr)
    if args.json:
        text = json.dumps(report.to_dict(records=args.records))
        if args.json == "-":
            print(text, flush=True)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    return 1 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
