"""Range plans: one tuning serves every input shape of a range, cut into measured buckets.

A :class:`RangePlan` holds a :class:`~dispatch.shape_range.ShapeRange` and the buckets the
tuner cut it into (:mod:`tuner.shapes`): each bucket is an interval of the range's size scale
(:meth:`ShapeRange.size`: the sequence length for a range over ``sequence``) and the
whole-model way (:mod:`dispatch.model_ways`) that was fastest at the sample shapes measured in
it, with the figures that made it win. It travels inside a :class:`~dispatch.plan.Plan`
(``Plan.shapes``), so the store, bundles and reports carry it as any plan.

:class:`RangeRunner` runs a range plan: each bucket's way is built once (the model compiled
with dynamic dimensions), and a request finds its bucket by its size — a bisection over the
buckets, no planning, no state per shape — so a stream of any number of distinct shapes keeps
the runner's memory bounded by the ways' own caches.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from dispatch.errors import ArgumentError, FeedError, PlanError
from dispatch.input_shapes import ShapeSet, format_shapes
from dispatch.model_ways import WayRunner, model_way
from dispatch.range_padding import padded_length, padded_runner, split_name
from dispatch.shape_range import ShapeRange

if TYPE_CHECKING:
    from dispatch.registry import Registry


@dataclass
class Bucket:
    """One interval ``[lo, hi]`` of a range's size scale and the way that runs it.

    Attributes:
        lo, hi: the sizes it covers, inclusive.
        way: the whole-model way that runs it (:class:`~dispatch.model_ways.ModelWay` name).
        why: why that way: its measured margin over the next one.
        samples: the sample shapes measured in it: ``{"point": [...], "size": n, "ms": {way:
            median ms}, "first_ms": {way: ms of the first run at that shape}}``.
        warm: run the way once at every shape of the bucket when the plan is loaded (the
            tuner sets it where the way's first run at a new shape costs more than a run at a
            seen one, and the bucket's shapes are few enough to warm within a bound): a
            served process then meets no shape for the first time.
        warm_points: points (one value per axis) to run once when the plan is loaded, for a
            range of several axes, where warming every shape is out of reach: the shapes of
            the user's requests in the bucket.
    """

    lo: int
    hi: int
    way: str
    why: str = ""
    samples: list[dict[str, Any]] = field(default_factory=list)
    warm: bool = False
    warm_points: list[list[int]] = field(default_factory=list)


@dataclass
class RangePlan:
    """The buckets of one shape range (see the module docstring)."""

    range: ShapeRange
    buckets: list[Bucket]
    #: way name -> its description, for every way measured
    ways: dict[str, str] = field(default_factory=dict)
    #: how the buckets were chosen (the score, the budget, the samples' source)
    notes: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.buckets:
            raise PlanError("a range plan needs at least one bucket")
        for a, b in zip(self.buckets, self.buckets[1:]):
            if b.lo != a.hi + 1:
                raise PlanError(f"range plan buckets must tile the size scale: bucket "
                                f"{a.lo}..{a.hi} is followed by {b.lo}..{b.hi}")
        self._starts = [b.lo for b in self.buckets]

    def bucket_for(self, shapes: ShapeSet) -> Bucket | None:
        """The bucket that runs concrete ``shapes``, ``None`` outside the range."""
        if not self.range.contains(shapes):
            return None
        size = self.range.size(shapes)
        k = bisect.bisect_right(self._starts, size) - 1
        bucket = self.buckets[max(k, 0)]
        return bucket if bucket.lo <= size <= bucket.hi else None

    def ways_used(self) -> list[str]:
        return list(dict.fromkeys(b.way for b in self.buckets))

    # -- JSON -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"range": self.range.to_dict(),
                "buckets": [{"lo": b.lo, "hi": b.hi, "way": b.way, "why": b.why,
                             "samples": b.samples, "warm": b.warm,
                             **({"warm_points": b.warm_points} if b.warm_points else {})}
                            for b in self.buckets],
                "ways": dict(self.ways), "notes": dict(self.notes)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RangePlan:
        """A range plan from its JSON form; raises :class:`~dispatch.errors.PlanError`."""
        if not isinstance(data, Mapping):
            raise PlanError(f"plan: shapes must be a JSON object, received {type(data).__name__}")
        try:
            shape_range = ShapeRange.from_dict(data["range"])
            buckets = [Bucket(int(b["lo"]), int(b["hi"]), str(b["way"]), str(b.get("why", "")),
                              list(b.get("samples", [])), bool(b.get("warm", False)),
                              [[int(v) for v in p] for p in b.get("warm_points", [])])
                       for b in data["buckets"]]
            return cls(shape_range, buckets, dict(data.get("ways", {})),
                       dict(data.get("notes", {})))
        except ArgumentError as exc:
            raise PlanError(f"plan: shapes: {exc}") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanError(f"malformed plan: shapes: {type(exc).__name__}: {exc}") from None

    def describe(self) -> str:
        """One line per bucket: sizes, way, margin."""
        lines = [f"range {self.range.text()} ({self.range.axes_text() or 'no ranged axis'}): "
                 f"{len(self.buckets)} bucket(s)"]
        for b in self.buckets:
            lines.append(f"  size {b.lo}..{b.hi}: {b.way}" + (f" ({b.why})" if b.why else "")
                         + ("; warmed at every shape when loaded" if b.warm else "")
                         + (f"; {len(b.warm_points)} shape(s) of the requests warmed when loaded"
                            if b.warm_points else ""))
        return "\n".join(lines)


class RangeRunner:
    """Runs a :class:`RangePlan` (see the module docstring): every bucket's way built on
    :meth:`build` (or on first use), requests routed by size.

    Args:
        plan: the range plan.
        model_path: the model file the ways compile.
        registry, backends: where the ways come from.
        output_names: the model's outputs, in its order.
    """

    def __init__(self, plan: RangePlan, model_path: str, registry: Registry,
                 backends: Sequence[str], output_names: Sequence[str],
                 dtypes: Mapping[str, Any] | None = None) -> None:
        self.plan = plan
        self.model_path = model_path
        self.output_names = list(output_names)
        self.dtypes = {k: np.dtype(v) for k, v in (dtypes or {}).items()}
        #: seconds spent warming buckets (:attr:`Bucket.warm`) by :meth:`build`
        self.warm_s = 0.0
        self.warmed = 0
        self._ways = {name: model_way(registry, backends, split_name(name)[0])
                      for name in plan.ways_used()}
        self._built: dict[str, WayRunner] = {}
        self._base: dict[str, WayRunner] = {}
        self._lock = threading.Lock()

    def build(self) -> None:
        """Build every bucket's way now, and run each warm bucket's way once at every shape
        of the bucket (what readiness waits for)."""
        for name in self._ways:
            self._runner(name)
        if self.warm_s or not self.dtypes:
            return
        t0 = time.perf_counter()
        for bucket in self.plan.buckets:
            points = [tuple(p) for p in bucket.warm_points]
            if bucket.warm and len(self.plan.range.axes) == 1:
                step = split_name(bucket.way)[1]
                hi = self.plan.range.ends()[1][0]
                points += [(padded_length(size, step, hi) if step else size,)
                           for size in range(bucket.lo, bucket.hi + 1)]
            run = self._runner(bucket.way)
            for point in dict.fromkeys(points):
                shapes = self.plan.range.at(point)
                run({n: np.ones(s, self.dtypes[n]) if self.dtypes[n].kind in "iub"
                     else np.zeros(s, self.dtypes[n]) for n, s in shapes.items()})
                self.warmed += 1
        self.warm_s = time.perf_counter() - t0 or 1e-9

    def _runner(self, name: str) -> WayRunner:
        found = self._built.get(name)
        if found is not None:
            return found
        with self._lock:
            if name not in self._built:
                base_name, step = split_name(name)
                if base_name not in self._base:
                    self._base[base_name] = self._ways[name].build(self.model_path)
                base = self._base[base_name]
                if step:
                    axes = (self.plan.notes.get("padding") or {}).get("axes")
                    if not isinstance(axes, dict):
                        raise PlanError(f"range plan: way {name!r} pads, but the plan records "
                                        f"no padded output axes (notes.padding.axes)")
                    base = padded_runner(base, self.plan.range, step, axes, self.output_names)
                self._built[name] = base
            return self._built[name]

    def covers(self, shapes: ShapeSet) -> bool:
        return self.plan.bucket_for(shapes) is not None

    def run(self, shapes: ShapeSet, feeds: Mapping[str, np.ndarray],
            output_names: Sequence[str] | None = None) -> list[np.ndarray]:
        """Run one request of concrete ``shapes`` on its bucket's way."""
        bucket = self.plan.bucket_for(shapes)
        if bucket is None:
            raise FeedError(f"input shapes {format_shapes(shapes)} lie outside the range plan's "
                            f"range {self.plan.range.text()}: {self.plan.range.why_not(shapes)}")
        outputs = self._runner(bucket.way)(feeds)
        if output_names is None:
            return list(outputs)
        index = {n: k for k, n in enumerate(self.output_names)}
        return [outputs[index[n]] for n in output_names]
