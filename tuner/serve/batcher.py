"""Dynamic batching: requests of the same shapes grouped into one run, as Triton's dynamic
batcher does, within a maximum queue delay.

Requests wait in a queue per *signature* (each input's name, dtype and shape): only requests
that can be concatenated meet. A queue is dispatched as soon as it holds the largest batch
size allowed, or when its first request has waited ``max_delay_s``; it is then cut into
groups of the allowed sizes, largest first (the sizes a plan is stored for: a batch of 3 is
never formed when only 1, 2 and 4 are planned; it runs as 2 + 1). Each group is handed to
``run_group``, which answers every request on its own (a bad request fails alone: see
:meth:`dispatch.session.Session.run_batch`).

Everything happens on the server's event loop; the runs themselves are the caller's
(``run_group`` is a coroutine that runs the group off the loop).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

#: one queued request: its feeds, the future its answer goes to, when it was queued
RunGroup = Callable[[Sequence["Queued"]], Awaitable[None]]


@dataclass
class Queued:
    """A request waiting in the batcher."""

    feeds: Mapping[str, np.ndarray]
    future: asyncio.Future
    queued_at: float = field(default_factory=time.perf_counter)


def signature(feeds: Mapping[str, np.ndarray]) -> Hashable:
    """What requests must share to be concatenated: every input's name, dtype and shape."""
    return tuple((name, a.dtype.str, a.shape) for name, a in sorted(feeds.items()))


def cut(count: int, sizes: Sequence[int]) -> list[int]:
    """``count`` requests cut into groups of the allowed ``sizes`` (1 is always allowed),
    largest first: ``cut(7, [1, 2, 4]) == [4, 2, 1]``."""
    allowed = sorted({1, *sizes}, reverse=True)
    groups = []
    while count:
        size = next(s for s in allowed if s <= count)
        groups.append(size)
        count -= size
    return groups


class DynamicBatcher:
    """Groups requests of the same signature (see the module docstring).

    Args:
        run_group: coroutine that runs one group and sets each request's future.
        sizes: the batch sizes that may be formed (``max(sizes)`` dispatches a queue at once).
        max_delay_s: how long a queue's first request waits for others.
    """

    def __init__(self, run_group: RunGroup, sizes: Sequence[int], max_delay_s: float) -> None:
        self.run_group = run_group
        self.sizes = sorted({1, *sizes})
        self.max_delay_s = max_delay_s
        self._queues: dict[Hashable, list[Queued]] = {}
        #: per signature, which queue a pending timer belongs to (a timer of a queue that was
        #: dispatched when it filled up must not cut the next queue short)
        self._generation: dict[Hashable, int] = {}
        self._tasks: set[asyncio.Task] = set()

    @property
    def largest(self) -> int:
        return self.sizes[-1]

    def submit(self, feeds: Mapping[str, np.ndarray]) -> asyncio.Future:
        """Queue one request (batch 1); its future gets the outputs or the exception."""
        loop = asyncio.get_running_loop()
        item = Queued(feeds, loop.create_future())
        key = signature(feeds)
        queue = self._queues.setdefault(key, [])
        queue.append(item)
        if len(queue) >= self.largest:
            self._dispatch(key)
        elif len(queue) == 1:
            generation = self._generation.get(key, 0) + 1
            self._generation[key] = generation
            loop.call_later(self.max_delay_s, self._on_timer, key, generation)
        return item.future

    def _on_timer(self, key: Hashable, generation: int) -> None:
        if self._generation.get(key) == generation and self._queues.get(key):
            self._dispatch(key)

    def _dispatch(self, key: Hashable) -> None:
        queue = self._queues.pop(key, [])
        self._generation[key] = self._generation.get(key, 0) + 1
        start = 0
        for size in cut(len(queue), self.sizes):
            group = queue[start:start + size]
            start += size
            task = asyncio.get_running_loop().create_task(self._run(group))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, group: Sequence[Queued]) -> None:
        try:
            await self.run_group(group)
        except BaseException as exc:  # run_group sets the futures; anything it let through too
            for item in group:
                if not item.future.done():
                    item.future.set_exception(exc if isinstance(exc, Exception)
                                              else RuntimeError(f"the batch was cancelled: {exc!r}"))

    def pending(self) -> int:
        """Requests queued and not yet dispatched."""
        return sum(len(q) for q in self._queues.values())

    async def drain(self) -> None:
        """Dispatch every queue now and wait for every group in flight (graceful shutdown)."""
        for key in list(self._queues):
            self._dispatch(key)
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

