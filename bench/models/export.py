"""Export a corpus of real-architecture models (Hugging Face transformers, random weights) to
ONNX for the end-to-end model benchmark (bench/test_bench_models.py).

    python bench/models/export.py                 # all models into ~/.cache/opdispatch/bench-models/
    python bench/models/export.py bert vit --out DIR

Every model is built from its transformers config (the defaults, except EfficientNet-B0's
coefficients and the ``_eager`` variants' attention) with seeded random weights
(``torch.manual_seed(0)``; nothing is downloaded from a model hub; BatchNorms calibrated on
random inputs, see :func:`_calibrate_batch_norms`), put in eval mode and exported under
``torch.no_grad()`` by the TorchScript exporter (``dynamo=False``, opset 17), batch 1, static
shapes, one output per model. A model whose file is already in the folder is skipped.
bench/models/README.md says what each model is and which ones opdispatch loads.

torch and transformers are imported here only (inside the functions), never by the package.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

#: where the models go unless ``--out`` (or ``OPDISPATCH_BENCH_MODELS``) says otherwise
DEFAULT_DIR = Path.home() / ".cache" / "opdispatch" / "bench-models"
OPSET = 17
SEQ = 128
IMAGE = (1, 3, 224, 224)


@dataclass(frozen=True)
class ModelSpec:
    """One model of the corpus: how to build it and what its ONNX graph takes and returns."""

    name: str
    description: str
    #: (transformers model class, config class), by name
    classes: tuple[str, str]
    #: ONNX input name -> (shape, "int64" | "float32")
    inputs: dict[str, tuple[tuple[int, ...], str]]
    #: the fields of the model's output that become the graph's outputs
    outputs: tuple[str, ...]
    #: extra keyword arguments of the forward call
    forward_kwargs: tuple[tuple[str, object], ...] = ()
    #: forward arguments that are constants of ``input_ids``' static shape, not graph inputs:
    #: (name, "zeros" | "ones")
    constant_inputs: tuple[tuple[str, str], ...] = ()
    #: arguments of the config class (empty: its defaults)
    config_kwargs: tuple[tuple[str, object], ...] = ()
    #: also write ``NAME.batch.onnx``: the same model exported with a symbolic ``batch`` first
    #: dimension on every input and output (``dynamic_axes``), as a user who serves it with a
    #: batcher exports it (the throughput bench's batched set-up)
    batch_copy: bool = False


_TOKENS = {"input_ids": ((1, SEQ), "int64")}
_BERT = ModelSpec(
    "bert", "BertModel, BertConfig() defaults (BERT-base: 12 layers, hidden 768, 12 heads), sequence 128",
    ("BertModel", "BertConfig"), {**_TOKENS, "attention_mask": ((1, SEQ), "int64")}, ("last_hidden_state",),
    # without token_type_ids BertEmbeddings gathers them from a buffer (GatherElements)
    constant_inputs=(("token_type_ids", "zeros"),))
_GPT2 = ModelSpec(
    "gpt2", "GPT2Model, GPT2Config() defaults (GPT-2 small: 12 layers, hidden 768, 12 heads), "
    "sequence 128, use_cache=False", ("GPT2Model", "GPT2Config"), dict(_TOKENS), ("last_hidden_state",),
    (("use_cache", False),),
    # without an attention_mask transformers checks position_ids for packed sequences with
    # torch.diff, which the TorchScript exporter cannot export (aten::diff)
    constant_inputs=(("attention_mask", "ones"),))
#: transformers' default attention (SDPA) with a mask is exported by the TorchScript exporter as
#: MatMul/Softmax plus Where(IsNaN(softmax), 0, softmax); these variants use the eager
#: attention (the same arithmetic, no IsNaN)
_EAGER = (("attn_implementation", "eager"),)
MODELS: dict[str, ModelSpec] = {m.name: m for m in (
    _BERT,
    _GPT2,
    replace(_BERT, name="bert_eager", description=_BERT.description + ", eager attention",
            config_kwargs=_EAGER),
    replace(_GPT2, name="gpt2_eager", description=_GPT2.description + ", eager attention",
            config_kwargs=_EAGER),
    # all-MiniLM-L6-v2's shape (sentence-transformers' small embedder) with random weights, as
    # `bert` otherwise (SDPA attention, token_type_ids a constant, last_hidden_state only)
    replace(_BERT, name="minilm", description="BertModel with all-MiniLM-L6-v2's shape (6 layers, hidden "
            "384, 12 heads, intermediate 1536, vocab 30522), sequence 128",
            config_kwargs=(("vocab_size", 30522), ("hidden_size", 384), ("num_hidden_layers", 6),
                           ("num_attention_heads", 12), ("intermediate_size", 1536))),
    # a short-query encoder: at sequence 8 each inference reads every weight for 8 tokens
    # only, so grouping requests in batches pays (tuner.throughput.batch; bench/README.md)
    ModelSpec("distilbert_s8", "DistilBertModel, DistilBertConfig() defaults (distilbert-base: 6 "
              "layers, hidden 768, 12 heads), sequence 8", ("DistilBertModel", "DistilBertConfig"),
              {"input_ids": ((1, 8), "int64"), "attention_mask": ((1, 8), "int64")},
              ("last_hidden_state",), batch_copy=True),
    ModelSpec("vit", "ViTModel, ViTConfig() defaults (ViT-B/16: 12 layers, hidden 768), 224x224",
              ("ViTModel", "ViTConfig"), {"pixel_values": (IMAGE, "float32")}, ("last_hidden_state",)),
    ModelSpec("convnext", "ConvNextModel, ConvNextConfig() defaults (ConvNeXt-tiny), 224x224",
              ("ConvNextModel", "ConvNextConfig"), {"pixel_values": (IMAGE, "float32")}, ("pooler_output",)),
    ModelSpec("mobilenet_v2", "MobileNetV2Model, MobileNetV2Config() defaults (width 1.0), 224x224",
              ("MobileNetV2Model", "MobileNetV2Config"), {"pixel_values": (IMAGE, "float32")},
              ("pooler_output",)),
    # its pooler is nn.AvgPool2d(hidden_dim=1280, ceil_mode=True) on the 7x7 map (an AveragePool
    # with a 1280x1280 kernel): the graph returns last_hidden_state (1x1280x7x7) instead.
    # EfficientNetConfig()'s defaults are B7 (width 2.0, depth 3.1, 600x600, head 2560), not B0:
    # B0 is width 1.0, depth 1.0, 224x224, head 1280 (google/efficientnet-b0's config)
    ModelSpec("efficientnet_b0", "EfficientNetModel, EfficientNetConfig with B0's coefficients "
              "(width 1.0, depth 1.0, head 1280; the defaults are B7), 224x224",
              ("EfficientNetModel", "EfficientNetConfig"), {"pixel_values": (IMAGE, "float32")},
              ("last_hidden_state",), config_kwargs=(("width_coefficient", 1.0), ("depth_coefficient", 1.0),
                                                 ("image_size", 224), ("hidden_dim", 1280),
                                                 ("dropout_rate", 0.2))),
)}


def model_dir(out: str | os.PathLike | None = None) -> Path:
    """The folder the models are written to and read from: ``out``, else the environment
    variable ``OPDISPATCH_BENCH_MODELS``, else :data:`DEFAULT_DIR`."""
    return Path(out or os.environ.get("OPDISPATCH_BENCH_MODELS") or DEFAULT_DIR).expanduser()


def _random_inputs(spec: ModelSpec, batch: int = 1, seed: int = 0) -> dict:
    """Seeded random inputs of ``spec``'s shapes (batch ``batch``): token ids in [0, 1000),
    all-ones attention masks, standard normal images."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, (shape, dtype) in spec.inputs.items():
        shape = (batch, *shape[1:])
        if dtype == "int64" and "mask" in name:
            out[name] = torch.ones(shape, dtype=torch.int64)
        elif dtype == "int64":
            out[name] = torch.randint(0, 1000, shape, generator=g, dtype=torch.int64)
        else:
            out[name] = torch.randn(shape, generator=g)
    return out


