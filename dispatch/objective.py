"""What tuning optimises, as one value: :class:`Objective` (parsed once, printed once).

An objective names what a plan is tuned for and is part of every plan key:

- ``latency`` or ``memory`` of one request at a time, optionally under a memory cap
  (``latency@cap=BYTES``);
- ``throughput`` — inferences per second with N requests in flight, optionally under a p99 latency
  bound (``throughput@n=4``, ``throughput@n=4,p99=50``);
- optionally computing regions in reduced precision within an accuracy budget measured on the
  user's data (``+accuracy=cosine:0.999,data=DIGEST``: :class:`AccuracyTarget`);
- optionally letting NaN/Inf outputs differ from the reference (``+nonstrict-nan``).

:meth:`Objective.parse` accepts the ``+`` parts in any order and checks every field, so that two
spellings of one objective are one value; ``str()`` writes the one canonical form that plan keys
use (the form the tuner has always stored: ``NAME[@...][+accuracy=...][+nonstrict-nan]``), so a
plan stored by an earlier release is found by the same string. The CLI, the Session, the store
keys, the server's repository configuration and the reports all go through this type.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from dispatch.errors import ArgumentError

__all__ = [
    "ACCURACY_METRICS", "MAX_CONCURRENCY", "NAMES", "AccuracyTarget", "Objective", "parse_accuracy",
]

#: The objectives tuning can optimise.
NAMES = ("latency", "memory", "throughput")
#: How many requests a throughput objective keeps in flight, at most
MAX_CONCURRENCY = 256
#: The accuracy metrics the tuner computes, with what their budget means
ACCURACY_METRICS: dict[str, str] = {
    "cosine": "the worst sample's cosine similarity of each output to float32's, "
              "at least BUDGET (0 < BUDGET <= 1)",
    "max-rel": "the largest difference to float32 relative to the output's largest magnitude, "
               "at most BUDGET (> 0)",
    "top1": "the drop in top-1 agreement with float32 (last axis), at most BUDGET (0 <= BUDGET < 1)",
}
_METRIC_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-.")
_HEX = frozenset("0123456789abcdef")
_NONSTRICT_NAN = "nonstrict-nan"
_ACCURACY = "accuracy="
_SYNTAX = ("NAME[@cap=BYTES | @n=N[,p99=MS]][+accuracy=METRIC:BUDGET,data=DIGEST][+nonstrict-nan] "
           f"with NAME one of {', '.join(NAMES)}")


def parse_accuracy(text: str) -> tuple[str, float]:
    """``METRIC:BUDGET`` -> ``(metric, budget)`` for a metric of :data:`ACCURACY_METRICS` or a
    user's metric name (lower-case letters, digits, ``_-.``; its function comes through the API,
    and its budget is the largest error it may return). Raises
    :class:`~dispatch.errors.ArgumentError` saying what is expected."""
    metric, sep, budget_text = str(text).partition(":")
    known_metrics = ", ".join(f"{m} ({why})" for m, why in ACCURACY_METRICS.items())
    try:
        budget = float(budget_text) if sep else math.nan
    except ValueError:
        budget = math.nan
    if not metric or not set(metric) <= _METRIC_CHARS or not math.isfinite(budget):
        raise ArgumentError(f"accuracy {text!r}: expected METRIC:BUDGET, e.g. cosine:0.999; "
                            f"metrics: {known_metrics}")
    out_of_range = {"cosine": not 0 < budget <= 1, "max-rel": not budget > 0,
                    "top1": not 0 <= budget < 1}.get(metric, budget < 0)
    if out_of_range:
        why = ACCURACY_METRICS.get(metric, "the largest error the metric may return, at least 0")
        raise ArgumentError(f"accuracy {text!r}: budget {budget:g} is out of range for {metric}: {why}")
    return metric, budget


@dataclass(frozen=True)
class AccuracyTarget:
    """Reduced precision allowed where ``metric`` on the user's data (``data``: its digest)
    stays within ``budget`` (:mod:`tuner.accuracy`)."""

    metric: str
    budget: float
    data: str

    def __post_init__(self) -> None:
        budget = parse_accuracy(f"{self.metric}:{self.budget!r}")[1]
        if not self.data or not set(self.data) <= _HEX:
            raise ArgumentError(f"accuracy data digest {self.data!r}: expected the hexadecimal "
                                "digest of the accuracy data")
        object.__setattr__(self, "budget", budget)

    @property
    def spec(self) -> str:
        """``METRIC:BUDGET`` as the command line takes it."""
        return f"{self.metric}:{self.budget:g}"

    def __str__(self) -> str:
        return f"{_ACCURACY}{self.spec},data={self.data}"


@dataclass(frozen=True)
class Objective:
    """What a plan is tuned for; ``str()`` is its canonical spelling in plan keys.

    ``memory_cap`` goes with latency and memory; ``concurrency`` (requests in flight) and
    ``p99_ms`` (a p99 latency bound) with throughput; ``accuracy`` with latency and throughput.
    A throughput objective without a concurrency means one request per usable core:
    :meth:`resolved` fills it in, and keys are always written resolved.
    """

    name: str = "latency"
    memory_cap: int | None = None
    concurrency: int | None = None
    p99_ms: float | None = None
    accuracy: AccuracyTarget | None = None
    nonstrict_nan: bool = False

    def __post_init__(self) -> None:
        if self.name not in NAMES:
            raise ArgumentError(f"unknown objective {self.name!r}; known: {', '.join(NAMES)} "
                                f"(spelled {_SYNTAX})")
        if self.memory_cap is not None:
            if isinstance(self.memory_cap, bool) or not isinstance(self.memory_cap, int) \
                    or self.memory_cap <= 0:
                raise ArgumentError(f"objective {self.name}: memory cap must be a positive integer "
                                    f"of bytes, e.g. latency@cap=100000000; received "
                                    f"{self.memory_cap!r}")
            if self.name == "throughput":
                raise ArgumentError("a memory cap goes with the latency or memory objective, "
                                    "not throughput")
        if self.name != "throughput" and (self.concurrency is not None or self.p99_ms is not None):
            raise ArgumentError("concurrency and a p99 latency bound go with the throughput "
                                f"objective, not {self.name!r}")
        if self.concurrency is not None and (
                isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int)
                or not 1 <= self.concurrency <= MAX_CONCURRENCY):
            raise ArgumentError(f"objective throughput: N requests in flight must be an integer "
                                f"from 1 to {MAX_CONCURRENCY}; received {self.concurrency!r}")
        if self.p99_ms is not None:
            try:
                p99 = float(self.p99_ms)
            except (TypeError, ValueError):
                p99 = math.nan
            if not (p99 > 0 and math.isfinite(p99)):
                raise ArgumentError(f"objective throughput: the p99 bound must be a positive "
                                    f"number of milliseconds, e.g. throughput@n=4,p99=50; "
                                    f"received {self.p99_ms!r}")
            object.__setattr__(self, "p99_ms", p99)
        if self.accuracy is not None:
            if not isinstance(self.accuracy, AccuracyTarget):
                raise ArgumentError(f"objective accuracy must be an AccuracyTarget, received "
                                    f"{type(self.accuracy).__name__}")
            if self.name == "memory" or self.memory_cap is not None:
                raise ArgumentError(f"an accuracy objective ({self.accuracy.spec}) goes with the "
                                    f"latency or the throughput objective, not "
                                    f"{self.replace(accuracy=None)}")
        object.__setattr__(self, "nonstrict_nan", bool(self.nonstrict_nan))

    # -- reading ------------------------------------------------------------------------------

    @classmethod
    def parse(cls, objective: str | Objective) -> Objective:
        """The objective ``objective`` spells (as in plan keys, the CLI or a server's config):
        its ``+`` parts in any order, each at most once. Raises
        :class:`~dispatch.errors.ArgumentError` saying what was received and expected."""
        if isinstance(objective, Objective):
            return objective
        if not isinstance(objective, str):
            raise ArgumentError(f"objective must be a string, received {type(objective).__name__}")
        head, *parts = objective.split("+")
        accuracy: AccuracyTarget | None = None
        nonstrict = False
        for part in parts:
            if part == _NONSTRICT_NAN and not nonstrict:
                nonstrict = True
            elif part.startswith(_ACCURACY) and accuracy is None:
                accuracy = _accuracy_part(objective, part[len(_ACCURACY):])
            else:
                raise ArgumentError(f"objective {objective!r}: unexpected part {'+' + part!r}; "
                                    f"expected {_SYNTAX}")
        name, at, rest = head.partition("@")
        if name not in NAMES:
            raise ArgumentError(f"unknown objective {objective!r}; known: {', '.join(NAMES)} "
                                f"(spelled {_SYNTAX})")
        fields: dict[str, Any] = {}
        if at:
            fields = _throughput_fields(objective, rest) if name == "throughput" \
                else {"memory_cap": _memory_cap(objective, rest)}
        return cls(name, accuracy=accuracy, nonstrict_nan=nonstrict, **fields)

    # -- deriving -----------------------------------------------------------------------------

    def replace(self, **changes: Any) -> Objective:
        """This objective with ``changes`` (checked as a new one)."""
        return dataclasses.replace(self, **changes)

    def resolved(self) -> Objective:
        """As plan keys name it: a throughput objective names its concurrency (the configured
        threads, one request per usable core, when none was given)."""
        if self.name != "throughput" or self.concurrency is not None:
            return self
        from dispatch.blas import configured_threads

        return self.replace(concurrency=configured_threads())

    @property
    def is_throughput(self) -> bool:
        """Whether requests are measured N in flight (a serving configuration is tuned)."""
        return self.name == "throughput"

    @property
    def float32(self) -> Objective:
        """The same objective without reduced precision (no accuracy part)."""
        return self.replace(accuracy=None) if self.accuracy is not None else self

    @property
    def strict(self) -> Objective:
        """The same objective with NaN/Inf held to the reference."""
        return self.replace(nonstrict_nan=False) if self.nonstrict_nan else self

    # -- writing ------------------------------------------------------------------------------

    def __str__(self) -> str:
        text = self.name
        if self.memory_cap is not None:
            text += f"@cap={self.memory_cap}"
        elif self.concurrency is not None or self.p99_ms is not None:
            bounds = [] if self.concurrency is None else [f"n={self.concurrency}"]
            bounds += [] if self.p99_ms is None else [f"p99={self.p99_ms:g}"]
            text += "@" + ",".join(bounds)
        if self.accuracy is not None:
            text += f"+{self.accuracy}"
        return text + (f"+{_NONSTRICT_NAN}" if self.nonstrict_nan else "")

    def tune_flags(self) -> str:
        """The ``opdispatch tune`` flags that tune for this objective, with a leading space, or
        ``""`` for the default (latency): ``throughput@n=4,p99=50`` ->
        ``" --objective throughput --concurrency 4 --max-latency-ms 50"``."""
        flags = "" if self.name == "latency" else f" --objective {self.name}"
        if self.concurrency is not None:
            flags += f" --concurrency {self.concurrency}"
        if self.p99_ms is not None:
            flags += f" --max-latency-ms {self.p99_ms:g}"
        if self.memory_cap is not None:
            flags += f" --memory-cap {self.memory_cap}"
        if self.accuracy is not None:  # (the data's digest names the file the user tuned with)
            flags += f" --accuracy {self.accuracy.spec} --data DATA"
        if self.nonstrict_nan:
            flags += " --allow-nonstrict-nan"
        return flags


def _accuracy_part(objective: str, text: str) -> AccuracyTarget:
    spec, sep, data = text.partition(",data=")
    if not sep or not data or not set(data) <= _HEX:
        raise ArgumentError(f"objective {objective!r}: expected +accuracy=METRIC:BUDGET,data=DIGEST "
                            "(the hexadecimal digest of the accuracy data)")
    metric, budget = parse_accuracy(spec)
    return AccuracyTarget(metric, budget, data)


def _memory_cap(objective: str, rest: str) -> int:
    text = rest[len("cap="):] if rest.startswith("cap=") else ""
    if not text.isdigit() or int(text) <= 0:
        raise ArgumentError(f"objective {objective!r}: expected NAME or NAME@cap=BYTES with a "
                            f"positive integer BYTES, e.g. latency@cap=100000000")
    return int(text)


def _throughput_fields(objective: str, rest: str) -> dict[str, Any]:
    found: dict[str, str] = {}
    fields: dict[str, Any] = {}
    try:
        for part in rest.split(","):
            key, eq, value = part.partition("=")
            if not eq or key not in ("n", "p99") or key in found:
                raise ValueError(part)
            found[key] = value
        if "n" in found:
            fields["concurrency"] = int(found["n"])
        if "p99" in found:
            fields["p99_ms"] = float(found["p99"])
        if fields.get("concurrency", 1) < 1 or fields.get("concurrency", 1) > MAX_CONCURRENCY \
                or not fields.get("p99_ms", 1.0) > 0 or not math.isfinite(fields.get("p99_ms", 1.0)):
            raise ValueError(rest)
    except ValueError:
        raise ArgumentError(
            f"objective {objective!r}: expected throughput, throughput@n=N or "
            f"throughput@n=N,p99=MS with N requests in flight (1 to {MAX_CONCURRENCY}) and a "
            f"positive p99 latency bound MS in milliseconds, e.g. throughput@n=4,p99=50") from None
    return fields
