"""Reduced precision per bucket (issue 51): a range tuned with an accuracy objective
(``--accuracy cosine:0.999 --data REQUESTS``) also measures the reduced-precision ways
(OpenVINO in bfloat16, onnxruntime's dynamic int8), and a bucket may take one only where the
user's own requests of that bucket's sizes stay within the budget against the float32 reference
(onnxruntime). Each request is checked on its own; a sample shape answers for the sizes
between the midpoints to its neighbours — exactly the sizes a bucket boundary can fall
between — so a bucket that takes a reduced way has had every request of its sizes checked, and
one with no request of the user's in it never takes one (nothing to check it on).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from dispatch.objective import AccuracyTarget
from dispatch.range_plan import Bucket
from tuner.accuracy.metrics import AccuracyObjective
from tuner.shapes.buckets import LOCAL_REJECTION, Sample

Feeds = dict[str, np.ndarray]
#: the most requests checked per reduced way (spread over the sizes)
MAX_CHECKED = 96


def request_errors(target: AccuracyTarget, ways: Mapping[str, Callable], reference: Callable,
                   requests: Sequence[tuple[int, Feeds]]) -> dict[str, list[tuple[int, float]]]:
    """Per reduced way, ``(size, error)`` of each request (size, feeds) against ``reference``."""
    metric = AccuracyObjective.parse(target.spec)
    chosen = sorted(requests, key=lambda r: r[0])
    if len(chosen) > MAX_CHECKED:
        step = (len(chosen) - 1) / (MAX_CHECKED - 1)
        chosen = [chosen[round(k * step)] for k in range(MAX_CHECKED)]
    wanted = [reference(feeds) for _, feeds in chosen]
    out: dict[str, list[tuple[int, float]]] = {}
    for name, run in ways.items():
        errors = []
        for (size, feeds), want in zip(chosen, wanted):
            try:
                errors.append((size, metric.error([want], [run(feeds)])))
            except Exception:  # a way that fails a request is over any budget there
                errors.append((size, math.inf))
        out[name] = errors
    return out


def figure(target: AccuracyTarget, error: float) -> float:
    """The metric's own figure for an error (cosine similarity for ``cosine``)."""
    return 1.0 - error if target.metric == "cosine" else error


def judge(samples: Sequence[Sample], target: AccuracyTarget,
          errors: Mapping[str, Sequence[tuple[int, float]]], lo: int, hi: int) -> None:
    """Reject each reduced way at the samples whose sizes (midpoint to midpoint) hold a request
    over the budget, or none to check it on (see the module docstring)."""
    allowance = AccuracyObjective.parse(target.spec).allowance
    ordered = sorted(samples, key=lambda s: s.size)
    for k, s in enumerate(ordered):
        a = lo if k == 0 else (ordered[k - 1].size + s.size) // 2 + 1
        b = hi if k == len(ordered) - 1 else (s.size + ordered[k + 1].size) // 2
        for way, errs in errors.items():
            if way not in s.ms:
                continue
            inside = [e for size, e in errs if a <= size <= b]
            if not inside:
                s.rejected[way] = (f"{LOCAL_REJECTION} none of your requests has a size in "
                                   f"{a}..{b} to check it on")
            elif max(inside) > allowance:
                s.rejected[way] = (f"{LOCAL_REJECTION} {target.metric} "
                                   f"{figure(target, max(inside)):.6g} on {len(inside)} of your "
                                   f"requests of sizes {a}..{b}, over the budget {target.budget:g}")


def annotate(buckets: Sequence[Bucket], target: AccuracyTarget,
             errors: Mapping[str, Sequence[tuple[int, float]]]) -> None:
    """Add to each reduced-precision bucket's ``why`` the worst figure on its requests."""
    for b in buckets:
        errs = [e for size, e in errors.get(b.way, ()) if b.lo <= size <= b.hi]
        if errs:
            b.why += (f"; {target.metric} {figure(target, max(errs)):.6g} on the {len(errs)} "
                      f"request(s) of yours in it (budget {target.budget:g})")
