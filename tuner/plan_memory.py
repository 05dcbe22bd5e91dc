"""A plan's peak memory, whole: what the executor's liveness plan counts (the tensors live
between calls), the constants the plan holds (the graph's and their layout copies) and what
the libraries behind its region steps allocated themselves (each region kernel's
``library_bytes``: :class:`impls.region_profile.MemoryProbe` around its session's creation and
first run). The executor's own figure (``Executor.memory.peak_bytes``) is the first term only:
a plan that is one onnxruntime region has a liveness peak of its input and output tensors
(606 KB for ResNet-50), while onnxruntime holds about 112 MB.

:func:`plan_memory` is the figure the memory objective should compare (the tuner's validation
sets ``PlanCandidate.peak_bytes`` from it once it calls it; see the module's tests).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dispatch.executor import Executor


@dataclass
class PlanMemory:
    """A plan's peak memory and its parts (bytes)."""

    liveness_bytes: int
    constant_bytes: int
    library_bytes: int
    #: plan step index (as a string) -> bytes its library allocated (region kernels only)
    per_call: dict[str, int] = field(default_factory=dict)

    @property
    def peak_bytes(self) -> int:
        """The whole figure: liveness peak + constants + library allocations."""
        return self.liveness_bytes + self.constant_bytes + self.library_bytes

    def to_dict(self) -> dict[str, object]:
        """JSON data, with the total and what it is made of (for a plan's provenance)."""
        return {"peak_bytes": self.peak_bytes, "liveness_bytes": self.liveness_bytes,
                "constant_bytes": self.constant_bytes, "library_bytes": self.per_call,
                "basis": (f"executor liveness {self.liveness_bytes:,} B + constants "
                          f"{self.constant_bytes:,} B + library allocations "
                          f"{self.library_bytes:,} B (C heap growth around each region's "
                          f"creation and first run)")}


def plan_memory(ex: Executor) -> PlanMemory:
    """The peak memory of the plan ``ex`` runs (after at least one run, so that the region
    kernels' first-run allocations are in)."""
    per_call: dict[str, int] = {}
    index = {id(s): k for k, s in enumerate(ex.plan.steps)}
    for call in ex.calls:
        b = getattr(call.fn, "library_bytes", None)
        if b is not None:  # keyed by the plan step's index, as the report's figures are
            k = index.get(id(call.step)) if call.step is not None else None
            per_call[call.label if k is None else str(k)] = int(b)
    return PlanMemory(int(ex.memory.peak_bytes), int(ex.memory.constant_bytes),
                      sum(per_call.values()), per_call)
