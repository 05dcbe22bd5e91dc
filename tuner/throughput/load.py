"""Measuring a model under load: N requests in flight from N threads, as a server runs it.

:func:`run_load` is the one load loop of the project: the throughput tuner compares serving
configurations with it (:mod:`tuner.throughput`), ``opdispatch run --concurrency N`` reports
it for a stored plan or a plain library (:mod:`tuner.throughput.library_load`), and the throughput bench
times every set-up through it. Like OpenVINO's ``benchmark_app``, each of the N threads sends
its next request as soon as its previous one returns; after a warm-up, requests are counted
for a fixed time (and at most a fixed number of them), and the figures are the completed
requests per second and the percentiles of their latencies.

Each thread's first request is a warm-up request, never counted (an OpenVINO infer request, a
stream's buffers, a session's thread pool: created on first use; ``benchmark_app`` runs a first
inference apart too). The requests counted are those that complete inside the window, wherever
they started.

Throughput is measured per thread, from the start of its first counted request to the end of its
last (:func:`closed_loop_rate`): in a closed loop a thread's requests run back to back, so that
span holds exactly its counted requests. Counting the completions in the window and dividing by
the window instead loses or gains up to a request per thread at the window's edges: with BERT-base
at 4 requests in flight (about 440 ms each) a 1.5 s window counts 12 to 16 of them, a +-15% figure
that decided the throughput tuner's choice among configurations (bench/README.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

#: the percentiles every load figure reports
PERCENTILES = (50, 90, 99)


def latency_figures(latencies_ms: Sequence[float] | np.ndarray) -> tuple[float, float, float, float]:
    """``(p50, p90, p99, mean)`` of request latencies in milliseconds, all NaN when there are
    none: the figures of every load result (:class:`LoadResult`, the serving bench's report)."""
    every = np.asarray(latencies_ms, dtype=np.float64)
    if not every.size:
        return (float("nan"),) * 4  # type: ignore[return-value]
    p50, p90, p99 = (float(np.percentile(every, q)) for q in PERCENTILES)
    return p50, p90, p99, float(every.mean())


@dataclass
class LoadResult:
    """What a load run measured."""

    concurrency: int
    #: requests completed in the measured window
    requests: int
    #: the measured window, seconds
    seconds: float
    #: completed requests per second
    throughput: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    #: requests that raised (their first error in :attr:`error`)
    errors: int = 0
    error: str | None = None

    @classmethod
    def measured(cls, concurrency: int, latencies_ms: Sequence[float] | np.ndarray, seconds: float,
                 throughput: float, errors: Sequence[str] = ()) -> LoadResult:
        """The result of a load whose counted requests took ``latencies_ms`` in a window of
        ``seconds`` (:func:`latency_figures`); ``errors``: what each failed request raised."""
        p50, p90, p99, mean = latency_figures(latencies_ms)
        return cls(concurrency=concurrency, requests=len(latencies_ms), seconds=seconds,
                   throughput=throughput, p50_ms=p50, p90_ms=p90, p99_ms=p99, mean_ms=mean,
                   errors=len(errors), error=errors[0] if errors else None)

    def to_dict(self) -> dict[str, Any]:
        """The figures as plain JSON values."""
        return asdict(self)

    def describe(self) -> str:
        """One line: throughput and the latency percentiles."""
        text = (f"{self.throughput:.1f} inferences/s at concurrency {self.concurrency} "
                f"({self.requests} requests in {self.seconds:.1f} s); latency p50 "
                f"{self.p50_ms:.2f} ms, p90 {self.p90_ms:.2f} ms, p99 {self.p99_ms:.2f} ms")
        if self.errors:
            text += f"; {self.errors} request(s) failed: {self.error}"
        return text


def closed_loop_rate(spans: list[list[tuple[float, float]]]) -> float | None:
    """Requests per second of a closed loop from each thread's counted requests, ``spans[k]``
    = ``[(start, end), ...]`` in order: the sum over threads of ``len / (last end - first
    start)``; ``None`` when a thread counted none (its rate is unknown: the caller divides the
    completions by the window instead)."""
    if not spans or any(not mine for mine in spans):
        return None
    total = 0.0
    for mine in spans:
        span = mine[-1][1] - mine[0][0]
        if span <= 0:
            return None
        total += len(mine) / span
    return total


def run_load(
    call: Callable[[int], Any],
    concurrency: int,
    duration_s: float,
    *,
    warmup_s: float = 0.3,
    max_requests: int | None = None,
) -> LoadResult:
    """Run ``call(thread_index)`` from ``concurrency`` threads, each calling again as soon as
    its call returns, for ``warmup_s`` (not counted) then ``duration_s`` seconds or until
    ``max_requests`` requests completed in the measured window, whichever comes first; the
    figures are those of the requests that completed in the window.

    Every thread stops at the end of the window (a request in flight then is finished and
    not counted). A call that raises is counted as an error and its thread stops; the
    first error's text is kept."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, received {concurrency}")
    if duration_s <= 0:
        raise ValueError(f"duration_s must be positive, received {duration_s}")
    lock = threading.Lock()
    #: each thread's counted requests: (start, end), in order
    spans: list[list[tuple[float, float]]] = [[] for _ in range(concurrency)]
    #: each thread's uncounted requests: its first (warm-up), any before the window opened and
    #: the one that ended after it
    early: list[list[tuple[float, float]]] = [[] for _ in range(concurrency)]
    errors: list[str] = []
    failed: set[int] = set()
    state = {"count": 0}
    start_at = time.perf_counter() + warmup_s  # threads start within ~1 ms of this
    stop_at = [start_at + duration_s]
    limit = max_requests if max_requests is not None else None
    done = threading.Event()

    ready = threading.Barrier(concurrency)

    def worker(k: int) -> None:
        mine = spans[k]
        ready.wait()  # every thread sends its first request together
        first = True
        while not done.is_set():
            t0 = time.perf_counter()
            try:
                call(k)
            except Exception as exc:  # counted and reported, never raised into the thread
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}")
                    failed.add(k)
                return
            t1 = time.perf_counter()
            if t1 > stop_at[0]:
                early[k].append((t0, t1))  # completed after the window: kept for the fallback below
                done.set()
                return
            if t1 < start_at or first:
                early[k].append((t0, t1))
            else:  # completed in the window (see the module docstring)
                mine.append((t0, t1))
                if limit is not None:
                    with lock:
                        state["count"] += 1
                        if state["count"] >= limit:
                            stop_at[0] = t1
                            done.set()
                            return
            first = False

    threads = [threading.Thread(target=worker, args=(k,), daemon=True, name=f"load-{k}")
               for k in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    end = min(stop_at[0], time.perf_counter())
    window = max(1e-9, end - start_at)
    live = [k for k in range(concurrency) if k not in failed]
    if live and any(not spans[k] for k in live):
        # a thread counted no request: the requests outlast the window (a slow model on a loaded
        # configuration). Its figures then come from every request it completed, the warm-up
        # ones too, over their span: slower than the steady state, never the 0/s of an empty
        # window (which ranked BERT-base's latency set-up at 0 in a throughput tuning)
        spans = [sorted(early[k] + spans[k]) for k in range(concurrency)]
    every = np.array([b - a for mine in spans for a, b in mine], dtype=np.float64) * 1e3
    rate = closed_loop_rate([mine for k, mine in enumerate(spans) if k not in failed])
    return LoadResult.measured(concurrency, every, window,
                               rate if rate is not None and not failed else every.size / window, errors)
