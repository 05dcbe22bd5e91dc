"""The installed packages' entry points that opdispatch looks up (backends, plan sources).

``importlib.metadata.entry_points()`` reads the metadata of every installed distribution at
each call (12-20 ms with ~80 distributions), and each entry point's ``dist.name`` and
``dist.version`` parse that distribution's METADATA file again (~1 ms each). A Session's
start looked entry points up twice and described six of them (issue 13: start-up). Here the
scan is done once and reused while ``sys.path`` and the modification times of its folders
are unchanged (installing or removing a distribution adds or removes a folder there), and a
distribution's name and version are read once.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
import threading
from typing import Any

_lock = threading.Lock()
_scan: tuple[tuple, importlib.metadata.EntryPoints] | None = None
_labels: dict[Any, str] = {}


def _path_state() -> tuple:
    """``sys.path`` with each folder's modification time: what a scan's result depends on."""
    state = []
    for entry in sys.path:
        try:
            state.append((entry, os.stat(entry or ".").st_mtime_ns))
        except OSError:
            state.append((entry, None))
    return tuple(state)


def entry_points(group: str) -> list[importlib.metadata.EntryPoint]:
    """The entry points of ``group`` of every installed distribution, in
    ``importlib.metadata``'s order (one scan per process while ``sys.path`` is unchanged)."""
    global _scan
    state = _path_state()
    with _lock:
        if _scan is None or _scan[0] != state:
            _scan = (state, importlib.metadata.entry_points())
            _labels.clear()
        found = _scan[1]
    return list(found.select(group=group))


def distribution_label(ep: importlib.metadata.EntryPoint) -> str:
    """``"NAME VERSION"`` of the distribution that declares ``ep`` (``""`` when unknown),
    read once per distribution."""
    dist = getattr(ep, "dist", None)
    if dist is None:
        return ""
    where = getattr(dist, "_path", None)  # the distribution's metadata folder, where known
    if where is not None and where in _labels:
        return _labels[where]
    label = f"{dist.name} {dist.version}"
    if where is not None:
        _labels[where] = label
    return label
