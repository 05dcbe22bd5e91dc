"""The external anchors of the generation bench (issue 53): onnxruntime-genai and llama.cpp on the
same weights as the bench's decoders, each timed in a process of its own, printing the keys of
``opdispatch run MODEL --generate N --prompt-len P --json F`` so ``bench/generate_bench.py`` can
put them in its table (ways ``genai-fp32``, ``genai-int4``, ``llama-cpp-f32``, ``llama-cpp-q8_0``,
``llama-cpp-q4_0``). Bench-only code: nothing here is part of the package.

    pip install -r bench/requirements-anchors.txt        # llama-cpp-python builds llama.cpp
    python bench/generation_anchors.py genai --family llama --precision fp32 --generate 128 \
        --prompt-len 32 --runs 3 --json out.json [--check-against llama.onnx]
    python bench/generation_anchors.py llama-cpp --family gpt2 --precision q8_0 ...

**The same weights.** The transformers model is rebuilt by ``make_decoders.build`` with the bench's
configuration and seed (so every weight equals the one in ``gpt2.onnx`` / ``llama.onnx``), saved
with ``save_pretrained`` to ``~/.cache/opdispatch/bench-models/decoders/anchors/hf-FAMILY`` and
converted from there (offline). Both converters insist on a tokenizer although only token ids are
fed: a tiny byte-level BPE (``tokenizers``, trained on this docstring, ~300 tokens, ``<|bos|>`` id
0 and ``<|eos|>`` id 1 as in the models' configs) saved beside the weights; llama.cpp pads its
vocabulary with ``[PAD{i}]`` up to the model's. ``--check-against MODEL.onnx`` runs the same
greedy generation through onnxruntime's plain ``run`` of our export and prints whether the tokens
agree and how far the prompt's last logits are from onnxruntime's (in float32 the tokens must
agree: same weights, same tokens). Checked on the bench models (32-token prompt, 8 tokens):
genai fp32 on llama agrees, logits within 2e-6; llama.cpp f32 agrees on llama (logits within
8e-4) and on GPT-2 (1.1e-3: llama.cpp keeps its key/value cache in float16 by default), q8_0
agrees on llama; the 4-bit ones (genai int4, llama.cpp q4_0) move the logits by ~1 of a 4.5 range
on these random-weight models and may pick other tokens. (With transformers' 0.02 initialisation
the random models repeat one token, so the logits are the telling check.)

**onnxruntime-genai** (``make_genai``): ``python -m onnxruntime_genai.models.builder -i HF -o OUT
-p fp32|int4 -e cpu`` (GroupQueryAttention with a cache shared by past and present at the
maximum length; ``int4``: ``MatMulNBits`` 4-bit weights, block 32, ``accuracy_level`` 4, the
tied embedding a ``GatherBlockQuantized`` 4-bit table). Timed by ``time_genai``:
``Generator`` greedy with ``max_length`` = prompt + new tokens, ``append_tokens(prompt)`` (the
prompt's forward: ``prompt_ms``), the first ``generate_next_token`` (``first_token_ms``), then one
``generate_next_token`` per token. GPT-2 cannot be given to it: the builder has no GPT-2
architecture (``GPT2LMHeadModel`` falls to ``NotImplementedError: The <folder> model is not
currently supported.``, onnxruntime-genai 0.18.0), so ``genai-*`` ways exist for ``llama`` only.

**llama.cpp** (``make_gguf``) through ``llama-cpp-python``: HF -> GGUF by llama.cpp's own
``convert_hf_to_gguf.py`` (with its ``conversion/`` package and ``gguf-py``, taken from the
llama-cpp-python source distribution: ``vendor/llama.cpp``; found through
``$LLAMA_CPP_CONVERT_DIR`` or fetched with ``pip download --no-binary`` of the installed version
into the anchors' cache; it imports ``sentencepiece``). ``--outtype f32`` and ``q8_0``
directly; ``q4_0`` by ``llama_cpp.llama_model_quantize`` from the f32 file (llama.cpp's rule
keeps the token table, here also the output, in Q6_K). The converter recognises a BPE tokenizer
only by the hash of its tokens on a fixed text, which a tokenizer trained here cannot match
(``NotImplementedError: BPE pre-tokenizer was not recognized - update get_vocab_base_pre()``),
so the conversion runs with ``get_vocab_base_pre`` answering ``"gpt-2"`` (the regular byte-level
pre-tokenizer; it matters only to text, never to the ids fed here). Timed by ``time_llama_cpp``:
``Llama(path, n_ctx, n_threads=cores, n_batch=prompt, logits_all=False)``, ``eval(prompt)``, then
greedy ``argmax`` of the last logits and one ``eval([token])`` per token (the KV cache is cleared
between generations). The Llama-style model converts as llama.cpp's ``llama`` architecture (Q/K
rows permuted by the converter for its rotary layout; the tied embedding serves as the output).
GPT-2 converts as llama.cpp's ``gpt2`` architecture: the same computation (learned positions,
LayerNorm, GELU-tanh, fused QKV with biases, tied output), the float32 weights copied as they are;
its converter reads ``n_ctx`` from config.json, which transformers 5 no longer writes
(``KeyError: 'n_ctx'``), so the saved config gets ``n_ctx = n_positions`` (no weight changes).

Threads: llama.cpp's threads (OpenMP here) spin while they wait; on a machine shared with other
work, ``n_threads`` = every core collapsed (2 cores at load ~6: the f32 llama at 0.4-1.2 tokens/s
against 35 with ``--threads 1``; q8_0 at 11 against 53 with ``OMP_WAIT_POLICY=PASSIVE``). Time it
on a quiet machine, as the rest of the bench; ``--threads N`` sets its threads.

Bandwidth keys: ``weights_bytes_per_token`` is the weights a token step reads, counted as
``tuner.generation.bandwidth`` does (a gathered table one row): from the genai ONNX file by that
module, from the GGUF file's tensor sizes here; the bandwidth is measured in the process by the
same streaming copy.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DECODERS = ROOT / "tests" / "models" / "decoders"
BENCH_DIR = Path.home() / ".cache" / "opdispatch" / "bench-models" / "decoders"
ANCHORS_DIR = BENCH_DIR / "anchors"

#: the bench decoders' make_decoders.build arguments (layers, hidden, vocab, positions, init):
#: gpt2.onnx is bench_gpt2(); llama.onnx is 12 layers, hidden 768 (12 heads, 6 key/value heads),
#: vocabulary 32000 (its positions do not change a weight: rotary angles are computed)
FAMILIES: dict[str, tuple[int, int, int, int, float]] = {
    "gpt2": (12, 768, 50257, 1024, 0.02),
    "llama": (12, 768, 32000, 1040, 0.02),
}
GENAI_PRECISIONS = ("fp32", "int4")
GGUF_PRECISIONS = ("f32", "q8_0", "q4_0")
#: the anchors' ways in bench/generate_bench.py: way -> (tool, precision)
WAYS: dict[str, tuple[str, str]] = {
    **{f"genai-{p}": ("genai", p) for p in GENAI_PRECISIONS},
    **{f"llama-cpp-{p}": ("llama-cpp", p) for p in GGUF_PRECISIONS},
}


def _make_decoders() -> Any:
    spec = importlib.util.spec_from_file_location("make_decoders", DECODERS / "make_decoders.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tokenizer(folder: Path) -> None:
    """A tiny byte-level BPE tokenizer (``<|bos|>`` = 0, ``<|eos|>`` = 1) saved in ``folder``: the
    converters only need one to load."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|bos|>", "<|eos|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([__doc__ or "opdispatch"], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>")
    fast.save_pretrained(str(folder))


