"""Tuning a decoder's generation: the step way of the prompt and of the token steps.

Every available step way (:mod:`dispatch.generation.ways`; onnxruntime with IO binding or plain
``run``, OpenVINO stateful or on shared tensors), on every core and, on a machine of several,
on one, is built once and measured in turn (one way's generator alive at a time, its threads
gone before the next is built: production runs one way per process):

* its greedy tokens over the first :data:`CHECK_TOKENS` steps after the prompt must equal the
  reference's (onnxruntime's plain ``run``, the loop users start from); a way that differs in
  float32, or fails, is rejected with the reason;
* the prompt: the median time of a prefill of the user's prompt length;
* the token steps: the mean time of a step over a generation of the user's number of new
  tokens (the past growing as in production), the median over rounds.

The prompt's winner and the steps' winner may differ: both then share one key/value cache
(:class:`~dispatch.generation.plan.GenerationPlan`), which needs both ways to write their
presents into the generation's buffers (``binds_cache``), and a plan on two ways must save
more than :data:`SPLIT_COST` of the whole generation's time over the best single way (two
libraries in one process disturb each other's thread pools). The plan is stored under the
model file's content digest, the machine and the libraries' versions, and
:func:`stored_generation_plan` finds it.

With an accuracy budget (``accuracy="tokens:0.95"``, :mod:`tuner.generation.precision`), the
weight-reduced variants of the model (int8, 4-bit: :mod:`dispatch.generation.weights`) are
candidates too: each variant's accuracy against float32 is measured first on the user's prompts
(a variant over the budget is rejected with its figure, never timed), then every step way of
each variant within budget is measured as above (its greedy tokens checked against onnxruntime's
plain run of the same variant). A plan runs one precision in both phases; the fastest plan of
any precision wins (float32 stays when every variant is over budget), and the plan records the
variant's recipe so a process whose variant cache is empty makes the file again. The plan is
stored under the objective ``latency+accuracy=METRIC:BUDGET,data=DIGEST`` (DIGEST: the prompts
measured on), apart from the float32 plan (``latency``).
"""

from __future__ import annotations

import gc
import hashlib
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dispatch.generation.plan import GenerationPlan, StepChoice
from dispatch.plan import Plan
from tuner.fingerprint import GENERATE_PREFIX, PlanKey, hardware_fingerprint, software_fingerprint
from tuner.tune_types import TuningError

#: greedy tokens after the prompt every way must reproduce
CHECK_TOKENS = 16
#: how much faster (over the whole generation) a plan on two ways must be than the best
#: single way to be kept
SPLIT_COST = 0.05
#: the pause after a way is dropped, before the next is built (its threads stop)
SETTLE_S = 0.2
#: the reference way, when available
REFERENCE_WAY = "onnxruntime"
#: rounds of each measurement at least / at most
MIN_ROUNDS, MAX_ROUNDS = 2, 9


@dataclass
class Candidate:
    """One step way at one thread count, and its figures."""

    way: str
    threads: int | None
    binds_cache: bool
    prefill_ms: list[float] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    build_s: float = 0.0
    rejected: str | None = None
    #: ``float32`` or the variant's recipe spec
    precision: str = "float32"

    @property
    def label(self) -> str:
        way = StepChoice(self.way, self.threads).label()
        return way if self.precision == "float32" else f"{self.precision}: {way}"

    @property
    def choice(self) -> StepChoice:
        return StepChoice(self.way, self.threads)

    def prefill(self) -> float:
        return statistics.median(self.prefill_ms)

    def step(self) -> float:
        return statistics.median(self.step_ms)

    def figures(self) -> dict[str, Any]:
        if self.rejected is not None:
            return {"rejected": self.rejected}
        return {"prefill_ms": round(self.prefill(), 4), "step_ms": round(self.step(), 5),
                "tokens_per_s": round(1e3 / self.step(), 2), "rounds": len(self.step_ms),
                "build_s": round(self.build_s, 3), "binds_cache": self.binds_cache}


@dataclass
class GenerateTuneResult:
    """What :func:`tune_generate` found and stored."""

    plan: Plan
    generation: GenerationPlan
    key: PlanKey
    plan_id: int | None
    candidates: list[Candidate]
    store_error: str | None = None

    def summary(self) -> str:
        stored = (f"stored (id {self.plan_id})" if self.plan_id is not None
                  else f"NOT stored ({self.store_error})")
        return f"generation plan {self.key.digest()[:16]} {stored}\n" + self.generation.describe()


