"""Configuration in one place.

Each setting is read, in order of precedence, from explicit arguments, then the environment
(``OPDISPATCH_*``), then a TOML config file (``OPDISPATCH_CONFIG`` or
``~/.config/opdispatch/config.toml``), then the built-in default. :meth:`Config.sources`
says where each effective value came from (``opdispatch config`` prints it).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dispatch.errors import ConfigError

#: The untuned plan's backend order when none is configured: onnxruntime first (when it is
#: installed, the untuned plan is then the whole model as one onnxruntime region, as fast as
#: plain onnxruntime), then this project's native kernels, then the numpy reference. Measured on
#: resnet50 (2-core AMD EPYC): the native-first untuned plan ran at 88 ms where plain
#: onnxruntime took 32 ms. Backends that are not installed are skipped.
DEFAULT_BACKEND_ORDER = ("onnxruntime", "native", "numpy")


def _cache_dir() -> Path:
    """The user's cache folder for opdispatch (platformdirs: ``$XDG_CACHE_HOME/opdispatch``,
    else ``~/.cache/opdispatch`` on Linux; the platform's own folder elsewhere)."""
    from platformdirs import user_cache_path

    return user_cache_path("opdispatch", appauthor=False)


def _config_dir() -> Path:
    """The user's configuration folder (platformdirs: ``$XDG_CONFIG_HOME/opdispatch``, else
    ``~/.config/opdispatch`` on Linux)."""
    from platformdirs import user_config_path

    return user_config_path("opdispatch", appauthor=False)


