"""The sessions a Session keeps for the other input shapes of a model with symbolic inputs.

A plan and its executor are made for concrete shapes. A :class:`~dispatch.session.Session` of
a model whose inputs have symbolic dimensions routes each run by its feeds' shapes: the
session's own shape runs on its own executor; another shape runs on a session planned for
it (its stored plan, else the untuned one), created on the shape's first run and kept in a
least-recently-used cache of ``max_shapes`` — the idea of TensorRT's optimisation profiles,
with a plan per concrete shape instead of one per range.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dispatch.errors import ArgumentError
from dispatch.feeds import check_declared_feeds
from dispatch.input_shapes import ShapeSet, is_dynamic

if TYPE_CHECKING:
    from dispatch.session import Session

#: how many shapes besides its own a Session keeps planned by default
MAX_SHAPES = 8


class ShapeSessions:
    """The per-shape sessions of one session (its *owner*), bounded and thread-safe."""

    def __init__(self, owner: Session, max_shapes: int = MAX_SHAPES) -> None:
        if isinstance(max_shapes, bool) or not isinstance(max_shapes, int) or max_shapes < 1:
            raise ArgumentError(f"max_shapes must be a positive integer, received {max_shapes!r}")
        self.owner = owner
        self.max_shapes = max_shapes
        self._sessions: OrderedDict[ShapeSet, Session] = OrderedDict()
        self._lock = threading.Lock()

    def own_shapes(self) -> ShapeSet | None:
        """The owner's input shapes (``None`` before its first run when it was deferred)."""
        graph = self.owner.graph
        if graph is None:
            return None
        return tuple((v.name, tuple(int(d) for d in (v.shape or ()))) for v in graph.inputs)

    def session_for(self, feeds: Any) -> Session:
        """The session that runs ``feeds``: the owner for its own shapes, else the one planned
        for the feeds' shapes, created (and planned) on the first run of those shapes. Feeds
        that fit no declared shape raise :class:`~dispatch.errors.FeedError`."""
        owner = self.owner
        if not isinstance(feeds, Mapping) or not is_dynamic(owner.declared):
            return owner
        arrays = check_declared_feeds(owner.declared, feeds)
        return self.get(tuple((d.name, tuple(arrays[d.name].shape)) for d in owner.declared))

    def get(self, shapes: ShapeSet) -> Session:
        """The session for concrete input ``shapes`` (see :meth:`session_for`)."""
        owner = self.owner
        with self._lock:
            if owner.graph is None:
                owner._plan_shapes(shapes)
                return owner
            if shapes == self.own_shapes():
                return owner
            found = self._sessions.get(shapes)
            if found is not None:
                self._sessions.move_to_end(shapes)
                return found
            # planned under the lock: two threads feeding a new shape plan it once
            session = owner._for_shapes(shapes)
            self._sessions[shapes] = session
            while len(self._sessions) > self.max_shapes:
                self._sessions.popitem(last=False)
            return session

    def planned(self) -> dict[ShapeSet, Session]:
        """The sessions kept, least recently run first (the owner's own shape not included)."""
        with self._lock:
            return dict(self._sessions)
