"""Export decoders with their key/value cache as users make them (issue 53).

transformers' GPT-2 and a Llama-style decoder (rotary embeddings, grouped key/value heads:
``num_key_value_heads < num_attention_heads``), built from a config with seeded random weights,
through ``torch.onnx.export`` with the cache: inputs ``input_ids``, ``attention_mask``
(``position_ids`` for Llama, which takes them; GPT-2 derives its positions from the past length),
``past_key_values.{i}.key`` / ``.value`` with a symbolic past length; outputs ``logits`` and
``present.{i}.key`` / ``.value``. A small wrapper module turns the flat past tensors into the
``DynamicCache`` transformers wants and its layers back into flat presents; the TorchScript
exporter (``dynamo=False``, ``dynamic_axes``) is used, the dynamo one needing onnxscript.
Each export is checked against transformers itself over a prompt and a few cached steps.

torch and transformers are needed here only; they are not dependencies of opdispatch.

    python tests/models/decoders/make_decoders.py                  # the tiny test models
    python tests/models/decoders/make_decoders.py --bench          # 12-layer GPT-2 (124M) into
                                                                   # ~/.cache/opdispatch/bench-models/decoders
    python tests/models/decoders/make_decoders.py --family llama --layers 4 --hidden 256 --out x.onnx
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCH_DIR = Path.home() / ".cache" / "opdispatch" / "bench-models" / "decoders"
SEED = 53


def build(family: str, layers: int, hidden: int, vocab: int, positions: int, init: float = 0.02):
    """A transformers model of ``family`` (``gpt2`` or ``llama``) with seeded random weights of
    standard deviation ``init``."""
    import torch
    import transformers

    torch.manual_seed(SEED)
    if family == "gpt2":
        heads = max(1, hidden // 64) if hidden >= 256 else 4
        config = transformers.GPT2Config(vocab_size=vocab, n_positions=positions, n_embd=hidden,
                                         n_layer=layers, n_head=heads, use_cache=True,
                                         bos_token_id=0, eos_token_id=1, initializer_range=init)
        model = transformers.GPT2LMHeadModel(config)
    elif family == "llama":
        heads = max(4, hidden // 64)
        config = transformers.LlamaConfig(
            vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
            num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads // 2,
            max_position_embeddings=positions, rope_theta=10000.0, tie_word_embeddings=True,
            use_cache=True, bos_token_id=0, eos_token_id=1, initializer_range=init)
        model = transformers.LlamaForCausalLM(config)
    else:
        raise SystemExit(f"unknown family {family!r}: expected gpt2 or llama")
    model.config._attn_implementation = "eager"  # no data-dependent shortcuts in the trace
    return model.eval()


def wrapper(model, positions: bool):
    """``model`` taking flat past tensors and returning ``(logits, *presents)``."""
    import torch
    from transformers import DynamicCache

    layers = model.config.num_hidden_layers

    class FlatCache(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, *rest):
            position_ids = rest[0] if positions else None
            past = rest[1:] if positions else rest
            cache = DynamicCache(ddp_cache_data=[(past[2 * i], past[2 * i + 1]) for i in range(layers)])
            kwargs = {"position_ids": position_ids} if positions else {}
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache,
                             use_cache=True, **kwargs)
            flat = []
            for layer in out.past_key_values.layers:
                flat += [layer.keys, layer.values]
            return (out.logits, *flat)

    return FlatCache().eval()


def kv_shape(model) -> tuple[int, int]:
    config = model.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return heads, config.hidden_size // config.num_attention_heads


def export(family: str, out: Path, layers: int, hidden: int, vocab: int, positions: int,
           init: float = 0.02) -> Path:
    """Export one decoder to ``out`` and check it against transformers."""
    import torch

    model = build(family, layers, hidden, vocab, positions, init)
    takes_positions = family != "gpt2"
    flat = wrapper(model, takes_positions)
    heads, head = kv_shape(model)
    past_len, new = 3, 2
    ids = torch.randint(0, vocab, (1, new))
    mask = torch.ones(1, past_len + new, dtype=torch.int64)
    args = [ids, mask]
    names = ["input_ids", "attention_mask"]
    axes: dict[str, dict[int, str]] = {"input_ids": {0: "batch_size", 1: "sequence_length"},
                                      "attention_mask": {0: "batch_size", 1: "total_sequence_length"}}
    if takes_positions:
        args.append(torch.arange(past_len, past_len + new).unsqueeze(0))
        names.append("position_ids")
        axes["position_ids"] = {0: "batch_size", 1: "sequence_length"}
    outputs = ["logits"]
    axes["logits"] = {0: "batch_size", 1: "sequence_length"}
    for i in range(layers):
        for kind in ("key", "value"):
            args.append(torch.randn(1, heads, past_len, head))
            names.append(f"past_key_values.{i}.{kind}")
            axes[names[-1]] = {0: "batch_size", 2: "past_sequence_length"}
            outputs.append(f"present.{i}.{kind}")
            axes[outputs[-1]] = {0: "batch_size", 2: "total_sequence_length"}
    out.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(flat, tuple(args), str(out), input_names=names, output_names=outputs,
                          dynamic_axes=axes, opset_version=17, dynamo=False, do_constant_folding=True)
    check(model, out, takes_positions)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB): {family}, {layers} layers, hidden {hidden}, "
          f"{heads} key/value heads of {head}, vocabulary {vocab}")
    return out


def check(model, path: Path, takes_positions: bool, prompt: int = 5, steps: int = 4) -> None:
    """The export's greedy tokens and logits equal transformers' over a prompt and cached steps."""
    import numpy as np
    import onnxruntime as ort
    import torch

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    heads, head = kv_shape(model)
    layers = model.config.num_hidden_layers
    ids = np.random.default_rng(SEED).integers(0, model.config.vocab_size, (1, prompt))
    past = {f"past_key_values.{i}.{k}": np.zeros((1, heads, 0, head), np.float32)
            for i in range(layers) for k in ("key", "value")}
    tokens, length, feed = [], 0, ids
    for _ in range(steps):
        n = feed.shape[1]
        feeds = {"input_ids": feed, "attention_mask": np.ones((1, length + n), np.int64), **past}
        if takes_positions:
            feeds["position_ids"] = np.arange(length, length + n)[None]
        results = dict(zip(names, session.run(None, feeds)))
        past = {f"past_key_values.{i}.{k}": results[f"present.{i}.{k}"]
                for i in range(layers) for k in ("key", "value")}
        length += n
        tokens.append(int(results["logits"][0, -1].argmax()))
        feed = np.array([[tokens[-1]]])
    with torch.no_grad():
        full = torch.tensor(np.concatenate([ids, np.array([tokens[:-1]])], axis=1))
        want = model(input_ids=full, use_cache=False).logits[0].numpy()
    got = results["logits"][0, -1]
    if want[-1].argmax() != tokens[-1] or not np.allclose(got, want[-1], atol=1e-4, rtol=1e-3):
        raise SystemExit(f"{path}: the export's cached steps disagree with transformers (max "
                         f"difference {np.abs(got - want[-1]).max():.3g})")


def bench_gpt2(out: Path | None = None) -> Path:
    """The bench GPT-2 (12 layers, hidden 768, 12 heads, vocabulary 50257, 1024 positions: 124M
    parameters, transformers' 0.02 initialisation) exported with its cache to ``out`` (default
    ``~/.cache/opdispatch/bench-models/decoders/gpt2.onnx``; ~650 MB, one file)."""
    return export("gpt2", out or BENCH_DIR / "gpt2.onnx", 12, 768, 50257, 1024)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=("gpt2", "llama"), help="one family (default: both tiny)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--positions", type=int, default=1040,
                        help="the longest sequence (GPT-2's position table)")
    parser.add_argument("--init", type=float, default=0.5,
                        help="the weights' standard deviation (transformers' 0.02 makes a tiny "
                             "model repeat one token; the bench model uses 0.02)")
    parser.add_argument("--out", type=Path, help="the file (with --family)")
    parser.add_argument("--bench", action="store_true",
                        help=f"the bench GPT-2 (12 layers, hidden 768, vocabulary 50257) into {BENCH_DIR}")
    args = parser.parse_args(argv)
    if args.bench:
        bench_gpt2(args.out)
    elif args.family:
        export(args.family, args.out or HERE / f"{args.family}_tiny.onnx", args.layers, args.hidden,
               args.vocab, args.positions, args.init)
    else:
        for family in ("gpt2", "llama"):
            export(family, HERE / f"{family}_tiny.onnx", args.layers, args.hidden, args.vocab,
                   args.positions, args.init)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
