"""Plan bundles against their JSON Schema: hostile bundles are refused with the path to the
offending field, by :func:`tuner.store.validate_bundle` and by ``opdispatch plans import``
(exit 2, one line, nothing imported): unknown fields at every level, non-finite numbers,
integers out of range, nesting beyond :data:`tuner.store.bundle.MAX_DEPTH` and JSON nested too
deeply for Python to read."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.store.test_store import _key, _plan
from tuner.store import BundleError, PlanStore, validate_bundle
from tuner.store.bundle import MAX_DEPTH

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> dict[str, Any]:
    with PlanStore(tmp_path_factory.mktemp("bundle") / "s.sqlite") as store:
        store.put_plan(_key(), _plan(), latency_ms=1.5, peak_bytes=100, notes={"a": 1})
        return store.export_plans()


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"d": value}
    return value


def _set(path: tuple, value: Any) -> Callable[[dict], None]:
    def apply(b: dict) -> None:
        target = b
        for p in path[:-1]:
            target = target[p]
        target[path[-1]] = value
    return apply


#: case -> (edit of a valid bundle, text the refusal holds)
CASES: dict[str, tuple[Callable[[dict], None], str]] = {
    "unknown top-level field": (_set(("extra",), 1), "the bundle: unknown field(s) ['extra']"),
    "unknown plan-entry field": (_set(("plans", 0, "shadow"), 1),
                                 "plans[0]: unknown field(s) ['shadow']"),
    "unknown key field": (_set(("plans", 0, "key", "colour"), "red"),
                          "plans[0].key: unknown field(s) ['colour']"),
    "unknown plan field": (_set(("plans", 0, "plan", "bogus"), 1), "unknown field(s) ['bogus']"),
    "NaN latency": (_set(("plans", 0, "latency_ms"), float("nan")),
                    "plans[0].latency_ms: expected a number or null, received a non-finite"),
    "infinite latency": (_set(("plans", 0, "latency_ms"), float("inf")),
                         "plans[0].latency_ms: expected a number or null, received a non-finite"),
    "latency beyond a double": (_set(("plans", 0, "latency_ms"), 10**400),
                                "plans[0].latency_ms"),
    "peak_bytes 10**100": (_set(("plans", 0, "peak_bytes"), 10**100),
                           "plans[0].peak_bytes: expected an integer or null (at most "),
    "negative peak beyond 64 bits": (_set(("plans", 0, "peak_bytes"), -(2**64)),
                                     "plans[0].peak_bytes"),
    "version 1e400": (_set(("version",), float("inf")), '"version": expected an integer'),
    "plan version 1e400": (_set(("plans", 0, "plan", "version"), float("inf")),
                           "plans[0].plan"),
    "id 10**30": (_set(("plans", 0, "id"), 10**30), "plans[0].id"),
    "notes nested too deep": (_set(("plans", 0, "notes"), _nested(MAX_DEPTH + 5)),
                              f"plans[0].notes.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d."
                              f"d.d.d.d.d: nested deeper than {MAX_DEPTH} levels"),
    "hardware nested too deep": (_set(("plans", 0, "key", "hardware"), _nested(200)),
                                 "plans[0].key.hardware.d.d"),
    "plan nested too deep": (_set(("plans", 0, "plan", "provenance"), _nested(2000)),
                             "nested deeper than"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_bundle_is_refused_naming_the_field(bundle, case):
    edit, needle = CASES[case]
    hostile = copy.deepcopy(bundle)
    edit(hostile)
    with pytest.raises(BundleError) as info:
        validate_bundle(hostile)
    message = str(info.value)
    assert needle in message, message
    assert "\n" not in message and len(message) < 400, message


def test_the_exported_bundle_itself_is_valid(bundle):
    (entry,) = validate_bundle(copy.deepcopy(bundle))
    assert entry["latency_ms"] == 1.5 and entry["peak_bytes"] == 100


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OPDISPATCH_STORE": str(cwd / "unused.sqlite")}
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


#: bundle text -> what the refusal holds (the JSON itself is hostile here)
TEXTS: dict[str, tuple[Callable[[str], str], str]] = {
    "JSON nested 100,000 deep": (
        lambda good: '{"format": "opdispatch-plan-bundle", "version": 1, "plans": ['
                     + "[" * 100_000 + "]" * 100_000 + "]}",
        "is not a JSON plan bundle: it is nested too deeply to read"),
    "NaN written by json.dumps": (
        lambda good: good.replace('"latency_ms": 1.5', '"latency_ms": NaN'),
        "plans[0].latency_ms: expected a number or null, received a non-finite number nan"),
    "Infinity written by json.dumps": (
        lambda good: good.replace('"latency_ms": 1.5', '"latency_ms": Infinity'),
        "plans[0].latency_ms: expected a number or null, received a non-finite number inf"),
    "version 1e400": (lambda good: good.replace('"VERSION"', "1e400"),
                      '"version": expected an integer, received a non-finite number inf'),
    "plan version 1e400": (lambda good: good.replace('"PLAN_VERSION"', "1e400"),
                           "plans[0].plan"),
    "peak_bytes of 10**100": (
        lambda good: good.replace('"peak_bytes": 100', '"peak_bytes": 1' + "0" * 100),
        "plans[0].peak_bytes"),
    "an integer of 5,000 digits": (
        lambda good: good.replace('"peak_bytes": 100', '"peak_bytes": 1' + "0" * 5000),
        "is not a JSON plan bundle"),
    "unknown field": (lambda good: good.replace('"plans": [', '"extra": 1, "plans": [', 1),
                      "unknown field(s) ['extra']"),
    "not UTF-8": (lambda good: good.replace('"a": 1', '"a": "\udcff"'), "is not a JSON plan bundle"),
}


@pytest.mark.parametrize("case", list(TEXTS))
def test_plans_import_refuses_a_hostile_bundle_with_one_line(tmp_path, bundle, case):
    make, needle = TEXTS[case]
    marked = copy.deepcopy(bundle)
    if "PLAN_VERSION" in case.upper().replace(" ", "_"):
        marked["plans"][0]["plan"]["version"] = "PLAN_VERSION"
    elif case == "version 1e400":
        marked["version"] = "VERSION"
    good = json.dumps(marked, sort_keys=True)
    assert '"latency_ms": 1.5' in good and '"peak_bytes": 100' in good
    path = tmp_path / "hostile.json"
    path.write_bytes(make(good).encode("utf-8", "surrogateescape"))
    res = _cli("plans", "import", str(path), "--store", str(tmp_path / "s.sqlite"), cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert needle in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "internal error" not in res.stderr
    assert not (tmp_path / "s.sqlite").exists()  # refused before the store is created