def make_hf(family: str, out_dir: Path | None = None) -> Path:
    """The bench decoder of ``family`` as a transformers folder (weights, config, a tiny
    tokenizer), made once: the same seed and configuration as the bench's ONNX export."""
    folder = out_dir or ANCHORS_DIR / f"hf-{family}"
    if (folder / "config.json").exists() and (folder / "tokenizer.json").exists():
        return folder
    layers, hidden, vocab, positions, init = FAMILIES[family]
    model = _make_decoders().build(family, layers, hidden, vocab, positions, init)
    tmp = folder.with_name(folder.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(str(tmp))
    if family == "gpt2":  # transformers 5 no longer writes n_ctx; llama.cpp's GPT-2 converter reads it
        config = json.loads((tmp / "config.json").read_text())
        config.setdefault("n_ctx", config["n_positions"])
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    _tokenizer(tmp)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


# --- onnxruntime-genai -------------------------------------------------------------------------


def make_genai(family: str, out_dir: Path | None = None, precision: str = "fp32") -> Path:
    """onnxruntime-genai's model builder on the bench decoder of ``family`` (``fp32`` or ``int4``),
    into ``out_dir`` (default: the anchors' cache); made once."""
    if precision not in GENAI_PRECISIONS:
        raise SystemExit(f"genai precision {precision!r}: expected one of {GENAI_PRECISIONS}")
    out = out_dir or ANCHORS_DIR / f"genai-{family}-{precision}"
    if (out / "genai_config.json").exists():
        return out
    hf = make_hf(family)
    tmp = out.with_name(out.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(tmp),
           "-p", precision, "-e", "cpu", "-c", str(ANCHORS_DIR / "genai-cache")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        raise SystemExit(f"onnxruntime-genai's builder cannot take the {family} model: "
                         f"{tail[-1] if tail else 'exit ' + str(proc.returncode)}")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def time_genai(model_dir: Path, prompt: np.ndarray, new_tokens: int,
               runs: int) -> tuple[list[dict], list[int], np.ndarray]:
    """``runs`` timed greedy generations through onnxruntime-genai (after one untimed), the
    tokens of the last and the prompt's last logits (of the untimed one)."""
    import onnxruntime_genai as og

    model = og.Model(str(model_dir))
    first: list[np.ndarray] = []

    def once() -> tuple[dict[str, float], list[int]]:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(prompt) + new_tokens, do_sample=False)
        gen = og.Generator(model, params)
        t0 = time.perf_counter()
        gen.append_tokens(prompt.astype(np.int32))
        t_prompt = time.perf_counter()
        if not first:
            first.append(np.array(gen.get_logits(), np.float32).reshape(-1))
        gen.generate_next_token()
        t_first = time.perf_counter()
        for _ in range(new_tokens - 1):
            gen.generate_next_token()
        t_end = time.perf_counter()
        tokens = [int(t) for t in gen.get_sequence(0)[len(prompt):]]
        if len(tokens) != new_tokens:
            raise SystemExit(f"onnxruntime-genai stopped after {len(tokens)} of {new_tokens} tokens")
        return _figures(t0, t_prompt, t_first, t_end, new_tokens), tokens

    once()  # warm-up
    timed = [once() for _ in range(runs)]
    return [f for f, _ in timed], timed[-1][1], first[0]


# --- llama.cpp ---------------------------------------------------------------------------------


def _convert_dir() -> Path:
    """llama.cpp's converter (``convert_hf_to_gguf.py``, ``conversion/``, ``gguf-py``) of the
    installed llama-cpp-python's source distribution."""
    given = os.environ.get("LLAMA_CPP_CONVERT_DIR")
    if given:
        return Path(given)
    from importlib.metadata import version

    ver = version("llama_cpp_python")
    where = ANCHORS_DIR / f"llama.cpp-{ver}"
    if (where / "convert_hf_to_gguf.py").exists():
        return where
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={ver}", "-d", tmp], check=True, capture_output=True)
        sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        part = where.with_name(where.name + ".part")
        shutil.rmtree(part, ignore_errors=True)
        with tarfile.open(sdist) as tar:
            prefix = f"{tar.getnames()[0].split('/')[0]}/vendor/llama.cpp/"
            keep = [m for m in tar.getmembers() if m.name.startswith(prefix) and (
                m.name == prefix + "convert_hf_to_gguf.py" or m.name.startswith(prefix + "conversion/")
                or m.name.startswith(prefix + "gguf-py/"))]
            for m in keep:
                m.name = m.name[len(prefix):]
            tar.extractall(part, members=keep, filter="data")
    shutil.rmtree(where, ignore_errors=True)
    part.rename(where)
    return where


#: runs llama.cpp's converter with get_vocab_base_pre answering "gpt-2" (see the docstring)
_CONVERT = """
import sys
d = sys.argv.pop(1)
sys.path[:0] = [d + "/gguf-py", d]
import conversion.base as base
for cls in vars(base).values():
    if isinstance(cls, type) and "get_vocab_base_pre" in vars(cls):
        cls.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
import convert_hf_to_gguf
sys.argv[0] = "convert_hf_to_gguf.py"
convert_hf_to_gguf.main()
"""


def make_gguf(family: str, precision: str = "f32", out_dir: Path | None = None) -> Path:
    """The bench decoder of ``family`` as a GGUF file (``f32``, ``q8_0`` by llama.cpp's converter,
    ``q4_0`` quantized from the f32 file by ``llama_model_quantize``); made once."""
    if precision not in GGUF_PRECISIONS:
        raise SystemExit(f"llama.cpp precision {precision!r}: expected one of {GGUF_PRECISIONS}")
    out_dir = out_dir or ANCHORS_DIR
    out = out_dir / f"{family}-{precision}.gguf"
    if out.exists():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    part = out.with_name(out.name + ".part")
    if precision == "q4_0":
        import llama_cpp

        src = make_gguf(family, "f32", out_dir)
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
        params.nthread = os.cpu_count() or 1
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(part).encode(), params)
        if rc != 0:
            raise SystemExit(f"llama_model_quantize to Q4_0 failed: {rc}")
    else:
        hf = make_hf(family)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        cmd = [sys.executable, "-c", _CONVERT, str(_convert_dir()), str(hf), "--outtype", precision,
               "--outfile", str(part)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            part.unlink(missing_ok=True)
            tail = (proc.stderr or proc.stdout).strip().splitlines()
            raise SystemExit(f"llama.cpp's converter cannot take the {family} model: "
                             f"{tail[-1] if tail else 'exit ' + str(proc.returncode)}")
    part.rename(out)
    return out


def time_llama_cpp(path: Path, prompt: np.ndarray, new_tokens: int, runs: int,
                   threads: int | None = None) -> tuple[list[dict], list[int], np.ndarray]:
    """``runs`` timed greedy generations through llama.cpp (after one untimed), the tokens of the
    last and the prompt's last logits (of the untimed one)."""
    from llama_cpp import Llama

    ctx = len(prompt) + new_tokens
    llm = Llama(model_path=str(path), n_ctx=ctx, n_batch=max(len(prompt), 1), n_ubatch=max(len(prompt), 1),
                n_threads=threads or os.cpu_count(), n_threads_batch=threads or os.cpu_count(),
                logits_all=False, verbose=False)
    ids = [int(t) for t in prompt]
    vocab = llm.n_vocab()
    first: list[np.ndarray] = []

    def last_logits() -> np.ndarray:  # the logits of the last token evaluated (logits_all=False)
        return np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(vocab,))

    def once() -> tuple[dict[str, float], list[int]]:
        llm.reset()  # the next eval drops the cache from position 0
        t0 = time.perf_counter()
        llm.eval(ids)
        t_prompt = time.perf_counter()
        token = int(np.argmax(last_logits()))
        t_first = time.perf_counter()
        if not first:
            first.append(last_logits().astype(np.float32))
        tokens = [token]
        for _ in range(new_tokens - 1):
            llm.eval([token])
            token = int(np.argmax(last_logits()))
            tokens.append(token)
        t_end = time.perf_counter()
        return _figures(t0, t_prompt, t_first, t_end, new_tokens), tokens

    once()  # warm-up
    timed = [once() for _ in range(runs)]
    return [f for f, _ in timed], timed[-1][1], first[0]