def _calibrate_batch_norms(model, spec: ModelSpec, batch: int = 4) -> None:
    """Give the BatchNorms of a randomly initialised model the statistics of the activations
    they see (scale 1, shift 0, running mean and variance of one forward pass of ``batch``
    random inputs in training mode), so that activations stay of order 1 through the network.

    transformers initialises BatchNorm scales (EfficientNet) and convolution weights with
    N(0, 0.02) and running statistics of (0, 1): in eval mode the activations then shrink
    layer after layer to ~1e-21 (MobileNetV2) or exactly 0 (EfficientNet), which makes the
    numerical comparison meaningless and the timing unrepresentative (denormal numbers, zeros).
    """
    import torch

    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return
    for bn in bns:
        bn.reset_parameters()  # running stats (0, 1), scale 1, shift 0
        bn.momentum = None  # cumulative average over the calibration batch
    model.train()
    with torch.no_grad():
        model(**_random_inputs(spec, batch, seed=1), **dict(spec.forward_kwargs))
    for bn in bns:
        bn.momentum = 0.1


def build(spec: ModelSpec):
    """The torch module of ``spec``: the transformers model from its config's defaults with
    seeded random weights, in eval mode, wrapped so that it takes the ONNX inputs positionally
    and returns the chosen output fields as a tuple."""
    import torch
    import transformers

    model_cls = getattr(transformers, spec.classes[0])
    config_cls = getattr(transformers, spec.classes[1])
    torch.manual_seed(0)
    model = model_cls(config_cls(**dict(spec.config_kwargs)))
    _calibrate_batch_norms(model, spec)
    model.eval()
    names = tuple(spec.inputs)
    kwargs = dict(spec.forward_kwargs)

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args):
            feeds = dict(zip(names, args))
            for name, fill in spec.constant_inputs:
                feeds[name] = getattr(torch, fill)(spec.inputs["input_ids"][0], dtype=torch.int64)
            res = self.model(**feeds, **kwargs)
            return tuple(getattr(res, f) for f in spec.outputs)

    return Wrapped().eval()


