"""Prometheus metrics of served models (``GET /metrics`` on the HTTP port, next to the
framework's own ``request_predict_seconds`` and friends).

| metric | type | labels | what |
|---|---|---|---|
| ``opdispatch_requests_total`` | counter | model, outcome | requests by outcome (below) |
| ``opdispatch_request_seconds`` | histogram | model | from admission to the answer |
| ``opdispatch_queue_seconds`` | histogram | model | from admission to the start of the request's run |
| ``opdispatch_batch_size`` | histogram | model | requests per run (1 without batching) |
| ``opdispatch_backend_seconds_total`` | counter | model, backend | wall time spent in each backend's calls |
| ``opdispatch_requests_in_flight`` | gauge | model | admitted, waiting or running |
| ``opdispatch_model_ready`` | gauge | model | 1 once the stored plan loaded and ran once |
| ``opdispatch_generations_total`` | counter | model, finish_reason | generations by how they ended |
| ``opdispatch_generated_tokens_total`` | counter | model | tokens generated |

The outcomes of ``opdispatch_requests_total``: ``ok``, ``invalid`` (the client's error: dtype,
shape, names), ``rejected`` (the queue was full), ``failed`` (the server's error). The backend
``conversion`` of ``opdispatch_backend_seconds_total`` is the time in layout conversions. The
finish reasons of ``opdispatch_generations_total``: ``length``, ``stop``, ``cancelled`` (the
client disconnected), ``error``.

The metrics live in ``prometheus_client``'s default registry, created once per process.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

#: request latency buckets (seconds): 1 ms to 30 s
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0)
#: batch size buckets
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128)

#: the outcomes ``opdispatch_requests_total`` counts
OUTCOMES = ("ok", "invalid", "rejected", "failed")

REQUESTS = Counter("opdispatch_requests", "Requests by outcome", ["model", "outcome"])
REQUEST_SECONDS = Histogram("opdispatch_request_seconds", "Time from admission to the answer",
                            ["model"], buckets=LATENCY_BUCKETS)
QUEUE_SECONDS = Histogram("opdispatch_queue_seconds", "Time from admission to the run's start",
                          ["model"], buckets=LATENCY_BUCKETS)
BATCH_SIZE = Histogram("opdispatch_batch_size", "Requests per run", ["model"],
                       buckets=BATCH_BUCKETS)
BACKEND_SECONDS = Counter("opdispatch_backend_seconds", "Wall time in each backend's calls",
                          ["model", "backend"])
IN_FLIGHT = Gauge("opdispatch_requests_in_flight", "Requests admitted, waiting or running",
                  ["model"])
READY = Gauge("opdispatch_model_ready", "1 once the model's plan loaded and ran once", ["model"])
GENERATIONS = Counter("opdispatch_generations", "Generations by how they ended",
                      ["model", "finish_reason"])
GENERATED_TOKENS = Counter("opdispatch_generated_tokens", "Tokens generated", ["model"])
