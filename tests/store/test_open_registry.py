"""The registry of the store files this process holds open (``tuner.store.integrity``) and
garbage collection: a store dropped without ``close()`` is forgotten by its finalizer, which
may run at any allocation, also inside a region of the same thread that holds the registry's
lock (opening a store, reading a header, looking at another program's file). It must never
wait for that lock there: the thread would wait for itself forever."""

from __future__ import annotations

import gc
import threading

from tuner.store import PlanStore
from tuner.store import integrity as registry


def test_a_store_collected_inside_a_locked_region_does_not_deadlock(tmp_path):
    path = tmp_path / "plans.sqlite"
    store = PlanStore(path)
    store.cycle = store  # collected by the cycle collector only, at some allocation
    inode = registry._inode(path)
    assert registry._OPEN_HERE.get(inode) == 1
    del store
    done = threading.Event()

    def collect_while_locked() -> None:
        with registry._locked():
            gc.collect()  # runs the store's finalizer here, inside the lock
        done.set()

    worker = threading.Thread(target=collect_while_locked, daemon=True)
    worker.start()
    assert done.wait(30), "the finalizer waited for a lock its own thread held"
    with registry._locked():  # the next locked region forgets the collected store's file
        assert registry._OPEN_HERE.get(inode) is None
    assert registry._read_head(path, 16) == b"SQLite format 3\x00"
