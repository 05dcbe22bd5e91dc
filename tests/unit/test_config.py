"""Configuration precedence: arguments > environment > file > default, with sources."""

from __future__ import annotations

import pytest

from dispatch.config import Config
from dispatch.errors import ConfigError


def test_defaults(tmp_path):
    cfg = Config.load(environ={"OPDISPATCH_CONFIG": str(tmp_path / "none.toml")})
    assert cfg.backend_order == ("onnxruntime", "native", "numpy")
    assert cfg.origin["backend_order"] == "default"
    assert cfg.effective_threads >= 1


def test_precedence(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('backend_order = ["numpy"]\nthreads = 3\nstore_path = "/tmp/x.sqlite"\n')
    env = {"OPDISPATCH_CONFIG": str(f), "OPDISPATCH_THREADS": "2"}
    cfg = Config.load({"store_path": "/tmp/arg.sqlite"}, environ=env)
    assert cfg.threads == 2 and cfg.origin["threads"] == "environment OPDISPATCH_THREADS"
    assert cfg.backend_order == ("numpy",) and cfg.origin["backend_order"].startswith("file ")
    assert cfg.store_path == "/tmp/arg.sqlite" and cfg.origin["store_path"] == "argument"
    assert cfg.config_file == str(f)


def test_bad_values_are_clear(tmp_path):
    with pytest.raises(ConfigError, match="threads.*received 'many'"):
        Config.load(environ={"OPDISPATCH_THREADS": "many", "OPDISPATCH_CONFIG": str(tmp_path / "n")})
    f = tmp_path / "c.toml"
    f.write_text("colour = 1\n")
    with pytest.raises(ConfigError, match="unknown setting.*colour"):
        Config.load(environ={"OPDISPATCH_CONFIG": str(f)})
    f.write_text("this is = not toml [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        Config.load(environ={"OPDISPATCH_CONFIG": str(f)})
    with pytest.raises(ConfigError, match="unknown setting"):
        Config.load({"nope": 1})
