"""Cutting a shape range into buckets where the measured winner changes.

Each sample shape has a median latency per way and the latency of the way's first run at that
shape (what a shape new to the process costs: OpenVINO prepares its kernels for a shape on
first sight). A way's *score* at a sample is its median plus its first-run excess spread over
the requests each shape is expected to see (``repeats``: the user's requests per distinct
shape when given, else :data:`DEFAULT_REPEATS`), so that a way that is fast once warm but
slow on every new shape does not win a range whose shapes are seldom repeated. Consecutive
samples (by size) with the same winner form one bucket; a bucket boundary lies halfway between
the last sample of one winner and the first of the next.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dispatch.range_plan import Bucket

#: requests per distinct shape assumed when the user gave no requests
DEFAULT_REPEATS = 4.0
#: how a rejection that holds at one sample only begins (an accuracy budget exceeded there);
#: any other rejection (wrong outputs, a failure) rules the way out everywhere
LOCAL_REJECTION = "accuracy:"


@dataclass
class Sample:
    """The figures of every way at one sample shape."""

    point: tuple[int, ...]
    size: int
    ms: dict[str, float] = field(default_factory=dict)
    first_ms: dict[str, float] = field(default_factory=dict)
    #: ways that failed or disagreed with the reference here, with the reason
    rejected: dict[str, str] = field(default_factory=dict)

    def score(self, way: str, repeats: float) -> float:
        excess = max(0.0, self.first_ms.get(way, self.ms[way]) - self.ms[way])
        return self.ms[way] + excess / max(repeats, 1.0)

    def ranking(self, repeats: float) -> list[tuple[str, float]]:
        """The ways measured here, best score first."""
        return sorted(((w, self.score(w, repeats)) for w in self.ms if w not in self.rejected),
                      key=lambda item: item[1])

    def to_dict(self) -> dict:
        return {"point": list(self.point), "size": self.size,
                "ms": {k: round(v, 4) for k, v in self.ms.items()},
                "first_ms": {k: round(v, 4) for k, v in self.first_ms.items()},
                **({"rejected": dict(self.rejected)} if self.rejected else {})}


def cut(samples: Sequence[Sample], lo: int, hi: int, repeats: float,
        usable: Mapping[str, bool] | None = None,
        shared: Mapping[str, float] | None = None) -> list[Bucket]:
    """Buckets tiling sizes ``lo..hi`` from ``samples`` (see the module docstring). A way
    rejected at any sample is not used anywhere (``usable`` may rule ways out too). ``shared``:
    ways whose one shape serves several sizes (a padded way: its step), whose first runs are
    spread over that many more requests. Raises ValueError when no way is usable at every
    sample."""
    shared = shared or {}
    samples = sorted(samples, key=lambda s: s.size)
    banned = {w for s in samples for w, why in s.rejected.items()
              if not why.startswith(LOCAL_REJECTION)}
    banned |= {w for w, ok in (usable or {}).items() if not ok}
    ways = [w for w in samples[0].ms if w not in banned and all(w in s.ms for s in samples)]
    winners = []
    for s in samples:
        ranked = sorted(((w, s.score(w, repeats * shared.get(w, 1.0))) for w in ways
                         if w not in s.rejected), key=lambda item: item[1])
        if not ranked:
            why = "; ".join(f"{w}: {r}" for x in samples for w, r in x.rejected.items())
            raise ValueError(f"no way ran every sample shape correctly ({why or 'none measured'})")
        winners.append(ranked)
    buckets: list[Bucket] = []
    start = 0
    for k in range(1, len(samples) + 1):
        if k < len(samples) and winners[k][0][0] == winners[start][0][0]:
            continue
        group = samples[start:k]
        way = winners[start][0][0]
        b_lo = lo if not buckets else buckets[-1].hi + 1
        b_hi = hi if k == len(samples) else max(b_lo, (group[-1].size + samples[k].size) // 2)
        margins = [r[1][1] / r[0][1] for r in winners[start:k] if len(r) > 1 and r[0][1] > 0]
        why = (f"best score at {len(group)} sample(s) (sizes "
               f"{', '.join(str(s.size) for s in group)})")
        if margins:
            runner_up = winners[start][1][0]
            why += (f"; next {runner_up}, {math.exp(sum(map(math.log, margins)) / len(margins)):.2f}x"
                    f" its score (geometric mean)")
        buckets.append(Bucket(b_lo, b_hi, way, why, [s.to_dict() for s in group]))
        start = k
    return buckets


#: the most seconds a range plan may spend warming its buckets when it is loaded (by default;
#: ``opdispatch tune --warm-limit S``)
WARM_LIMIT_S = 15.0
#: the most shapes a range plan warms when loaded: a library keeps per-shape state for each
#: (OpenVINO's CPU plugin grew by 0.9 GB warming PP-OCRv4's recogniser at 701 widths, and its
#: runtime cache, 5,000 entries by default, then evicted what had been warmed)
WARM_MAX_SHAPES = 256


def _first_ms(samples: Sequence[Sample], way: str) -> float:
    """The mean time of ``way``'s first run at a new shape over ``samples``."""
    got = [s.first_ms.get(way, s.ms.get(way, 0.0)) for s in samples if way in s.ms]
    return sum(got) / len(got) if got else 0.0


