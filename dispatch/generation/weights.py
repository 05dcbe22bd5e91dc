"""Weight-reduced variants of a decoder file, made by onnxruntime's own quantization tools.

A token step reads every weight once, so the bytes of the weights bound its speed
(:mod:`tuner.generation.bandwidth`): int8 weights read a quarter of float32's bytes, 4-bit ones
an eighth (plus their scales). A :class:`WeightRecipe` names one way of making such a variant:

* ``int8``: ``onnxruntime.quantization.quantize_dynamic`` on the ``MatMul`` weights (int8,
  per output channel when ``per_channel``; activations quantized per call:
  ``DynamicQuantizeLinear`` + ``MatMulInteger``);
* ``int4``: ``onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer``, symmetric,
  ``block_size`` weights per scale (32 or 128), ``accuracy_level`` 4 (activations quantized to
  int8 inside the kernel: fast on VNNI CPUs) or 0 (dequantized to float32).

Both tools quantize ``MatMul`` nodes whose weight is an initializer only: a ``Gemm`` with a
constant weight (GPT-2's ``Conv1D`` blocks export as ``Gemm``) is first rewritten as ``MatMul``
(weight transposed when ``transB``) + ``Add`` of its bias, which computes the same. The token
and position embeddings (``Gather``: one row read per token) stay float32. The LM head (the
``MatMul`` producing the logits; GPT-2 ties it to the token embedding and the export writes it
as its own transposed initializer: 154 MB of GPT-2's 650) is quantized only when the recipe says
``head``: it is the largest single weight and the one whose error reaches the logits directly.

Variant files are cached in a folder (``OPDISPATCH_VARIANT_CACHE``, default
``~/.cache/opdispatch/variants``; see :func:`variant_folder`), named by the source file's
content digest and the recipe's :attr:`WeightRecipe.spec`, with a sidecar ``.json`` naming
both; :func:`ensure_variant` returns the cached file or makes it again (a plan records the
recipe, so a process whose cache was emptied rebuilds the same file).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dispatch.errors import PlanError

#: the kinds of recipe
KINDS = ("int8", "int4")
#: the block sizes MatMulNBits takes here
BLOCK_SIZES = (16, 32, 64, 128, 256)
#: the environment variable naming the variant folder
ENV_FOLDER = "OPDISPATCH_VARIANT_CACHE"


@dataclass(frozen=True)
class WeightRecipe:
    """How a weight-reduced variant is made (see the module docstring).

    Attributes:
        kind: ``int8`` or ``int4``.
        head: whether the LM head (the logits' ``MatMul``) is quantized too.
        per_channel: int8: one scale per output channel (else one per tensor).
        block_size: int4: weights per scale along the reduction axis.
        accuracy_level: int4: MatMulNBits' compute type (0: float32 from dequantized weights;
            4: int8 activations).
    """

    kind: str
    head: bool = True
    per_channel: bool = True
    block_size: int = 32
    accuracy_level: int = 4

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise PlanError(f"a weight recipe's kind must be one of {', '.join(KINDS)}, received "
                            f"{self.kind!r}")
        if self.kind == "int4" and self.block_size not in BLOCK_SIZES:
            raise PlanError(f"an int4 recipe's block_size must be one of {BLOCK_SIZES}, received "
                            f"{self.block_size!r}")
        if self.kind == "int4" and self.accuracy_level not in (0, 1, 2, 3, 4):
            raise PlanError(f"an int4 recipe's accuracy_level must be 0..4, received "
                            f"{self.accuracy_level!r}")

    @property
    def spec(self) -> str:
        """A short unique name: ``int8-pc-head``, ``int4-b32-a4``..."""
        body = (f"int8-{'pc' if self.per_channel else 'pt'}" if self.kind == "int8"
                else f"int4-b{self.block_size}-a{self.accuracy_level}")
        return body + ("-head" if self.head else "")

    def describe(self) -> str:
        if self.kind == "int8":
            what = (f"int8 weights ({'per channel' if self.per_channel else 'per tensor'}, "
                    f"quantize_dynamic)")
        else:
            what = (f"4-bit weights (MatMulNBits, symmetric, block {self.block_size}, "
                    f"accuracy level {self.accuracy_level})")
        return what + ("; LM head quantized" if self.head else "; LM head float32")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> WeightRecipe:
        if not isinstance(data, dict) or data.get("kind") not in KINDS:
            raise PlanError(f"a weight recipe must be {{'kind': one of {list(KINDS)}, ...}}, "
                            f"received {data!r}")
        fields = {k: data[k] for k in ("kind", "head", "per_channel", "block_size",
                                       "accuracy_level") if k in data}
        return cls(**fields)


def file_digest(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def variant_folder(folder: str | os.PathLike | None = None) -> Path:
    """The folder variant files are cached in: ``folder``, else ``$OPDISPATCH_VARIANT_CACHE``,
    else ``variants`` beside the configured graph cache's folder (``~/.cache/opdispatch``)."""
    if folder is not None:
        return Path(folder)
    env = os.environ.get(ENV_FOLDER)
    if env:
        return Path(env)
    from dispatch.config import _cache_dir

    return _cache_dir() / "variants"


