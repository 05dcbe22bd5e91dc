"""``opdispatch tune|run MODEL --generate N --prompt-len P``: text generation from the command line.

``tune --generate N`` measures every step way of a decoder exported with its cache for a
``P``-token prompt and ``N`` new tokens and stores the generation plan
(:mod:`tuner.generation.tune_generate`). ``run --generate N`` generates ``N`` tokens after a
``P``-token prompt (seeded random token ids, or ``--input input_ids=FILE.npy``) with the stored
plan (``--library WAY``: one step way instead; ``--untuned``: the default way) and prints the
prompt's time, the time to the first token, tokens per second of the steps, and beside them the
memory-bandwidth bound (:mod:`tuner.generation.bandwidth`).

``tune --generate N --accuracy tokens:0.95 [--prompts FILE]`` also tries the int8 and 4-bit weight
variants of the model within that accuracy budget on the prompts
(:mod:`tuner.generation.precision`); ``run --generate N --accuracy tokens:0.95 [--prompts FILE]``
runs the plan tuned so (the same prompts name it) and reports its weights' precision.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import numpy as np

from tuner.cli.args import UsageError, positive_int

#: timed generations when --runs is not given
DEFAULT_RUNS = 3


def add_arguments(parser: argparse.ArgumentParser, *, run: bool) -> None:
    """The generation options of ``tune`` (``run=False``) or ``run``."""
    parser.add_argument("--generate", type=positive_int, default=None, metavar="N",
                        help=("generate N new tokens after a --prompt-len prompt with the stored "
                              "generation plan (a decoder exported with its cache) and print the "
                              "prompt's time, time to first token, tokens/s and the memory-"
                              "bandwidth bound; --library WAY: one step way instead "
                              "(onnxruntime-iobinding, onnxruntime, openvino, openvino-stateful)")
                        if run else
                        ("tune the generation of N new tokens after a --prompt-len prompt: "
                         "every step way is measured on the prompt and on the token steps and "
                         "the winner of each is stored (a decoder exported with its cache); with "
                         "--accuracy tokens:0.95 (teacher-forced greedy agreement with float32), "
                         "prefix:0.5 or cosine:0.99 (worst logits cosine), int8 and 4-bit weight "
                         "variants within that budget on --prompts are candidates too"))
    parser.add_argument("--prompt-len", type=positive_int, default=None, metavar="P",
                        help="with --generate: the prompt's tokens (default 32)")
    parser.add_argument("--prompts", default=None, metavar="FILE.npy|.npz",
                        help=("with --generate and --accuracy: the prompts the plan was tuned on "
                              "(token ids; they name the plan)") if run else
                        ("with --generate and --accuracy: prompts of token ids the weight variants' "
                         "accuracy is measured on: an .npy [N, L] or an .npz with input_ids (and "
                         "attention_mask: padding dropped); default 4 seeded random prompts of "
                         "--prompt-len ids"))


def check(args: argparse.Namespace) -> None:
    if getattr(args, "prompt_len", None) is not None and args.generate is None:
        raise UsageError("--prompt-len goes with --generate N (the new tokens)")
    if getattr(args, "prompts", None) is not None and (args.generate is None or args.accuracy is None):
        raise UsageError("--prompts goes with --generate N and --accuracy METRIC:BUDGET (the prompts "
                         "the weight variants' accuracy is measured on)")


def _prompts(args: argparse.Namespace, vocab: int, prompt_len: int) -> list[np.ndarray]:
    """The accuracy prompts of ``--prompts`` (else the seeded random ones tuning defaults to)."""
    from tuner.generation.precision import load_prompts, random_prompts
    from tuner.tune_types import TuningError

    if args.prompts is None:
        return random_prompts(vocab, prompt_len)
    try:
        return load_prompts(args.prompts, vocab)
    except TuningError as exc:
        raise UsageError(str(exc)) from None


def _objective(args: argparse.Namespace, vocab: int, prompt_len: int) -> tuple[str, Any]:
    """The generation plan's objective and the accuracy prompts (``None`` in float32)."""
    from tuner.generation.tune_generate import generation_objective
    from tuner.tune_types import TuningError

    if args.accuracy is None:
        return "latency", None
    prompts = _prompts(args, vocab, prompt_len)
    try:
        return generation_objective(args.accuracy, prompts), prompts
    except TuningError as exc:
        raise UsageError(str(exc)) from None