def _shapes(bucket: Bucket, shared: Mapping[str, float] | None) -> int:
    """How many distinct shapes ``bucket``'s way meets (a padded way: one per step)."""
    return math.ceil((bucket.hi - bucket.lo + 1) / (shared or {}).get(bucket.way, 1.0))


def warm_cost_s(bucket: Bucket, samples: Sequence[Sample],
                shared: Mapping[str, float] | None = None) -> float:
    """Seconds to run ``bucket``'s way once at each of its shapes (one ranged axis; a padded
    way meets one shape per ``shared`` sizes)."""
    inside = [s for s in samples if bucket.lo <= s.size <= bucket.hi] or list(samples)
    return _shapes(bucket, shared) * _first_ms(inside, bucket.way) / 1e3


def plan_buckets(samples: Sequence[Sample], lo: int, hi: int, repeats: float,
                 one_axis: bool, limit_s: float = WARM_LIMIT_S,
                 request_points: Sequence[tuple[int, ...]] = (),
                 shared: Mapping[str, float] | None = None) -> list[Bucket]:
    """The buckets of a range. With one ranged axis and every bucket of the medians' cut
    warmable within ``limit_s`` and :data:`WARM_MAX_SHAPES` (each way run once at every size
    when the plan loads), that
    cut, every bucket warm: no request then meets a shape for the first time, and medians
    alone decide. Otherwise the cut that charges first runs (:func:`cut` with ``repeats``),
    warming the cheapest buckets that fit in ``limit_s`` (one axis), or the shapes of the
    user's requests (``request_points``) while they fit (several axes)."""
    if one_axis:
        warm = cut(samples, lo, hi, math.inf, shared=shared)
        if (sum(warm_cost_s(b, samples, shared) for b in warm) <= limit_s
                and sum(_shapes(b, shared) for b in warm) <= WARM_MAX_SHAPES):
            for b in warm:
                b.warm = True
            return warm
    buckets = cut(samples, lo, hi, repeats, shared=shared)
    spent = 0.0
    if one_axis:
        shapes = 0
        for b in sorted(buckets, key=lambda b: warm_cost_s(b, samples, shared)):
            cost = warm_cost_s(b, samples, shared)
            if spent + cost <= limit_s and shapes + _shapes(b, shared) <= WARM_MAX_SHAPES:
                b.warm, spent, shapes = True, spent + cost, shapes + _shapes(b, shared)
        return buckets
    for point in request_points:
        size = math.prod(point)
        b = next((b for b in buckets if b.lo <= size <= b.hi), None)
        if b is None:
            continue
        inside = [s for s in samples if s.point == tuple(point)] or \
            [s for s in samples if b.lo <= s.size <= b.hi]
        cost = _first_ms(inside, b.way) / 1e3
        if spent + cost <= limit_s and sum(len(x.warm_points) for x in buckets) < WARM_MAX_SHAPES:
            b.warm_points.append([int(v) for v in point])
            spent += cost
    return buckets
