"""``opdispatch tune MODEL --shape input_ids=1x1..512``: one tuning for a whole shape range.

The whole-model ways the backends offer (:mod:`dispatch.model_ways`: onnxruntime with every
core or one thread, OpenVINO under its latency hint, each compiled once with the model's
dimensions dynamic) are built once, then measured at sample shapes across the range — both
ends, points on a geometric scale between them, and shapes of the user's requests when given
(:func:`tuner.shapes.measure.measure_sample`: each way's outputs checked against onnxruntime's
at every sample) — with the budget spread over the samples. The range is cut where the winner
changes (:func:`tuner.shapes.buckets.cut`), and the :class:`~dispatch.range_plan.RangePlan`
is stored as a plan whose key names the model's structure (its family: the same for every
shape) and the range (``range input_ids=1x1..512 attention_mask=1x1..512``), so that a
Session finds it for any shape inside.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dispatch.config import Config
from dispatch.graph import Value
from dispatch.input_shapes import declared_in_file, format_shapes, shape_set
from dispatch.model_ways import model_file, model_ways
from dispatch.objective import Objective
from dispatch.plan import Plan
from dispatch.plan_policy import plan_backends
from dispatch.range_padding import (
    PAD_STEP,
    following_axes,
    mask_inputs,
    pad_feeds,
    padded_length,
    padded_name,
    padded_runner,
    split_name,
)
from dispatch.range_plan import RangePlan
from dispatch.registry import Registry
from dispatch.shape_range import ShapeRange
from tuner.fingerprint import RANGE_PREFIX, PlanKey, hardware_fingerprint, software_fingerprint
from tuner.index_bounds import index_bounds
from tuner.measure import model_tolerance, random_input
from tuner.shapes.accuracy import annotate, figure, judge, request_errors
from tuner.shapes.buckets import (
    DEFAULT_REPEATS,
    LOCAL_REJECTION,
    WARM_LIMIT_S,
    WARM_MAX_SHAPES,
    Sample,
    plan_buckets,
)
from tuner.shapes.measure import measure_sample
from tuner.store import PlanStore
from tuner.store.guarded import GuardedStore
from tuner.tune_types import TuningError

Feeds = dict[str, np.ndarray]
#: sample shapes spread over the range, and the most taken from the user's requests
SPREAD_SAMPLES, DATA_SAMPLES = 6, 6
#: the way whose outputs the others must match when it is measured
REFERENCE_WAY = "onnxruntime"


@dataclass
class RangeTuneResult:
    """What tuning a range produced."""

    plan: Plan
    range_plan: RangePlan
    key: PlanKey
    plan_id: int | None
    samples: list[Sample]
    stats: dict[str, Any] = field(default_factory=dict)
    store_error: str | None = None

    def summary(self) -> str:
        stored = (f"stored (id {self.plan_id})" if self.plan_id is not None
                  else f"NOT stored ({self.store_error})")
        s = self.stats
        return (f"range plan {self.key.digest()[:16]} {stored}; objective {self.key.objective}\n"
                f"measured {len(self.ways_measured())} way(s) at {len(self.samples)} sample "
                f"shape(s) in {s.get('tuning_s', 0):.1f} s (building the ways "
                f"{s.get('build_s', 0):.1f} s)\n" + self.range_plan.describe())

    def ways_measured(self) -> list[str]:
        return list(self.range_plan.ways)


def range_key(family: str, shape_range: ShapeRange, registry: Registry, backends: Sequence[str],
              objective: str) -> PlanKey:
    """The key a range plan is stored under: the model's structure (shapes open), the range."""
    return PlanKey(model=family, inputs=RANGE_PREFIX + shape_range.text(),
                   hardware=hardware_fingerprint(), software=software_fingerprint(registry, backends),
                   objective=objective, family=family)


