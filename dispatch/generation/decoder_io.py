"""The signature of a decoder exported with its key/value cache.

A decoder step takes the new tokens (``input_ids``), usually an ``attention_mask`` over past and
new positions, sometimes ``position_ids``, and one past tensor per layer for keys and for values;
it returns ``logits`` and the presents: each past with the new positions appended along its
*past axis*. :func:`read_decoder` finds those pieces by name in a model file's declared inputs and
outputs (the spellings of transformers' ``torch.onnx`` exports, optimum's and onnxruntime-genai's
model builder, and a few older ones) and reads heads, head size, element type and the past axis
from the declared shapes; a model that is not such a decoder raises
:class:`~dispatch.errors.ModelLoadError` naming what it found and what was expected.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from dispatch.errors import ModelLoadError

#: the spellings of a past input: (pattern, group of the layer, group of key|value)
PAST_PATTERNS: tuple[tuple[re.Pattern[str], int, int], ...] = (
    (re.compile(r"^past_key_values\.(\d+)\.(key|value)$"), 1, 2),  # transformers, optimum, genai
    (re.compile(r"^past_key_values_(\d+)_(key|value)$"), 1, 2),
    (re.compile(r"^past\.(\d+)\.(key|value)$"), 1, 2),
    (re.compile(r"^past_(key|value)s?[._](\d+)$"), 2, 1),  # past_key.0, past_values_3
)
#: the spellings of a present output, same groups
PRESENT_PATTERNS: tuple[tuple[re.Pattern[str], int, int], ...] = (
    (re.compile(r"^present\.(\d+)\.(key|value)$"), 1, 2),  # transformers, optimum, genai
    (re.compile(r"^present_key_values\.(\d+)\.(key|value)$"), 1, 2),
    (re.compile(r"^present_(\d+)_(key|value)$"), 1, 2),
    (re.compile(r"^present_(key|value)s?[._](\d+)$"), 2, 1),
)
TOKEN_NAMES = ("input_ids", "ids", "tokens")
MASK_NAMES = ("attention_mask",)
POSITION_NAMES = ("position_ids",)
#: optimum's merged decoders: one ``If`` choosing the branch with or without past
CACHE_BRANCH_NAMES = ("use_cache_branch",)
LOGITS_NAMES = ("logits",)
EXPECTED = ("a decoder exported with its cache: an int64/int32 'input_ids' [batch, sequence], "
            "optionally 'attention_mask' and 'position_ids', inputs 'past_key_values.N.key' / "
            "'.value' and outputs 'logits' and 'present.N.key' / '.value' for every layer N")


@dataclass(frozen=True)
class Declared:
    """One declared input or output: its name, numpy element type and dimensions (an ``int``,
    a symbol ``str``, or ``None`` when the file names neither)."""

    name: str
    dtype: np.dtype
    dims: tuple[int | str | None, ...]

    def describe(self) -> str:
        dims = ", ".join("?" if d is None else str(d) for d in self.dims)
        return f"{self.name} {self.dtype.name}[{dims}]"


@dataclass(frozen=True)
class CacheTensor:
    """The past input and present output of one layer's keys or values.

    Attributes:
        layer: the layer number N.
        kind: ``"key"`` or ``"value"``.
        past: the input's name.
        present: the output's name.
        shape: the past's dimensions with the batch and past axes as ``None``.
        past_axis: the axis that grows by the new positions each step.
    """

    layer: int
    kind: str
    past: str
    present: str
    shape: tuple[int | None, ...]
    past_axis: int

    def dims(self, batch: int, length: int) -> tuple[int, ...]:
        """The concrete shape at ``batch`` rows and ``length`` past positions."""
        out = [batch if i == 0 else length if i == self.past_axis else int(d)
               for i, d in enumerate(self.shape)]
        return tuple(out)

    def elements(self, batch: int, length: int) -> int:
        return int(np.prod(self.dims(batch, length), dtype=np.int64))


@dataclass(frozen=True)
class DecoderIO:
    """What a decoder step takes and returns (see the module docstring).

    Attributes:
        path: the model file.
        input_ids: the token input's name; ``ids_dtype`` its element type.
        attention_mask: the mask input's name, or ``None``.
        position_ids: the position input's name, or ``None``.
        cache_branch: optimum's ``use_cache_branch`` input, or ``None`` (fed ``True``: with an
            empty past the cached branch computes what the other would).
        logits: the logits output's name; ``vocab`` its last dimension.
        cache: the past/present pairs, layer by layer, key before value.
        dtype: the element type of every past and present.
        inputs: every declared input, in the model's order; ``outputs`` likewise.
    """

    path: str
    input_ids: str
    ids_dtype: np.dtype
    attention_mask: str | None
    position_ids: str | None
    cache_branch: str | None
    logits: str
    vocab: int
    cache: tuple[CacheTensor, ...]
    dtype: np.dtype
    inputs: tuple[Declared, ...]
    outputs: tuple[Declared, ...]

    @property
    def logits_dtype(self) -> np.dtype:
        return next(o.dtype for o in self.outputs if o.name == self.logits)

    @property
    def layers(self) -> int:
        return len(self.cache) // 2

    @property
    def heads(self) -> int:
        """The key/value heads of layer 0's keys (fewer than the attention heads with grouped
        heads)."""
        return int(self.cache[0].shape[1 if self.cache[0].past_axis != 1 else 2] or 0)

    @property
    def head_size(self) -> int:
        return int(self.cache[0].shape[-1] or 0)

    def past_bytes(self, batch: int, length: int) -> int:
        """The bytes of every past tensor at ``batch`` rows and ``length`` positions."""
        return sum(c.elements(batch, length) for c in self.cache) * self.dtype.itemsize

    def describe(self) -> str:
        extra = ", ".join(n for n in (self.attention_mask, self.position_ids, self.cache_branch) if n)
        return (f"decoder {os.path.basename(self.path)}: {self.layers} layers, {self.heads} key/value "
                f"heads of {self.head_size}, {self.dtype.name} cache on axis "
                f"{self.cache[0].past_axis}, vocabulary {self.vocab}; inputs {self.input_ids}"
                + (f", {extra}" if extra else ""))


def _declared(value: Any) -> Declared:
    from onnx import helper

    tensor = value.type.tensor_type
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type)) if tensor.elem_type else \
        np.dtype("float32")
    dims: list[int | str | None] = []
    for d in tensor.shape.dim:
        dims.append(d.dim_value if d.HasField("dim_value") else
                    d.dim_param if d.HasField("dim_param") else None)
    return Declared(value.name, dtype, tuple(dims))


def _match(names: list[str], patterns: tuple[tuple[re.Pattern[str], int, int], ...]
           ) -> dict[tuple[int, str], str]:
    found: dict[tuple[int, str], str] = {}
    for name in names:
        for pattern, layer, kind in patterns:
            m = pattern.match(name)
            if m:
                found[(int(m.group(layer)), m.group(kind))] = name
                break
    return found


def _first(declared: dict[str, Declared], names: tuple[str, ...]) -> str | None:
    return next((n for n in names if n in declared), None)


def _listing(values: tuple[Declared, ...]) -> str:
    return "; ".join(v.describe() for v in values) or "none"


def _past_axis(past: Declared, present: Declared | None, where: str) -> int:
    """The axis of ``past`` that grows: the one non-batch dimension that is not a fixed size
    (its symbol differs from the present's at that axis when both are named)."""
    free = [i for i, d in enumerate(past.dims) if i > 0 and not isinstance(d, int)]
    if len(free) > 1 and present is not None and len(present.dims) == len(past.dims):
        free = [i for i in free if present.dims[i] != past.dims[i]] or free
    if len(past.dims) != 4 or len(free) != 1:
        raise ModelLoadError(
            f"{where}: cannot tell which axis of past input {past.describe()} is the past length: "
            f"expected 4 dimensions [batch, heads, past, head size] (or [batch, past, heads, head "
            f"size]) with exactly one symbolic past axis besides the batch")
    return free[0]


#: the attention operators of onnxruntime's tools that take a layer's past key and value
#: (their input positions), whose head size a symbolic ``kv_cache_dim`` leaves to the graph
_PAST_INPUTS = {"GroupQueryAttention": (3, 4), "MultiHeadAttention": (6, 7)}


def attention_head_sizes(graph: Any) -> dict[str, int]:
    """Past input name -> the head size of the attention node that reads it, for decoders whose
    past tensors leave the head size symbolic (onnxruntime-genai's model builder writes
    ``[batch, kv_heads, past_sequence_length, kv_cache_dim]``): from a packed QKV projection's
    weight (``(num_heads + 2 * kv_num_heads) * head`` columns), else the ``scale`` attribute
    (``1 / sqrt(head)``), else a rotary cos cache (``head / 2`` columns)."""
    import onnx

    dims = {i.name: list(i.dims) for i in graph.initializer}
    producers = {o: n for n in graph.node for o in n.output}
    out: dict[str, int] = {}
    for node in graph.node:
        where = _PAST_INPUTS.get(node.op_type)
        if node.domain != "com.microsoft" or where is None or len(node.input) <= where[1]:
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        heads = int(attrs.get("num_heads", 0))
        kv_heads = int(attrs.get("kv_num_heads", heads))
        head = 0
        packed = node.op_type == "GroupQueryAttention" and not (len(node.input) > 1 and node.input[1])
        producer = producers.get(node.input[0])
        if packed and producer is not None and producer.op_type == "MatMul" and heads and kv_heads:
            weight = dims.get(producer.input[1])
            if weight is not None and len(weight) == 2 and weight[1] % (heads + 2 * kv_heads) == 0:
                head = weight[1] // (heads + 2 * kv_heads)
        scale = float(attrs.get("scale", 0.0) or 0.0)
        if not head and scale > 0:
            head = round(scale ** -2)
        if not head and node.op_type == "GroupQueryAttention" and len(node.input) > 7:
            cos = dims.get(node.input[7])
            head = 2 * cos[1] if cos is not None and len(cos) == 2 else 0
        if head > 0:
            for k in where:
                if node.input[k]:
                    out[node.input[k]] = head
    return out


def read_decoder(model: Any) -> DecoderIO:
    """The decoder signature of ``model`` (a path, or an ``onnx.ModelProto``); raises
    :class:`~dispatch.errors.ModelLoadError` naming what was found when it is not a decoder
    with its cache."""
    import onnx

    from dispatch.model_ways import model_file

    path = model_file(model)
    where = f"model {path}"
    try:
        proto = onnx.load(path, load_external_data=False)
    except Exception as exc:  # any unreadable file is the same error to the user
        raise ModelLoadError(f"{where}: cannot be read as ONNX ({exc})") from exc
    initializers = {i.name for i in proto.graph.initializer}
    inputs = tuple(_declared(v) for v in proto.graph.input if v.name not in initializers)
    outputs = tuple(_declared(v) for v in proto.graph.output)
    head_sizes = attention_head_sizes(proto.graph)
    del proto
    by_in = {v.name: v for v in inputs}
    by_out = {v.name: v for v in outputs}
    found = f"inputs: {_listing(inputs)}; outputs: {_listing(outputs)}"

    def refuse(why: str) -> ModelLoadError:
        return ModelLoadError(f"{where} is not a decoder with its key/value cache: {why}. "
                              f"Expected {EXPECTED}. Found {found}")

    pasts = _match(list(by_in), PAST_PATTERNS)
    presents = _match(list(by_out), PRESENT_PATTERNS)
    if not pasts:
        raise refuse("no past key/value inputs")
    if not presents:
        raise refuse("no present key/value outputs")
    if set(pasts) != set(presents):
        missing = sorted(set(pasts) ^ set(presents))
        raise refuse("the past inputs and present outputs do not pair up (unpaired: "
                     + ", ".join(f"layer {n} {k}" for n, k in missing) + ")")
    layers = sorted({n for n, _ in pasts})
    if layers != list(range(len(layers))) or any((n, k) not in pasts for n in layers
                                                 for k in ("key", "value")):
        raise refuse(f"expected a key and a value for every layer 0..{len(layers) - 1}, found "
                     + ", ".join(sorted(pasts.values())))
    ids = _first(by_in, TOKEN_NAMES)
    if ids is None:
        raise refuse(f"no token input (one of {', '.join(TOKEN_NAMES)})")
    if by_in[ids].dtype not in (np.dtype("int64"), np.dtype("int32")) or len(by_in[ids].dims) != 2:
        raise refuse(f"the token input is {by_in[ids].describe()}, expected int64 or int32 "
                     f"[batch, sequence]")
    logits = _first(by_out, LOGITS_NAMES) or next(
        (o.name for o in outputs if o.name not in presents.values()), None)
    if logits is None:
        raise refuse("no logits output")
    vocab = by_out[logits].dims[-1] if by_out[logits].dims else None
    if not isinstance(vocab, int) or len(by_out[logits].dims) != 3:
        raise refuse(f"logits {by_out[logits].describe()}: expected [batch, sequence, vocabulary] "
                     f"with a fixed vocabulary size")
    cache: list[CacheTensor] = []
    dtypes = set()
    for n in layers:
        for kind in ("key", "value"):
            past, present = by_in[pasts[(n, kind)]], by_out[presents[(n, kind)]]
            axis = _past_axis(past, present, where)
            if (len(past.dims) == 4 and axis == 2 and not isinstance(past.dims[3], int)
                    and past.name in head_sizes):  # onnxruntime-genai's builder: kv_cache_dim
                past = replace(past, dims=(*past.dims[:3], head_sizes[past.name]))
            fixed = [d for i, d in enumerate(past.dims) if i not in (0, axis)]
            if not all(isinstance(d, int) and d > 0 for d in fixed):
                raise refuse(f"past {past.describe()}: heads and head size must be fixed sizes")
            if past.dtype != present.dtype:
                raise refuse(f"past {past.describe()} and present {present.describe()} differ in "
                             f"element type")
            dtypes.add(past.dtype)
            shape = tuple(None if i in (0, axis) else int(d) for i, d in enumerate(past.dims))
            cache.append(CacheTensor(n, kind, past.name, present.name, shape, axis))
    if len(dtypes) != 1 or next(iter(dtypes)).kind != "f":
        raise refuse(f"the past tensors' element types are {sorted(d.name for d in dtypes)}: "
                     f"expected one floating type")
    known = {ids, *pasts.values()}
    mask = _first(by_in, MASK_NAMES)
    positions = _first(by_in, POSITION_NAMES)
    branch = _first(by_in, CACHE_BRANCH_NAMES)
    others = [v.describe() for v in inputs if v.name not in known | {mask, positions, branch}]
    if others:
        raise refuse("inputs a decoder step cannot fill: " + ", ".join(others))
    return DecoderIO(path, ids, by_in[ids].dtype, mask, positions, branch, logits, vocab,
                     tuple(cache), next(iter(dtypes)), inputs, outputs)
