"""What the accuracy stage measures of each (block, variant) and how it chooses among them:
the :class:`Trial` records, the per-call timings and recorded inputs of an executor's plan
steps, and the knapsack over blocks (:func:`choose`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dispatch.executor import Executor
from dispatch.plan import PlanStep
from dispatch.registry import Implementation
from tuner.accuracy.data import Feeds

#: runs whose per-call median gives a block's time
TIMING_RUNS = 5
#: steps of the allowance in the knapsack over blocks (:func:`choose`)
ERROR_STEPS = 1000


@dataclass
class Trial:
    """One block in one variant, measured alone in the library's float32 plan."""

    library: str
    block: int
    nodes: int
    impl: str
    precision: str
    ms_float32: float
    ms: float | None = None
    error: float | None = None
    note: str = ""


def variant_name(impl: Implementation) -> str:
    """How a reduced variant is named in labels: its registration's variant (``compiled_bf16``,
    ``session_int8_static``, ...)."""
    return impl.name.rsplit(".", 1)[-1]


def outputs(ex: Executor, samples: Sequence[Feeds]) -> list[list[np.ndarray]]:
    """``ex``'s outputs for each sample (copies)."""
    return [[np.array(o, copy=True) for o in ex.run(feeds)] for feeds in samples]


def call_times(ex: Executor, feeds: Feeds, steps: Sequence[PlanStep], runs: int = TIMING_RUNS) -> list[float]:
    """The median time in milliseconds of each of ``steps`` (kernel calls of ``ex``) over
    ``runs`` runs of the whole plan on ``feeds`` (after one untimed run)."""
    index = {id(c.step): k for k, c in enumerate(ex.calls) if c.kind == "kernel"}
    ex.run(feeds)
    samples: list[list[float]] = []
    for _ in range(max(1, runs)):
        timings: list[float] = []
        ex.run(feeds, timings=timings)
        samples.append(timings)
    return [float(np.median([t[index[id(s)]] for t in samples])) * 1e3 for s in steps]


def record_inputs(ex: Executor, steps: Sequence[PlanStep], samples: Sequence[Feeds]) -> list[list[tuple]]:
    """The inputs each of ``steps`` (kernel calls of ``ex``) reads, per sample: what a
    calibrated variant (static int8) is calibrated on."""
    seen: list[list[tuple]] = [[] for _ in steps]
    originals = []
    for k, step in enumerate(steps):
        def recorder(*arrays: np.ndarray, _k: int = k) -> Any:
            seen[_k].append(tuple(np.array(a, copy=True) for a in arrays))
            return originals[_k](*arrays)
        originals.append(ex.swap_kernel(step, recorder))
    try:
        for feeds in samples:
            ex.run(feeds)
    finally:
        for step, fn in zip(steps, originals):
            ex.swap_kernel(step, fn)
    return seen


def choose(options: Sequence[Sequence[tuple[float, float, Any]]], allowance: float) -> list[Any]:
    """The cheapest choice of one option ``(ms, error, tag)`` per block whose errors sum to at
    most ``allowance`` (each block's first option must be its float32 one, error 0): an exact
    knapsack over blocks with the allowance in :data:`ERROR_STEPS` steps (an error is
    rounded up, so the sum never exceeds it). Returns the chosen tags."""
    unit = allowance / ERROR_STEPS if allowance > 0 else 0.0
    cap = ERROR_STEPS if unit > 0 else 0

    def steps_of(err: float) -> int | None:
        if err <= 0:
            return 0
        if unit <= 0:
            return None
        need = int(np.ceil(err / unit - 1e-9))
        return need if need <= cap else None

    best: dict[int, tuple[float, list[Any]]] = {0: (0.0, [])}
    for opts in options:
        nxt: dict[int, tuple[float, list[Any]]] = {}
        for used, (ms_sum, tags) in best.items():
            for ms, err, tag in opts:
                need = steps_of(err)
                if need is None or used + need > cap:
                    continue
                total = ms_sum + ms
                key = used + need
                if key not in nxt or total < nxt[key][0]:
                    nxt[key] = (total, [*tags, tag])
        best = nxt
    return min(best.values(), key=lambda t: t[0])[1]
