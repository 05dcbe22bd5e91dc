"""Python's cyclic garbage collector paused while a session starts.

Creating a session imports modules, registers hundreds of implementations and builds plan
objects: hundreds of thousands of allocations, each batch of which can start a collection that
walks every object the process holds (with numpy, onnx, onnxruntime and OpenVINO loaded, tens
of thousands). Measured on squeezenet from the store: 30 ms of a 130 ms creation went to
collections. :func:`gc_paused` pauses the collector for the duration of a call and starts it
again afterwards (only when it was running before), the way interpreters pause it for their
own start-up; nothing is lost: objects that became garbage meanwhile are collected by the next
collection. Calls nest and may run in several threads: the collector restarts when the last
paused call returns.
"""

from __future__ import annotations

import functools
import gc
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

_lock = threading.Lock()
_depth = 0
_restart = False


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector inside the ``with`` block (see the module docstring)."""
    global _depth, _restart
    with _lock:
        if _depth == 0:
            _restart = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _restart:
                gc.enable()


def gc_paused(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorator: ``fn`` runs with the garbage collector paused (:func:`paused_gc`)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with paused_gc():
            return fn(*args, **kwargs)

    return wrapper
