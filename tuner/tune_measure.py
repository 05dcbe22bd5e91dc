"""The tuner's measurement stage: every distinct candidate signature measured once (or reused
from the store's measurements table for this hardware and software), the untuned plans'
candidates first and the rest until the stage's deadline (:func:`_measure_all`), and the cost
of every layout conversion a plan could need, estimated from the run's bandwidth once the
budget is spent (:func:`_conversion_costs`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dispatch.errors import OpDispatchError
from dispatch.graph import Graph
from dispatch.registry import STANDARD, Registry
from tuner.candidates import Candidate, CandidateSet
from tuner.measure import Measurement, measure_candidate, measure_conversion
from tuner.nonfinite import check_measured
from tuner.store import PlanStore
from tuner.tune_types import TuneOptions


def _progress(total: int, desc: str, enabled: bool) -> contextlib.AbstractContextManager[Any]:
    if not enabled:
        return contextlib.nullcontext(None)
    from tqdm import tqdm

    # no ETA: the rate times the candidates left ignores the budget, which ends measuring
    # first; the postfix says how much of the budget is left instead
    return tqdm(total=total, desc=desc, unit="cand", file=sys.stderr, leave=False,
                bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} "
                           "[{elapsed}{postfix}]",
                disable=not sys.stderr.isatty() and not os.environ.get("OPDISPATCH_PROGRESS"))


@dataclass
class _Measurements:
    by_signature: dict[str, Measurement] = field(default_factory=dict)
    measured: int = 0
    reused: int = 0
    skipped: list[str] = field(default_factory=list)


def _measure_all(
    registry: Registry,
    cands: CandidateSet,
    first: set[str],
    store: PlanStore,
    hw: str,
    sw: str,
    opts: TuneOptions,
    deadline: float,
    captured: dict[str, np.ndarray] | None = None,
) -> _Measurements:
    """Measure each distinct candidate signature once (or reuse the store's figure); those
    over dynamic values run on ``captured`` (:func:`tuner.measure.capture_values`)."""
    out = _Measurements()
    groups = cands.signatures()
    order = sorted(groups, key=lambda sig: (
        0 if any(c.id in first for c in groups[sig]) else 1,
        -max(c.impl.priority for c in groups[sig]),
    ))
    with _progress(len(order), "measuring", opts.progress) as bar:
        for sig in order:
            cand = groups[sig][0]
            if bar is not None:
                bar.set_postfix_str(f"budget left {max(0.0, deadline - time.monotonic()):.0f} s, "
                                    f"{cand.impl.name[:40]}")
            hit = store.get_measurement(sig, cand.impl.name, hw, sw)
            if hit is not None:
                out.by_signature[sig] = Measurement(hit.median_s, hit.spread_s, hit.samples, hit.error)
                out.reused += 1
            elif time.monotonic() > deadline:
                out.skipped.append(sig)
            else:
                m = measure_candidate(
                    registry, cand, seed=opts.seed, time_cap_s=opts.per_candidate_cap_s,
                    ci_target=opts.ci_target, captured=captured,
                )
                store.put_measurement(sig, cand.impl.name, hw, sw, median_s=m.median_s,
                                      spread_s=m.spread_s, samples=m.samples, error=m.error)
                out.by_signature[sig] = m
                out.measured += 1
            if bar is not None:
                bar.update(1)
    # and on NaN/Inf inputs, in the stage's time left, when a candidate that differs there
    # must lose: with the non-finite guard the winner is checked (and guarded) end to end
    if not opts.allow_nonstrict_nan and not opts.nonfinite_guard:
        check_measured(registry, groups, order, out.by_signature, store, hw, sw, opts.seed,
                       deadline)
    return out


def _conversion_costs(
    registry: Registry,
    graph: Graph,
    cands: Sequence[Candidate],
    store: PlanStore,
    hw: str,
    sw: str,
    opts: TuneOptions,
    deadline: float,
    estimated: list[str],
) -> tuple[dict[tuple[str, str, str], float | None], int]:
    """Measured cost of every conversion a plan could need: for each tensor, from each layout
    a candidate can produce it in, to each layout a candidate wants it in. Past ``deadline``
    the conversions not yet measured are estimated from the bandwidth of those measured
    (their signatures are appended to ``estimated``; estimates are never stored)."""
    produced: dict[str, set[str]] = {v.name: {STANDARD} for v in graph.inputs}
    wanted: dict[str, set[str]] = {v.name: {STANDARD} for v in graph.outputs}
    for c in cands:
        for v, lay in zip(c.node.inputs, c.layouts_in):
            if v is not None and not v.is_const:
                wanted.setdefault(v.name, set()).add(lay)
        for v, lay in zip(c.node.outputs, c.layouts_out):
            produced.setdefault(v.name, set()).add(lay)
    costs: dict[tuple[str, str, str], float | None] = {}
    by_shape: dict[tuple, float | None] = {}
    measured = 0
    per_byte: list[float] = []  # seconds per byte of the conversions measured or reused
    for name, srcs in produced.items():
        v = graph.value(name)
        if v.shape is None:  # dynamic values are held in the standard layout only
            continue
        for src in srcs:
            for dst in wanted.get(name, ()):
                if src == dst:
                    continue
                key = (tuple(v.shape), np.dtype(v.dtype).str, src, dst)
                if key not in by_shape:
                    try:
                        chain = registry.layouts.path(src, dst, v.shape, v.dtype)
                    except OpDispatchError:
                        by_shape[key] = None
                    else:
                        sig = f"convert:{src}->{dst}:{'x'.join(map(str, v.shape))}:{key[1]}"
                        label = " > ".join(c.name for c in chain)
                        hit = store.get_measurement(sig, label, hw, sw)
                        if hit is None and time.monotonic() > deadline and per_byte:
                            # budget spent: estimate from this run's bandwidth (not stored)
                            by_shape[key] = float(np.median(per_byte)) * v.nbytes * max(1, len(chain))
                            estimated.append(sig)
                        elif hit is None:
                            m = measure_conversion(registry, chain, v.shape, v.dtype, seed=opts.seed,
                                                   time_cap_s=opts.per_candidate_cap_s,
                                                   ci_target=opts.ci_target)
                            store.put_measurement(sig, label, hw, sw, median_s=m.median_s,
                                                  spread_s=m.spread_s, samples=m.samples, error=m.error)
                            measured += 1
                            by_shape[key] = m.median_s if m.ok else None
                        else:
                            by_shape[key] = hit.median_s if hit.error is None else None
                        if by_shape[key] is not None and v.nbytes and sig not in estimated:
                            per_byte.append(by_shape[key] / (v.nbytes * max(1, len(chain))))
                costs[(name, src, dst)] = by_shape[key]
    return costs, measured
