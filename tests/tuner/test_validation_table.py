"""What the tuner says about validation (issue 18): the validated plans in the objective's own
unit (megabytes for memory, milliseconds for latency), winner first with each plan's margin to
it and one line saying why the winner won; validation reports progress through the tuner's
``log``; first-run tuning announces itself, with its budget, on the ``opdispatch.tuning``
logger."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np

from dispatch import Session
from dispatch.backend import load_registry
from tests.builders import small_cnn
from tuner.tune import TuneOptions, tune
from tuner.validation_table import validation_lines, why_won


def _pc(label, latency, peak, predicted, error=None):
    return SimpleNamespace(label=label, latency_ms=latency, spread_ms=0.5, peak_bytes=peak,
                           predicted_s=predicted, error=error)


def test_memory_objective_is_in_megabytes_and_sorted_winner_first():
    big = _pc("optimum", 10.0, 9_600_000, 9_000_000.0)
    small = _pc("numpy only", 12.0, 600_000, 500_000.0)
    bad = _pc("openvino first", None, None, None, error="wrong result on NaN/Inf inputs")
    lines = validation_lines([big, bad, small], small, "memory")
    text = "\n".join(lines)
    assert "predicted (MB)" in text and "500.0 kB" in text and "9.00 MB" in text
    assert "500000000" not in text and "predicted (ms)" not in text  # bytes were printed as ms
    rows = [ln for ln in lines[:-1] if "numpy only" in ln or "optimum" in ln or "openvino" in ln]
    assert rows[0].lstrip().startswith("*") and "numpy only" in rows[0]
    assert "openvino" in rows[-1]  # failures last
    assert "+9.00 MB" in text  # the margin to the winner
    assert lines[-1].startswith("winner numpy only: lowest peak memory")


def test_latency_objective_says_margin_and_why():
    fast = _pc("optimum", 10.0, 9_600_000, 0.008)
    slow = _pc("numpy only", 12.0, 600_000, 0.011)
    lines = validation_lines([slow, fast], fast, "latency")
    text = "\n".join(lines)
    assert "predicted (ms)" in text and "8.0000 ms" in text and "+2.0000 ms (+20%)" in text
    assert "fastest measured" in lines[-1] and "numpy only" in lines[-1]
    # a baseline kept within the spread says so
    note = "optimum measured 9.9 ms, within the measured spread: the single-backend plan is kept"
    assert why_won([slow, fast], slow, "latency", note) == note
    # a memory cap: the faster plan over the cap is marked
    capped = "\n".join(validation_lines([slow, fast], slow, "latency@cap=1000000"))
    assert "over the memory cap" in capped and "fits the cap" in capped


def _opts(**kw) -> TuneOptions:
    base = dict(budget_s=6, top_k=2, validate_runs=2, per_candidate_cap_s=0.02, progress=False)
    return TuneOptions(**{**base, **kw})


def test_validation_reports_progress_and_the_summary_uses_units(tmp_path):
    heard: list[str] = []
    result = tune(small_cnn(), store=str(tmp_path / "plans.sqlite"), options=_opts(),
                  registry=load_registry(), log=heard.append)
    assert any(m.startswith("validating ") for m in heard), heard
    assert any("checking" in m for m in heard) and any(m.startswith("timed ") for m in heard)
    summary = result.summary()
    assert "median latency" in summary and "vs winner" in summary
    assert f"winner {next(pc.label for pc in result.validated if pc.plan is result.plan)}:" \
        in summary


def test_first_run_tuning_announces_itself_on_the_logger(tmp_path, caplog):
    sess = Session(small_cnn(), registry=load_registry(), store=tmp_path / "plans.sqlite",
                   tune="first-run", tune_budget_s=5, tune_options=_opts())
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    with caplog.at_level(logging.INFO, logger="opdispatch.tuning"):
        sess.run(None, {"x": x})
    msgs = [r.getMessage() for r in caplog.records if r.name == "opdispatch.tuning"]
    start = [m for m in msgs if "on its first run" in m]
    assert start and "budget 5 s" in start[0], msgs
    assert any("first-run tuning of" in m and "done in" in m for m in msgs), msgs
    assert sess.plan_source == "tuned"
