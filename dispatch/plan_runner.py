"""What runs a plan's requests: the interface the executor and the stream pool share.

A plan without concurrent streams runs on one :class:`~dispatch.executor.Executor`; a
throughput plan's requests run on a :class:`~dispatch.stream_pool.StreamPool` of one executor
per stream (:mod:`dispatch.serving`). Both are a :class:`PlanRunner`:
:func:`dispatch.stream_pool.build_runner` builds the one a plan's serving configuration asks
for, and callers (the Session, the tuner's throughput and accuracy stages) run requests
through it without asking which it is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import numpy as np

    from dispatch.errors import KernelError
    from dispatch.executor import Executor


class PlanRunner(Protocol):
    """Runs one plan's requests, from any number of threads."""

    @property
    def executor(self) -> Executor:
        """The executor of the plan's first (or only) stream: the one to inspect (its calls,
        its memory plan, its guard); an executor is its own."""
        ...

    def run(
        self,
        feeds: Mapping[str, np.ndarray],
        output_names: Sequence[str] | None = None,
        *,
        timings: list[float] | None = None,
        on_fault: Callable[[KernelError], None] | None = None,
    ) -> list[np.ndarray]:
        """Run one request (see :meth:`dispatch.executor.Executor.run`)."""
        ...
