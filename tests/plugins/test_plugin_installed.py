"""The example plugin pip-installed like a third-party package, then found through its
``opdispatch.backends`` entry point by ``opdispatch backends`` and used by a Session.

The plugin is installed with pip into a throwaway folder (``pip install --target``) that only
the subprocesses of this test put on their path, so the developer's environment is never
changed. pip builds the plugin offline when this environment can (setuptools >= 70.1, or an
older setuptools with the ``wheel`` package); otherwise it builds it in pip's isolated build
environment, which downloads setuptools from PyPI, and the test is skipped, saying why, only
when that download is impossible.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from packaging.version import Version

from tests.plugins.plugin_support import EXAMPLE_DIR, REPO, fast_gelu_formula

NETWORK_ERRORS = (
    "Could not find a version that satisfies the requirement",
    "No matching distribution found",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "Max retries exceeded",
    "ProxyError",
)


def _offline_build_blocker() -> str | None:
    """``None`` when pip can build the plugin here without downloading, else why not."""
    try:
        version = Version(importlib.metadata.version("setuptools"))
    except importlib.metadata.PackageNotFoundError:
        return "setuptools is not installed"
    if version >= Version("70.1") or importlib.util.find_spec("wheel") is not None:
        return None
    return f"setuptools {version} builds wheels only with the `wheel` package, which is not installed"


def _pip_install(source: Path, target: Path) -> None:
    blocker = _offline_build_blocker()
    offline = ["--no-build-isolation", "--no-index"] if blocker is None else []
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check",
           "--no-input", *offline, "--target", str(target), str(source)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if res.returncode == 0:
        return
    output = res.stdout + res.stderr
    if blocker is not None and any(e in output for e in NETWORK_ERRORS):
        pytest.skip(f"cannot build the example plugin: offline impossible ({blocker}) and PyPI "
                    f"unreachable for pip's isolated build; last lines: {output.strip()[-300:]}")
    pytest.fail(f"{' '.join(cmd)} failed ({res.returncode}):\n{output[-4000:]}")


def _opdispatch_command() -> list[str]:
    """The ``opdispatch`` console script of this environment, else ``python -m tuner.cli``."""
    script = Path(sys.executable).parent / ("opdispatch.exe" if os.name == "nt" else "opdispatch")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "tuner.cli"]


RUN_MODEL = textwrap.dedent("""
    import json, sys
    from pathlib import Path

    import numpy as np

    import dispatch
    import opdispatch_example_plugin
    from tests.plugins.plugin_support import fast_gelu_model

    out = Path(sys.argv[1])
    model, bias = fast_gelu_model((32, 128), relu=True)
    x = np.random.default_rng(11).standard_normal((32, 128)).astype(np.float32)
    untuned = dispatch.Session(model, backends=["example", "numpy"], store=False)
    tuned = dispatch.Session(model, store=str(out / "plans.sqlite"))
    tuned.tune(budget_s=30, progress=False, validate_runs=3)
    for label, sess in (("untuned", untuned), ("tuned", tuned)):
        np.save(out / f"y_{label}.npy", sess.run(None, {"x": x})[0])
    np.save(out / "x.npy", x)
    np.save(out / "bias.npy", bias)
    status = untuned.registry.backends["example"]
    print(json.dumps({
        "plugin_file": opdispatch_example_plugin.__file__,
        "origin": status.origin,
        "custom_ops": status.custom_ops,
        "untuned": [s.impl for s in untuned.plan.steps],
        "tuned": [s.impl for s in tuned.plan.steps],
        "tuned_source": tuned.plan_source,
    }))
""")


def test_installed_plugin_is_listed_and_runs_a_model(tmp_path):
    source = tmp_path / "src"
    shutil.copytree(EXAMPLE_DIR, source,
                    ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    site = tmp_path / "site"
    _pip_install(source, site)
    dist = next(site.glob("opdispatch_example_plugin-*.dist-info"))
    assert "example = opdispatch_example_plugin:ExampleBackend" in (dist / "entry_points.txt").read_text()

    env = dict(os.environ)
    env.pop("OPDISPATCH_PLUGIN_PATH", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), str(REPO), env.get("PYTHONPATH")) if p)
    env["OPDISPATCH_STORE"] = str(tmp_path / "plans.sqlite")

    res = subprocess.run([*_opdispatch_command(), "backends", "-v"], capture_output=True,
                         text=True, timeout=120, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    row = next(line for line in res.stdout.splitlines() if line.startswith("example "))
    assert "available" in row and "unavailable" not in row and "ex_colmajor" in row, row
    assert "entry point opdispatch_example_plugin:ExampleBackend" in row, row
    assert "FastGelu.example.tanh" in res.stdout

    out = tmp_path / "out"
    out.mkdir()
    res = subprocess.run([sys.executable, "-c", RUN_MODEL, str(out)], capture_output=True,
                         text=True, timeout=180, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-4000:]
    report = json.loads(res.stdout.strip().splitlines()[-1])
    assert Path(report["plugin_file"]).is_relative_to(site)  # the pip-installed copy
    assert report["origin"] == ("entry point opdispatch_example_plugin:ExampleBackend"
                                " of opdispatch-example-plugin 0.1.0")
    assert report["custom_ops"] == ["com.example::FastGelu"]
    assert report["untuned"][0] == "FastGelu.example.tanh"
    assert report["tuned_source"] == "tuned"
    assert report["tuned"][0].startswith("FastGelu.example."), report
    x, bias = np.load(out / "x.npy"), np.load(out / "bias.npy")
    expected = np.maximum(fast_gelu_formula(x, bias), 0)
    for label in ("untuned", "tuned"):
        np.testing.assert_allclose(np.load(out / f"y_{label}.npy"), expected, rtol=1e-5, atol=1e-6)
