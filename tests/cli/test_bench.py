"""``opdispatch run`` as a benchmark (issue 18): warm-up, a number of runs or a duration, mean,
median, p90/p95/p99, min, max and throughput, ``--json`` for machines; ``--version``. The
statistics are checked on a fake clock; nothing here asserts a speed."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.builders import small_cnn
from tuner.cli import bench


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], capture_output=True,
                          text=True, timeout=300)


class FakeClock:
    """Each call to the function under test takes ``step`` seconds of this clock."""

    def __init__(self, step: float) -> None:
        self.now, self.step, self.calls = 0.0, step, 0

    def __call__(self) -> float:
        return self.now

    def fn(self) -> int:
        self.calls += 1
        self.now += self.step
        return self.calls


def test_runs_duration_and_warmup_on_a_fake_clock():
    c = FakeClock(0.01)
    times, last = bench.timed_runs(c.fn, runs=7, duration_s=None, warmup=3, clock=c)
    assert len(times) == 7 and c.calls == 10 and last == 10
    assert times == pytest.approx([0.01] * 7)
    c = FakeClock(0.01)
    times, _ = bench.timed_runs(c.fn, runs=None, duration_s=0.5, warmup=0, clock=c)
    assert len(times) == pytest.approx(50, abs=1)
    c = FakeClock(0.01)  # both: until both are reached
    times, _ = bench.timed_runs(c.fn, runs=100, duration_s=0.1, warmup=0, clock=c)
    assert len(times) == 100
    c = FakeClock(1.0)  # a duration shorter than one run still times one run
    times, _ = bench.timed_runs(c.fn, runs=None, duration_s=0.001, warmup=0, clock=c)
    assert len(times) == 1
    c = FakeClock(0.01)
    times, _ = bench.timed_runs(c.fn, runs=None, duration_s=None, warmup=0, clock=c)
    assert len(times) == bench.DEFAULT_RUNS


def test_statistics():
    times = [k / 1000 for k in range(1, 101)]  # 1..100 ms
    s = bench.stats(times, batch=4)
    ms = np.arange(1, 101, dtype=float)
    assert s["runs"] == 100 and s["mean_ms"] == pytest.approx(50.5)
    assert s["median_ms"] == pytest.approx(50.5)
    for name, q in (("p90", 90), ("p95", 95), ("p99", 99)):
        assert s[f"{name}_ms"] == pytest.approx(np.percentile(ms, q))
    assert s["min_ms"] == pytest.approx(1) and s["max_ms"] == pytest.approx(100)
    assert s["throughput_per_s"] == pytest.approx(100 / 5.05)
    assert s["samples_per_s"] == pytest.approx(400 / 5.05)
    text = bench.stats_text(s, warmup=2)
    for word in ("mean", "median", "p90", "p95", "p99", "min", "max", "throughput"):
        assert word in text


def test_run_prints_and_writes_the_statistics(tmp_path):
    model = tmp_path / "small.onnx"
    model.write_bytes(small_cnn().SerializeToString())
    out = tmp_path / "bench.json"
    res = cli("run", str(model), "--untuned", "--runs", "12", "--warmup", "2", "--json", str(out))
    assert res.returncode == 0, res.stderr
    for word in ("mean", "median", "p90", "p95", "p99", "throughput"):
        assert word in res.stdout, word
    data = json.loads(out.read_text())
    assert data["stats"]["runs"] == 12 and len(data["times_ms"]) == 12
    for key in ("mean_ms", "median_ms", "p90_ms", "p95_ms", "p99_ms", "min_ms", "max_ms",
                "throughput_per_s"):
        assert data["stats"][key] > 0, key
    assert data["settings"] == {"warmup": 2, "runs": 12, "duration_s": None}
    # a duration, and the JSON on stdout with the human text on stderr
    res = cli("run", str(model), "--untuned", "--duration", "0.05", "--json", "-")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["stats"]["runs"] >= 1 and "p99" in res.stderr


def test_version():
    from dispatch import __version__

    res = cli("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"opdispatch {__version__}"
