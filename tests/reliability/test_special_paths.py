"""Special files where a regular file is expected, and hostile HOME setups.

A FIFO, a socket, a folder or a device at the store path (or beside it, as its ``-wal``) is
refused at once, without being opened (opening a FIFO blocks until a writer comes): each open
fails within a second, and each command (``tune``, ``plans import``, ``plans list``, ``run``)
exits 2 with one line. Models, bundles and ``--input`` arrays that are FIFOs are refused the
same way. A HOME whose folders cannot be searched, or holds a folder or a FIFO where the config
file goes, gives a clear message (or none, where nothing could be read anyway), never a
misleading "Permission denied" for a file that does not exist nor a bare exception.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest

from dispatch.config import Config
from dispatch.errors import ConfigError
from dispatch.session import Session
from tests.store.store_worker import tiny_model
from tuner.store import PlanStore, StoreError

REPO = Path(__file__).resolve().parents[2]


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _socket(path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()  # the socket file stays


def _folder(path: Path) -> None:
    path.mkdir()


def _device(path: Path) -> None:
    path.symlink_to("/dev/null")  # a character device (followed through the link)


SPECIAL: dict[str, Callable[[Path], None]] = {
    "FIFO": _fifo, "socket": _socket, "folder": _folder, "device": _device}
WHAT = {"FIFO": "a FIFO (named pipe)", "socket": "a socket", "folder": "a folder",
        "device": "a character device"}


@pytest.fixture
def special(tmp_path, request) -> Iterator[Path]:
    path = tmp_path / "plans.sqlite"
    SPECIAL[request.param](path)
    yield path


@pytest.mark.parametrize("special", list(SPECIAL), indirect=True)
@pytest.mark.parametrize("readonly", [False, True])
def test_a_special_file_at_the_store_path_is_refused_within_a_second(special, readonly):
    kind = next(k for k, f in SPECIAL.items() if _is(special, k))
    t0 = time.monotonic()
    with pytest.raises(StoreError, match=f"is {WHAT[kind].replace('(', '.').replace(')', '.')}, "
                                         f"not a regular file"):
        PlanStore(special, readonly=readonly)
    assert time.monotonic() - t0 < 1.0


def _is(path: Path, kind: str) -> bool:
    mode = os.stat(path).st_mode
    return {"FIFO": stat.S_ISFIFO, "socket": stat.S_ISSOCK, "folder": stat.S_ISDIR,
            "device": stat.S_ISCHR}[kind](mode)


@pytest.mark.parametrize("kind", ["FIFO", "folder"])
def test_a_special_file_beside_the_store_is_refused(tmp_path, kind):
    path = tmp_path / "plans.sqlite"
    PlanStore(path).close()
    SPECIAL[kind](Path(f"{path}-wal"))
    t0 = time.monotonic()
    with pytest.raises(StoreError, match="the SQLite side file of the plan store"):
        PlanStore(path)
    assert time.monotonic() - t0 < 1.0


@pytest.mark.parametrize("kind", list(SPECIAL))
def test_a_session_on_a_special_store_path_runs_the_untuned_plan(tmp_path, kind):
    path = tmp_path / "plans.sqlite"
    SPECIAL[kind](path)
    t0 = time.monotonic()
    sess = Session(tiny_model(), store=path)
    assert time.monotonic() - t0 < 30
    assert sess.plan_source == "heuristic" and "not a regular file" in sess.plan_note


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("special_cli")
    onnx.save(tiny_model(), d / "model.onnx")
    with PlanStore(d / "source.sqlite") as source:
        (d / "bundle.json").write_text(json.dumps(source.export_plans()))
    for kind, make in SPECIAL.items():
        make(d / kind)
    return d


def _cli(args: list[str], cwd: Path, env: dict[str, str] | None = None,
         timeout: float = 120) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(REPO), "OPDISPATCH_STORE": str(cwd / "unused.sqlite"),
            **(env or {})}
    return subprocess.run([sys.executable, "-m", "tuner.cli", *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=timeout)


COMMANDS = {
    "tune": ["tune", "{d}/model.onnx", "--budget", "30", "--no-progress", "--store", "{p}"],
    "plans import": ["plans", "import", "{d}/bundle.json", "--store", "{p}"],
    "plans list": ["plans", "list", "--store", "{p}"],
    "run --require-plan": ["run", "{d}/model.onnx", "--repeat", "1", "--require-plan",
                           "--store", "{p}"],
}


@pytest.mark.parametrize("kind", list(SPECIAL))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_refuses_a_special_store_path_at_once(files, kind, command):
    args = [a.format(d=files, p=files / kind) for a in COMMANDS[command]]
    res = _cli(args, files)  # a FIFO opened for reading would block until the timeout
    assert res.returncode == 2, res.stderr
    assert "not a regular file" in res.stderr and WHAT[kind] in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr
    # tune refuses before measuring anything (the budget would be 30 s)
    assert "measured" not in res.stdout


@pytest.mark.parametrize(("what", "args", "needle"), [
    ("a FIFO as the model", ["run", "{d}/FIFO"], "not a regular file"),
    ("a FIFO as the bundle", ["plans", "import", "{d}/FIFO", "--store", "{d}/s.sqlite"],
     "is a FIFO (named pipe), not a regular file"),
    ("a FIFO as an input array", ["run", "{d}/model.onnx", "--input", "x={d}/FIFO"],
     "is a FIFO (named pipe), not a regular file"),
    ("a device as the bundle", ["plans", "import", "{d}/device", "--store", "{d}/s.sqlite"],
     "is a device, not a regular file"),
    ("a FIFO as a plan to diff", ["plans", "diff", "{d}/FIFO", "{d}/FIFO"], "not a regular file"),
])
def test_special_files_as_models_bundles_and_inputs_are_refused(files, what, args, needle):
    res = _cli([a.format(d=files) for a in args], files)
    assert res.returncode == 2, res.stderr
    assert needle in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


# ------------------------------------------------------------------------------------------
# HOME
# ------------------------------------------------------------------------------------------

#: Run as root, this drops the capabilities that let root search any folder, so that the
#: chmod below binds it as it binds any other user.
_AS_USER = ["setpriv", "--inh-caps=-all", "--ambient-caps=-all",
            "--bounding-set=-dac_override,-dac_read_search,-fowner", "--"]


def _unprivileged(locked: Path) -> list[str]:
    """The command prefix under which ``locked`` (chmod 000) really cannot be searched."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("run as root without setpriv: chmod cannot lock root out of a folder")
    probe = subprocess.run([*_AS_USER, sys.executable, "-c", f"import os; os.listdir({str(locked)!r})"],
                           capture_output=True)
    if probe.returncode == 0:
        pytest.skip("setpriv could not drop root's CAP_DAC_READ_SEARCH here")
    return _AS_USER


