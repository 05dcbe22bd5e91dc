"""NaN and infinity semantics of tuned plans: a plan the tuner happens to choose must not
decide whether production sees NaN.

Libraries differ from ONNX (the numpy reference) on non-finite inputs: oneDNN and OpenVINO
compute ``Relu(NaN) = 0``, their MaxPool and onnxruntime's skip NaN, OpenVINO's Softmax keeps
finite probabilities beside a NaN. A candidate that agrees with the reference on finite inputs
may therefore turn a NaN input into a plausible finite output. By default (strict) the tuner
also checks every candidate on inputs holding NaN, +Inf and -Inf (:func:`candidate_error`,
cached in the store like a measurement: :func:`check_measured`) and the winner of validation end
to end on such feeds (:func:`nonfinite_winner`): an output must be NaN, +Inf or -Inf exactly
where the reference's is. By default (``nonfinite_guard``) a winner that differs is *guarded*
instead of rejected: requests whose inputs hold NaN or Inf run a fallback plan that agrees
(:mod:`dispatch.guard`), all-finite requests the fast plan; the candidate checks are then not
needed for correctness and are skipped (the guarded plan is checked end to end). Without the
guard a candidate or plan that differs loses, with the reason. Only the explicit
objective option ``allow_nonstrict_nan`` (``opdispatch tune --allow-nonstrict-nan``) skips both
checks; the plan key's objective then ends in ``+nonstrict-nan``
(:attr:`dispatch.objective.Objective.nonstrict_nan`), so that such a plan is used only by a
Session that asks for that objective.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dispatch.executor import Executor
from dispatch.fusion import FusedNode
from dispatch.guard import has_nonfinite
from dispatch.plan import Plan
from dispatch.registry import STANDARD, Registry
from tuner.errors import TuningError
from tuner.measure import Measurement, _convert, _reference, random_input, reference_impl
from tuner.store.measurements import VERDICT_PREFIX

if TYPE_CHECKING:
    from dispatch.graph import Graph
    from tuner.candidates import Candidate
    from tuner.plan_candidate import PlanCandidate

#: what an error on non-finite inputs starts with (the candidate's or the plan's)
WRONG = "wrong result on NaN/Inf inputs"
#: at most this many elements of an input are made NaN, +Inf or -Inf
MAX_SPECIALS = 48
#: candidates covering more nodes than this (large regions) are not checked one by one
MAX_CHECKED_NODES = 16
#: how many reference computations on NaN/Inf inputs are kept for the next candidates of
#: the same nodes (a Conv has a dozen implementations: one reference serves them all)
REFERENCES_KEPT = 4
_REFERENCES: dict[tuple, tuple] = {}
_REFERENCES_LOCK = threading.Lock()


def special_values(arr: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A copy of the float array ``arr`` with NaN, +Inf and -Inf (in turn) at a few random
    positions (about one element in 32, at least one, at most :data:`MAX_SPECIALS`): sparse,
    so that most windows and rows of an operator hold one special value amid finite ones,
    where implementations that skip NaN or clamp infinities show it."""
    out = np.array(arr, copy=True)
    flat = out.reshape(-1)
    if flat.size == 0 or out.dtype.kind != "f":
        return out
    k = int(min(MAX_SPECIALS, max(1, flat.size // 32)))
    where = rng.choice(flat.size, size=k, replace=False)
    cycle = np.array([np.nan, np.inf, -np.inf], dtype=out.dtype)
    flat[where] = cycle[np.arange(k) % 3]
    return out


def nonfinite_difference(outs: Sequence[Any], refs: Sequence[Any]) -> str | None:
    """Where ``outs`` put NaN, +Inf or -Inf other than the reference ``refs`` does (float
    outputs; finite values are compared by the finite-input check, not here), else ``None``."""
    for k, (o, r) in enumerate(zip(outs, refs)):
        o, r = np.asarray(o), np.asarray(r)
        if o.dtype.kind not in "fc" or r.dtype.kind not in "fc":
            continue
        if o.shape != r.shape:
            return f"output {k}: shape {list(o.shape)} where the reference gives {list(r.shape)}"
        wrong = ((np.isnan(o) != np.isnan(r)) | (np.isposinf(o) != np.isposinf(r))
                 | (np.isneginf(o) != np.isneginf(r)))
        if wrong.any():
            at = tuple(int(i) for i in np.argwhere(wrong)[0])
            return (f"output {k}: {int(wrong.sum())} of {o.size} element(s) differ in NaN/Inf, "
                    f"e.g. at {list(at)}: {o[at].item()!r} where the reference gives "
                    f"{r[at].item()!r} "
                    f"(reference: {int(np.isnan(r).sum())} NaN, {int(np.isinf(r).sum())} Inf; "
                    f"here: {int(np.isnan(o).sum())} NaN, {int(np.isinf(o).sum())} Inf)")
    return None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Numpy's "invalid value" warnings are what these inputs are for."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def candidate_error(registry: Registry, cand: Candidate, seed: int = 0) -> str | None:
    """Why ``cand`` differs from the numpy reference on inputs holding NaN, +Inf and -Inf
    (its non-constant float inputs: :func:`special_values`), else ``None``. A candidate that
    fails on them differs; the reference implementation itself, a candidate without such an
    input, or one whose reference cannot run here are not judged (``None``)."""
    node = cand.node
    if not needs_check(registry, cand):
        return None
    with _quiet():
        try:
            std, refs = _reference_on_specials(registry, cand, seed)
        except Exception:  # no reference here: nothing to compare with
            return None
        try:
            # copies: the inputs are shared with the next candidates of these nodes
            ins = [None if a is None else _convert(registry, np.array(a), v, STANDARD, lay)
                   for v, a, lay in zip(node.inputs, std, cand.layouts_in)]
            out = cand.impl.build(node)(*ins)
            outs = list(out) if isinstance(out, tuple | list) else [out]
            got = [_convert(registry, np.asarray(o), v, lay, STANDARD)
                   for v, o, lay in zip(node.outputs, outs, cand.layouts_out)]
        except Exception as exc:  # failing on NaN/Inf is differing
            return f"failed: {type(exc).__name__}: {exc}"
    ops = [n.op_type for n in (node.nodes if isinstance(node, FusedNode) else [node])]
    shown = "+".join(ops) if len(ops) <= 4 else "+".join(ops[:3]) + f"+... ({len(ops)} nodes)"
    why = nonfinite_difference(got, refs)
    return None if why is None else f"{why} ({shown})"


def _reference_on_specials(registry: Registry, cand: Candidate, seed: int,
                           ) -> tuple[list[np.ndarray | None], list[np.ndarray]]:
    """``cand``'s standard-layout inputs holding NaN/Inf (:func:`special_values`) and the
    reference outputs on them. The implementations of one node (or one chain) share them: the
    last few are kept (:data:`_REFERENCES`, holding the registry and the nodes, so that the ids
    in their keys stay theirs)."""
    node = cand.node
    nodes = tuple(node.nodes) if isinstance(node, FusedNode) else (node,)
    key = (id(registry), tuple(id(n) for n in nodes),
           tuple(None if v is None else v.name for v in node.inputs), seed)
    with _REFERENCES_LOCK:
        hit = _REFERENCES.pop(key, None)
    if hit is None:
        rng = np.random.default_rng(seed + 7919)
        std: list[np.ndarray | None] = []
        for v in node.inputs:
            if v is None:
                std.append(None)
            elif v.is_const:
                std.append(np.asarray(v.const))
            else:
                arr = random_input(v, rng)
                std.append(special_values(arr, rng) if arr.dtype.kind == "f" else arr)
        hit = ((registry, nodes), std, _reference(registry, cand, std))
    with _REFERENCES_LOCK:
        _REFERENCES[key] = hit  # most recently used last
        while len(_REFERENCES) > REFERENCES_KEPT:
            del _REFERENCES[next(iter(_REFERENCES))]
    return hit[1], hit[2]


def needs_check(registry: Registry, cand: Candidate) -> bool:
    """Whether ``cand`` is judged on NaN/Inf inputs here: not the reference implementation
    itself, with a non-constant float input, and not a region of more than
    :data:`MAX_CHECKED_NODES` nodes (whose numpy reference would cost about as much as the
    whole model: the winner's end-to-end check covers those, :func:`nonfinite_winner`)."""
    if not cand.fused and reference_impl(registry, cand.node) is cand.impl:
        return False
    if isinstance(cand.node, FusedNode) and len(cand.node.nodes) > MAX_CHECKED_NODES:
        return False
    return any(v is not None and not v.is_const and v.dtype is not None
               and np.dtype(v.dtype).kind == "f" for v in cand.node.inputs)


def check_measured(registry: Registry, groups: Mapping[str, Sequence[Candidate]],
                   order: Sequence[str], measured: dict[str, Measurement], store: Any, hw: str,
                   sw: str, seed: int, deadline: float) -> None:
    """After the timings, in the measurement stage's time left: every candidate signature
    that passed the finite-input check (``measured``, taken in measurement ``order``) is
    checked on NaN/Inf inputs too (:func:`candidate_error`); one that differs gets a failed
    measurement saying where, and is never chosen. Verdicts are cached in the store's
    measurements table under :data:`VERDICT_PREFIX` + the signature (for this hardware and
    software) and reused as timings are, so a later run checks what this one had no time
    for. A check that would end past ``deadline`` (``time.monotonic()``; it costs a run of
    the candidate and one of the reference, estimated as two runs) is not started: the
    candidate stays usable unchecked, as the winner's end-to-end check on NaN/Inf feeds still
    guards the plan (:func:`nonfinite_winner`)."""
    for sig in order:
        m = measured.get(sig)
        cand = groups[sig][0]
        if m is None or not m.ok or not needs_check(registry, cand):
            continue
        key = VERDICT_PREFIX + sig
        hit = store.get_measurement(key, cand.impl.name, hw, sw)
        if hit is not None:
            error = hit.error
        elif time.monotonic() + 2 * m.median_s > deadline:
            continue
        else:
            error = candidate_error(registry, cand, seed)
            store.put_measurement(key, cand.impl.name, hw, sw, median_s=0.0, spread_s=0.0,
                                  samples=1, error=error)
        if error is not None:
            measured[sig] = Measurement(float("inf"), 0.0, 0, f"{WRONG}: {error}")


def special_feeds(graph: Graph, seed: int) -> dict[str, np.ndarray]:
    """Random feeds for ``graph`` with NaN, +Inf and -Inf in its float inputs."""
    rng = np.random.default_rng(seed + 104729)
    return {v.name: special_values(random_input(v, rng), rng) for v in graph.inputs}


def plan_error(graph: Graph, registry: Registry, plan: Plan,
               feeds: Mapping[str, np.ndarray], reference: Sequence[np.ndarray]) -> str | None:
    """Why ``plan`` run on ``feeds`` (holding NaN/Inf) puts NaN or infinities elsewhere than
    the ``reference`` outputs on the same feeds, else ``None``."""
    try:
        with _quiet():
            outs = Executor(graph, plan, registry).run(dict(feeds))
    except Exception as exc:  # failing on NaN/Inf is differing
        return f"{WRONG}: failed: {type(exc).__name__}: {exc}"
    why = nonfinite_difference(outs, reference)
    return None if why is None else f"{WRONG}: {why}"


def guarded_plan(plan: Plan, fallback: Plan, label: str) -> Plan:
    """``plan`` with the non-finite guard: requests holding NaN or Inf run ``fallback`` (a
    copy of it, its steps without their rejected candidates, its provenance naming
    ``label``), every other request ``plan`` (:mod:`dispatch.guard`)."""
    fb = Plan(graph=fallback.graph,
              steps=[dataclasses.replace(s, rejected=[]) for s in fallback.steps],
              conversions=list(fallback.conversions),
              provenance={k: v for k, v in fallback.provenance.items()
                          if k not in ("validated", "winner")} | {"label": label},
              version=fallback.version)
    return dataclasses.replace(plan, provenance=dict(plan.provenance, nonfinite_guard={
        "fallback": label}), nonfinite_fallback=fb)


def guard_cost_s(graph: Graph, seed: int, repeats: int = 20) -> float:
    """What the guard's check costs per run on ``graph``'s inputs (seconds, the best of
    ``repeats``; feeds of the validation's kind, all finite: the whole check runs)."""
    from tuner.validate import _random_feeds

    feeds = _random_feeds(graph, seed)
    names = [v.name for v in graph.inputs if v.dtype is not None and np.dtype(v.dtype).kind in "fc"]
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        has_nonfinite(feeds, names)
        best = min(best, time.perf_counter() - t0)
    return 0.0 if not names else best


def nonfinite_winner(graph: Graph, registry: Registry, plans: Sequence[PlanCandidate],
                     reference_plan: Plan, opts: Any,
                     choose: Callable[[Sequence[PlanCandidate], Any], PlanCandidate],
                     ) -> tuple[PlanCandidate, str]:
    """The winner ``choose(plans, opts)`` picks among the validated ``plans``, run end to end
    on feeds holding NaN and infinities (:func:`special_feeds`) against ``reference_plan``.

    With the guard (``opts.nonfinite_guard``, the default), a winner that differs there keeps
    winning as a *guarded* plan (:func:`guarded_plan`): its fallback is the plan ``choose``
    would pick among the others that agree (checked the same way, only as many as needed), or
    ``reference_plan`` when none does; the guarded plan is then checked end to end on those
    feeds (it must agree, else it is rejected), and the guard's measured cost
    (:func:`guard_cost_s`) is added to its latency before the choice is made again, so the
    guard is paid for in the comparison. Without the guard, a winner that differs gets its
    error and the next winner is picked, until one agrees. With ``opts.allow_nonstrict_nan``
    nothing is checked. Returns the winner and one line for the tuning summary saying what
    was done."""
    if getattr(opts, "allow_nonstrict_nan", False):
        return choose(plans, opts), ("not checked (--allow-nonstrict-nan): the plan may give "
                                     "finite outputs where the reference gives NaN or Inf")
    feeds = special_feeds(graph, opts.seed)
    reference = None
    if any(np.asarray(a).dtype.kind == "f" for a in feeds.values()):
        try:
            with _quiet():
                reference = Executor(graph, reference_plan, registry).run(dict(feeds))
        except Exception:  # no reference on these feeds: nothing to compare with
            reference = None
    if reference is None:
        return choose(plans, opts), "no float input: nothing to check on NaN/Inf inputs"
    use_guard = getattr(opts, "nonfinite_guard", True)
    verdicts: dict[int, str | None] = {}

    def differs(pc: PlanCandidate) -> str | None:
        if id(pc) not in verdicts:
            verdicts[id(pc)] = plan_error(graph, registry, pc.plan, feeds, reference)
        return verdicts[id(pc)]

    def fallback_for(win: PlanCandidate) -> tuple[Plan, str]:
        others = [pc for pc in plans if pc is not win and pc.error is None]
        while others:
            try:
                pick = choose(others, opts)
            except TuningError:
                break
            if differs(pick) is None:
                return pick.plan, pick.label
            others.remove(pick)
        return reference_plan, "the numpy reference"

    rejected: list[str] = []
    guarded: dict[int, str] = {}
    cost_s: float | None = None
    while True:
        try:
            win = choose(plans, opts)
        except TuningError as exc:
            if not rejected:
                raise
            raise TuningError(f"{exc} (--allow-nonstrict-nan accepts plans that differ on "
                              f"NaN/Inf inputs)") from None
        if id(win) in guarded:
            break  # still the winner with the guard's cost counted
        why = differs(win)
        if why is None:
            break
        if use_guard:
            fallback, label = fallback_for(win)
            plan = guarded_plan(win.plan, fallback, label)
            still = plan_error(graph, registry, plan, feeds, reference)
            if still is None:
                if cost_s is None:
                    cost_s = guard_cost_s(graph, opts.seed)
                plan.provenance["nonfinite_guard"]["check_us"] = round(cost_s * 1e6, 1)
                win.plan, guarded[id(win)] = plan, label
                if win.latency_ms is not None:
                    win.latency_ms += cost_s * 1e3
                continue
            why = f"{why}; guarded by {label}: {still}"
        win.error = why
        rejected.append(win.label)
    what = ("the winner checked against the reference on inputs with NaN and +-Inf"
            if use_guard else
            "candidates and the winner checked against the reference on inputs with NaN and +-Inf")
    if id(win) in guarded:
        what += (f"; {win.label}, guarded: NaN/Inf inputs run {guarded[id(win)]} (the guard's "
                 f"check: {cost_s * 1e6:.0f} us per run, counted in its latency)")
    if rejected:
        what += f"; rejected for differing there: {', '.join(rejected)}"
    return win, what
