"""The two policies a plan key depends on, written once: objectives and which backends a plan uses.

An objective names what tuning optimises: ``latency`` or ``memory`` of one request at a time,
optionally under a memory cap (``latency@cap=BYTES``), or ``throughput`` — inferences per second
with N requests in flight, optionally under a p99 latency bound (``throughput@n=4``,
``throughput@n=4,p99=50``: :func:`throughput_target`) — and optionally letting NaN/Inf outputs
differ from the reference (``latency+nonstrict-nan``), and optionally computing regions in reduced
precision within an accuracy budget measured on the user's data
(``latency+accuracy=cosine:0.999,data=DIGEST``: :func:`accuracy_target`); the spelled-out form is
part of every plan key. The backends a plan
may use are the ones asked for, else the configured order first (it orders the untuned plan)
followed by every other available backend. The Session, the tuner and the report's plan lookup
all ask this module, so that they compute the same key for the same model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from dispatch.errors import ArgumentError

if TYPE_CHECKING:
    from dispatch.registry import Registry

#: The objectives tuning can optimise.
OBJECTIVES = ("latency", "memory", "throughput")
#: How many requests a throughput objective keeps in flight, at most
MAX_CONCURRENCY = 256
#: How an objective ends when its plan may differ from the reference on NaN/Inf inputs
#: (tuned with ``allow_nonstrict_nan``: :mod:`tuner.nonfinite`), e.g. ``latency+nonstrict-nan``.
NONSTRICT_NAN_SUFFIX = "+nonstrict-nan"
#: What marks an accuracy objective's part: ``+accuracy=METRIC:BUDGET,data=DIGEST`` (before a
#: :data:`NONSTRICT_NAN_SUFFIX`): reduced precision where the metric on the user's data (its
#: digest) stays within the budget (:mod:`tuner.accuracy`)
ACCURACY_MARK = "+accuracy="
#: The accuracy metrics the tuner computes, with what their budget means
ACCURACY_METRICS: dict[str, str] = {
    "cosine": "the worst sample's cosine similarity of each output to float32's, at least BUDGET (0 < BUDGET <= 1)",
    "max-rel": "the largest difference to float32 relative to the output's largest magnitude, at most BUDGET (> 0)",
    "top1": "the drop in top-1 agreement with float32 (last axis), at most BUDGET (0 <= BUDGET < 1)",
}
_METRIC_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-.")


def parse_accuracy(text: str) -> tuple[str, float]:
    """``METRIC:BUDGET`` -> ``(metric, budget)`` for a metric of :data:`ACCURACY_METRICS` or a
    user's metric name (lower-case letters, digits, ``_-.``; its function comes through the API,
    and its budget is the largest error it may return). Raises
    :class:`~dispatch.errors.ArgumentError` saying what is expected."""
    metric, sep, budget_text = str(text).partition(":")
    known_metrics = ", ".join(f"{m} ({why})" for m, why in ACCURACY_METRICS.items())
    try:
        budget = float(budget_text) if sep else float("nan")
    except ValueError:
        budget = float("nan")
    if not metric or not set(metric) <= _METRIC_CHARS or not budget == budget or budget in (float("inf"), float("-inf")):
        raise ArgumentError(f"accuracy {text!r}: expected METRIC:BUDGET, e.g. cosine:0.999; metrics: {known_metrics}")
    bad = {"cosine": not 0 < budget <= 1, "max-rel": not budget > 0, "top1": not 0 <= budget < 1}.get(metric, budget < 0)
    if bad:
        why = ACCURACY_METRICS.get(metric, "the largest error the metric may return, at least 0")
        raise ArgumentError(f"accuracy {text!r}: budget {budget:g} is out of range for {metric}: {why}")
    return metric, budget


def split_accuracy(objective: str) -> tuple[str, tuple[str, float, str] | None]:
    """``(objective without its accuracy part, (metric, budget, data digest) or None)``."""
    strict = objective.removesuffix(NONSTRICT_NAN_SUFFIX)
    suffix = objective[len(strict):]
    base, mark, rest = strict.partition(ACCURACY_MARK)
    if not mark:
        return objective, None
    spec, sep, data = rest.partition(",data=")
    if not sep or not data or not set(data) <= set("0123456789abcdef"):
        raise ArgumentError(f"objective {objective!r}: expected {ACCURACY_MARK}METRIC:BUDGET,data=DIGEST "
                            "(the hexadecimal digest of the accuracy data)")
    metric, budget = parse_accuracy(spec)
    return base + suffix, (metric, budget, data)


def accuracy_target(objective: str) -> tuple[str, float, str] | None:
    """``(metric, budget, data digest)`` of an objective with an accuracy part (as in plan
    keys: ``latency+accuracy=cosine:0.999,data=0a1b...``), else ``None``."""
    return split_accuracy(objective)[1]


def accuracy_string(metric: str, budget: float, data_digest: str) -> str:
    """The accuracy part of an objective as plan keys spell it (checked)."""
    metric, budget = parse_accuracy(f"{metric}:{budget!r}")
    return f"{ACCURACY_MARK}{metric}:{budget:g},data={data_digest}"


def parse_objective(objective: str) -> tuple[str, int | None]:
    """Split an objective as it appears in plan keys into ``(objective, memory_cap_bytes)``:
    ``"latency"`` -> ``("latency", None)``, ``"latency@cap=1000000"`` -> ``("latency", 1000000)``,
    ``"throughput@n=4,p99=50"`` -> ``("throughput", None)`` (its target:
    :func:`throughput_target`); a :data:`NONSTRICT_NAN_SUFFIX` is accepted and left to
    :func:`nonstrict_nan`. Raises :class:`~dispatch.errors.ArgumentError` naming the known
    objectives."""
    if not isinstance(objective, str):
        raise ArgumentError(f"objective must be a string, received {type(objective).__name__}")
    strict = split_accuracy(objective)[0].removesuffix(NONSTRICT_NAN_SUFFIX)
    name, sep, rest = strict.partition("@")
    if name not in OBJECTIVES:
        raise ArgumentError(
            f"unknown objective {objective!r}; known: {', '.join(OBJECTIVES)} "
            f"(latency and memory optionally @cap=BYTES, throughput optionally @n=N[,p99=MS], "
            f"then optionally {NONSTRICT_NAN_SUFFIX})"
        )
    if name == "throughput":
        _throughput_fields(objective, rest if sep else "")
        return name, None
    cap: int | None = None
    if sep:
        text = rest[len("cap="):] if rest.startswith("cap=") else ""
        try:
            cap = int(text)
        except ValueError:
            cap = None
        if cap is None or cap <= 0:
            raise ArgumentError(
                f"objective {objective!r}: expected NAME or NAME@cap=BYTES with a positive "
                f"integer BYTES, e.g. latency@cap=100000000"
            )
    return name, cap


def _throughput_fields(objective: str, rest: str) -> tuple[int | None, float | None]:
    """``(concurrency, p99_ms)`` of a throughput objective's ``n=N[,p99=MS]`` part."""
    found: dict[str, str] = {}
    for part in rest.split(",") if rest else ():
        key, eq, value = part.partition("=")
        if not eq or key not in ("n", "p99") or key in found:
            found = {"": ""}
            break
        found[key] = value
    n: int | None = None
    p99: float | None = None
    try:
        if "" in found:
            raise ValueError
        n = int(found["n"]) if "n" in found else None
        p99 = float(found["p99"]) if "p99" in found else None
    except ValueError:
        n = p99 = -1
    if (n is not None and not 1 <= n <= MAX_CONCURRENCY) or (
            p99 is not None and not (p99 > 0 and p99 < float("inf"))):
        raise ArgumentError(
            f"objective {objective!r}: expected throughput, throughput@n=N or "
            f"throughput@n=N,p99=MS with N requests in flight (1 to {MAX_CONCURRENCY}) and a "
            f"positive p99 latency bound MS in milliseconds, e.g. throughput@n=4,p99=50"
        )
    return n, p99