def export(name: str, out: str | os.PathLike | None = None, *, force: bool = False,
           log: Callable[[str], None] = print) -> Path:
    """Write ``NAME.onnx`` (and ``NAME.batch.onnx`` for a spec with ``batch_copy``) into
    :func:`model_dir` (each skipped when it exists, unless ``force``); returns the first one's
    path."""
    spec = MODELS[name]
    folder = model_dir(out)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.onnx"
    for target, batch in ((path, False),
                          *(((folder / f"{name}.batch.onnx", True),) if spec.batch_copy else ())):
        if target.exists() and not force:
            log(f"{name}: {target} exists, skipped")
            continue
        t0 = time.monotonic()
        _write(spec, target, symbolic_batch=batch)
        log(f"{name}: wrote {target} ({target.stat().st_size / 1e6:.1f} MB, {time.monotonic() - t0:.1f} s)")
    return path


def _write(spec: ModelSpec, path: Path, symbolic_batch: bool = False) -> None:
    import torch

    module = build(spec)
    tmp = path.with_suffix(".onnx.tmp")
    names = [*spec.inputs, *spec.outputs]
    with torch.no_grad(), warnings.catch_warnings():
        # the TorchScript exporter's deprecation notice and transformers' tracer warnings
        # (shapes become constants, which is intended: static shapes)
        warnings.simplefilter("ignore")
        torch.onnx.export(module, tuple(_random_inputs(spec).values()), str(tmp), dynamo=False,
                          opset_version=OPSET,
                          input_names=list(spec.inputs), output_names=list(spec.outputs),
                          do_constant_folding=True, external_data=False,
                          dynamic_axes={n: {0: "batch"} for n in names} if symbolic_batch else None)
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", help=f"which models (default: all of {', '.join(MODELS)})")
    ap.add_argument("--out", help=f"folder (default: $OPDISPATCH_BENCH_MODELS or {DEFAULT_DIR})")
    ap.add_argument("--force", action="store_true", help="export again even when the file exists")
    args = ap.parse_args(argv)
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {', '.join(MODELS)}")
    for name in args.models or MODELS:
        export(name, args.out, force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
