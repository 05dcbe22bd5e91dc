"""The non-finite guard of a plan: NaN/Inf requests run a plan that agrees with the reference.

Libraries differ from ONNX on NaN and infinities (oneDNN's and OpenVINO's ``Relu(NaN) = 0``,
MaxPools that skip NaN, ...), and agree on finite inputs. A tuned plan whose fastest form
differs there carries a *fallback* (:attr:`dispatch.plan.Plan.nonfinite_fallback`): a plan
checked to put NaN, +Inf and -Inf where the numpy reference does. Every run first checks its
float inputs (:func:`has_nonfinite`: one vectorised ``np.isfinite(x).all()`` per float
input, about 15 us for a 1x3x224x224 float32 input and 10 us for a 1x128x768 one); a request
holding a NaN or an infinity runs the fallback, every all-finite request the fast plan. The
fallback's executor is built on the first such request (never at start-up), once, under a
lock; the counters say which plan ran how often (:class:`NonfiniteGuard`).

What it guarantees is what the tuner's NaN/Inf check verifies: on inputs holding NaN or
infinities, the outputs' NaN/Inf positions are the reference's. A non-finite value that a
plan *creates* from finite inputs (an overflow inside the model) runs on the fast plan.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np


def has_nonfinite(feeds: Mapping[str, Any], names: Sequence[str]) -> bool:
    """Whether any of the float inputs ``names`` of ``feeds`` holds a NaN or an infinity."""
    for name in names:
        arr = feeds.get(name)
        if arr is not None and not np.isfinite(arr).all():
            return True
    return False


class NonfiniteGuard:
    """The fallback of one guarded executor: which inputs to check, the fallback's executor
    (built by ``build`` on first use) and how many runs each plan answered."""

    def __init__(self, float_inputs: Sequence[str], build: Callable[[], Any]) -> None:
        self.float_inputs = tuple(float_inputs)
        self._build = build
        self._executor: Any = None
        self._lock = threading.Lock()
        #: runs answered by the fallback plan (a NaN or an infinity in the inputs)
        self.fallback_runs = 0

    @property
    def built(self) -> bool:
        """Whether the fallback's executor exists (it is built on the first NaN/Inf request)."""
        return self._executor is not None

    def needed(self, feeds: Mapping[str, Any]) -> bool:
        """Whether ``feeds`` must run on the fallback (a float input holds NaN or Inf)."""
        return bool(self.float_inputs) and has_nonfinite(feeds, self.float_inputs)

    def executor(self) -> Any:
        """The fallback's executor, built on first use (once, whatever the threads), and the
        run counted."""
        with self._lock:
            if self._executor is None:
                self._executor = self._build()
            self.fallback_runs += 1
            return self._executor