def variant_path(digest: str, recipe: WeightRecipe, folder: str | os.PathLike | None = None) -> Path:
    """Where the variant of the file of content ``digest`` made by ``recipe`` is cached."""
    return variant_folder(folder) / f"{digest[:32]}-{recipe.spec}.onnx"


def _logits_matmul(model: Any) -> str | None:
    """The name of the ``MatMul`` producing the model's logits (the LM head), if any."""
    producers = {out: node for node in model.graph.node for out in node.output}
    names = [o.name for o in model.graph.output]
    target = "logits" if "logits" in names else (names[0] if names else None)
    node = producers.get(target) if target else None
    while node is not None and node.op_type in ("Reshape", "Identity", "Cast"):
        node = producers.get(node.input[0])
    return node.name if node is not None and node.op_type in ("MatMul", "Gemm") else None


def gemm_as_matmul(model: Any) -> int:
    """Rewrite, in place, each ``Gemm`` of ``model`` with a constant 2-D weight, ``transA`` 0 and
    ``alpha`` 1 as ``MatMul`` (weight transposed when ``transB``) + ``Add`` (times ``beta``) of
    its bias: the quantizers handle ``MatMul`` only. Returns how many were rewritten."""
    import numpy as np
    from onnx import helper, numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    done = 0
    nodes = []
    for node in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        weight = inits.get(node.input[1]) if node.op_type == "Gemm" and len(node.input) > 1 else None
        if (weight is None or attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0
                or len(weight.dims) != 2):
            nodes.append(node)
            continue
        name = node.name or f"gemm_{done}"
        w_name = node.input[1]
        if attrs.get("transB", 0):
            w_name = f"{name}/weight_t"
            array = numpy_helper.to_array(weight).T.copy()
            model.graph.initializer.append(numpy_helper.from_array(array, w_name))
        bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
        out = node.output[0]
        mm_out = f"{name}/matmul_out" if bias else out
        nodes.append(helper.make_node("MatMul", [node.input[0], w_name], [mm_out], name=f"{name}/MatMul"))
        if bias:
            beta = float(attrs.get("beta", 1.0))
            if beta != 1.0:
                b = numpy_helper.to_array(inits[bias]) * np.float32(beta) if bias in inits else None
                if b is None:
                    nodes[-1] = node  # a computed bias scaled by beta: leave this Gemm
                    continue
                bias = f"{name}/bias_scaled"
                model.graph.initializer.append(numpy_helper.from_array(b.astype(np.float32), bias))
            nodes.append(helper.make_node("Add", [mm_out, bias], [out], name=f"{name}/Add"))
        done += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return done


def make_variant(source: str | os.PathLike, recipe: WeightRecipe, dest: str | os.PathLike) -> Path:
    """Write the variant of the decoder file ``source`` made by ``recipe`` to ``dest``."""
    import onnx

    model = onnx.load(os.fspath(source))
    gemm_as_matmul(model)
    head = _logits_matmul(model)
    exclude = [] if recipe.head or head is None else [head]
    dest = Path(dest)
    # the tools log every node they skip (INFO) and advise pre-processing (a root WARNING)
    quiet, root = logging.getLogger("onnxruntime.quantization"), logging.getLogger()
    levels = quiet.level, root.level
    quiet.setLevel(logging.WARNING)
    root.setLevel(max(root.level, logging.ERROR))
    try:
        if recipe.kind == "int8":
            from onnxruntime.quantization import QuantType, quantize_dynamic

            with tempfile.TemporaryDirectory() as tmp:
                staged = Path(tmp) / "source.onnx"
                onnx.save(model, os.fspath(staged))
                quantize_dynamic(staged, dest, op_types_to_quantize=["MatMul"],
                                 per_channel=recipe.per_channel, weight_type=QuantType.QInt8,
                                 nodes_to_exclude=exclude,
                                 extra_options={"MatMulConstBOnly": True})
        else:
            from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

            quant = MatMulNBitsQuantizer(model, bits=4, block_size=recipe.block_size,
                                         is_symmetric=True, accuracy_level=recipe.accuracy_level,
                                         nodes_to_exclude=exclude)
            quant.process()
            onnx.save(quant.model.model, os.fspath(dest))
    finally:
        quiet.setLevel(levels[0])
        root.setLevel(levels[1])
    return dest


def ensure_variant(source: str | os.PathLike, recipe: WeightRecipe, *, digest: str | None = None,
                   folder: str | os.PathLike | None = None) -> tuple[Path, bool]:
    """The cached variant of ``source`` by ``recipe`` (made, atomically, when missing or when
    its sidecar does not name this source and recipe); returns ``(path, made now)``."""
    digest = digest or file_digest(source)
    path = variant_path(digest, recipe, folder)
    sidecar = path.with_suffix(".json")
    want = {"source_digest": digest, "recipe": recipe.to_dict()}
    if path.is_file() and sidecar.is_file():
        try:
            have = json.loads(sidecar.read_text())
            if {k: have.get(k) for k in want} == want and have.get("bytes") == path.stat().st_size:
                return path, False
        except (OSError, ValueError):
            pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.stem, suffix=".tmp.onnx", dir=path.parent)
    os.close(fd)
    try:
        make_variant(source, recipe, tmp)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    sidecar.write_text(json.dumps({**want, "source": os.fspath(source),
                                   "bytes": path.stat().st_size}, indent=1))
    return path, True