@pytest.fixture
def locked_home(tmp_path) -> Iterator[Path]:
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0)
    try:
        yield home
    finally:
        home.chmod(stat.S_IRWXU)


def _env_home(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPDISPATCH_STORE", "OPDISPATCH_CONFIG", "XDG_CONFIG_HOME",
                        "XDG_CACHE_HOME", "OPDISPATCH_GRAPH_CACHE")}
    return {**env, "HOME": str(home), "PYTHONPATH": str(REPO)}


def test_an_unsearchable_home_does_not_break_every_command(locked_home, tmp_path):
    prefix = _unprivileged(locked_home)
    env = _env_home(locked_home)
    model = tmp_path / "model.onnx"
    onnx.save(tiny_model(), model)
    res = subprocess.run([*prefix, sys.executable, "-m", "tuner.cli", "config"], env=env,
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "config.toml unreachable: Permission denied on a folder of its path; none used" in res.stdout
    res = subprocess.run([*prefix, sys.executable, "-m", "tuner.cli", "plans", "list"], env=env,
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert "cannot reach the plan store" in res.stderr and "config.toml" not in res.stderr
    script = ("from dispatch.session import Session; import numpy as np; "
              f"s = Session({str(model)!r}); s.run(None, {{'x': np.ones((1, 4, 8, 8), np.float32)}}); "
              "print(s.plan_source, '|', s.plan_note)")
    res = subprocess.run([*prefix, sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("heuristic |") and "cannot reach the plan store" in res.stdout


@pytest.mark.parametrize("kind", ["folder", "FIFO"])
def test_a_special_file_where_the_config_file_goes_is_named(tmp_path, kind, monkeypatch):
    config_dir = tmp_path / "xdg" / "opdispatch"
    config_dir.mkdir(parents=True)
    SPECIAL[kind](config_dir / "config.toml")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("OPDISPATCH_CONFIG", raising=False)
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="config.toml' is a (folder|FIFO, socket or device), "
                                          "not a file"):
        Config.load()
    assert time.monotonic() - t0 < 1.0


def test_home_set_to_a_file_is_a_one_line_error(tmp_path):
    home = tmp_path / "home-file"
    home.write_text("not a folder")
    env = _env_home(home)
    res = subprocess.run([sys.executable, "-m", "tuner.cli", "plans", "list"], env=env,
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    np.testing.assert_equal(res.stderr.count("error:"), 1)