def cmd_tune_generate(args: argparse.Namespace) -> int:
    """``opdispatch tune MODEL --generate N [--prompt-len P] [--accuracy M:B [--prompts FILE]]``."""
    from dispatch.config import Config
    from dispatch.errors import OpDispatchError
    from dispatch.generation.decoder_io import read_decoder
    from tuner.generation.tune_generate import tune_generate
    from tuner.tune_types import TuningError

    if args.shape or args.inputs or args.data or args.objective != "latency":
        raise UsageError("--generate tunes a decoder's generation for latency (prompt and token "
                         "steps), with --accuracy on --prompts; --shape, --inputs, --data and "
                         "--objective go with other tunings")
    config = Config.load({"store_path": args.store})
    budget = args.budget if args.budget is not None else min(config.tune_budget_s, 120.0)
    backends = [b.strip() for b in args.backends.split(",")] if args.backends else None
    prompt_len = args.prompt_len or 32
    try:
        vocab = read_decoder(args.model).vocab
    except OpDispatchError as exc:
        raise UsageError(str(exc)) from None
    _objective_text, prompts = _objective(args, vocab, prompt_len)
    print(f"tuning the generation of {args.model}: {prompt_len}-token prompt, {args.generate} new "
          f"tokens (budget {budget:.0f} s, store {config.store_path})"
          + (f", weight variants within {args.accuracy} on {len(prompts)} prompt(s)"
             if prompts is not None else ""), flush=True)
    try:
        result = tune_generate(args.model, prompt_len=prompt_len, new_tokens=args.generate,
                               budget_s=budget, store=config.store_path, backends=backends,
                               config=config, log=lambda msg: print(msg, flush=True),
                               accuracy=args.accuracy, prompts=prompts)
    except (TuningError, OpDispatchError) as exc:
        raise UsageError(str(exc)) from None
    print(result.summary())
    print(f"bandwidth bound: {result.generation.notes['bound_tokens_per_s']:.1f} tokens/s "
          f"({result.generation.notes['weights_bytes_per_token'] / 1e6:.1f} MB of weights per "
          f"token at {result.generation.notes['bandwidth']})")
    return 0 if result.plan_id is not None else 2


def _generator(args: argparse.Namespace, capacity: int) -> tuple[Any, str, str]:
    """The generator ``run --generate`` times, where its ways came from, and its weights'
    precision."""
    from dispatch.backend import load_registry
    from dispatch.config import Config
    from dispatch.generation.decoder_io import read_decoder
    from dispatch.generation.generate import Generator
    from dispatch.generation.planned import planned_generator
    from dispatch.generation.ways import default_step_way, step_way
    from tuner.generation.tune_generate import stored_generation_plan

    io = read_decoder(args.model)
    if args.library is not None:
        return Generator(args.model, step_way(args.library), max_length=capacity, io=io), \
            f"plain {args.library} (--library)", "the model file's"
    config = Config.load({"store_path": args.store})
    registry = load_registry(config.plugin_path or None, order=config.backend_order)
    if not args.untuned:
        objective, _prompts = _objective(args, io.vocab, args.prompt_len or 32)
        plan, note = stored_generation_plan(args.model, config.store_path, registry, objective)
        if plan is not None:
            precision = plan.precision + (f" ({plan.accuracy['describe']}; budget "
                                          f"{plan.accuracy.get('budget')})" if plan.accuracy else "")
            # the key matched the file's digest: the plan's is the file's (no second hashing)
            return planned_generator(args.model, plan, max_length=capacity, registry=registry, io=io,
                                     digest=plan.notes.get("source_digest")), note, precision
        if args.require_plan:
            flags = "" if args.accuracy is None else f" --accuracy {args.accuracy}" + (
                f" --prompts {args.prompts}" if args.prompts else "")
            raise UsageError(f"--require-plan: {note} for {args.model} on this machine; tune it "
                             f"with opdispatch tune {args.model} --generate {args.generate}{flags}")
    else:
        note = "--untuned"
    way = default_step_way(registry)
    return Generator(args.model, way, max_length=capacity, io=io), \
        f"untuned: {way.name} ({note})", "float32 (untuned)"