def model_digest(path: str) -> str:
    """sha256 of the model file's bytes (a generation plan's model key)."""
    h = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def generation_key(path: str, registry: Any, backends: Sequence[str],
                   objective: str = "latency", digest: str | None = None) -> PlanKey:
    """The key a generation plan of the model at ``path`` (of content ``digest`` when known) is
    stored under, for ``objective`` (:func:`generation_objective`)."""
    digest = digest or model_digest(path)
    return PlanKey(model=digest, inputs=GENERATE_PREFIX.strip(), hardware=hardware_fingerprint(),
                   software=software_fingerprint(registry, backends), objective=objective,
                   family=digest)


def generation_objective(accuracy: str | None, prompts: Sequence[np.ndarray] | None = None,
                         ) -> str:
    """The objective of a generation plan's key: ``latency`` in float32, else
    ``latency+accuracy=METRIC:BUDGET,data=DIGEST`` with DIGEST naming the prompts the variants
    were measured on (:func:`~tuner.generation.precision.prompts_digest`)."""
    if accuracy is None:
        return "latency"
    from dispatch.objective import AccuracyTarget, Objective
    from tuner.generation.precision import GenerationAccuracy, prompts_digest

    target = GenerationAccuracy.parse(accuracy)
    data = prompts_digest(prompts or [])
    return str(Objective("latency", accuracy=AccuracyTarget(target.metric, target.budget, data)))


def _prompt(vocab: int, length: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, size=length, dtype=np.int64)


def _measure(cand: Candidate, make: Callable[[], Any], prompt: np.ndarray, new_tokens: int,
             want: np.ndarray | None, seconds: float) -> np.ndarray | None:
    """Build ``cand``'s generator, check its greedy tokens against ``want`` and time its prompt
    and steps in rounds within about ``seconds``; returns its check tokens."""
    t0 = time.perf_counter()
    try:
        gen = make()
    except Exception as exc:  # a library that cannot compile the model is left out
        cand.rejected = f"not built: {type(exc).__name__}: {str(exc)[:300]}"
        return None
    cand.build_s = time.perf_counter() - t0
    try:
        check = gen.generate(prompt, CHECK_TOKENS)
        if want is not None and not np.array_equal(check, want):
            first = int(np.argmax(check != want))
            cand.rejected = (f"greedy tokens differ from the reference's at step {first + 1} of "
                             f"{CHECK_TOKENS} (got {check[first]}, the reference {want[first]})")
            return check
        deadline = time.perf_counter() + seconds
        while len(cand.step_ms) < MAX_ROUNDS and (len(cand.step_ms) < MIN_ROUNDS
                                                   or time.perf_counter() < deadline):
            t = time.perf_counter()
            logits = gen.prefill(prompt)
            cand.prefill_ms.append((time.perf_counter() - t) * 1e3)
            token = np.array([int(np.argmax(logits[0, -1]))])
            spent = 0.0
            for _ in range(new_tokens - 1):
                t = time.perf_counter()
                logits = gen.step(token)
                spent += time.perf_counter() - t
                token[0] = int(np.argmax(logits[0, -1]))
            cand.step_ms.append(spent * 1e3 / max(1, new_tokens - 1))
        return check
    except Exception as exc:
        cand.rejected = f"{type(exc).__name__}: {str(exc)[:300]}"
        return None
    finally:
        del gen
        gc.collect()
        time.sleep(SETTLE_S)