def throughput_target(objective: str) -> tuple[int, float | None] | None:
    """``(concurrency, p99_bound_ms)`` of a throughput objective as in plan keys
    (``throughput@n=4,p99=50`` -> ``(4, 50.0)``), ``None`` for the other objectives. Every
    throughput key names its concurrency (:func:`objective_string` writes it); a bare
    ``throughput`` means one request in flight per usable core."""
    name, _ = parse_objective(objective)
    if name != "throughput":
        return None
    strict = split_accuracy(objective)[0].removesuffix(NONSTRICT_NAN_SUFFIX)
    n, p99 = _throughput_fields(objective, strict.partition("@")[2])
    if n is None:
        from dispatch.blas import configured_threads

        n = configured_threads()
    return n, p99


def canonical_objective(objective: str) -> str:
    """``objective`` as plan keys spell it: a throughput objective names its concurrency
    (``throughput`` -> ``throughput@n=CORES``; ``throughput@p99=50`` -> ``throughput@n=CORES,p99=50``),
    the others are returned as given once checked (:func:`parse_objective`)."""
    target = throughput_target(objective)
    if target is None:
        return objective
    accuracy = accuracy_target(objective)
    return objective_string("throughput", nonstrict_nan=nonstrict_nan(objective),
                            concurrency=target[0], max_latency_ms=target[1], accuracy=accuracy)


