"""Argument helpers shared by the ``opdispatch`` commands: exit codes, argparse types, parsers.

Every command module (:mod:`tuner.cli.commands`, :mod:`tuner.cli.plans`, :mod:`tuner.cli.reports`)
imports from here, so that none imports another: integer and seconds types with messages that
say what was received, ``--shape NAME=DIMxDIM`` and ``--input NAME=FILE.npy`` parsing, the plan
store path an argument names, and the plain text table the commands print.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dispatch.errors import OpDispatchError

EXIT_USER_ERROR = 2
#: exit status of an unexpected failure (BSD sysexits EX_SOFTWARE)
EXIT_INTERNAL_ERROR = 70


class UsageError(OpDispatchError):
    """A command-line argument could not be understood."""


def int_at_least(minimum: int, what: str):
    """An argparse type: an integer >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, received {text!r}")
        return value

    return parse


positive_int = int_at_least(1, "a positive integer")
non_negative_int = int_at_least(0, "an integer >= 0")


def positive_seconds(text: str) -> float:
    """argparse type: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, received {text!r}")
    return value


def table(rows: Sequence[Sequence[str]], max_width: int = 60) -> str:
    """An aligned terminal table (first row: header), cells cut to ``max_width`` characters
    (ending in ``…`` when cut); laid out by tabulate."""
    from tuner.tables import aligned

    return aligned(rows, max_width=max_width)


def parse_shape(text: str) -> tuple[str, list[int]]:
    name, sep, dims = text.rpartition("=")
    if not sep or not name:
        raise UsageError(f"--shape expects NAME=DIMxDIMx..., e.g. data=1x3x224x224; received {text!r}")
    try:
        shape = [int(d) for d in dims.lower().split("x")] if dims else []
    except ValueError:
        raise UsageError(f"--shape {text!r}: dimensions must be integers separated by 'x'") from None
    return name, shape


#: the most shapes one ``opdispatch tune`` run takes (each is tuned in its share of the budget)
MAX_SHAPE_SETS = 64


def _dim_values(text: str, arg: str) -> list[int]:
    """One dimension of a ``--shape`` for several shapes: ``128``, a list ``1,4,8`` or an
    inclusive range ``START:STOP:STEP`` (``16:128:16``; ``START:STOP`` steps by 1)."""
    try:
        if ":" in text:
            parts = [int(p) for p in text.split(":")]
            if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] <= 0) or parts[1] < parts[0]:
                raise ValueError
            start, stop, step = parts[0], parts[1], parts[2] if len(parts) == 3 else 1
            return list(range(start, stop + 1, step))
        return [int(p) for p in text.split(",")]
    except ValueError:
        raise UsageError(
            f"--shape {arg!r}: a dimension must be an integer, a list like 1,4,8 or a range "
            f"START:STOP:STEP like 16:128:16 (STOP >= START, STEP > 0); received {text!r}"
        ) from None


def parse_shape_sets(texts: Sequence[str]) -> list[dict[str, list[int]]]:
    """The input shapes ``--shape`` options ask to tune, one dict per set of shapes.

    ``NAME=1x128`` gives one shape; a dimension may list values (``NAME=1,4x128``) or range
    over them (``NAME=1x16:128:16``), giving every combination; repeating ``--shape`` for one
    input adds shapes. Inputs given one shape keep it in every set; inputs given several are
    paired in order, so they must be given the same number. Inputs not given are sized from
    the symbolic dimensions they share with those given (``attention_mask: [batch,
    sequence]`` follows ``input_ids``)."""
    per_input: dict[str, list[list[int]]] = {}
    for text in texts:
        name, sep, dims = text.rpartition("=")
        if not sep or not name:
            raise UsageError(
                f"--shape expects NAME=DIMxDIMx..., e.g. data=1x3x224x224 (a dimension may be a "
                f"list 1,4 or a range 16:128:16); received {text!r}")
        values = [_dim_values(d, text) for d in dims.lower().split("x")] if dims else []
        shapes: list[list[int]] = [[]]
        for vals in values:
            shapes = [[*s, v] for s in shapes for v in vals]
        per_input.setdefault(name, []).extend(shapes)
    counts = {n: len(v) for n, v in per_input.items() if len(v) > 1}
    if len(set(counts.values())) > 1:
        raise UsageError(
            "--shape gives inputs different numbers of shapes ("
            + ", ".join(f"{n}: {c}" for n, c in counts.items())
            + "); inputs with several shapes are paired in order, so give each the same number "
            "(or one shape, kept in every set)")
    n = max(counts.values(), default=1)
    if n > MAX_SHAPE_SETS:
        raise UsageError(f"--shape asks for {n} sets of shapes; "
                         f"at most {MAX_SHAPE_SETS} are tuned in one run")
    return [{name: (v[k] if len(v) > 1 else v[0]) for name, v in per_input.items()} for k in range(n)]


def parse_input(text: str) -> tuple[str, np.ndarray]:
    name, sep, path = text.rpartition("=")
    if not sep or not name:
        raise UsageError(f"--input expects NAME=FILE.npy; received {text!r}")
    p = regular_file(path, f"--input {name}: file")
    try:
        return name, np.load(p, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise UsageError(f"--input {name}: {path!r} is not a .npy array file ({exc})") from None


def parse_input_sets(paths: Sequence[str]) -> list[dict[str, np.ndarray]]:
    """The sets of tuning inputs ``--inputs`` names: each ``.npz`` file one set (arrays named
    like the model's inputs), a folder every ``.npz`` file in it, in name order."""
    files: list[Path] = []
    for text in paths:
        p = Path(text)
        if p.is_dir():
            found = sorted(p.glob("*.npz"))
            if not found:
                raise UsageError(f"--inputs: the folder {text!r} holds no .npz file")
            files += found
        else:
            files.append(Path(regular_file(text, "--inputs: file")))
    sets = []
    for f in files:
        try:
            with np.load(f, allow_pickle=False) as data:
                sets.append({name: np.asarray(data[name]) for name in data.files})
        except (ValueError, OSError) as exc:
            raise UsageError(f"--inputs: {str(f)!r} is not an .npz archive of arrays "
                             f"(numpy.savez; {exc})") from None
        if not sets[-1]:
            raise UsageError(f"--inputs: {str(f)!r} holds no array")
    return sets


def store_path(arg: str | None) -> str:
    """The plan store ``--store`` names, else the configured one (``~`` expanded)."""
    from dispatch.config import Config

    return str(Path(Config.load({"store_path": arg}).store_path).expanduser())


def regular_file(path: str | Path, what: str) -> Path:
    """``path`` when it is a regular file; else :class:`UsageError` saying what is there (a
    FIFO is refused before anything opens it: opening one blocks until a writer comes)."""
    import os
    import stat

    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise UsageError(f"{what} {str(p)!r} does not exist") from None
    except OSError as exc:
        raise UsageError(f"{what} {str(p)!r} cannot be reached: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO (named pipe)"
                if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
                else "not a regular file")
        raise UsageError(f"{what} {str(p)!r} is {kind}, not a regular file")
    return p


def read_json(path: str | Path, what: str) -> object:
    """The JSON data in the regular file ``path``; :class:`UsageError` naming the file and
    ``what`` it should be (``plan bundle``) when it cannot be read or is not JSON (malformed,
    not UTF-8, nested too deeply for Python to read, an integer too long to convert)."""
    import json

    p = regular_file(path, f"the {what}")
    try:
        return json.loads(p.read_bytes())
    except RecursionError:
        raise UsageError(f"{str(p)!r} is not a JSON {what}: it is nested too deeply to "
                         f"read") from None
    except MemoryError:
        raise UsageError(f"{str(p)!r} is too large to read") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer too long
        detail = str(exc).splitlines()[0][:120]
        raise UsageError(f"{str(p)!r} is not a JSON {what} ({detail})") from None

