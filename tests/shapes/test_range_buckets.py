"""Cutting a range into buckets (tuner/shapes/buckets.py) on FAKE, deterministic figures: the
samples below are made up, not measured, so that the optimiser's choices can be checked
exactly; the range plan's routing and JSON (dispatch/range_plan.py)."""

from __future__ import annotations

import numpy as np
import pytest

from dispatch.errors import PlanError
from dispatch.input_shapes import DeclaredInput
from dispatch.plan import Plan
from dispatch.range_plan import Bucket, RangePlan
from dispatch.shape_range import ShapeRange
from tuner.shapes.buckets import Sample, cut, plan_buckets, warm_cost_s

RANGE = ShapeRange.bind([DeclaredInput("x", (1, "seq"), np.dtype(np.float32))], {"x": [1, "1..128"]})


def fake(size: int, ms: dict[str, float], first: dict[str, float] | None = None,
         rejected: dict[str, str] | None = None) -> Sample:
    """A made-up sample (a fake backend's deterministic costs)."""
    return Sample((size,), size, dict(ms), dict(first or ms), dict(rejected or {}))


def shapes(n: int):
    return (("x", (1, n)),)


def test_the_range_is_cut_where_the_winner_changes():
    samples = [fake(1, {"a": 1.0, "b": 2.0}), fake(16, {"a": 2.0, "b": 3.0}),
               fake(64, {"a": 6.0, "b": 5.0}), fake(128, {"a": 12.0, "b": 9.0})]
    buckets = cut(samples, 1, 128, repeats=4)
    assert [(b.lo, b.hi, b.way) for b in buckets] == [(1, 40, "a"), (41, 128, "b")]
    assert "next b" in buckets[0].why and "sizes 1, 16" in buckets[0].why


def test_first_runs_weigh_by_the_repeats():
    # b is faster once warm but pays 20 ms more on every new shape
    samples = [fake(1, {"a": 5.0, "b": 4.0}, {"a": 5.0, "b": 24.0}),
               fake(128, {"a": 5.0, "b": 4.0}, {"a": 5.0, "b": 24.0})]
    assert [b.way for b in cut(samples, 1, 128, repeats=2)] == ["a"]
    assert [b.way for b in cut(samples, 1, 128, repeats=100)] == ["b"]


def test_a_way_rejected_at_any_sample_is_used_nowhere():
    samples = [fake(1, {"a": 2.0, "b": 1.0}),
               fake(128, {"a": 2.0, "b": 1.0}, rejected={"b": "wrong outputs: differs"})]
    assert [b.way for b in cut(samples, 1, 128, repeats=4)] == ["a"]
    with pytest.raises(ValueError, match="wrong outputs"):
        cut([fake(1, {"b": 1.0}, rejected={"b": "wrong outputs: differs"})], 1, 1, 4)


def test_buckets_are_warmed_only_within_the_limit():
    samples = [fake(1, {"a": 1.0}, {"a": 10.0}), fake(128, {"a": 2.0}, {"a": 10.0})]
    warm = plan_buckets(samples, 1, 128, repeats=4, one_axis=True, limit_s=5.0)
    assert all(b.warm for b in warm)
    assert warm_cost_s(warm[0], samples) == pytest.approx(128 * 10.0 / 1e3)
    cold = plan_buckets(samples, 1, 128, repeats=4, one_axis=True, limit_s=0.5)
    assert not any(b.warm for b in cold)
    assert not any(b.warm for b in plan_buckets(samples, 1, 128, 4, one_axis=False))


def test_a_range_plan_routes_each_shape_to_its_bucket():
    plan = RangePlan(RANGE, [Bucket(1, 40, "a"), Bucket(41, 128, "b")])
    assert plan.bucket_for(shapes(1)).way == "a"
    assert plan.bucket_for(shapes(40)).way == "a"
    assert plan.bucket_for(shapes(41)).way == "b"
    assert plan.bucket_for(shapes(128)).way == "b"
    assert plan.bucket_for(shapes(129)) is None


def test_buckets_must_tile_the_range():
    with pytest.raises(PlanError, match="tile"):
        RangePlan(RANGE, [Bucket(1, 40, "a"), Bucket(50, 128, "b")])
    with pytest.raises(PlanError, match="at least one bucket"):
        RangePlan(RANGE, [])


def test_a_range_plan_travels_inside_a_plan_json():
    ranged = RangePlan(RANGE, [Bucket(1, 40, "a", "why", warm=True), Bucket(41, 128, "b")],
                       {"a": "way a", "b": "way b"}, {"repeats": 4})
    plan = Plan("g", [], [], shapes=ranged.to_dict())
    back = Plan.from_json(plan.to_json())
    assert back.range_plan().to_dict() == ranged.to_dict()
    assert "size 1..40: a (why); warmed" in back.describe()
    assert "shapes" not in Plan("g", [], []).to_dict()  # concrete plans' JSON unchanged
    broken = plan.to_dict()
    broken["shapes"]["buckets"][0]["lo"] = "x"
    with pytest.raises(PlanError, match="shapes"):
        Plan.from_dict(broken)