def objective_string(objective: str, memory_cap_bytes: int | None = None,
                     nonstrict_nan: bool = False, *, concurrency: int | None = None,
                     max_latency_ms: float | None = None,
                     accuracy: tuple[str, float, str] | None = None) -> str:
    """The objective as it appears in plan keys, e.g. ``latency``, ``latency@cap=1000000``,
    ``latency+nonstrict-nan``, ``throughput@n=4,p99=50`` (a throughput objective always
    names its ``concurrency``: the caller resolves the default, the usable cores) or
    ``latency+accuracy=cosine:0.999,data=DIGEST`` (``accuracy``: metric, budget, digest)."""
    if objective == "throughput":
        if concurrency is None:
            raise ArgumentError("a throughput objective needs its concurrency (requests in flight)")
        objective = f"throughput@n={int(concurrency)}"
        if max_latency_ms is not None:
            objective += f",p99={float(max_latency_ms):g}"
        parse_objective(objective)
    elif concurrency is not None or max_latency_ms is not None:
        raise ArgumentError(
            f"concurrency and a p99 latency bound go with the throughput objective, not {objective!r}")
    if memory_cap_bytes is not None:
        objective = f"{objective}@cap={int(memory_cap_bytes)}"
    if accuracy is not None:
        objective += accuracy_string(*accuracy)
    return objective + (NONSTRICT_NAN_SUFFIX if nonstrict_nan else "")


def tune_flags(objective: str) -> str:
    """The ``opdispatch tune`` flags that tune for ``objective`` (as in plan keys), with a
    leading space, or ``""`` for the default (latency): ``throughput@n=4,p99=50`` ->
    ``" --objective throughput --concurrency 4 --max-latency-ms 50"``."""
    name, cap = parse_objective(objective)
    flags = ""
    if name != "latency":
        flags += f" --objective {name}"
    target = throughput_target(objective)
    if target is not None:
        flags += f" --concurrency {target[0]}"
        if target[1] is not None:
            flags += f" --max-latency-ms {target[1]:g}"
    if cap is not None:
        flags += f" --memory-cap {cap}"
    accuracy = accuracy_target(objective)
    if accuracy is not None:  # (the data's digest names the file the user tuned with)
        flags += f" --accuracy {accuracy[0]}:{accuracy[1]:g} --data DATA"
    if nonstrict_nan(objective):
        flags += " --allow-nonstrict-nan"
    return flags


def nonstrict_nan(objective: str) -> bool:
    """Whether ``objective`` (as in plan keys) lets NaN/Inf differ from the reference."""
    return isinstance(objective, str) and objective.endswith(NONSTRICT_NAN_SUFFIX)


def plan_backends(
    registry: Registry, configured: Sequence[str], requested: Sequence[str] | None = None,
) -> list[str]:
    """The backends a plan may use, in priority order: the ``requested`` ones that are
    available, else the ``configured`` order's available backends followed by every other
    available backend (in the registry's order)."""
    available = registry.available_backends()
    if requested:
        return [b for b in requested if b in available]
    order = [b for b in configured if b in available]
    return order + [b for b in available if b not in order]


def unavailable_backends(registry: Registry, requested: Sequence[str]) -> list[str]:
    """The ``requested`` backends that are not available here (unknown or unavailable)."""
    available = registry.available_backends()
    return [b for b in requested if b not in available]
