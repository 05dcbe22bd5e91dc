"""Running a plan's concurrent requests on its streams (:mod:`dispatch.serving`).

:func:`build_runner` builds what runs a plan's requests (a
:class:`~dispatch.plan_runner.PlanRunner`) as its serving configuration says: a plan without
one, or whose requests do not run concurrently, gets the one executor it always had (built
under the configuration's settings); a plan serving concurrent requests gets a
:class:`StreamPool` of every stream's executor, which :meth:`dispatch.session.Session.run`
sends requests through. A request takes a free stream and gives it back when it ends; requests
beyond the configuration's ``requests`` wait for one (a queue, never a lock around every run):
that is the back-pressure a server sees.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from dispatch import serving
from dispatch.errors import KernelError
from dispatch.executor import Executor
from dispatch.graph import Graph
from dispatch.plan import Plan
from dispatch.registry import Registry
from dispatch.serving import ServingConfig

if TYPE_CHECKING:
    from dispatch.plan_runner import PlanRunner


class StreamPool:
    """The executors of a plan's streams, each lent to one request at a time (``shared``
    mode: one executor lent to ``requests`` requests at once, the libraries scheduling them).

    Waiting requests are served first come, first served: a stream given back goes straight
    to the oldest waiting request, so that no caller is starved by one that gives a stream
    back and asks again at once (which a plain queue allows, and which shows as p99)."""

    def __init__(self, executors: Sequence[Executor], config: ServingConfig) -> None:
        self.executors = list(executors)
        self.config = config
        self._lock = threading.Lock()
        self._free: collections.deque[Executor] = collections.deque(
            [self.executors[0]] * config.requests if config.mode == "shared" else self.executors)
        self._waiting: collections.deque[_Waiter] = collections.deque()

    def _take(self) -> Executor:
        with self._lock:
            if self._free and not self._waiting:
                return self._free.popleft()
            waiter = _Waiter()
            self._waiting.append(waiter)
        waiter.ready.wait()
        assert waiter.executor is not None
        return waiter.executor

    def _give_back(self, ex: Executor) -> None:
        with self._lock:
            if self._waiting:
                waiter = self._waiting.popleft()
                waiter.executor = ex
                waiter.ready.set()
            else:
                self._free.append(ex)

    def run(
        self,
        feeds: Mapping[str, np.ndarray],
        output_names: Sequence[str] | None = None,
        *,
        timings: list[float] | None = None,
        on_fault: Callable[[KernelError], None] | None = None,
    ) -> list[np.ndarray]:
        """Run one request on a free stream (waiting for one, first come first served, when
        all are busy)."""
        ex = self._take()
        try:
            return ex.run(feeds, output_names, timings=timings, on_fault=on_fault)
        finally:
            self._give_back(ex)

    @property
    def executor(self) -> Executor:
        """The first stream's executor (:class:`~dispatch.plan_runner.PlanRunner`)."""
        return self.executors[0]

    def __len__(self) -> int:
        return len(self.executors)


class _Waiter:
    """A request waiting for a stream."""

    __slots__ = ("executor", "ready")

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.executor: Executor | None = None


def build_runner(graph: Graph, plan: Plan, registry: Registry) -> PlanRunner:
    """What runs ``plan``'s requests as its serving configuration says (see the module
    docstring). A plan without one: ``Executor(graph, plan, registry)``, unchanged."""
    config = plan.serving_config()
    if config is None:
        return Executor(graph, plan, registry)
    count = config.streams if config.mode == "streams" else 1
    executors = []
    with serving.building(config):
        for _ in range(count):
            ex = Executor(graph, plan, registry)
            if config.threads:
                # the OpenMP threads of native and oneDNN steps, per stream (per request when
                # the requests share one executor)
                ex.threads = replace(ex.threads, openmp=config.threads)
            executors.append(ex)
    if config.concurrent:
        return StreamPool(executors, config)
    return executors[0]