def test_with_several_axes_the_requests_shapes_are_warmed_within_the_limit():
    samples = [Sample((1, 1), 1, {"a": 1.0}, {"a": 100.0}),
               Sample((2, 3), 6, {"a": 2.0}, {"a": 100.0}),
               Sample((4, 4), 16, {"a": 3.0}, {"a": 100.0})]
    (bucket,) = plan_buckets(samples, 1, 16, 4, one_axis=False, limit_s=0.25,
                             request_points=[(2, 3), (4, 4), (3, 3)])
    assert bucket.warm_points == [[2, 3], [4, 4]] and not bucket.warm  # 0.1 s each
    back = RangePlan.from_dict(RangePlan(RANGE2, [bucket]).to_dict())
    assert back.buckets[0].warm_points == [[2, 3], [4, 4]]
    assert "2 shape(s) of the requests warmed" in back.describe()


RANGE2 = ShapeRange.bind([DeclaredInput("x", ("h", "w"), np.dtype(np.float32))],
                         {"x": ["1..4", "1..4"]})


def test_a_range_of_more_shapes_than_can_be_kept_warm_is_cut_on_first_runs():
    # b is faster once warm, but 2,001 shapes are more than a library should keep warm
    samples = [fake(100, {"a": 5.0, "b": 4.0}, {"a": 5.0, "b": 20.0}),
               fake(2100, {"a": 9.0, "b": 7.0}, {"a": 9.0, "b": 25.0})]
    buckets = plan_buckets(samples, 100, 2100, repeats=1.1, one_axis=True, limit_s=1e9)
    assert [b.way for b in buckets] == ["a"] and not buckets[0].warm
    # 701 (PP-OCRv4's recogniser's widths) are kept warm: b once warm decides
    samples = [fake(100, {"a": 5.0, "b": 4.0}, {"a": 5.0, "b": 20.0}),
               fake(800, {"a": 9.0, "b": 7.0}, {"a": 9.0, "b": 25.0})]
    buckets = plan_buckets(samples, 100, 800, repeats=1.1, one_axis=True, limit_s=1e9)
    assert [b.way for b in buckets] == ["b"] and buckets[0].warm
    buckets = plan_buckets(samples, 100, 800, repeats=1.1, one_axis=True, limit_s=1e9, max_shapes=700)
    assert [b.way for b in buckets] == ["a"] and not buckets[0].warm


def test_a_lone_sample_won_within_noise_goes_to_its_neighbours_way():
    samples = [fake(1, {"a": 1.0, "b": 2.0}), fake(16, {"a": 2.04, "b": 2.0}),
               fake(64, {"a": 6.0, "b": 9.0})]
    assert [b.way for b in cut(samples, 1, 64, repeats=4)] == ["a"]
    clear = [fake(1, {"a": 1.0, "b": 2.0}), fake(16, {"a": 2.5, "b": 2.0}),
             fake(64, {"a": 6.0, "b": 9.0})]
    assert [b.way for b in cut(clear, 1, 64, repeats=4)] == ["a", "b", "a"]


def test_the_requests_shapes_of_several_axes_are_scored_as_warmed():
    # b is faster once warm but slow on a new shape: at the requests' shapes, warmed when the
    # plan loads, only its median counts
    samples = [Sample((2, 3), 6, {"a": 5.0, "b": 4.0}, {"a": 5.0, "b": 40.0}),
               Sample((4, 4), 16, {"a": 9.0, "b": 7.0}, {"a": 9.0, "b": 60.0})]
    buckets = plan_buckets(samples, 1, 16, repeats=2, one_axis=False, limit_s=1.0,
                           request_points=[(2, 3), (4, 4)])
    assert [b.way for b in buckets] == ["b"] and buckets[0].warm_points == [[2, 3], [4, 4]]
    for s in samples:
        s.warmed = False
    assert [b.way for b in plan_buckets(samples, 1, 16, repeats=2, one_axis=False,
                                        limit_s=0.01, request_points=[(2, 3), (4, 4)])] == ["a"]


def test_one_library_is_kept_when_switching_libraries_buys_little():
    from tuner.shapes.buckets import one_library

    libraries = {"ort": "onnxruntime", "ov": "openvino"}
    near = [fake(1, {"ort": 1.0, "ov": 1.2}), fake(64, {"ort": 6.0, "ov": 5.0}),
            fake(128, {"ort": 12.0, "ov": 10.0})]
    mixed = cut(near, 1, 128, repeats=4)
    assert [b.way for b in mixed] == ["ort", "ov"]
    kept = one_library(mixed, near, 1, 128, 4, libraries, {1: 1.0, 64: 1.0, 128: 1.0})
    assert [b.way for b in kept] == ["ov"] and "one library kept" in kept[0].why
    # weighted by the requests: with ten short ones per long one, each library alone costs
    # 8% (openvino) and 12% (onnxruntime) more than the split
    assert [b.way for b in one_library(mixed, near, 1, 128, 4, libraries,
                                       {1: 10.0, 64: 1.0, 128: 1.0})] == ["ort", "ov"]
    far = [fake(1, {"ort": 1.0, "ov": 3.0}), fake(128, {"ort": 12.0, "ov": 10.0})]
    split = cut(far, 1, 128, repeats=4)
    assert [b.way for b in one_library(split, far, 1, 128, 4, libraries, {})] == ["ort", "ov"]