def tune_range(
    model: Any,
    shapes: Mapping[str, Sequence[Any]],
    *,
    store: PlanStore | str | os.PathLike | None = None,
    budget_s: float = 180.0,
    objective: str | Objective = "latency",
    backends: Sequence[str] | None = None,
    requests: Sequence[Feeds] = (),
    config: Config | None = None,
    registry: Registry | None = None,
    log: Callable[[str], None] | None = None,
    warm_limit_s: float = WARM_LIMIT_S,
    range_from: str = "the shapes given",
    warm_max_shapes: int = WARM_MAX_SHAPES,
) -> RangeTuneResult:
    """Tune ``model`` over the range ``shapes`` (input name -> dimensions, a dimension a size
    or ``"LO..HI"``) within ``budget_s`` and store the range plan (see the module docstring).
    ``requests``: the user's requests (feeds of mixed shapes): their shapes are sampled and
    their repeats weigh a way's cost on shapes new to the process. ``warm_limit_s``: the most
    seconds the plan may spend when loaded running its ways once at shapes it would otherwise
    meet for the first time in a request (0: none), at most ``warm_max_shapes`` shapes (each
    costs the library's per-shape state: memory). ``range_from``: where the range came from
    (kept in the plan's notes for the report)."""
    from dispatch.backend import load_registry
    from dispatch.graph_cache import load_graph

    t_start = time.monotonic()
    say = log or (lambda _msg: None)
    objective = Objective.parse(objective).resolved()
    if (objective.name not in ("latency", "throughput") or objective.memory_cap is not None
            or objective.nonstrict_nan or objective.p99_ms is not None):
        raise TuningError(
            f"a shape range is tuned for the latency or the throughput objective (with an "
            f"accuracy budget or without, no p99 bound), received objective {objective}; tune "
            f"the shapes of other objectives one by one (--shape NAME=1x128)")
    concurrency = objective.concurrency or 1
    target = objective.accuracy
    if target is not None and not requests:
        raise TuningError(
            f"the objective {objective} lets a bucket compute in reduced precision where your "
            f"requests of its sizes stay within {target.spec}: give them (--data REQUESTS)")
    config = config or Config.load()
    registry = registry or load_registry(config.plugin_path or None, order=config.backend_order)
    backends = plan_backends(registry, config.backend_order, list(backends) if backends else None)
    for status in registry.backends.values():
        configure = getattr(status.backend, "configure", None)
        if status.available and configure is not None:
            configure(config)
    ways = {n: w for n, w in model_ways(registry, backends).items()
            if (w.precision == "float32" or target is not None)
            and (concurrency > 1 or not w.throughput_only)}
    if not ways:
        raise TuningError(
            "no available backend runs a whole model with dynamic dimensions (onnxruntime, "
            "openvino), which is what a shape range needs; install one: pip install "
            "'opdispatch[onnxruntime]'")
    path = model_file(model)
    declared = declared_in_file(path)
    shape_range = ShapeRange.bind(declared, shapes)
    small = shape_range.at(shape_range.ends()[0])
    graph = load_graph(path, small, registry, backends, config.graph_cache).graph
    names = [v.name for v in graph.outputs]
    # (MODEL_TOLERANCE, or looser where the file declares int8 activations: dispatch.compare)
    tol = model_tolerance(graph.nodes)
    bounds = index_bounds(graph.nodes)
    dtypes = {d.name: d.dtype for d in declared}
    # the requests inside the range, with their shapes, found once
    inside = _inside(requests, shape_range, declared)
    by_point: dict[tuple[int, ...], Feeds] = {}
    for got, feeds in inside:
        by_point.setdefault(shape_range.point(got), feeds)
    data_points = _spread(sorted(by_point, key=lambda p: (int(np.prod(p)), p)), DATA_SAMPLES)
    align = _alignment(list(by_point))
    points = shape_range.sample_points(SPREAD_SAMPLES, data_points, align)
    say(f"tuning the range {shape_range.text()} ({shape_range.axes_text()}): {len(ways)} "
        f"way(s) ({', '.join(ways)}) at {len(points)} sample shape(s), budget {budget_s:.0f} s")
    t_build = time.monotonic()
    runners = {}
    for name, way in ways.items():
        try:
            runners[name] = way.build(path)
        except Exception as exc:  # a library that cannot compile the model is left out
            say(f"  {name}: not built ({type(exc).__name__}: {str(exc)[:200]})")
    if not runners:
        raise TuningError(f"no whole-model way could build {path}")
    build_s = time.monotonic() - t_build
    reference = REFERENCE_WAY if REFERENCE_WAY in runners else next(iter(runners))
    rng = np.random.default_rng(0)

    def random_feeds(concrete: Mapping[str, Sequence[int]]) -> Feeds:
        return {n: np.ones(s, dtypes[n]) if n in masks else
                random_input(Value(n, tuple(s), dtypes[n]), rng, bounds.get(n))
                for n, s in concrete.items()}

    masks = mask_inputs([d.name for d in declared])
    padding = _padded_ways(shape_range, runners, reference, names, masks, random_feeds)
    runners.update(padding.pop("runners"))
    if padding.get("rejected"):
        say(f"  padding not offered: {padding['rejected']}")
    approximate = [w for w in runners if ways[split_name(w)[0]].precision != "float32"]
    samples: list[Sample] = []
    unrunnable: list[str] = []
    skipped: list[tuple[int, ...]] = []
    for k, point in enumerate(points):
        left = budget_s - (time.monotonic() - t_start)
        if left <= 0 and len(samples) >= 1 and k < len(points) - 1:
            skipped.append(point)  # over budget: only the large end is still measured
            continue
        share = max(0.05, 0.9 * left / (len(points) - k))
        concrete = shape_range.at(point)
        feeds = by_point.get(point) or random_feeds(concrete)
        sample = measure_sample(point, int(np.prod(point)) if point else 1, feeds, runners,
                                reference, names, share, approximate=approximate,
                                concurrency=concurrency, tol=tol)
        for way, why in list(sample.rejected.items()):
            if split_name(way)[1] and why.startswith("wrong outputs"):
                sample.rejected[way] = ("padding changes the outputs at the real positions: "
                                        + why.removeprefix("wrong outputs: "))
        if not sample.ms and not any(w.startswith(LOCAL_REJECTION) for w in sample.rejected.values()):
            unrunnable.append(f"{format_shapes(concrete)}: " + "; ".join(
                f"{w}: {why.splitlines()[0][:160]}" for w, why in sample.rejected.items()))
            say(f"  {format_shapes(concrete)}: no way runs it, left out of the samples")
            continue
        samples.append(sample)
        say(f"  {format_shapes(concrete)}: " + ", ".join(
            f"{w} {ms:.2f} ms (first {sample.first_ms.get(w, ms):.2f})"
            for w, ms in sorted(sample.ms.items(), key=lambda i: i[1]))
            + "".join(f"; {w} rejected: {why}" for w, why in sample.rejected.items()))
    if not samples:
        raise TuningError(f"no way runs any sample shape of the range {shape_range.text()}: "
                          + " | ".join(unrunnable[:3]))
    repeats = (len(requests) / max(1, len(by_point))) if by_point else DEFAULT_REPEATS
    small_size, large_size = (int(np.prod(p)) if p else 1 for p in shape_range.ends())
    errors: dict[str, list[tuple[int, float]]] = {}
    if target is not None:
        reduced = {w: runners[w] for w in approximate}
        sized = [(shape_range.size(got), feeds) for got, feeds in inside]
        errors = request_errors(target, reduced, runners[reference], sized)
        judge(samples, target, errors, small_size, large_size)
        for way, errs in errors.items():
            worst = max((e for _, e in errs), default=0.0)
            say(f"  {way}: {target.metric} {figure(target, worst):.6g} at worst on "
                f"{len(errs)} of your requests (budget {target.budget:g})")
    try:
        buckets = plan_buckets(samples, small_size, large_size, repeats,
                               len(shape_range.axes) == 1, warm_limit_s, list(by_point),
                               {w: float(split_name(w)[1]) for w in runners if split_name(w)[1]},
                               {w: ways[split_name(w)[0]].backend for w in runners},
                               _weights(samples, [shape_range.size(got) for got, _ in inside],
                                        small_size, large_size),
                               warm_max_shapes)
    except ValueError as exc:
        raise TuningError(f"the range {shape_range.text()} cannot be planned: {exc}") from None
    if target is not None:
        annotate(buckets, target, errors)
    range_plan = RangePlan(shape_range, buckets,
                           {n: _describe(n, ways) for n in runners},
                           {"range_from": range_from,
                            **({"concurrency": concurrency,
                                "figure": f"ms per request with {concurrency} in flight"}
                               if concurrency > 1 else {}),
                            "score": "median, every bucket warmed at load" if all(
                               b.warm for b in buckets) else "median + (first run - median) / repeats",
                            "warm_limit_s": warm_limit_s, "warm_max_shapes": warm_max_shapes,
                            "repeats": round(repeats, 2),
                            "repeats_from": "the requests given" if by_point else "the default",
                            "reference": reference, "budget_s": budget_s,
                            "samples_from_requests": len(data_points),
                            **({"aligned_to": list(align)} if any(a > 1 for a in align) else {}),
                            **({"unrunnable": unrunnable} if unrunnable else {}),
                            **({"skipped_over_budget": [list(p) for p in skipped]}
                               if skipped else {}),
                            **({"padding": padding} if padding else {})})
    plan = Plan(graph.name, [], [], provenance={
        "tuned_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "range": shape_range.text(),
        "label": "range plan"}, shapes=range_plan.to_dict())
    key = range_key(graph.family, shape_range, registry, backends, str(objective))
    opened = not isinstance(store, PlanStore)
    plans = PlanStore(store or config.store_path) if opened else store
    guarded = GuardedStore(plans)
    stats = {"build_s": round(build_s, 3), "samples": len(samples)}
    try:
        run_id = guarded.start_run(model_fp=key.model, budget_s=budget_s, objective=key.objective)
        plan_id = guarded.put_plan(key, plan.to_json(), latency_ms=None, run_id=run_id,
                                   notes={"range": shape_range.text()})
        stats["tuning_s"] = round(time.monotonic() - t_start, 3)
        guarded.finish_run(run_id, "finished", stats)
    finally:
        if opened:
            plans.close()
    return RangeTuneResult(plan, range_plan, key, plan_id, samples, stats, guarded.error)


