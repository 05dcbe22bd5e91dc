"""Shape ranges (dispatch/shape_range.py): parsing, binding through symbols, membership,
sample points, JSON round trip."""

from __future__ import annotations

import numpy as np
import pytest

from dispatch.errors import ArgumentError
from dispatch.input_shapes import DeclaredInput
from dispatch.shape_range import ShapeRange, has_range, parse_dim

DECLARED = [DeclaredInput("input_ids", ("batch", "sequence"), np.dtype(np.int64)),
            DeclaredInput("attention_mask", ("batch", "sequence"), np.dtype(np.int64)),
            DeclaredInput("pixel", (1, 3), np.dtype(np.float32))]


def test_parse_dim_reads_sizes_and_ranges():
    assert parse_dim(128, "x") == (128, 128)
    assert parse_dim("128", "x") == (128, 128)
    assert parse_dim(" 1..512 ", "x") == (1, 512)


@pytest.mark.parametrize("bad", ["5..2", "a..b", "-1..4", "1..", True, 2.5, None, "1..99999999"])
def test_parse_dim_refuses_what_is_no_dimension(bad):
    with pytest.raises(ArgumentError, match=r"LO\.\.HI.*received"):
        parse_dim(bad, "shape range of input 'x'")


def test_has_range():
    assert has_range({"x": [1, "1..4"]})
    assert not has_range({"x": [1, 4]})
    assert not has_range(None)


def test_bind_sizes_inputs_sharing_a_symbol():
    r = ShapeRange.bind(DECLARED, {"input_ids": [1, "1..512"]})
    assert r.text() == "input_ids=1x1..512 attention_mask=1x1..512 pixel=1x3"
    assert [(label, dim) for label, dim, _ in r.axes] == [("sequence", (1, 512))]
    assert r.axes_text() == "sequence 1..512"
    shapes = (("input_ids", (1, 37)), ("attention_mask", (1, 37)), ("pixel", (1, 3)))
    assert r.contains(shapes) and r.size(shapes) == 37 and r.point(shapes) == (37,)
    assert r.at((37,)) == {"input_ids": [1, 37], "attention_mask": [1, 37], "pixel": [1, 3]}


def test_why_not_names_the_dimension_outside():
    r = ShapeRange.bind(DECLARED, {"input_ids": [1, "1..512"]})
    outside = (("input_ids", (1, 600)), ("attention_mask", (1, 600)), ("pixel", (1, 3)))
    assert r.why_not(outside) == "input 'input_ids' dimension 1 is 600, outside 1..512"
    assert not r.contains(outside)


@pytest.mark.parametrize("given, match", [
    ({"nope": [1, "1..4"]}, "not inputs of the model"),
    ({"input_ids": [1, "1..4"], "attention_mask": [1, "1..8"]}, "must agree"),
    ({"input_ids": ["1..4"]}, "rank 1"),
    ({"pixel": [1, "2..3"]}, "fixes it to 3"),
    ({"attention_mask": "1x1..4"}, "list of dimensions"),
])
def test_bind_refuses_ranges_that_do_not_fit(given, match):
    with pytest.raises(ArgumentError, match=match):
        ShapeRange.bind(DECLARED, given)


def test_an_input_left_unsized_is_named():
    declared = [DeclaredInput("a", ("n",), np.dtype(np.float32)),
                DeclaredInput("b", ("m",), np.dtype(np.float32))]
    with pytest.raises(ArgumentError, match="does not size input b"):
        ShapeRange.bind(declared, {"a": ["1..4"]})


def test_sample_points_keep_both_ends_and_the_requests_inside():
    r = ShapeRange.bind(DECLARED, {"input_ids": [1, "1..128"]})
    points = r.sample_points(6, extra=[(37,), (500,)])
    assert points[0] == (1,) and points[-1] == (128,)
    assert (37,) in points and (500,) not in points
    assert points == sorted(points) and len(points) == len(set(points))


def test_json_round_trip():
    r = ShapeRange.bind(DECLARED, {"input_ids": [1, "1..128"]})
    assert ShapeRange.from_dict(r.to_dict()) == r
    with pytest.raises(ArgumentError, match="malformed shape range"):
        ShapeRange.from_dict({"inputs": 3})
