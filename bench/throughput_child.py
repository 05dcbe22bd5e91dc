"""One timed set-up of the throughput bench (bench/test_bench_throughput.py), in a process of
its own: nothing of another set-up (sessions, thread pools, compiled models, spinning
workers) is alive while it is timed.

    python bench/throughput_child.py MODEL SETUP CONCURRENCY DURATION_S STORE [WARMUP_S]

SETUP is ``tuned-throughput`` (``dispatch.Session(MODEL, store=STORE,
objective="throughput@n=CONCURRENCY", require_plan=True)`` run from CONCURRENCY threads; a plan
tuned to run requests in batches of B, from CONCURRENCY / B threads each sending B requests
through ``Session.run_batch``: :func:`tuner.throughput.batch.session_load`),
``tuned-latency`` (the same with ``objective="latency"``), ``tuned-batched`` (as
``tuned-throughput``, for a MODEL with a symbolic batch whose plan is stored for batch 1) or
one of the plain library set-ups
of :data:`tuner.throughput.library_load.SETUPS`. Every set-up gets the same seeded inputs
(:func:`tuner.throughput.library_load.random_feeds`). Prints one JSON line: ``LoadResult.to_dict()`` with
``setup`` added and, for the tuned set-ups, ``plan`` (the backends the plan runs and how many
steps on each), ``serving`` (the plan's serving configuration: streams, threads; ``None`` for
one executor called from every thread) and ``plan_note``.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: the dispatcher's set-ups: name -> the objective of the stored plan ({n}: the concurrency)
TUNED = {"tuned-throughput": "throughput@n={n}", "tuned-latency": "latency",
         "tuned-batched": "throughput@n={n}"}


def measure(model: str, setup: str, concurrency: int, duration_s: float, store: str,
            warmup_s: float = 0.5) -> dict:
    """Build ``setup`` for ``model``, time it under load and return the result as a dict."""
    from tuner.throughput.batch import session_load
    from tuner.throughput.library_load import SETUPS, measure_library, random_feeds

    feeds = random_feeds(model)
    if setup not in TUNED:
        if setup not in SETUPS:
            raise SystemExit(f"unknown set-up {setup!r}; known: {', '.join([*TUNED, *SETUPS])}")
        result = measure_library(model, setup, concurrency, duration_s, feeds=feeds, warmup_s=warmup_s)
        return {"setup": setup, **result.to_dict()}
    from dispatch import Session

    # tuned-batched: a model with a symbolic batch, its plan stored for batch 1 (the feeds' shapes)
    shapes = {n: list(a.shape) for n, a in feeds.items()} if setup == "tuned-batched" else None
    sess = Session(model, store=store, objective=TUNED[setup].format(n=concurrency), require_plan=True,
                   input_shapes=shapes)
    # from N threads; a plan tuned to run requests in batches, in batches (tuner.throughput.batch)
    result = session_load(sess, feeds, concurrency, duration_s, warmup_s=warmup_s)
    serving = getattr(sess.plan, "serving_config", lambda: None)()
    return {"setup": setup, **result.to_dict(), "plan": sess.plan.backends_used(),
            "serving": serving.label() if serving is not None else None, "plan_note": sess.plan_note}


def main(argv: list[str]) -> int:
    if len(argv) not in (5, 6):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    model, setup, concurrency, duration, store = argv[:5]
    warmup = float(argv[5]) if len(argv) == 6 else 0.5
    out = measure(model, setup, int(concurrency), float(duration), store, warmup)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
