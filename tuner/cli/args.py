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
    widths = [min(max_width, max(len(str(r[k])) for r in rows)) for k in range(len(rows[0]))]
    lines = []
    for n, r in enumerate(rows):
        lines.append("  ".join(str(c)[: widths[k]].ljust(widths[k]) for k, c in enumerate(r)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def parse_shape(text: str) -> tuple[str, list[int]]:
    name, sep, dims = text.rpartition("=")
    if not sep or not name:
        raise UsageError(f"--shape expects NAME=DIMxDIMx..., e.g. data=1x3x224x224; received {text!r}")
    try:
        shape = [int(d) for d in dims.lower().split("x")] if dims else []
    except ValueError:
        raise UsageError(f"--shape {text!r}: dimensions must be integers separated by 'x'") from None
    return name, shape


def parse_input(text: str) -> tuple[str, np.ndarray]:
    name, sep, path = text.rpartition("=")
    if not sep or not name:
        raise UsageError(f"--input expects NAME=FILE.npy; received {text!r}")
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"--input {name}: file {path!r} does not exist")
    try:
        return name, np.load(p, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise UsageError(f"--input {name}: {path!r} is not a .npy array file ({exc})") from None


def store_path(arg: str | None) -> str:
    """The plan store ``--store`` names, else the configured one (``~`` expanded)."""
    from dispatch.config import Config

    return str(Path(Config.load({"store_path": arg}).store_path).expanduser())