def _padded_ways(shape_range: ShapeRange, runners: Mapping[str, Any], reference: str,
                 names: Sequence[str], masks: Sequence[str],
                 random_feeds: Callable[[Mapping[str, Sequence[int]]], Feeds]) -> dict[str, Any]:
    """The padded variants of ``runners`` (:mod:`dispatch.range_padding`) for a range of one
    axis over a model that takes a mask: ``{"runners": {...}, "step", "axes"}``, or why none
    (``"rejected"``). Which output axes follow the ranged axis is found by running the
    reference way at a length and padded to the next step; whether the padded outputs equal
    the plain ones is then checked at every sample like any way's outputs."""
    if len(shape_range.axes) != 1 or not masks:
        return {"runners": {}}
    (_, (lo, hi), _), = shape_range.axes
    value = next((v for v in range(max(lo, 1), hi + 1) if v % PAD_STEP), None)
    if value is None or padded_length(value, PAD_STEP, hi) == value:
        return {"runners": {}}
    target = padded_length(value, PAD_STEP, hi)
    feeds = random_feeds(shape_range.at((value,)))
    base = runners[reference]
    try:
        axes = following_axes(base(pad_feeds(shape_range, feeds, value, target)), base(feeds),
                              names, value, target)
    except Exception as exc:  # a model that refuses the padded shape is not padded
        axes = f"{type(exc).__name__}: {exc}"
    if isinstance(axes, str):
        return {"runners": {}, "rejected": axes, "mask": list(masks)}
    return {"runners": {padded_name(w, PAD_STEP): padded_runner(r, shape_range, PAD_STEP, axes,
                                                                names)
                        for w, r in runners.items()},
            "step": PAD_STEP, "axes": axes, "mask": list(masks)}