def gguf_bytes_per_token(path: Path) -> tuple[int, int]:
    """(bytes of weights a token step reads, all bytes of weights) of a GGUF file: the token and
    position tables a row each, unless the token table also serves as the output."""
    from gguf import GGUFReader

    tensors = {t.name: (int(t.n_bytes), int(t.shape[-1]) if len(t.shape) > 1 else 1)
               for t in GGUFReader(str(path)).tensors}
    total = sum(b for b, _ in tensors.values())
    per_token = total
    for name in ("token_embd.weight", "position_embd.weight"):
        if name in tensors and (name != "token_embd.weight" or "output.weight" in tensors):
            nbytes, rows = tensors[name]  # GGUF shapes are innermost first: rows last
            per_token -= nbytes - nbytes // max(rows, 1)
    return per_token, total


# --- common ------------------------------------------------------------------------------------


def _figures(t0: float, t_prompt: float, t_first: float, t_end: float, new_tokens: int) -> dict[str, float]:
    steps = max(1, new_tokens - 1)
    return {"prompt_ms": (t_prompt - t0) * 1e3, "first_token_ms": (t_first - t0) * 1e3,
            "step_ms": (t_end - t_first) * 1e3 / steps,
            "tokens_per_s": steps / max(t_end - t_first, 1e-9),
            "total_ms": (t_end - t0) * 1e3}


