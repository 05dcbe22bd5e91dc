"""What a Session does when an implementation fails at run time (``on_error="fallback"``):
the :class:`Fault` records and the reference re-runs (a mixin of
:class:`dispatch.session.Session`)."""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from dispatch.errors import KernelError, OpDispatchError
from dispatch.executor import Executor, reference_plan

#: How many :class:`Fault` records a session keeps (the most recent).
MAX_FAULTS = 1000


@dataclass(frozen=True)
class Fault:
    """One run-time failure of an implementation that ``on_error="fallback"`` recovered from.

    Attributes:
        node: the failing call's label (node name, fused ``a+b``, or ``convert ...``).
        implementation: the implementation (or converter chain) that raised.
        backend: its backend.
        error: ``"ExceptionType: message"`` of the failure.
        time: when it happened (``time.time()``, seconds since the epoch).
        recovery: how the run was answered: ``"reference implementation"`` (the failing
            step re-run on the reference implementations of its nodes, the rest of the plan
            as planned) or ``"reference plan"`` (the whole run on the numpy reference plan,
            when the step could not be re-run).
    """

    node: str
    implementation: str
    backend: str
    error: str
    time: float
    recovery: str = "reference implementation"



class FallbackMixin:
    """Recovering from run-time failures of implementations (``on_error="fallback"``)."""

    def _execute(self, feeds: Mapping[str, np.ndarray], names: list[str] | None) -> list[np.ndarray]:
        """Run the session's executor. With ``on_error="fallback"``, a step whose
        implementation raises is re-run on the reference implementations of its nodes (its
        inputs converted to the standard layout and its outputs back, see
        :meth:`Executor.fallback_call`) and the run goes on; the fault is recorded in
        :attr:`faults` and warned about once per implementation. Only when that cannot answer
        (no reference implementation for the node, a converter failing, the reference raising
        too) is the whole run answered by the numpy reference plan, the last resort."""
        # a throughput plan's requests run on its streams (dispatch.stream_pool)
        runner = self.runner
        if self.on_error != "fallback":
            return runner.run(feeds, names)
        try:
            return runner.run(feeds, names, on_fault=self._record_fault)
        except KernelError as exc:
            self._record_fault(exc, recovery="reference plan")
            try:
                reference = self._reference()
            except KernelError as none:
                raise KernelError(f"{exc}; {none}", node=exc.node, impl=exc.impl,
                                  backend=exc.backend) from exc
            try:
                return reference.run(feeds, names)
            except KernelError as again:
                raise KernelError(
                    f"{exc}; the numpy reference plan run as a fallback failed too: {again}",
                    node=exc.node, impl=exc.impl, backend=exc.backend,
                ) from again

    def _record_fault(self, exc: KernelError, recovery: str = "reference implementation") -> None:
        """Record one recovered run-time failure and warn once per implementation."""
        fault = Fault(node=exc.node or "?", implementation=exc.impl or "?",
                      backend=exc.backend or "?", error=str(exc), time=time.time(),
                      recovery=recovery)
        with self._fallback_lock:
            self.faults.append(fault)
            del self.faults[:-MAX_FAULTS]
            first = fault.implementation not in self._warned_impls
            self._warned_impls.add(fault.implementation)
        if first:
            instead = ("its nodes on the reference implementation" if recovery == "reference implementation"
                       else "the whole model on the numpy reference plan")
            warnings.warn(
                f"opdispatch: {fault.implementation} (backend {fault.backend}) failed on node "
                f"{fault.node!r}, running {instead} instead: {exc}",
                RuntimeWarning, stacklevel=4,
            )

    def _reference(self) -> Executor:
        """The executor of the numpy reference plan, built on first use."""
        with self._fallback_lock:
            if self._reference_executor is None:
                try:
                    plan = reference_plan(self.graph, self.registry)
                    self._reference_executor = Executor(self.graph, plan, self.registry)
                except (LookupError, OpDispatchError) as exc:
                    raise KernelError(
                        f"on_error='fallback' needs the numpy reference plan of model "
                        f"{self.graph.name!r}, which cannot be built: {type(exc).__name__}: {exc}"
                    ) from exc
            return self._reference_executor

