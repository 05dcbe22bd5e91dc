"""The command line under bad input: every user error exits non-zero with one clear message
on stderr and no traceback.

Each case is a real ``opdispatch`` process (``python -m tuner.cli``): missing, garbage,
truncated and folder-shaped models; bad input arrays and shapes; corrupt, foreign and
unwritable stores; bad budgets, objectives, ids, bundles, output paths and node names; a
broken plugin folder and unknown backends in the environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.builders import small_cnn

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli_hostile")
    model = d / "model.onnx"
    onnx.save(small_cnn(), model)
    raw = model.read_bytes()
    (d / "garbage.onnx").write_bytes(os.urandom(4096))
    (d / "truncated.onnx").write_bytes(raw[: len(raw) // 3])
    (d / "empty.onnx").write_bytes(b"")
    (d / "folder.onnx").mkdir()
    np.save(d / "x_f64.npy", np.zeros((1, 3, 16, 16)))
    np.save(d / "x_shape.npy", np.zeros((2, 3, 8, 8), np.float32))
    (d / "x_corrupt.npy").write_bytes(b"\x93NUMPY\x01\x00garbage")
    np.save(d / "x_obj.npy", np.array([object()], dtype=object), allow_pickle=True)
    (d / "corrupt.sqlite").write_bytes(b"SQLite format 3\x00" + os.urandom(8192))
    (d / "bundle_garbage.json").write_text("{not json")
    (d / "bundle_wrong.json").write_text('{"format": "something else", "plans": 3}')
    (d / "plan_list.json").write_text("[1, 2, 3]")
    from tuner.store import PlanStore

    PlanStore(d / "empty-store.sqlite").close()
    plugins = d / "plugins"
    plugins.mkdir()
    (plugins / "broken_plugin.py").write_text("def oops(:\n")
    return d


def _cli(args, cwd, env_extra=None, timeout=240):
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env_extra or {})}
    env["OPDISPATCH_STORE"] = str(Path(cwd) / "default-store.sqlite")
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


# (case id, arguments with {d} for the fixture folder, extra environment, text stderr must
# hold); every case is an error: exit 2 (argparse's own usage errors exit 2 as well)
CASES = [
    ("missing model", ["run", "{d}/nope.onnx"], None, "nope.onnx"),
    ("garbage model", ["run", "{d}/garbage.onnx"], None, "garbage.onnx"),
    ("truncated model", ["run", "{d}/truncated.onnx"], None, "truncated.onnx"),
    ("empty model", ["run", "{d}/empty.onnx"], None, "empty.onnx"),
    ("folder as model", ["run", "{d}/folder.onnx"], None, "folder.onnx"),
    ("tune garbage", ["tune", "{d}/garbage.onnx", "--budget", "5"], None, "garbage.onnx"),
    ("input of the wrong dtype", ["run", "{d}/model.onnx", "--input", "x={d}/x_f64.npy"], None, "float64"),
    ("input of the wrong shape", ["run", "{d}/model.onnx", "--input", "x={d}/x_shape.npy"], None, "shape"),
    ("corrupt input file",
     ["run", "{d}/model.onnx", "--input", "x={d}/x_corrupt.npy"], None, "x_corrupt.npy"),
    ("pickled input file", ["run", "{d}/model.onnx", "--input", "x={d}/x_obj.npy"], None, "x_obj.npy"),
    ("missing input file", ["run", "{d}/model.onnx", "--input", "x={d}/none.npy"], None, "none.npy"),
    ("input without a name", ["run", "{d}/model.onnx", "--input", "{d}/x_f64.npy"], None, "NAME=FILE"),
    ("unknown input name", ["run", "{d}/model.onnx", "--input", "y={d}/x_shape.npy"], None, "'y'"),
    ("bad shape spec", ["run", "{d}/model.onnx", "--shape", "x=1xthreex16"], None, "1xthreex16"),
    ("negative repeat", ["run", "{d}/model.onnx", "--repeat", "-3"], None, "-3"),
    ("unknown backend", ["run", "{d}/model.onnx", "--backends", "cuda,numpy"], None, "cuda"),
    ("require a plan from an empty store",
     ["run", "{d}/model.onnx", "--require-plan", "--store", "{d}/empty-store.sqlite"],
     None, "no usable tuned plan"),
    ("require a plan from a corrupt store",
     ["run", "{d}/model.onnx", "--require-plan", "--store", "{d}/corrupt-copy.sqlite"], None, "corrupt"),
    ("store path is a folder",
     ["run", "{d}/model.onnx", "--store", "{d}/folder.onnx", "--require-plan"], None, "folder.onnx"),
    ("output into a file", ["run", "{d}/model.onnx", "--output", "{d}/model.onnx/out"], None, "model.onnx"),
    ("negative budget", ["tune", "{d}/model.onnx", "--budget", "-1"], None, "-1"),
    ("NaN budget", ["tune", "{d}/model.onnx", "--budget", "nan"], None, "nan"),
    ("unknown objective", ["run", "{d}/model.onnx", "--objective", "joy"], None, "joy"),
    ("tune into a store under a file",
     ["tune", "{d}/model.onnx", "--store", "{d}/model.onnx/s.sqlite", "--budget", "5"], None, "model.onnx"),
    ("show an unknown plan",
     ["plans", "show", "424242", "--store", "{d}/empty-store.sqlite"], None, "424242"),
    ("import garbage",
     ["plans", "import", "{d}/bundle_garbage.json", "--store", "{d}/s2.sqlite"], None, "bundle_garbage.json"),
    ("import a foreign JSON",
     ["plans", "import", "{d}/bundle_wrong.json", "--store", "{d}/s2.sqlite"], None, "bundle"),
    ("import a missing bundle",
     ["plans", "import", "{d}/none.json", "--store", "{d}/s2.sqlite"], None, "none.json"),
    ("export from an empty store",
     ["plans", "export", "-o", "{d}/model.onnx/b.json", "--store", "{d}/empty-store.sqlite"],
     None, "holds no plans to export"),
    ("diff a JSON list",
     ["plans", "diff", "{d}/plan_list.json", "{d}/plan_list.json", "--store", "{d}/empty-store.sqlite"],
     None, "plan_list.json"),
    ("report with no plan", ["report", "{d}/model.onnx", "--store", "{d}/empty-store.sqlite"], None, "model"),
    ("report under a file",
     ["report", "{d}/model.onnx", "--untuned", "--format", "html", "-o", "{d}/model.onnx/r.html"],
     None, "model.onnx"),
    ("explain an unknown node",
     ["explain", "{d}/model.onnx", "--untuned", "--node", "nosuchnode"], None, "nosuchnode"),
    ("profile under a file",
     ["profile", "{d}/model.onnx", "--untuned", "-o", "{d}/model.onnx/t.json"], None, "model.onnx"),
    ("profile zero runs",
     ["profile", "{d}/model.onnx", "--untuned", "-o", "{d}/t.json", "--runs", "0"], None, "runs"),
    ("unknown example", ["example", "gpt5"], None, "gpt5"),
    ("unknown command", ["frobnicate"], None, "frobnicate"),
]


@pytest.mark.parametrize(("args", "env", "needle"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_user_errors_exit_non_zero_without_a_traceback(files, args, env, needle):
    d = str(files)
    (files / "corrupt-copy.sqlite").write_bytes((files / "corrupt.sqlite").read_bytes())
    argv = [a.format(d=d) for a in args]
    extra = {k: v.format(d=d) for k, v in (env or {}).items()}
    proc = _cli(argv, files, extra)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode != 0, f"exit 0 for {argv}\n{proc.stdout}\n{proc.stderr}"
    assert proc.returncode in (1, 2), f"exit {proc.returncode}: {proc.stderr}"
    assert needle.format(d=d) in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 12, proc.stderr


# runs that go on, with a warning on stderr (exit 0): the model still runs
WARNINGS = [
    ("unknown backend in the environment", ["run", "{d}/model.onnx", "--repeat", "1"],
     {"OPDISPATCH_BACKENDS": "tpu,native,numpy"},
     "opdispatch: warning: the configured backend order names ['tpu']"),
    ("a requested backend from a broken plugin",
     ["run", "{d}/model.onnx", "--repeat", "1", "--backends", "broken_plugin,numpy"],
     {"OPDISPATCH_PLUGIN_PATH": "{d}/plugins"},
     "opdispatch: warning: backend 'broken_plugin' is unavailable (failed to import: SyntaxError"),
    ("a missing plugin folder", ["run", "{d}/model.onnx", "--repeat", "1"],
     {"OPDISPATCH_PLUGIN_PATH": "{d}/no-such-folder"}, "no-such-folder"),
]


@pytest.mark.parametrize(("args", "env", "needle"), [c[1:] for c in WARNINGS], ids=[c[0] for c in WARNINGS])
def test_what_can_still_run_runs_and_says_what_it_skipped(files, args, env, needle):
    d = str(files)
    proc = _cli([a.format(d=d) for a in args], files, {k: v.format(d=d) for k, v in env.items()})
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr
    assert needle.format(d=d) in proc.stderr + proc.stdout, proc.stderr
    assert "run median" in proc.stdout


def test_an_internal_error_is_one_line_unless_debugging(monkeypatch, capsys):
    """A bug (here a command that raises a TypeError: no user error) prints one line and
    exits 70; OPDISPATCH_DEBUG=1 re-raises it for the traceback."""
    import tuner.cli.commands as cli

    def broken(args):
        raise TypeError("simulated bug")

    monkeypatch.delenv("OPDISPATCH_DEBUG", raising=False)
    monkeypatch.setattr(cli, "cmd_config", broken)
    assert cli.main(["config"]) == cli.EXIT_INTERNAL_ERROR
    err = capsys.readouterr().err
    assert err.strip() == ("opdispatch config: internal error: TypeError: simulated bug (a bug: "
                           "OPDISPATCH_DEBUG=1 shows the traceback; please report it)")
    monkeypatch.setenv("OPDISPATCH_DEBUG", "1")
    with pytest.raises(TypeError, match="simulated bug"):
        cli.main(["config"])