def _file_state(path: Path) -> str:
    """``"file"`` (a regular file), ``"missing"``, or what else is at ``path``: ``"unreachable:
    ..."`` when a folder of its path cannot be searched, ``"is a folder..."`` (checked with
    ``stat``: a FIFO is never opened)."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    except OSError as exc:
        return f"unreachable: {exc.strerror or exc} on a folder of its path"
    if stat.S_ISREG(st.st_mode):
        return "file"
    kind = "a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO, socket or device"
    return f"is {kind}, not a file"


def _as_list(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",")]
    elif isinstance(value, list | tuple):
        items = [str(v).strip() for v in value]
    else:
        raise ConfigError(f"expected a comma-separated list, received {value!r}")
    return tuple(i for i in items if i)


def _as_threads(value: Any) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ConfigError(
            f"threads must be a positive integer or 0 (all cores), received {value!r}"
        ) from None
    if n < 0:
        raise ConfigError(f"threads must be a positive integer or 0 (all cores), received {n}")
    return n


def _as_float(value: Any) -> float:
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"expected a number, received {value!r}") from None
    if f <= 0:
        raise ConfigError(f"expected a positive number, received {f}")
    return f


def _as_int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"expected an integer, received {value!r}") from None


def _as_str(value: Any) -> str:
    return str(value)


@dataclass(frozen=True)
class Setting:
    name: str
    env: str
    parse: Callable[[Any], Any]
    default: Callable[[], Any]
    doc: str


SETTINGS: tuple[Setting, ...] = (
    Setting("threads", "OPDISPATCH_THREADS", _as_threads, lambda: 0,
            "threads for native kernels (0: all cores)"),
    Setting("backend_order", "OPDISPATCH_BACKENDS", _as_list, lambda: DEFAULT_BACKEND_ORDER,
            "untuned backend priority order"),
    Setting("plugin_path", "OPDISPATCH_PLUGIN_PATH", _as_str, lambda: "",
            "folders with plugin backend modules (os.pathsep-separated)"),
    Setting("store_path", "OPDISPATCH_STORE", _as_str, lambda: str(_cache_dir() / "plans.sqlite"),
            "SQLite plan store"),
    Setting("graph_cache", "OPDISPATCH_GRAPH_CACHE", _as_str, lambda: str(_cache_dir() / "graphs"),
            "folder of imported and simplified graphs (dispatch.graph_cache; off: none)"),
    Setting("compiled_cache", "OPDISPATCH_COMPILED_CACHE", _as_str, lambda: str(_cache_dir() / "compiled"),
            "folder of library regions compiled once per machine (OpenVINO; off: none)"),
    Setting("tune_budget_s", "OPDISPATCH_TUNE_BUDGET", _as_float, lambda: 120.0,
            "default tuning budget in seconds"),
    Setting("tune_top_k", "OPDISPATCH_TUNE_TOP_K", _as_int, lambda: 3,
            "plans validated end to end by the tuner"),
    Setting("objective", "OPDISPATCH_OBJECTIVE", _as_str, lambda: "latency",
            "tuning objective: latency or memory"),
)


@dataclass(frozen=True)
class Config:
    """The effective configuration and where each value came from."""

    threads: int = 0
    backend_order: tuple[str, ...] = DEFAULT_BACKEND_ORDER
    plugin_path: str = ""
    store_path: str = ""
    graph_cache: str = ""
    compiled_cache: str = ""
    tune_budget_s: float = 120.0
    tune_top_k: int = 3
    objective: str = "latency"
    config_file: str | None = None
    origin: Mapping[str, str] = field(default_factory=dict)
    #: why no config file was looked at (its folder cannot be searched), else ``None``
    config_note: str | None = None

    @classmethod
    def load(
        cls,
        overrides: Mapping[str, Any] | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        config_file: str | os.PathLike | None = None,
    ) -> Config:
        """Resolve every setting: arguments, then environment, then file, then default."""
        env = os.environ if environ is None else environ
        overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
        known_names = {s.name for s in SETTINGS}
        bad = set(overrides) - known_names
        if bad:
            raise ConfigError(
                f"unknown setting(s) {sorted(bad)}; known settings: {sorted(known_names)}"
            )
        path = (Path(config_file) if config_file
                else Path(env.get("OPDISPATCH_CONFIG", "") or _config_dir() / "config.toml"))
        file_values: dict[str, Any] = {}
        used_file = None
        state = _file_state(path)
        note = None
        if state not in ("file", "missing"):
            if config_file or env.get("OPDISPATCH_CONFIG") or not state.startswith("unreachable"):
                raise ConfigError(f"config file {str(path)!r} {state}")
            # the default location in a home this user cannot search: no file it could read
            note = f"{path} {state}; none used"
        if state == "file":
            try:  # imported here: most processes have no config file (start-up, issue 13)
                import tomllib
            except ModuleNotFoundError:  # Python 3.10: the same parser, from PyPI (pyproject.toml)
                import tomli as tomllib  # type: ignore[no-redef]
            try:
                file_values = tomllib.loads(path.read_text())
            except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
                raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None
            except OSError as exc:
                raise ConfigError(f"config file {str(path)!r} cannot be read: "
                                  f"{exc.strerror or exc}") from None
            used_file = str(path)
            table = file_values.get("opdispatch", file_values)
            bad = set(table) - known_names
            if bad:
                raise ConfigError(
                    f"config file {str(path)!r} has unknown setting(s) {sorted(bad)}; "
                    f"known: {sorted(known_names)}"
                )
            file_values = dict(table)
        elif config_file:
            raise ConfigError(f"config file {str(path)!r} does not exist")
        values: dict[str, Any] = {}
        origin: dict[str, str] = {}
        for s in SETTINGS:
            try:
                if s.name in overrides:
                    values[s.name], origin[s.name] = s.parse(overrides[s.name]), "argument"
                elif env.get(s.env):
                    values[s.name], origin[s.name] = s.parse(env[s.env]), f"environment {s.env}"
                elif s.name in file_values:
                    values[s.name], origin[s.name] = s.parse(file_values[s.name]), f"file {path}"
                else:
                    values[s.name], origin[s.name] = s.default(), "default"
            except ConfigError as exc:
                raise ConfigError(
                    f"setting {s.name!r} ({origin.get(s.name, 'from ' + s.env)}): {exc}"
                ) from None
        if values["objective"] not in ("latency", "memory"):
            raise ConfigError(
                f"objective must be 'latency' or 'memory', received {values['objective']!r}"
            )
        return cls(**values, config_file=used_file, origin=origin, config_note=note)

    @property
    def effective_threads(self) -> int:
        return self.threads or (os.cpu_count() or 1)

    def rows(self) -> list[tuple[str, str, str, str]]:
        """``(name, value, source, description)`` for every setting."""
        out = []
        for s in SETTINGS:
            value = getattr(self, s.name)
            shown = ",".join(value) if isinstance(value, tuple) else str(value)
            if s.name == "threads" and value == 0:
                shown = f"0 (all cores: {self.effective_threads})"
            out.append((s.name, shown, self.origin.get(s.name, "default"), s.doc))
        return out


