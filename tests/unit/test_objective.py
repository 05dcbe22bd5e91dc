"""The objective as one value (:class:`dispatch.objective.Objective`): parsed once, printed once.

First the bug that made it one: ``opdispatch run --objective latency+nonstrict-nan --accuracy ...``
built ``latency+nonstrict-nan+accuracy=...`` while ``tune`` stores ``latency+accuracy=...+nonstrict-nan``,
so the run looked for a key that was never stored. Then every way of naming one objective (the
CLI's run and tune, a Session, a served model's ``config.toml``, a plan bundle) must give the same
plan key, and the keys an earlier release stored must read back unchanged.
"""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from dispatch.errors import ArgumentError
from dispatch.objective import AccuracyTarget, Objective, parse_accuracy

#: what ``opdispatch tune --accuracy cosine:0.999 --data D --allow-nonstrict-nan`` stores (the
#: order an earlier release stored too): base, accuracy part, then the NaN part
STORED = "latency+accuracy=cosine:0.999,data={digest}+nonstrict-nan"


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "samples.npz"
    rng = np.random.default_rng(0)
    np.savez(path, x=rng.random((8, 1, 4), dtype=np.float32))
    return path


def _digest(path) -> str:
    from tuner.accuracy.data import data_digest

    return data_digest(path)


def _run_args(objective: str, **more) -> argparse.Namespace:
    return argparse.Namespace(objective=objective, concurrency=None, **more)


def test_run_with_nonstrict_nan_and_accuracy_finds_the_key_tune_stores(data_file):
    from tuner.cli.load_run import objective_for

    args = _run_args("latency+nonstrict-nan", accuracy="cosine:0.999", data=str(data_file))
    assert str(objective_for(args)) == STORED.format(digest=_digest(data_file))


def test_every_way_of_naming_one_objective_gives_the_same_key(data_file, tmp_path):
    from tuner.cli.load_run import objective_for
    from tuner.fingerprint import PlanKey
    from tuner.serve.repository import ServeSettings

    digest = _digest(data_file)
    stored = STORED.format(digest=digest)
    by_run = objective_for(_run_args("latency+nonstrict-nan", accuracy="cosine:0.999",
                                     data=str(data_file)))
    by_server = ServeSettings(objective="latency+nonstrict-nan", accuracy="cosine:0.999",
                              data=str(data_file)).checked("config.toml").objective
    by_value = Objective("latency", accuracy=AccuracyTarget("cosine", 0.999, digest),
                         nonstrict_nan=True)
    swapped = f"latency+nonstrict-nan+accuracy=cosine:0.999,data={digest}"
    assert {str(by_run), str(by_server), str(by_value), str(Objective.parse(swapped))} == {stored}
    key = {"model": "m", "inputs": "i", "hardware": {}, "software": {}}
    assert PlanKey(**key, objective=swapped) == PlanKey(**key, objective=stored)
    assert PlanKey(**key, objective=swapped).digest() == PlanKey(**key, objective=stored).digest()


def test_a_session_names_the_objective_as_the_store_does(tmp_path):
    import onnx

    import dispatch
    from tests.builders import small_cnn

    path = tmp_path / "cnn.onnx"
    onnx.save(small_cnn(), path)
    for spelled, key in [("throughput@p99=50", "throughput@n={n},p99=50"),
                         ("latency+nonstrict-nan", "latency+nonstrict-nan"),
                         ("memory@cap=1000", "memory@cap=1000")]:
        sess = dispatch.Session(str(path), objective=spelled, store=False,
                                backends=["numpy"])
        from dispatch.blas import configured_threads

        assert str(sess.objective) == key.format(n=configured_threads())


@pytest.mark.parametrize("text", [
    "latency", "memory", "latency@cap=1000000", "memory@cap=5", "throughput@n=4",
    "throughput@n=4,p99=50", "throughput@n=1,p99=0.5", "latency+nonstrict-nan",
    "latency+accuracy=cosine:0.999,data=0a1b", "latency+accuracy=top1:0.01,data=ff+nonstrict-nan",
    "throughput@n=16+accuracy=max-rel:0.05,data=abc123", "throughput@n=2,p99=10+nonstrict-nan",
])
def test_keys_an_earlier_release_stored_read_back_unchanged(text):
    assert str(Objective.parse(text)) == text
    assert Objective.parse(str(Objective.parse(text))) == Objective.parse(text)


def test_parts_in_any_order_are_one_value():
    a = Objective.parse("throughput@n=4+nonstrict-nan+accuracy=cosine:0.99,data=aa")
    b = Objective.parse("throughput@n=4+accuracy=cosine:0.99,data=aa+nonstrict-nan")
    assert a == b and hash(a) == hash(b)
    assert a.float32 == Objective.parse("throughput@n=4+nonstrict-nan")
    assert a.strict.float32 == Objective("throughput", concurrency=4)


def test_a_bare_throughput_objective_resolves_to_one_request_per_core():
    from dispatch.blas import configured_threads

    assert str(Objective.parse("throughput").resolved()) == f"throughput@n={configured_threads()}"
    assert Objective.parse("latency").resolved() == Objective()


def test_tune_flags_say_how_to_tune_it():
    assert Objective().tune_flags() == ""
    assert Objective.parse("throughput@n=4,p99=50+nonstrict-nan").tune_flags() == (
        " --objective throughput --concurrency 4 --max-latency-ms 50 --allow-nonstrict-nan")
    assert Objective.parse("latency+accuracy=cosine:0.999,data=ab").tune_flags() == (
        " --accuracy cosine:0.999 --data DATA")
    assert Objective.parse("memory@cap=9").tune_flags() == " --objective memory --memory-cap 9"


@pytest.mark.parametrize(("text", "says"), [
    ("fast", "unknown objective 'fast'; known: latency, memory, throughput"),
    ("latency@cap=x", "positive integer BYTES"),
    ("latency@n=3", "positive integer BYTES"),
    ("throughput@n=0", "1 to 256"),
    ("throughput@n=4,n=5", "throughput@n=N,p99=MS"),
    ("throughput@p99=-1", "positive p99 latency bound"),
    ("throughput@cap=3", "throughput@n=N"),
    ("latency+fast", "unexpected part '+fast'"),
    ("latency+nonstrict-nan+nonstrict-nan", "unexpected part"),
    ("latency+accuracy=cosine:0.999", "data=DIGEST"),
    ("latency+accuracy=cosine:2,data=aa", "out of range for cosine"),
    ("memory+accuracy=cosine:0.9,data=aa", "goes with the latency or the throughput objective"),
])
def test_a_bad_objective_says_what_was_received_and_expected(text, says):
    with pytest.raises(ArgumentError, match=None) as err:
        Objective.parse(text)
    assert says in str(err.value)


def test_values_are_checked_when_built_not_only_when_parsed():
    with pytest.raises(ArgumentError, match="concurrency and a p99 latency bound go with"):
        Objective("latency", concurrency=4)
    with pytest.raises(ArgumentError, match="memory cap must be a positive integer"):
        Objective("latency", memory_cap=0)
    with pytest.raises(ArgumentError, match="must be a string, received int"):
        Objective.parse(4)  # type: ignore[arg-type]
    assert parse_accuracy("top1:0") == ("top1", 0.0)
