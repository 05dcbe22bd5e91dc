"""Checking a run's feeds and output names against the model, before anything runs.

Feeds are never converted silently: a feed of another dtype or shape, a masked array, a value
that is no array of numbers, an unknown or missing name each raise a
:class:`~dispatch.errors.FeedError` that says what was received and what the model expects.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
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

def feed_signature(feeds: Any) -> tuple | None:
    """What :func:`check_feeds` judges of ``feeds`` (each name with its array's dtype and
    shape, in the caller's order), ``None`` unless ``feeds`` is a ``dict`` of plain numpy
    arrays: feeds of a signature checked once need no second check (the Session's fast path;
    a masked array, a list or an ``np.matrix`` always takes the full check)."""
    if type(feeds) is not dict:
        return None
    sig = []
    for name, value in feeds.items():
        if type(value) is not np.ndarray:
            return None
        sig.append((name, value.dtype, value.shape))
    return tuple(sig)


def check_feeds(graph: Graph, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """``feeds`` as plain arrays, each checked against its input's dtype and static shape;
    anything else raises :class:`~dispatch.errors.FeedError` saying what was received and
    what the model expects. Nothing is converted silently."""
    expected = [_Expected(v.name, np.dtype(v.dtype), list(v.shape or ()), None)  # type: ignore[arg-type]
                for v in graph.inputs]
    return _check(expected, feeds)


def check_declared_feeds(declared: Sequence[Any], feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """As :func:`check_feeds`, against the model's declared inputs
    (:class:`dispatch.input_shapes.DeclaredInput`: symbolic dimensions accept any size, the
    inputs sharing a symbol must agree on it)."""
    from dispatch.input_shapes import feed_shapes, mismatch

    expected = [_Expected(d.name, np.dtype(d.dtype), list(d.dims) if d.dims is not None else None,
                          functools.partial(mismatch, d)) for d in declared]
    arrays = _check(expected, feeds)
    feed_shapes(declared, arrays)  # one symbol given two sizes: a FeedError naming both
    return arrays


@dataclass(frozen=True)
class _Expected:
    name: str
    dtype: np.dtype
    #: the expected dimensions (sizes, or symbols for a declared input; None: any rank)
    dims: list[Any] | None
    #: for a declared input: shape -> why it does not fit, else None (static: equality)
    fits: Callable[[Sequence[int]], str | None] | None


def _dims_text(dims: list[Any] | None) -> str:
    if dims is None:
        return "(any rank)"
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _check(expected: Sequence[_Expected], feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
    if not isinstance(feeds, Mapping):
        raise FeedError(f"feeds must be a dict of input name -> array, received {type(feeds).__name__}")
    by_name = {e.name: e for e in expected}
    unknown = [k for k in feeds if k not in by_name]
    missing = [k for k in by_name if k not in feeds]
    if unknown or missing:
        parts = []
        if unknown:
            parts.append(f"unknown input name(s) {unknown}")
        if missing:
            parts.append(f"missing input(s) {missing}")
        want = ", ".join(f"{e.name}: {e.dtype} {_dims_text(e.dims)}" for e in expected)
        raise FeedError(f"{'; '.join(parts)}; the model expects {want or 'no inputs'}")
    out: dict[str, np.ndarray] = {}
    for name, value in feeds.items():
        e = by_name[name]
        if isinstance(value, np.ma.MaskedArray):
            raise FeedError(
                f"input {name!r}: received a numpy masked array; its mask would be ignored: "
                f"pass a plain array (e.g. value.filled(0)) of dtype {e.dtype} and shape "
                f"{_dims_text(e.dims)}"
            )
        given = "" if isinstance(value, np.ndarray) else (
            f" (converted from a {type(value).__name__})")
        try:
            # a plain ndarray: subclasses (np.matrix) change what operators mean
            arr = value if type(value) is np.ndarray else np.asarray(value)
        except (ValueError, TypeError, OverflowError) as exc:
            raise FeedError(
                f"input {name!r}: received a {type(value).__name__} that is not an array of "
                f"numbers ({exc}); expected a numpy array of dtype {e.dtype} and shape "
                f"{_dims_text(e.dims)}"
            ) from None
        if arr.dtype != e.dtype:
            raise FeedError(
                f"input {name!r}: received dtype {arr.dtype}{given}, expected {e.dtype} "
                f"(shape {_dims_text(e.dims)}); feeds are not converted silently: pass "
                f"np.asarray(value, dtype=np.{e.dtype.name})"
            )
        if e.fits is not None:
            why = e.fits(arr.shape)
            if why:
                raise FeedError(f"input {name!r}: received shape {list(arr.shape)}, expected "
                                f"{_dims_text(e.dims)} ({why})")
        elif list(arr.shape) != e.dims:
            raise FeedError(
                f"input {name!r}: received shape {list(arr.shape)}, expected {_dims_text(e.dims)}"
                f"; a session is planned for static shapes: plan one for this shape with "
                f"--shape {name}={'x'.join(str(d) for d in arr.shape) or 'scalar'} on the "
                f"command line, or input_shapes={{{name!r}: {list(arr.shape)}}} in Python"
            )
        out[name] = arr
    return out