def prompt_ids(vocab: int, length: int, seed: int = 0) -> np.ndarray:
    """The prompt ``opdispatch run --generate`` makes (seeded random ids)."""
    return np.random.default_rng(seed).integers(0, vocab, size=length, dtype=np.int64)


def reference_tokens(onnx_path: Path, prompt: np.ndarray, new_tokens: int) -> tuple[list[int], np.ndarray]:
    """Greedy tokens of our export through onnxruntime's plain ``run`` (presents fed back), and
    the prompt's last logits."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    past = {}
    for name, arg in inputs.items():
        if name.startswith("past_key_values."):
            past[name] = np.zeros((1, arg.shape[1], 0, arg.shape[3]), np.float32)
    feed, length, tokens = prompt[None].astype(np.int64), 0, []
    for _ in range(new_tokens):
        n = feed.shape[1]
        feeds = {"input_ids": feed, "attention_mask": np.ones((1, length + n), np.int64), **past}
        if "position_ids" in inputs:
            feeds["position_ids"] = np.arange(length, length + n, dtype=np.int64)[None]
        results = dict(zip(names, session.run(None, feeds)))
        past = {k: results[k.replace("past_key_values.", "present.")] for k in past}
        length += n
        tokens.append(int(results["logits"][0, -1].argmax()))
        if len(tokens) == 1:
            first = results["logits"][0, -1].astype(np.float32)
        feed = np.array([[tokens[-1]]], np.int64)
    return tokens, first


def run(tool: str, family: str, precision: str, new_tokens: int, prompt_len: int, runs: int,
        seed: int = 0, check_against: Path | None = None, threads: int | None = None) -> dict[str, Any]:
    """Make (once) and time one anchor; the ``run --generate --json`` payload."""
    sys.path.insert(0, str(ROOT))
    from tuner.generation.bandwidth import WeightBytes, bound_tokens_per_s, bytes_per_token, stream_bandwidth

    vocab = FAMILIES[family][2]
    prompt = prompt_ids(vocab, prompt_len, seed)
    t0 = time.perf_counter()
    if tool == "genai":
        path = make_genai(family, precision=precision)
        made = time.perf_counter()
        figures, tokens, logits = time_genai(path, prompt, new_tokens, runs)
        weights = bytes_per_token(str(path / "model.onnx"))
        import onnxruntime_genai as og

        ways = f"onnxruntime-genai {og.__version__} {precision} (model builder, {path.name})"
    elif tool == "llama-cpp":
        path = make_gguf(family, precision)
        made = time.perf_counter()
        figures, tokens, logits = time_llama_cpp(path, prompt, new_tokens, runs, threads)
        per_token, total = gguf_bytes_per_token(path)
        weights = WeightBytes(per_token=per_token, total=total, gathered=0)
        import llama_cpp

        ways = f"llama.cpp (llama-cpp-python {llama_cpp.__version__}) {precision} ({path.name})"
    else:
        raise SystemExit(f"unknown anchor {tool!r}: expected genai or llama-cpp")
    load_s = time.perf_counter() - made  # model load, warm-up generation and the timed ones
    bandwidth = stream_bandwidth()
    bound = bound_tokens_per_s(bandwidth, weights)
    med = {k: statistics.median(r[k] for r in figures) for k in figures[0]}
    payload: dict[str, Any] = {
        "model": str(path), "ways": ways, "way": f"{tool}-{precision}", "precision": precision,
        "prompt_tokens": prompt_len,
        "new_tokens": new_tokens, **med, "runs": figures, "bound_tokens_per_s": bound,
        "weights_bytes_per_token": weights.per_token, "bandwidth_gb_s": bandwidth.gb_per_s,
        "load_s": load_s, "make_s": made - t0, "tokens": tokens}
    if check_against is not None:
        want, want_logits = reference_tokens(check_against, prompt, new_tokens)
        same = next((i for i, (a, b) in enumerate(zip(tokens, want)) if a != b), len(want))
        payload["reference_tokens"] = want
        payload["agree_tokens"] = same
        payload["prompt_logits_max_diff"] = float(np.abs(logits - want_logits).max())
        payload["prompt_logits_range"] = float(want_logits.max() - want_logits.min())
        payload["prompt_top5"] = [np.argsort(-logits)[:5].tolist(), np.argsort(-want_logits)[:5].tolist()]
    return payload


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tool", choices=("genai", "llama-cpp"))
    parser.add_argument("--family", choices=tuple(FAMILIES), default="gpt2")
    parser.add_argument("--precision", default=None,
                        help=f"genai: {', '.join(GENAI_PRECISIONS)} (default fp32); llama-cpp: "
                             f"{', '.join(GGUF_PRECISIONS)} (default f32; fp32 means f32)")
    parser.add_argument("--generate", type=int, default=128, help="new tokens")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3, help="timed generations (after one untimed)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompt's ids (as opdispatch run)")
    parser.add_argument("--check-against", type=Path, default=None,
                        help="our ONNX export: compare greedy tokens with onnxruntime's plain run")
    parser.add_argument("--threads", type=int, default=None,
                        help="llama-cpp: its threads (default: every core)")
    parser.add_argument("--json", default=None, help="write the payload here ('-': stdout)")
    args = parser.parse_args(argv)
    precision = args.precision or ("fp32" if args.tool == "genai" else "f32")
    if args.tool == "llama-cpp" and precision == "fp32":
        precision = "f32"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    payload = run(args.tool, args.family, precision, args.generate, args.prompt_len, args.runs,
                  args.seed, args.check_against, args.threads)
    human = sys.stderr if args.json == "-" else sys.stdout
    print(f"ways: {payload['ways']}", file=human)
    print(f"prompt {args.prompt_len} tokens: {payload['prompt_ms']:.2f} ms; first token after "
          f"{payload['first_token_ms']:.2f} ms; {args.generate} new tokens: "
          f"{payload['tokens_per_s']:.1f} tokens/s ({payload['step_ms']:.3f} ms per step); bound "
          f"{payload['bound_tokens_per_s']:.1f} tokens/s ({payload['weights_bytes_per_token'] / 1e6:.1f} "
          f"MB per token at {payload['bandwidth_gb_s']:.1f} GB/s)", file=human)
    if "agree_tokens" in payload:
        print(f"greedy tokens agree with onnxruntime on {args.check_against.name} for "
              f"{payload['agree_tokens']} of {args.generate}: {payload['tokens'][:12]} vs "
              f"{payload['reference_tokens'][:12]}; the prompt's last logits differ by at most "
              f"{payload['prompt_logits_max_diff']:.3g} (their range {payload['prompt_logits_range']:.3g}); "
              f"top 5 {payload['prompt_top5'][0]} vs {payload['prompt_top5'][1]}", file=human)
    if args.json:
        text = json.dumps(payload, indent=2)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
