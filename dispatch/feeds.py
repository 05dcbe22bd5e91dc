"""Checking a run's feeds and output names against the model, before anything runs.

Feeds are never converted silently: a feed of another dtype or shape, a masked array, a value
that is no array of numbers, an unknown or missing name each raise a
:class:`~dispatch.errors.FeedError` that says what was received and what the model expects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dispatch.errors import FeedError
from dispatch.graph import Graph


def check_output_names(graph: Graph, output_names: Sequence[str] | None) -> list[str] | None:
    """The output names asked for, checked against ``graph``'s outputs (``None``: all)."""
    if output_names is None:
        return None
    if isinstance(output_names, str):
        raise FeedError(f"output_names must be a list of names, received the string {output_names!r}")
    known = [v.name for v in graph.outputs]
    bad = [n for n in output_names if n not in known]
    if bad:
        raise FeedError(f"unknown output name(s) {bad}; the model's outputs are {known}")
    return list(output_names)

def check_feeds(graph: Graph, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """``feeds`` as plain arrays, each checked against its input's dtype and static shape;
    anything else raises :class:`~dispatch.errors.FeedError` saying what was received and
    what the model expects. Nothing is converted silently."""
    if not isinstance(feeds, Mapping):
        raise FeedError(f"feeds must be a dict of input name -> array, received {type(feeds).__name__}")
    expected = {v.name: v for v in graph.inputs}
    unknown = [k for k in feeds if k not in expected]
    missing = [k for k in expected if k not in feeds]
    if unknown or missing:
        parts = []
        if unknown:
            parts.append(f"unknown input name(s) {unknown}")
        if missing:
            parts.append(f"missing input(s) {missing}")
        want = ", ".join(f"{v.name}: {v.dtype} {list(v.shape or ())}" for v in graph.inputs)
        raise FeedError(f"{'; '.join(parts)}; the model expects {want or 'no inputs'}")
    out: dict[str, np.ndarray] = {}
    for name, value in feeds.items():
        v = expected[name]
        if isinstance(value, np.ma.MaskedArray):
            raise FeedError(
                f"input {name!r}: received a numpy masked array; its mask would be ignored: "
                f"pass a plain array (e.g. value.filled(0)) of dtype {v.dtype} and shape "
                f"{list(v.shape or ())}"
            )
        given = "" if isinstance(value, np.ndarray) else (
            f" (converted from a {type(value).__name__})")
        try:
            # a plain ndarray: subclasses (np.matrix) change what operators mean
            arr = value if type(value) is np.ndarray else np.asarray(value)
        except (ValueError, TypeError, OverflowError) as exc:
            raise FeedError(
                f"input {name!r}: received a {type(value).__name__} that is not an array of "
                f"numbers ({exc}); expected a numpy array of dtype {v.dtype} and shape "
                f"{list(v.shape or ())}"
            ) from None
        if arr.dtype != v.dtype:
            raise FeedError(
                f"input {name!r}: received dtype {arr.dtype}{given}, expected {v.dtype} "
                f"(shape {list(v.shape or ())}); feeds are not converted silently: pass "
                f"np.asarray(value, dtype=np.{np.dtype(v.dtype).name})"
            )
        if tuple(arr.shape) != tuple(v.shape or ()):
            raise FeedError(
                f"input {name!r}: received shape {list(arr.shape)}, expected {list(v.shape or ())}"
                f"; a session is planned for static shapes, create it with input_shapes= for others"
            )
        out[name] = arr
    return out