def _prompt(args: argparse.Namespace, vocab: int, length: int) -> np.ndarray:
    for text in args.input or []:
        _name, _, path = text.partition("=")
        if path:
            ids = np.load(path)
            return np.asarray(ids).reshape(-1).astype(np.int64)
        raise UsageError(f"--input expects NAME=FILE.npy, received {text!r}")
    return np.random.default_rng(args.seed).integers(0, vocab, size=length, dtype=np.int64)


def _timed(gen: Any, prompt: np.ndarray, new_tokens: int) -> dict[str, float]:
    """One greedy generation, timed: the prompt, the first token, the steps."""
    t0 = time.perf_counter()
    logits = gen.prefill(prompt)
    t_prompt = time.perf_counter()
    token = np.array([int(np.argmax(logits[0, -1]))])
    t_first = time.perf_counter()
    for _ in range(new_tokens - 1):
        logits = gen.step(token)
        token[0] = int(np.argmax(logits[0, -1]))
    t_end = time.perf_counter()
    steps = max(1, new_tokens - 1)
    return {"prompt_ms": (t_prompt - t0) * 1e3, "first_token_ms": (t_first - t0) * 1e3,
            "step_ms": (t_end - t_first) * 1e3 / steps,
            "tokens_per_s": steps / max(t_end - t_first, 1e-9),
            "total_ms": (t_end - t0) * 1e3}


def cmd_run_generate(args: argparse.Namespace) -> int:
    """``opdispatch run MODEL --generate N [--prompt-len P] [--accuracy M:B [--prompts FILE]]``."""
    from tuner.generation.bandwidth import bound_tokens_per_s, bytes_per_token, stream_bandwidth

    if args.concurrency is not None or args.data is not None or args.output:
        raise UsageError("--generate times one generation at a time; --concurrency, --data and "
                         "--output go with other runs")
    prompt_len = args.prompt_len or 32
    t0 = time.perf_counter()
    gen, source, precision = _generator(args, prompt_len + args.generate)
    prompt = _prompt(args, gen.io.vocab, prompt_len)
    if len(prompt) + args.generate > gen.max_length:
        gen.reset(len(prompt) + args.generate)
    gen.generate(prompt, min(args.generate, 8))  # compiles per-shape kernels, allocates
    load_s = time.perf_counter() - t0
    weights = bytes_per_token(gen.io.path)  # the variant's file when the plan runs one
    bandwidth = stream_bandwidth()
    bound = bound_tokens_per_s(bandwidth, weights)
    runs = [_timed(gen, prompt, args.generate) for _ in range(args.runs or DEFAULT_RUNS)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    human = sys.stderr if args.json == "-" else sys.stdout
    print(gen.describe(), file=human)
    print(f"ways: {source}", file=human)
    print(f"weights: {precision}" + (f" ({gen.io.path})" if gen.io.path != args.model else ""),
          file=human)
    print(f"prompt {len(prompt)} tokens: {med['prompt_ms']:.2f} ms; first token after "
          f"{med['first_token_ms']:.2f} ms; {args.generate} new tokens: {med['tokens_per_s']:.1f} "
          f"tokens/s ({med['step_ms']:.3f} ms per step); medians of {len(runs)} generation(s)",
          file=human)
    print(f"bandwidth bound: {bound:.1f} tokens/s ({weights.per_token / 1e6:.1f} MB of weights read "
          f"per token at {bandwidth.describe()}): the steps run at {med['tokens_per_s'] / bound:.2f} "
          f"of it; load and warm-up {load_s:.2f} s", file=human)
    if args.json:
        payload = {"model": args.model, "ways": source, "way": gen.way.name,
                   "precision": precision, "weights_file": gen.io.path,
                   "prompt_tokens": len(prompt), "new_tokens": args.generate, **med,
                   "runs": runs, "bound_tokens_per_s": bound,
                   "weights_bytes_per_token": weights.per_token,
                   "bandwidth_gb_s": bandwidth.gb_per_s, "load_s": load_s}
        text = json.dumps(payload, indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    return 0
