"""Batch sizes as throughput candidates (issue 30): a server's batcher groups requests, and a
plan run on the group as one batch may answer more requests per second than the same plan
running them one by one on its streams.

Only a model whose inputs all start with the same symbolic dimension
(:func:`dispatch.session_batch.batch_dimension`), tuned at batch 1, gets batch candidates: a
model exported with batch 1 is never re-batched behind the user's back. With N requests in
flight, a batch size ``b`` that divides N (one of :data:`BATCH_SIZES`) is measured as a
saturated server runs it: ``N / b`` groups in flight, each of ``b`` requests, on the serving
configurations that fit ``N / b`` requests (:func:`tuner.throughput.stage.serving_candidates`). Each
call concatenates ``b`` distinct samples and splits the outputs back, as
:meth:`dispatch.session.Session.run_batch` does behind the batcher, so that the copies are
paid for; the time a request waits in the batcher's queue is not (under saturation a group
fills as fast as the previous one returns).

The plan run at batch ``b`` is the batch-1 plan's steps on the graph loaded for batch ``b``
(:func:`plan_at_batch`: layouts as each implementation declares them at that shape,
conversions planned again), so a winner at batch ``b`` is stored twice: the batch-1 plan with
its serving configuration (``batch = b``), which a server reads to know what to group, and the
batch-``b`` plan under the batch-``b`` shapes' key, which the batched runs load.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from dispatch.fusion import step_node
from dispatch.graph import Graph
from dispatch.plan import Plan
from dispatch.plan_assembly import order_steps, plan_conversions
from dispatch.plan_check import validate_plan
from dispatch.registry import Registry
from dispatch.session_batch import batch_dimension, concatenate, split_outputs
from tuner.throughput.load import LoadResult, run_load

#: the batch sizes measured (those dividing the concurrency)
BATCH_SIZES = (2, 4, 8, 16)

Feeds = Mapping[str, np.ndarray]


def batch_sizes(graph: Graph, concurrency: int) -> list[int]:
    """The batch sizes worth measuring for ``graph`` (tuned at batch 1) with ``concurrency``
    requests in flight: none unless every declared input starts with one symbolic dimension
    and every input of the tuned graph has 1 there (see the module docstring)."""
    if concurrency < 2 or batch_dimension(graph.declared) is None:
        return []
    if any(not v.shape or int(v.shape[0]) != 1 for v in graph.inputs):
        return []
    return [b for b in BATCH_SIZES if b <= concurrency and concurrency % b == 0]


def shapes_at(graph: Graph, batch: int) -> dict[str, tuple[int, ...]]:
    """The input shapes of ``graph`` (batch 1) at batch ``batch``."""
    return {v.name: (batch, *(int(d) for d in v.shape[1:])) for v in graph.inputs}  # type: ignore[index]


def plan_at_batch(plan: Plan, graph: Graph, registry: Registry) -> Plan:
    """``plan``'s steps on ``graph`` (the model loaded at another batch size): each step's
    layouts as its implementation declares them for these shapes, the conversions planned
    again; checked as a stored plan is (:func:`dispatch.plan_check.validate_plan`), which raises
    :class:`~dispatch.errors.PlanError` naming the step that does not apply."""
    steps = []
    for s in plan.steps:
        impl = registry.impl(s.impl)
        node = step_node(graph, s.nodes, s.op)
        steps.append(replace(s, layouts_in=list(impl.input_layouts(node)),
                             layouts_out=list(impl.output_layouts(node)), rejected=[]))
    ordered = order_steps(graph, steps)
    out = Plan(graph.name, ordered, plan_conversions(graph, registry, ordered), dict(plan.provenance),
               plan.version, plan.nonfinite_fallback, plan.serving)
    validate_plan(out, graph, registry)
    return out


def samples(feeds: Feeds, batch: int) -> list[dict[str, np.ndarray]]:
    """``batch`` distinct batch-1 samples made from ``feeds``: sample ``k`` has every input
    rolled by ``k`` along its last axis (values stay in their domain: token ids, masks), so a
    batched run that mixed samples up would show it."""
    out = []
    for k in range(batch):
        out.append({n: (np.roll(a, k, axis=-1) if a.ndim and a.shape[-1] > 1 else a.copy())
                    for n, a in feeds.items()})
    return out


def batched_call(run: Callable[[Feeds], Sequence[np.ndarray]],
                 group: Sequence[Feeds]) -> list[list[np.ndarray]]:
    """``group`` run as one batch by ``run``: inputs concatenated along the first axis, every
    output split back per request, as :meth:`dispatch.session.Session.run_batch` does
    (:func:`dispatch.session_batch.concatenate`, :func:`~dispatch.session_batch.split_outputs`)."""
    outs = run(concatenate(group))
    split = split_outputs(outs, [1] * len(group))  # every request is batch 1
    if split is None:
        raise ValueError(f"an output of a batch of {len(group)} does not start with the batch")
    return split


def per_request(result: LoadResult, batch: int, concurrency: int) -> LoadResult:
    """A load of groups of ``batch`` requests as requests: ``batch`` requests per completed
    call; the latencies are the groups' (each request in a group waits for the whole group)."""
    return replace(result, concurrency=concurrency, requests=result.requests * batch,
                   throughput=result.throughput * batch)


class BatchedGraphs:
    """The model's graph at each batch size, loaded once (``load(shapes)``: imported and
    simplified exactly as a Session does for those shapes)."""

    def __init__(self, graph: Graph, load: Callable[[Mapping[str, Sequence[int]]], Graph]) -> None:
        self.graph = graph
        self._load = load
        self._graphs: dict[int, Graph] = {}

    def at(self, batch: int) -> Graph:
        """The graph at batch ``batch``."""
        if batch not in self._graphs:
            self._graphs[batch] = self._load(shapes_at(self.graph, batch))
        return self._graphs[batch]


def check_batched(got: Sequence[Sequence[np.ndarray]], want: Sequence[Sequence[np.ndarray]],
                  check: Callable[[Sequence[np.ndarray], Sequence[np.ndarray]], str | None]) -> str | None:
    """Each request's outputs from a batched run against its outputs run alone, or what
    differed (naming the request)."""
    for k, (g, w) in enumerate(zip(got, want)):
        wrong = check(g, w)
        if wrong:
            return f"request {k} of a batch of {len(got)}: {wrong}"
    return None


def session_load(sess: Any, feeds: Feeds, concurrency: int, duration_s: float, *,
                 warmup_s: float = 0.5) -> LoadResult:
    """``sess`` (a :class:`dispatch.session.Session`) under load as a server runs its plan:
    ``concurrency`` threads each sending ``feeds``; for a plan tuned to run requests in batches
    of ``b`` (its serving configuration's ``batch``, dividing ``concurrency``), ``concurrency /
    b`` callers each sending a batch of ``b`` distinct requests (:func:`samples`) through
    :meth:`~dispatch.session.Session.run_batch`, as a server's batcher does, counted per
    request. A request that fails raises (the load loop counts it)."""
    serving = sess.plan.serving_config()
    batch = serving.batch if serving is not None and serving.batch else 1
    if batch == 1 or concurrency % batch:
        sess.run(None, feeds)
        return run_load(lambda _k: sess.run(None, feeds), concurrency, duration_s, warmup_s=warmup_s)
    group = samples(feeds, batch)

    def call() -> None:
        for got in sess.run_batch(group):
            if isinstance(got, Exception):
                raise got

    call()
    return per_request(run_load(lambda _k: call(), concurrency // batch, duration_s,
                                warmup_s=warmup_s), batch, concurrency)
