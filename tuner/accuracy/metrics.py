"""Accuracy metrics: how far a reduced-precision plan's outputs are from the float32 plan's on
the user's samples, as one error figure against a budget.

Every metric is turned into an *error* (0: identical; larger: worse) so that the search can add
the errors regions cause alone and compare a sum with one allowance: ``cosine`` (the worst
sample's cosine similarity over every float output; error ``1 - cosine``, allowance
``1 - BUDGET``), ``max-rel`` (the largest absolute difference relative to the largest magnitude
of that sample's output; allowance ``BUDGET``), ``top1`` (the drop in top-1 agreement along the
last axis; allowance ``BUDGET``), or a user's function through the API (``error(float32_outputs,
outputs)`` over the samples, allowance ``BUDGET``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dispatch.objective import ACCURACY_METRICS, parse_accuracy
from tuner.errors import TuningError

#: one sample's outputs, in the graph's output order
Outputs = Sequence[np.ndarray]
#: a user's metric: ``error(float32 outputs per sample, outputs per sample) -> error >= 0``
ErrorFn = Callable[[Sequence[Outputs], Sequence[Outputs]], float]


def _floats(outputs: Outputs) -> list[np.ndarray]:
    return [np.asarray(o, dtype=np.float64).ravel() for o in outputs
            if np.asarray(o).dtype.kind == "f"]


def cosine_error(reference: Sequence[Outputs], got: Sequence[Outputs]) -> float:
    """``1 -`` the worst cosine similarity of any sample's float output to float32's (two
    all-zero vectors are identical; one all-zero vector against another is 1 apart)."""
    worst = 1.0
    for ref, out in zip(reference, got):
        for a, b in zip(_floats(ref), _floats(out)):
            if not (np.isfinite(a).all() and np.isfinite(b).all()):
                if not np.array_equal(a, b, equal_nan=True):
                    return float("inf")
                continue
            na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
            cos = ((1.0 if na == nb else 0.0) if na == 0.0 or nb == 0.0
                   else float(np.dot(a, b) / (na * nb)))
            worst = min(worst, cos)
    return max(0.0, 1.0 - worst)


def max_rel_error(reference: Sequence[Outputs], got: Sequence[Outputs]) -> float:
    """The largest absolute difference of any float output, relative to the largest
    magnitude of that sample's float32 output."""
    worst = 0.0
    for ref, out in zip(reference, got):
        for a, b in zip(_floats(ref), _floats(out)):
            if a.size == 0:
                continue
            scale = float(np.max(np.abs(a)))
            diff = float(np.max(np.abs(a - b)))
            if not np.isfinite(diff):
                return float("inf")
            worst = max(worst, diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf")))
    return worst


def top1_error(reference: Sequence[Outputs], got: Sequence[Outputs]) -> float:
    """The share of rows (every float output's rows along its last axis, over every sample)
    whose arg-max differs from float32's: the drop in top-1 agreement."""
    rows = differ = 0
    for ref, out in zip(reference, got):
        for a, b in zip(ref, out):
            a, b = np.asarray(a), np.asarray(b)
            if a.dtype.kind != "f" or a.ndim == 0 or a.shape[-1] < 2:
                continue
            ia = np.argmax(a.reshape(-1, a.shape[-1]), axis=-1)
            ib = np.argmax(b.reshape(-1, b.shape[-1]), axis=-1)
            rows += ia.size
            differ += int(np.count_nonzero(ia != ib))
    return differ / rows if rows else 0.0


METRIC_ERRORS: dict[str, ErrorFn] = {"cosine": cosine_error, "max-rel": max_rel_error, "top1": top1_error}


@dataclass(frozen=True)
class AccuracyObjective:
    """A metric and its budget (``cosine:0.999``), with the error function it is computed by."""

    metric: str
    budget: float
    error_fn: ErrorFn

    @classmethod
    def parse(cls, text: str, fn: ErrorFn | None = None) -> AccuracyObjective:
        """From ``METRIC:BUDGET`` (``cosine:0.999``, ``max-rel:1e-2``, ``top1:0.01``); ``fn``: the
        function of a metric of the user's (its budget is the largest error it may return)."""
        from dispatch.errors import ArgumentError

        try:
            metric, budget = parse_accuracy(text)
        except ArgumentError as exc:
            raise TuningError(str(exc)) from None
        if fn is None:
            if metric not in METRIC_ERRORS:
                raise TuningError(f"accuracy metric {metric!r} is not one of {', '.join(ACCURACY_METRICS)}; "
                                  "a metric of your own needs its function (Session.tune(accuracy_fn=...))")
            fn = METRIC_ERRORS[metric]
        elif metric in METRIC_ERRORS:
            raise TuningError(f"accuracy metric {metric!r} is built in; "
                              "name your own function's metric otherwise")
        return cls(metric, budget, fn)

    @property
    def worst_sample(self) -> bool:
        """Whether the error is the worst sample's (``cosine``, ``max-rel``): then an error
        over the budget on some of the samples is over it on all of them."""
        return self.metric in ("cosine", "max-rel") and self.error_fn is METRIC_ERRORS[self.metric]

    @property
    def allowance(self) -> float:
        """The largest error within the budget."""
        return 1.0 - self.budget if self.metric == "cosine" else self.budget

    def error(self, reference: Sequence[Outputs], got: Sequence[Outputs]) -> float:
        """The error of ``got`` against the float32 ``reference`` outputs, per sample."""
        value = float(self.error_fn(reference, got))
        if not value >= 0:  # NaN too
            raise TuningError(f"accuracy metric {self.metric} returned {value!r}; expected an error >= 0")
        return value

    def figure(self, error: float) -> float:
        """The metric's own figure for an ``error`` (a cosine, not its distance to 1)."""
        return 1.0 - error if self.metric == "cosine" else error

    def describe(self, error: float) -> str:
        """``cosine 0.99953 (budget >= 0.999)`` and the like; an error that is not finite is
        outputs NaN or Inf where float32's are finite (the built-in metrics' inf), not a figure
        (``cosine -inf``)."""
        if not math.isfinite(error):
            return f"{self.metric}: outputs NaN or Inf where float32's are finite (budget {self.budget:g})"
        if self.metric == "cosine":
            return f"cosine {self.figure(error):.5f} (budget >= {self.budget:g})"
        return f"{self.metric} {error:.4g} (budget <= {self.budget:g})"

    def within(self, error: float) -> bool:
        return error <= self.allowance
