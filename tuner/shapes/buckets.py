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
    #: a shape the plan runs once when it loads (one of the user's requests, for a range of
    #: several axes): no request meets it first, so its first runs cost nothing here
    warmed: bool = False

    def score(self, way: str, repeats: float) -> float:
        if self.warmed:
            return self.ms[way]
        excess = max(0.0, self.first_ms.get(way, self.ms[way]) - self.ms[way])
        return self.ms[way] + excess / max(repeats, 1.0)

    def to_dict(self) -> dict:
        return {"point": list(self.point), "size": self.size,
                "ms": {k: round(v, 4) for k, v in self.ms.items()},
                "first_ms": {k: round(v, 4) for k, v in self.first_ms.items()},
                **({"rejected": dict(self.rejected)} if self.rejected else {})}


#: a lone sample's winner within this factor of the way winning on both sides of it is
#: taken for noise: the neighbours' way runs there too (no bucket of one sample won by 2%)
NOISE = 1.05


def _smooth(winners: list[list[tuple[str, float]]]) -> None:
    """Give a lone sample whose winner differs from both neighbours' (which agree) to the
    neighbours' way when that way's score there is within :data:`NOISE` of the winner's."""
    for k in range(1, len(winners) - 1):
        left, right, here = winners[k - 1][0][0], winners[k + 1][0][0], winners[k]
        if left != right or here[0][0] == left:
            continue
        scores = dict(here)
        if left in scores and scores[left] <= NOISE * here[0][1]:
            here.sort(key=lambda item: (item[0] != left, item[1]))


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
    _smooth(winners)
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
#: (OpenVINO's CPU plugin grew by 0.8 GB warming PP-OCRv4's recogniser at its 701 widths; its
#: whole-model ways keep room for this many shapes in their runtime cache:
#: impls.openvino.whole_model.RUNTIME_CACHE_CAPACITY. At OpenVINO's default of 5,000 entries it
#: evicted what had been warmed, and this bound was 256)
WARM_MAX_SHAPES = 1024


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


#: how much slower (in total, weighted by the requests) a plan on one library may be than one
#: that switches libraries between buckets and still be preferred: two libraries in one process
#: disturb each other (their thread pools; measured on MiniLM: the OpenVINO requests of an
#: onnxruntime + OpenVINO plan 0-35% slower than in an OpenVINO-only process, from run to run)
SWITCH_COST = 0.05


def _weighted_cost(buckets: Sequence[Bucket], samples: Sequence[Sample], repeats: float,
                   weights: Mapping[int, float], shared: Mapping[str, float]) -> float:
    total = 0.0
    for s in samples:
        b = next(b for b in buckets if b.lo <= s.size <= b.hi)
        total += weights.get(s.size, 1.0) * s.score(b.way, repeats * shared.get(b.way, 1.0))
    return total


def one_library(buckets: list[Bucket], samples: Sequence[Sample], lo: int, hi: int,
                repeats: float, libraries: Mapping[str, str], weights: Mapping[int, float],
                shared: Mapping[str, float] | None = None) -> list[Bucket]:
    """``buckets``, or the cut among one library's ways alone when its weighted cost is within
    :data:`SWITCH_COST` of theirs (``libraries``: way -> its library; ``weights``: sample size
    -> how many requests it stands for)."""
    shared = shared or {}
    used = {libraries.get(b.way, b.way) for b in buckets}
    if len(used) < 2:
        return buckets
    mixed = _weighted_cost(buckets, samples, repeats, weights, shared)
    best = None
    for library in sorted(set(libraries.values())):
        try:
            alone = cut(samples, lo, hi, repeats, {w: lib == library for w, lib in libraries.items()},
                        shared)
        except ValueError:
            continue
        cost = _weighted_cost(alone, samples, repeats, weights, shared)
        if cost <= (1 + SWITCH_COST) * mixed and (best is None or cost < best[0]):
            best = (cost, alone)
    if best is None:
        return buckets
    for b in best[1]:
        b.why += (f"; {libraries.get(b.way, b.way)} alone costs {best[0] / mixed:.3f}x the plan "
                  f"switching libraries, within {1 + SWITCH_COST:.2f}x: one library kept")
    return best[1]


def plan_buckets(samples: Sequence[Sample], lo: int, hi: int, repeats: float,
                 one_axis: bool, limit_s: float = WARM_LIMIT_S,
                 request_points: Sequence[tuple[int, ...]] = (),
                 shared: Mapping[str, float] | None = None,
                 libraries: Mapping[str, str] | None = None,
                 weights: Mapping[int, float] | None = None,
                 max_shapes: int = WARM_MAX_SHAPES) -> list[Bucket]:
    """The buckets of a range. With one ranged axis and every bucket of the medians' cut
    warmable within ``limit_s`` and :data:`WARM_MAX_SHAPES` (each way run once at every size
    when the plan loads), that
    cut, every bucket warm: no request then meets a shape for the first time, and medians
    alone decide. Otherwise the cut that charges first runs (:func:`cut` with ``repeats``),
    warming the cheapest buckets that fit in ``limit_s`` (one axis), or the shapes of the
    user's requests (``request_points``) while they fit (several axes). With ``libraries``
    (way -> library), a cut on one library is kept when it costs little more
    (:func:`one_library`)."""
    def cut_(rep: float) -> list[Bucket]:
        got = cut(samples, lo, hi, rep, shared=shared)
        if libraries:
            got = one_library(got, samples, lo, hi, rep, libraries, weights or {}, shared)
        return got

    if one_axis:
        warm = cut_(math.inf)
        if (sum(warm_cost_s(b, samples, shared) for b in warm) <= limit_s
                and sum(_shapes(b, shared) for b in warm) <= max_shapes):
            for b in warm:
                b.warm = True
            return warm
    if not one_axis and request_points:
        wanted = {tuple(p) for p in request_points}
        at = [s for s in samples if s.point in wanted]
        cost = sum(max(s.first_ms.values(), default=0.0) for s in at) / 1e3
        if cost <= limit_s and len(wanted) <= max_shapes:
            for s in at:
                s.warmed = True
    buckets = cut_(repeats)
    spent = 0.0
    if one_axis:
        shapes = 0
        for b in sorted(buckets, key=lambda b: warm_cost_s(b, samples, shared)):
            cost = warm_cost_s(b, samples, shared)
            if spent + cost <= limit_s and shapes + _shapes(b, shared) <= max_shapes:
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
        if spent + cost <= limit_s and sum(len(x.warm_points) for x in buckets) < max_shapes:
            b.warm_points.append([int(v) for v in point])
            spent += cost
    return buckets
