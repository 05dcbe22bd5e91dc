"""Text generation, side by side (issue 53): one decoder generating the same tokens through the
tuned generation plan and through plain libraries, each way in a process of its own, ways
alternating by round.

    python tests/models/decoders/make_decoders.py --bench      # the 12-layer GPT-2, once
    python bench/generate_bench.py [--model M] [--rounds 3] [--tune-budget 120] [--json out.json]

Each way is one ``opdispatch run MODEL --generate N --prompt-len P --json FILE`` process
(:mod:`tuner.cli.generate_cli`: the model compiled and warmed by a short generation, then
``--runs`` greedy generations timed; the process's figures are their medians):

* ``plan``: the stored generation plan (with ``--tune-budget S``: first tuned by ``opdispatch
  tune MODEL --generate N --prompt-len P`` into the bench's own store);
* ``onnxruntime-iobinding``: onnxruntime with IO binding (pasts and presents bound to buffers
  reused across steps), the anchor of the issue;
* ``onnxruntime``: onnxruntime's plain ``run``, presents fed back as pasts (every user's first
  loop);
* ``openvino-stateful``: OpenVINO with the cache inside the compiled model as state;
* ``openvino``: OpenVINO on shared-memory tensors;
* optional, with ``--ways``: the external anchors of :mod:`bench.generation_anchors` on the same
  weights (``genai-fp32``, ``genai-int4``: onnxruntime-genai's model builder, Llama-style only;
  ``llama-cpp-f32``, ``llama-cpp-q8_0``, ``llama-cpp-q4_0``: llama.cpp through llama-cpp-python),
  the family taken from the model's name (``gpt2.onnx``, ``llama.onnx``); they need
  ``pip install -r bench/requirements-anchors.txt``.

Prints, per way, the medians over the rounds of the prompt's time, the time to the first token,
tokens/s of the steps, the ratios to onnxruntime with IO binding and to OpenVINO's faster way,
and the fraction of the memory-bandwidth bound (weights' bytes per token over a streaming
copy's bandwidth, measured in each process). Run it on a quiet machine and name the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = Path.home() / ".cache" / "opdispatch" / "bench-models" / "decoders" / "gpt2.onnx"
WAYS = ("plan", "onnxruntime-iobinding", "onnxruntime", "openvino-stateful", "openvino")
#: the stored float32 plan, beside the plan of ``--plan-args`` (e.g. an accuracy objective's)
EXTRA_WAYS = ("plan-float32",)
#: optional ways (bench/generation_anchors.py): way -> (anchor, precision)
ANCHOR_WAYS = {"genai-fp32": ("genai", "fp32"), "genai-int4": ("genai", "int4"),
               "llama-cpp-f32": ("llama-cpp", "f32"), "llama-cpp-q8_0": ("llama-cpp", "q8_0"),
               "llama-cpp-q4_0": ("llama-cpp", "q4_0")}


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)


def generate_once(way: str, model: Path, store: Path, new_tokens: int, prompt_len: int,
                  runs: int, extra: list[str]) -> dict[str, Any]:
    """One way in a process of its own: its ``run --generate`` JSON."""
    with tempfile.TemporaryDirectory(prefix="generate-bench-") as tmp:
        out = Path(tmp) / "generate.json"
        cmd = [sys.executable, "-m", "tuner.cli", "run", str(model), "--generate", str(new_tokens),
               "--prompt-len", str(prompt_len), "--runs", str(runs), "--store", str(store),
               "--json", str(out)]
        if way == "plan":
            cmd += ["--require-plan", *extra]
        elif way == "plan-float32":  # the float32 plan beside a reduced one (--plan-args)
            cmd += ["--require-plan"]
        else:
            cmd += ["--library", way]
        if way in ANCHOR_WAYS:  # the same weights through onnxruntime-genai or llama.cpp
            anchor, precision = ANCHOR_WAYS[way]
            cmd = [sys.executable, str(ROOT / "bench" / "generation_anchors.py"), anchor, "--family",
                   model.stem, "--precision", precision, "--generate", str(new_tokens),
                   "--prompt-len", str(prompt_len), "--runs", str(runs), "--json", str(out)]
        proc = _run(cmd)
        if proc.returncode != 0:
            raise RuntimeError(f"{way}: exit {proc.returncode}: {proc.stderr[-2000:]}")
        return json.loads(out.read_text())


def _median(rounds: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rounds)


def table(results: dict[str, list[dict[str, Any]]]) -> str:
    """The medians per way, as a markdown table."""
    anchor = results.get("onnxruntime-iobinding")
    ov = [w for w in results if w.startswith("openvino")]
    best_ov = max((_median(results[w], "tokens_per_s") for w in ov), default=None)
    rows = ["| way | prompt ms | first token ms | tokens/s | x onnxruntime-iobinding | "
            "x OpenVINO's faster | of the bandwidth bound | ways |",
            "|---|---:|---:|---:|---:|---:|---:|---|"]
    for way, rounds in results.items():
        tps = _median(rounds, "tokens_per_s")
        ra = f"{tps / _median(anchor, 'tokens_per_s'):.2f}" if anchor else "-"
        rov = f"{tps / best_ov:.2f}" if best_ov else "-"
        bound = _median(rounds, "bound_tokens_per_s")
        rows.append(f"| {way} | {_median(rounds, 'prompt_ms'):.2f} | "
                    f"{_median(rounds, 'first_token_ms'):.2f} | {tps:.1f} | {ra} | {rov} | "
                    f"{tps / bound:.2f} of {bound:.0f} | {rounds[0].get('ways', '')} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3, help="timed generations per process")
    parser.add_argument("--generate", type=int, default=128, help="new tokens")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--ways", default=",".join(WAYS))
    parser.add_argument("--store", type=Path, default=None,
                        help="plan store (default: a temporary one; give one to reuse a tuning)")
    parser.add_argument("--tune-budget", type=float, default=None,
                        help="tune the generation plan first (seconds)")
    parser.add_argument("--tune-args", default="", help="more options for opdispatch tune")
    parser.add_argument("--plan-args", default="",
                        help="more options for the plan's run (e.g. '--accuracy tokens:0.95')")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if not args.model.exists():
        parser.error(f"{args.model} does not exist: run python tests/models/decoders/make_decoders.py "
                     f"--bench first")
    ways = [w.strip() for w in args.ways.split(",") if w.strip()]
    unknown = sorted(set(ways) - set(WAYS) - set(EXTRA_WAYS) - set(ANCHOR_WAYS))
    if unknown:
        parser.error(f"unknown ways {unknown}; known: {', '.join([*WAYS, *EXTRA_WAYS, *ANCHOR_WAYS])}")
    if set(ways) & set(ANCHOR_WAYS) and args.model.stem not in ("gpt2", "llama"):
        parser.error(f"the anchors ({', '.join(ANCHOR_WAYS)}) rebuild the bench's gpt2 or llama "
                     f"decoder from its seed: {args.model.name} is neither")
    with tempfile.TemporaryDirectory(prefix="generate-store-") as tmp:
        store = args.store or Path(tmp) / "plans.sqlite"
        if args.tune_budget is not None and "plan" in ways:
            cmd = [sys.executable, "-m", "tuner.cli", "tune", str(args.model), "--generate",
                   str(args.generate), "--prompt-len", str(args.prompt_len), "--budget",
                   f"{args.tune_budget:g}", "--store", str(store), *args.tune_args.split()]
            proc = _run(cmd)
            print(proc.stdout[-4000:], flush=True)
            if proc.returncode != 0:
                raise SystemExit(f"tuning failed: {proc.stderr[-2000:]}")
        results: dict[str, list[dict[str, Any]]] = {w: [] for w in ways}
        for k in range(args.rounds):
            order = ways if k % 2 == 0 else list(reversed(ways))  # alternating
            for way in order:
                got = generate_once(way, args.model, store, args.generate, args.prompt_len,
                                    args.runs, args.plan_args.split())
                results[way].append(got)
                print(f"round {k + 1} {way}: prompt {got['prompt_ms']:.2f} ms, "
                      f"{got['tokens_per_s']:.1f} tokens/s", flush=True)
    print(f"\n{_cpu()}, {os.cpu_count()} cores; {args.model.name}, batch 1, a {args.prompt_len}-token "
          f"prompt, {args.generate} new tokens, greedy; medians of {args.rounds} round(s) of "
          f"{args.runs} generation(s), each way in a process of its own")
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps({"cpu": _cpu(), "rounds": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
