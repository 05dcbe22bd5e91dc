"""The garbage collector paused while a session starts (dispatch/gcpause.py): paused inside,
restarted after, left off when the program had it off, nested and threaded calls included."""

from __future__ import annotations

import gc
import threading

import pytest

from dispatch.gcpause import gc_paused, paused_gc


@pytest.fixture(autouse=True)
def _gc_back_on():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def test_paused_inside_and_restarted_after():
    gc.enable()
    with paused_gc():
        assert not gc.isenabled()
        with paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer call still runs
    assert gc.isenabled()


def test_left_off_when_the_program_had_it_off():
    gc.disable()
    with paused_gc():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_restarted_when_the_call_raises():
    gc.enable()

    @gc_paused
    def boom() -> None:
        raise ValueError("x")

    with pytest.raises(ValueError):
        boom()
    assert gc.isenabled()
    assert boom.__name__ == "boom"


def test_threads_restart_it_once_the_last_one_returns():
    gc.enable()
    inside = threading.Barrier(3)
    leave = threading.Event()

    def worker() -> None:
        with paused_gc():
            inside.wait()
            leave.wait()

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    inside.wait()
    assert not gc.isenabled()
    leave.set()
    for t in threads:
        t.join()
    assert gc.isenabled()


def test_a_session_leaves_the_collector_as_it_found_it(tmp_path):
    import onnx

    from dispatch import Session
    from tests.builders import small_cnn

    path = tmp_path / "m.onnx"
    onnx.save(small_cnn(), str(path))
    gc.enable()
    Session(str(path), store=False)
    assert gc.isenabled()
    gc.disable()
    Session(str(path), store=False)
    assert not gc.isenabled()
