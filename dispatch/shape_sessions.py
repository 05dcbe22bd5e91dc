"""The sessions a Session keeps for the other input shapes of a model with symbolic inputs.

A plan and its executor are made for concrete shapes. A :class:`~dispatch.session.Session` of
a model whose inputs have symbolic dimensions routes each run by its feeds' shapes
(:func:`feed_shapes_of`): the session's own shape runs on its own executor; another shape runs
on a session planned for it (its stored plan, else the untuned one), created on the shape's
first run and kept in a least-recently-used cache of ``max_shapes`` (:class:`ShapeSessions`) —
the idea of TensorRT's optimisation profiles, with a plan per concrete shape instead of one per
range. The cache knows nothing of sessions: it is given the functions that build one.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from dispatch.errors import ArgumentError
from dispatch.feeds import check_declared_feeds
from dispatch.input_shapes import ShapeSet, bind, feed_shapes, format_shapes, is_dynamic

if TYPE_CHECKING:
    from dispatch.graph import Graph
    from dispatch.input_shapes import DeclaredInput

#: how many shapes besides its own a Session keeps planned by default
MAX_SHAPES = 8

S = TypeVar("S")


class ShapeSessions(Generic[S]):
    """The per-shape sessions of one session (its *owner*), bounded and thread-safe.

    ``own(shapes)`` returns the owner when it runs ``shapes`` (planning it for them when it
    waits for its first run's shapes), else ``None``; ``build(shapes)`` makes the session of
    another shape. Both are called under the cache's lock: two threads feeding a new shape
    plan it once.
    """

    def __init__(self, build: Callable[[ShapeSet], S], own: Callable[[ShapeSet], S | None],
                 max_shapes: int = MAX_SHAPES) -> None:
        if isinstance(max_shapes, bool) or not isinstance(max_shapes, int) or max_shapes < 1:
            raise ArgumentError(f"max_shapes must be a positive integer, received {max_shapes!r}")
        self.max_shapes = max_shapes
        self._build = build
        self._own = own
        self._sessions: OrderedDict[ShapeSet, S] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, shapes: ShapeSet) -> S:
        """The session for concrete input ``shapes``: the owner for its own shapes, else the
        one planned for them, built on the first run of those shapes."""
        with self._lock:
            mine = self._own(shapes)
            if mine is not None:
                return mine
            found = self._sessions.get(shapes)
            if found is not None:
                self._sessions.move_to_end(shapes)
                return found
            session = self._build(shapes)
            self._sessions[shapes] = session
            while len(self._sessions) > self.max_shapes:
                self._sessions.popitem(last=False)
            return session

    def planned(self) -> dict[ShapeSet, S]:
        """The sessions kept, least recently run first (the owner's own shape not included)."""
        with self._lock:
            return dict(self._sessions)


def graph_shapes(graph: Graph | None) -> ShapeSet | None:
    """The input shapes ``graph`` is planned for (``None`` without a graph: a session that
    waits for its first run's shapes)."""
    if graph is None:
        return None
    return tuple((v.name, tuple(int(d) for d in (v.shape or ()))) for v in graph.inputs)


def feed_shapes_of(declared: Sequence[DeclaredInput], feeds: Any) -> ShapeSet | None:
    """The concrete input shapes of ``feeds`` for a model with symbolic inputs (``None`` for a
    static model, or feeds that are no mapping: the session's own run checks those). Feeds
    that fit no declared shape raise :class:`~dispatch.errors.FeedError`."""
    if not isinstance(feeds, Mapping) or not is_dynamic(declared):
        return None
    arrays = check_declared_feeds(declared, feeds)
    return tuple((d.name, tuple(arrays[d.name].shape)) for d in declared)


@dataclass(frozen=True)
class _Shaped:
    """A stand-in feed with a shape only (for :func:`given_shapes`)."""

    shape: tuple[int, ...]


def given_shapes(declared: Sequence[DeclaredInput],
                 input_shapes: Mapping[str, Sequence[int]]) -> ShapeSet:
    """The concrete input shapes ``input_shapes`` gives (every input's shape, or enough of them
    to size the others through their shared symbolic dimensions), for
    :meth:`dispatch.session.Session.for_shapes`."""
    shapes = bind(declared, input_shapes)
    missing = [d.name for d in declared if d.name not in shapes]
    if missing:
        raise ArgumentError(
            f"for_shapes: the shapes given ({format_shapes(dict(input_shapes))}) do not size "
            f"input(s) {missing}; the model's inputs are "
            + "; ".join(d.describe() for d in declared))
    sized = {n: _Shaped(tuple(v)) for n, v in shapes.items()}
    return feed_shapes(declared, sized)