def choose(candidates: Sequence[Candidate], prompt_len: int, new_tokens: int) -> GenerationPlan:
    """The plan of the measured ``candidates`` (see the module docstring)."""
    ok = [c for c in candidates if c.rejected is None]
    if not ok:
        raise TuningError("no step way generated the reference's tokens: " + "; ".join(
            f"{c.label}: {c.rejected}" for c in candidates))

    def total(p: Candidate, d: Candidate) -> float:
        return p.prefill() + (new_tokens - 1) * d.step()

    single = min(ok, key=lambda c: total(c, c))
    best = (total(single, single), single, single)
    bound = [c for c in ok if c.binds_cache]
    for p in bound:
        for d in bound:
            if p is not d and total(p, d) < best[0] * (1 - SPLIT_COST):
                best = min(best, (total(p, d), p, d), key=lambda b: b[0])
    _, pre, dec = best

    def margin(phase: str, won: Candidate) -> str:
        figure = (lambda c: c.prefill()) if phase == "prefill" else (lambda c: c.step())
        rest = sorted((figure(c), c.label) for c in ok if c is not won)
        unit = "ms for the prompt" if phase == "prefill" else "ms per token"
        text = f"{figure(won):.3f} {unit}"
        if rest:
            text += f"; next {rest[0][1]} {rest[0][0]:.3f} ({rest[0][0] / figure(won):.2f}x)"
        return text

    why = {"prefill": margin("prefill", pre), "decode": margin("decode", dec)}
    if pre is dec:
        why["single"] = (f"one way for both: {pre.label} takes {best[0]:.1f} ms for a {prompt_len}-token "
                         f"prompt and {new_tokens} new tokens")
    else:
        why["split"] = (f"prompt on {pre.label}, steps on {dec.label}: {best[0]:.1f} ms against "
                        f"{total(single, single):.1f} ms on {single.label} alone")
    return GenerationPlan(pre.choice, dec.choice, why, {c.label: c.figures() for c in candidates},
                          {"prompt_len": prompt_len, "new_tokens": new_tokens})


def choose_precision(candidates: Sequence[Candidate], prompt_len: int, new_tokens: int,
                     ) -> GenerationPlan:
    """The fastest plan of any precision: :func:`choose` within each precision's candidates,
    the least time of a whole generation (prompt and ``new_tokens`` steps) between them. The
    plan's ``measured`` holds every candidate of every precision."""
    groups: dict[str, list[Candidate]] = {}
    for c in candidates:
        groups.setdefault(c.precision, []).append(c)
    best: tuple[float, GenerationPlan] | None = None
    totals: dict[str, float] = {}
    for precision, group in groups.items():
        if all(c.rejected is not None for c in group):
            continue
        plan = choose(group, prompt_len, new_tokens)
        by_choice = {c.choice: c for c in group if c.rejected is None}
        total = by_choice[plan.prefill].prefill() + (new_tokens - 1) * by_choice[plan.decode].step()
        totals[precision] = total
        plan.precision = precision
        if best is None or total < best[0]:
            best = (total, plan)
    if best is None:
        raise TuningError("no step way generated the reference's tokens: " + "; ".join(
            f"{c.label}: {c.rejected}" for c in candidates))
    plan = best[1]
    plan.measured = {c.label: c.figures() for c in candidates}
    if len(totals) > 1:
        plan.why["precision"] = f"{plan.precision}: " + ", ".join(
            f"{p} {t:.1f} ms" for p, t in sorted(totals.items(), key=lambda kv: kv[1])) + \
            " for the whole generation"
    return plan


def _accuracy_checks(path: str, digest: str, io: Any, ways: dict[str, Any], accuracy: str,
                     prompts: Sequence[np.ndarray], steps: int, recipes: Sequence[Any] | None,
                     variant_folder: Any, say: Callable[[str], None]) -> list[Any]:
    """float32's reference runs on ``prompts`` and every recipe's variant checked against them
    (:func:`tuner.generation.precision.check_variants`)."""
    from dispatch.generation.generate import Generator
    from tuner.generation.precision import (
        GenerationAccuracy,
        check_variants,
        default_recipes,
        reference_runs,
    )

    target = GenerationAccuracy.parse(accuracy)
    way = ways.get("onnxruntime-iobinding") or ways.get(REFERENCE_WAY) or next(iter(ways.values()))
    capacity = max(len(p) for p in prompts) + steps
    ref_gen = Generator(path, way, max_length=capacity, io=io)
    t0 = time.perf_counter()
    references = reference_runs(ref_gen, prompts, steps)
    del ref_gen
    gc.collect()
    say(f"accuracy budget {target.spec}: float32's greedy tokens on {len(prompts)} prompt(s), "
        f"{steps} steps each ({time.perf_counter() - t0:.1f} s, {way.name}); variants:")
    return check_variants(path, digest, list(recipes) if recipes is not None else default_recipes(),
                          references, target,
                          lambda p: Generator(p, way, max_length=capacity),
                          folder=variant_folder, log=say)


