"""What ``opdispatch serve`` serves: model files, or a model repository laid out as Triton's.

A repository is a folder with one folder per model, named as the model is served::

    models/
      resnet50/
        config.toml          optional: how the model is served (see ServeSettings)
        1/model.onnx         versions: numbered folders, the highest is served
        2/model.onnx
      minilm/
        model.onnx           or the model file directly in the model's folder
        config.toml

A model file given on its own is served under its file name without the suffix, with the
settings of the command line. Nothing here imports a server framework: the repository is read
and checked before one starts, so a mistake is one clear error naming the file and the key.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from dispatch.errors import ArgumentError
from dispatch.objective import AccuracyTarget, Objective, parse_accuracy
from dispatch.shape_range import parse_dim

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

#: the name of a model's optional configuration file in a repository
CONFIG_FILE = "config.toml"
#: the model file a version folder (or a model folder without versions) holds
MODEL_FILE = "model.onnx"


@dataclass(frozen=True)
class ServeSettings:
    """How one model is served (``config.toml`` keys, or the command line's defaults).

    Attributes:
        objective: the plan objective looked up in the store (``"latency"``,
            ``"throughput@n=4"``, ...): its serving configuration decides how many requests
            run at once.
        allow_untuned: serve the untuned plan when no plan is stored for this machine (and
            say so in the model's metadata); by default such a model is not ready.
        shapes: the input shapes served at batch 1, for a model whose inputs have symbolic
            dimensions (``{"input_ids": [1, 128], ...}``); a model with static inputs needs
            none. Its plan must be stored for them (unless ``allow_untuned``). A dimension may
            be a range ``"LO..HI"`` (``{"input_ids": [1, "1..512"]}``): every shape inside
            the range is served, on the range plan stored for exactly that range
            (``opdispatch tune MODEL --shape input_ids=1x1..512``); once checked, a range is
            the text ``"LO..HI"`` and every other dimension an integer.
        max_batch_size: dynamic batching: requests of batch 1 with the same shapes are
            grouped up to this many into one run (only sizes with a stored plan are formed;
            ``1``: no batching; ``None``: the batch size the plan was tuned with, its
            serving configuration's ``batch``, else no batching). Only for models whose
            inputs share a symbolic first dimension.
        max_queue_delay_ms: how long the first request of a group waits for others.
        max_queue: requests admitted at once (waiting and running); one more is refused
            (HTTP 503 / gRPC UNAVAILABLE) instead of growing the queue without bound.
        tune_budget_s: when no plan is stored for this machine, tune the served shapes first
            (this many seconds each) and serve the tuned plan; ``None``: not ready instead.
        accuracy: with ``data``, serve the plan tuned for this accuracy objective on that data
            (``"cosine:0.999"``: ``opdispatch tune --accuracy``); once checked, both are part of
            ``objective`` (the data's digest names the plan) and are ``None`` here.
        data: the samples the plan was tuned on (``.npz`` or a folder; in ``config.toml``
            relative to the model's folder).
    """

    objective: str = "latency"
    allow_untuned: bool = False
    shapes: Mapping[str, Sequence[int | str]] = field(default_factory=dict)
    max_batch_size: int | None = None
    max_queue_delay_ms: float = 2.0
    max_queue: int = 64
    tune_budget_s: float | None = None
    accuracy: str | None = None
    data: str | None = None

    def checked(self, where: str) -> ServeSettings:
        """These settings, each one checked; :class:`ArgumentError` naming ``where``."""
        try:
            objective = Objective.parse(str(self.objective)).resolved()
        except Exception as exc:
            raise ArgumentError(f"{where}: objective: {exc}") from None
        if (self.accuracy is None) != (self.data is None):
            raise ArgumentError(f"{where}: accuracy and data go together (the plan was tuned for "
                                f"that budget on that data), received accuracy={self.accuracy!r} "
                                f"and data={self.data!r}")
        if self.accuracy is not None:
            objective = _with_accuracy(objective, str(self.accuracy), str(self.data), where)
        if not isinstance(self.allow_untuned, bool):
            raise ArgumentError(f"{where}: allow_untuned must be true or false, received "
                                f"{self.allow_untuned!r}")
        for key, minimum in (("max_batch_size", 1), ("max_queue", 1)):
            value = getattr(self, key)
            if key == "max_batch_size" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ArgumentError(f"{where}: {key} must be an integer >= {minimum}, "
                                    f"received {value!r}")
        delay = self.max_queue_delay_ms
        if isinstance(delay, bool) or not isinstance(delay, int | float) or not 0 <= delay <= 10_000:
            raise ArgumentError(f"{where}: max_queue_delay_ms must be a number of milliseconds "
                                f"from 0 to 10000, received {delay!r}")
        budget = self.tune_budget_s
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int | float)
                                   or budget <= 0):
            raise ArgumentError(f"{where}: tune_budget_s must be a positive number of seconds, "
                                f"received {budget!r}")
        if not isinstance(self.shapes, Mapping):
            raise ArgumentError(f"{where}: shapes must be a table of input name = [dims], "
                                f"received {self.shapes!r}")
        shapes: dict[str, tuple[int | str, ...]] = {}
        for name, dims in self.shapes.items():
            shapes[str(name)] = _checked_dims(dims, f"{where}: shapes.{name}")
        return replace(self, objective=str(objective), shapes=shapes, max_queue_delay_ms=float(delay),
                       accuracy=None, data=None)


def _checked_dims(dims: Any, where: str) -> tuple[int | str, ...]:
    """One input's served dimensions, each a positive integer or a range ``"LO..HI"``
    (:func:`dispatch.shape_range.parse_dim` checks it); :class:`ArgumentError` naming
    ``where`` with what was received and what is expected."""
    expected = (f"{where} must be a list of positive integers or ranges \"LO..HI\" (like "
                f"[1, 128] or [1, \"1..512\"]), received {dims!r}")
    if not isinstance(dims, list | tuple) or not dims:
        raise ArgumentError(expected)
    checked: list[int | str] = []
    for dim in dims:
        if isinstance(dim, str):
            lo, hi = parse_dim(dim, where)
            if ".." in dim:
                checked.append(f"{lo}..{hi}")
                continue
            dim = lo
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ArgumentError(expected)
        checked.append(dim)
    return tuple(checked)


def _with_accuracy(objective: Objective, accuracy: str, data: str, where: str) -> Objective:
    """``objective`` with the accuracy target ``accuracy`` (``METRIC:BUDGET``) on ``data`` (its
    digest) in place of any it had."""
    from tuner.accuracy.data import data_digest

    try:
        metric, budget = parse_accuracy(accuracy)
        return objective.replace(accuracy=AccuracyTarget(metric, budget, data_digest(data)))
    except Exception as exc:
        raise ArgumentError(f"{where}: accuracy: {exc}") from None


#: every key ``config.toml`` may hold
SETTING_KEYS = tuple(f.name for f in fields(ServeSettings))


@dataclass(frozen=True)
class ModelSpec:
    """One model to serve: its name, its file, its version and its settings."""

    name: str
    path: Path
    settings: ServeSettings
    version: str | None = None


def read_settings(path: Path, base: ServeSettings) -> ServeSettings:
    """``base`` updated from the TOML file ``path`` (unknown keys are an error listing the
    known ones)."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ArgumentError(f"{path}: cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ArgumentError(f"{path}: not valid TOML: {exc}") from None
    unknown = sorted(set(data) - set(SETTING_KEYS))
    if unknown:
        raise ArgumentError(f"{path}: unknown key(s) {', '.join(unknown)}; the keys are "
                            f"{', '.join(SETTING_KEYS)}")
    if isinstance(data.get("data"), str) and not Path(data["data"]).is_absolute():
        data["data"] = str(path.parent / data["data"])  # relative to the model's folder
    return replace(base, **data).checked(str(path))


def _model_in_folder(folder: Path) -> tuple[Path, str | None]:
    """The model file of a repository folder and its version (the highest numbered folder
    holding a model, else the folder's own ``model.onnx``)."""
    versions = sorted((int(p.name), p) for p in folder.iterdir()
                      if p.is_dir() and p.name.isdigit() and (p / MODEL_FILE).is_file())
    if versions:
        number, where = versions[-1]
        return where / MODEL_FILE, str(number)
    if (folder / MODEL_FILE).is_file():
        return folder / MODEL_FILE, None
    onnx_files = sorted(folder.glob("*.onnx"))
    if len(onnx_files) == 1:
        return onnx_files[0], None
    found = ", ".join(p.name for p in onnx_files) or "no .onnx file"
    raise ArgumentError(f"{folder}: a model folder holds {MODEL_FILE}, a single .onnx file, or "
                        f"numbered version folders with {MODEL_FILE}; found {found}")


def discover(targets: Sequence[str | Path], base: ServeSettings) -> list[ModelSpec]:
    """The models that ``targets`` (model files, model folders, or repositories) name, each
    with its settings; :class:`ArgumentError` for a missing path, a folder without a model,
    a bad ``config.toml`` or two models of the same name."""
    if not targets:
        raise ArgumentError("nothing to serve: name a model repository or model files")
    base = base.checked("the command line")
    specs: list[ModelSpec] = []
    for target in map(Path, targets):
        if target.is_file():
            specs.append(ModelSpec(target.stem, target, base))
        elif target.is_dir():
            specs.extend(_folder_specs(target, base))
        else:
            raise ArgumentError(f"{target}: no such model file or repository folder")
    names = [s.name for s in specs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ArgumentError(f"two models would be served under the same name: "
                            f"{', '.join(twice)}")
    return specs


def _folder_specs(folder: Path, base: ServeSettings) -> list[ModelSpec]:
    """A model folder (it holds a model) or a repository (its sub-folders are models)."""
    direct = ((folder / CONFIG_FILE).is_file() or any(folder.glob("*.onnx"))
              or any(p.is_dir() and p.name.isdigit() for p in folder.iterdir()))
    folders = [folder] if direct else sorted(p for p in folder.iterdir() if p.is_dir()
                                             and not p.name.startswith("."))
    if not folders:
        raise ArgumentError(f"{folder}: an empty model repository (one folder per model is "
                            f"expected, each with {MODEL_FILE} or numbered version folders)")
    specs = []
    for model_folder in folders:
        path, version = _model_in_folder(model_folder)
        config = model_folder / CONFIG_FILE
        settings = read_settings(config, base) if config.is_file() else base
        specs.append(ModelSpec(model_folder.name, path, settings, version))
    return specs


def settings_from(values: Mapping[str, Any]) -> ServeSettings:
    """:class:`ServeSettings` from keyword values (``None`` values keep the defaults)."""
    return ServeSettings(**{k: v for k, v in values.items() if v is not None}).checked(
        "the serve settings")
