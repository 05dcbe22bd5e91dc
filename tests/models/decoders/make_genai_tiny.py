"""The tiny Llama-style decoder of make_decoders.py (same seed, 2 layers, hidden 64, vocabulary
256, weights of standard deviation 0.5) through onnxruntime-genai's model builder, as its users
make decoders: GroupQueryAttention with rotary inside, SkipSimplifiedLayerNormalization, and past
tensors whose head size is left symbolic (``kv_cache_dim``); ``int4`` adds MatMulNBits weights.

    pip install -r bench/requirements-anchors.txt
    python tests/models/decoders/make_genai_tiny.py       # writes llama_tiny_genai{,_int4}/

The builder needs a tokenizer to load; a tiny byte-level BPE is saved beside the weights
(bench/generation_anchors.py). Only token ids are ever fed to the models.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


def make(precision: str) -> Path:
    sys.path.insert(0, str(ROOT / "bench"))
    import generation_anchors as anchors

    out = HERE / ("llama_tiny_genai" + ("" if precision == "fp32" else f"_{precision}"))
    model = anchors._make_decoders().build("llama", 2, 64, 256, 1040, 0.5)
    with tempfile.TemporaryDirectory() as tmp:
        hf = Path(tmp) / "hf"
        model.save_pretrained(str(hf))
        anchors._tokenizer(hf)
        built = Path(tmp) / "genai"
        cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(built),
               "-p", precision, "-e", "cpu", "-c", str(Path(tmp) / "cache")]
        subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        for name in ("model.onnx", "model.onnx.data", "genai_config.json"):
            if (built / name).exists():
                shutil.copy(built / name, out / name)
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    for p in ("fp32", "int4"):
        make(p)