def tune_generate(model: str | os.PathLike, *, prompt_len: int = 32, new_tokens: int = 128,
                  budget_s: float = 120.0, store: Any = None, backends: Sequence[str] | None = None,
                  config: Any = None, registry: Any = None,
                  log: Callable[[str], None] | None = None, accuracy: str | None = None,
                  prompts: Sequence[np.ndarray] | None = None, accuracy_steps: int | None = None,
                  recipes: Sequence[Any] | None = None,
                  variant_folder: Any = None) -> GenerateTuneResult:
    """Measure every step way on the decoder at ``model`` for a ``prompt_len``-token prompt and
    ``new_tokens`` new tokens within about ``budget_s`` and store the generation plan (see the
    module docstring). With ``accuracy`` (``tokens:0.95``, ``prefix:0.5``, ``cosine:0.99``), the
    weight-reduced variants of ``recipes`` (default
    :func:`~tuner.generation.precision.default_recipes`) are candidates too, their accuracy
    measured on ``prompts`` (token id arrays; default seeded random ones of ``prompt_len``) over
    ``accuracy_steps`` steps (default ``new_tokens``) before any timing, which the budget does
    not bound; variants are cached in ``variant_folder``."""
    from dispatch.backend import load_registry
    from dispatch.config import Config
    from dispatch.generation.decoder_io import read_decoder
    from dispatch.generation.generate import Generator
    from dispatch.generation.step_ways import usable_cores
    from dispatch.generation.ways import available_step_ways
    from dispatch.plan_policy import plan_backends
    from tuner.generation.bandwidth import bound_tokens_per_s, bytes_per_token, stream_bandwidth
    from tuner.generation.precision import random_prompts
    from tuner.store import PlanStore
    from tuner.store.guarded import GuardedStore

    t_start = time.monotonic()
    say = log or (lambda _msg: None)
    if prompt_len < 1 or new_tokens < 2:
        raise TuningError(f"a generation is tuned for a prompt of at least 1 token and at least 2 "
                          f"new tokens, received a prompt of {prompt_len} and {new_tokens} new")
    path = os.fspath(model)
    io = read_decoder(path)
    digest = model_digest(path)
    config = config or Config.load()
    registry = registry or load_registry(config.plugin_path or None, order=config.backend_order)
    backends = plan_backends(registry, config.backend_order, list(backends) if backends else None)
    ways = available_step_ways(registry, backends)
    if not ways:
        raise TuningError("no step way is available: generation needs onnxruntime or openvino "
                          "(pip install 'opdispatch[onnxruntime]')")
    steps = accuracy_steps or new_tokens
    if accuracy is not None:
        prompts = [np.asarray(p, dtype=np.int64).reshape(-1) for p in prompts] if prompts \
            else random_prompts(io.vocab, prompt_len)
    objective = generation_objective(accuracy, prompts)  # checks the budget's spelling first
    checks = [] if accuracy is None else _accuracy_checks(
        path, digest, io, ways, accuracy, prompts or [], steps, recipes, variant_folder, say)
    files = {"float32": (path, io)}
    files.update((c.label, (c.path, read_decoder(c.path))) for c in checks if c.rejected is None)
    cores = usable_cores()
    threads: list[int | None] = [None] + ([1] if cores > 1 else [])
    candidates = [Candidate(w.name, t, w.binds_cache, precision=p) for p in files
                  for w in ways.values() for t in threads]
    order = sorted(candidates, key=lambda c: (c.precision != "float32", c.precision,
                                              c.way != REFERENCE_WAY, c.threads is not None))
    prompt = _prompt(io.vocab, prompt_len)
    capacity = prompt_len + max(new_tokens, CHECK_TOKENS)
    say(f"tuning generation of {path}: {len(candidates)} candidate(s) "
        f"({', '.join(c.label for c in order)}), prompt {prompt_len} tokens, {new_tokens} new, "
        f"budget {budget_s:.0f} s")
    want: dict[str, np.ndarray] = {}
    t_timing = time.monotonic()  # the budget bounds the timing (the accuracy checks come before)
    for k, cand in enumerate(order):
        left = budget_s - (time.monotonic() - t_timing)
        share = max(1.0, 0.9 * left / (len(order) - k))
        file, file_io = files[cand.precision]
        got = _measure(cand, lambda c=cand, f=file, i=file_io: Generator(
            f, ways[c.way], max_length=capacity, threads=c.threads, io=i),
            prompt, new_tokens, want.get(cand.precision), share)
        if cand.precision not in want and cand.rejected is None and got is not None:
            want[cand.precision] = got  # the precision's reference (onnxruntime's plain run first)
        say(f"  {cand.label}: " + (f"rejected: {cand.rejected}" if cand.rejected else
                                   f"prompt {cand.prefill():.2f} ms, step {cand.step():.3f} ms "
                                   f"({1e3 / cand.step():.1f} tokens/s)"))
    generation = choose_precision(candidates, prompt_len, new_tokens)
    for check in checks:
        generation.measured[f"weights {check.label}"] = check.figures()
        if check.label == generation.precision and check.accuracy is not None:
            generation.recipe = check.recipe.to_dict()
            generation.accuracy = {**check.accuracy.to_dict(), "budget": accuracy,
                                   "describe": check.accuracy.describe()}
    if checks:
        over = [f"{c.label}: {c.rejected}" for c in checks if c.rejected is not None]
        generation.notes.update({"accuracy": accuracy, "accuracy_steps": steps,
                                 "accuracy_prompts": len(prompts or []),
                                 "variants_rejected": over})
        if generation.recipe is None:
            generation.why["precision"] = ("float32: " + ("; ".join(over) if len(over) == len(checks)
                                                          else "faster than every variant within "
                                                               "budget"))
    winner = files[generation.precision][0]
    weights = bytes_per_token(winner)
    bandwidth = stream_bandwidth()
    bound = bound_tokens_per_s(bandwidth, weights)
    generation.notes.update({
        "reference": order[0].label, "budget_s": budget_s, "check_tokens": CHECK_TOKENS,
        "weights_bytes_per_token": weights.per_token, "bandwidth": bandwidth.describe(),
        "bound_tokens_per_s": round(bound, 2), "cores": cores, "source_digest": digest})
    plan = Plan(f"generation of {os.path.basename(path)}", [], [], provenance={
        "tuned_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "label": "generation plan"},
        generation=generation.to_dict())
    step_backends = sorted({w.backend for w in ways.values()})
    key = generation_key(path, registry, step_backends, objective, digest=digest)
    opened = not isinstance(store, PlanStore)
    plans = PlanStore(store or config.store_path) if opened else store
    guarded = GuardedStore(plans)
    try:
        run_id = guarded.start_run(model_fp=key.model, budget_s=budget_s, objective=key.objective)
        plan_id = guarded.put_plan(key, plan.to_json(), latency_ms=None, run_id=run_id,
                                   notes={"generation": f"prompt {prompt_len}, {new_tokens} new",
                                          "precision": generation.precision})
        guarded.finish_run(run_id, "finished", {"tuning_s": round(time.monotonic() - t_start, 3)})
    finally:
        if opened:
            plans.close()
    return GenerateTuneResult(plan, generation, key, plan_id, candidates, guarded.error)


def stored_generation_plan(path: str, store: Any, registry: Any, objective: str = "latency",
                           ) -> tuple[GenerationPlan | None, str]:
    """The generation plan stored for the model at ``path`` on this machine with these
    libraries for ``objective`` (:func:`generation_objective`), and a note: where it came from,
    or why none is used."""
    from dispatch.generation.ways import available_step_ways
    from tuner.store import PlanStore

    ways = available_step_ways(registry)
    key = generation_key(path, registry, sorted({w.backend for w in ways.values()}), objective)
    opened = not isinstance(store, PlanStore)
    plans = PlanStore(store) if opened else store
    try:
        row = plans.get_plan(key)
        if row is None:
            reasons = [f"plan {p.id}: " + ", ".join(p.key.explain_difference(key) or ["a different key"])
                       for p in plans.plans_for_model(key.model)]
            return None, "no generation plan stored" + (f" ({'; '.join(reasons)})" if reasons else "")
        plan = row.plan().generation_plan()
        return plan, (f"stored generation plan (id {row.id}, {plan.precision}): prompt on "
                      f"{plan.prefill.label()}, token steps on {plan.decode.label()}")
    finally:
        if opened:
            plans.close()