def _describe(name: str, ways: Mapping[str, Any]) -> str:
    base, step = split_name(name)
    text = ways[base].description
    return (f"{text}; each request padded with zeros on the ranged axis to the next multiple "
            f"of {step}, its outputs cut back" if step else text)


def _inside(requests: Sequence[Feeds], shape_range: ShapeRange,
            declared: Sequence[Any]) -> list[tuple[Any, Feeds]]:
    """The requests inside the range, each with its shapes (a :data:`ShapeSet`)."""
    order = [d.name for d in declared]
    got = [(shape_set({k: np.shape(v) for k, v in feeds.items()}, order), feeds)
           for feeds in requests]
    return [(shapes, feeds) for shapes, feeds in got if shape_range.contains(shapes)]


def _weights(samples: Sequence[Sample], sizes: Sequence[int], lo: int, hi: int) -> dict[int, float]:
    """Per sample size, how many requests it stands for (those between the midpoints to its
    neighbours); 1 each without requests."""
    if not sizes:
        return {}
    ordered = sorted(s.size for s in samples)
    out = {}
    for k, size in enumerate(ordered):
        a = lo if k == 0 else (ordered[k - 1] + size) // 2 + 1
        b = hi if k == len(ordered) - 1 else (size + ordered[k + 1]) // 2
        out[size] = float(sum(1 for x in sizes if a <= x <= b))
    return out


def _alignment(points: Sequence[tuple[int, ...]]) -> list[int]:
    """Per axis, the largest step every request's size is a multiple of (2 requests or more;
    a detector fed multiples of 32 gives 32), else 1."""
    if len(points) < 2:
        return []
    return [math.gcd(*(p[k] for p in points)) or 1 for k in range(len(points[0]))]


def _spread(items: Sequence[Any], count: int) -> list[Any]:
    """At most ``count`` of ``items``, evenly spaced, the ends kept."""
    if len(items) <= count:
        return list(items)
    step = (len(items) - 1) / (count - 1)
    return [items[round(k * step)] for k in range(count)]


def model_family(path: str, shapes: Mapping[str, Sequence[int]] | None = None) -> str:
    """The family of the model at ``path`` (its structure with the input shapes left open:
    the key of its range plans), imported at ``shapes`` (default: every symbolic dimension 1)."""
    from dispatch.input_shapes import family_digest
    from dispatch.onnx_import import import_model

    if shapes is None:
        shapes = {d.name: [x if isinstance(x, int) else 1 for x in d.dims or ()]
                  for d in declared_in_file(path)}
    graph = import_model(path, shapes)
    return family_digest(graph, graph.declared)


def stored_range_plans(store: PlanStore, family: str) -> list[Any]:
    """The range plans stored for ``family`` (StoredPlan rows, newest first), any machine."""
    return [p for p in store.plans_for_family(family) if p.key.inputs.startswith(RANGE_PREFIX)]
