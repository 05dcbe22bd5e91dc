"""numpy references of onnxruntime's ``EmbedLayerNormalization`` and ``QEmbedLayerNormalization``
(domain ``com.microsoft``, issue 52): the transformers optimizer's fusion of a BERT-style model's
embeddings, and the dynamic QOperator quantizer's form of it (its tables, gamma and beta int8 or
uint8, dequantized per tensor first; no position_ids). Schemas:
:mod:`dispatch.contrib_schemas_quantized`.

``EmbedLayerNormalization(input_ids, segment_ids?, word_embedding, position_embedding,
segment_embedding?, gamma, beta, mask?, position_ids?)``:

- ``embedding_sum = word_embedding[input_ids] + position_embedding[position] (+
  segment_embedding[segment_ids])``, ``position`` the index of the step (0 to S - 1) or, when
  given, ``position_ids`` ((B, S), or (1, S) shared by the batch);
- ``output``: embedding_sum normalized over its last dimension, ``(s - mean) / sqrt(var +
  epsilon) * gamma + beta`` (epsilon 1e-12 by default), in float64 rounded to the embeddings'
  type;
- ``mask_index`` (B,) int32: the number of elements of each row of mask equal to 1 (other
  values, 2 or -1, are not counted: onnxruntime counts ones); zeros without a mask.

An id outside its table is an error (as in onnxruntime). Not covered (refused, so that the
node runs on onnxruntime): segment_ids without segment_embedding or the reverse, position_ids
of another shape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dispatch.graph import Node
from dispatch.registry import Priority
from impls.numpy.contrib_activations import MS_DOMAIN
from impls.numpy.misc import check_dtypes, first_reason
from impls.numpy.table import impls

Kernel = Callable[..., Any]

#: onnxruntime's default epsilon (1e-12 as a float32)
EMBED_EPSILON = float(np.float32(1e-12))


def _shape(node: Node, k: int) -> tuple[Any, ...] | None:
    v = node.input(k)
    return None if v is None or v.shape is None else tuple(v.shape)


def _embed_reason(node: Node) -> str | None:
    if (node.input(1) is None) != (node.input(4) is None):
        return ("EmbedLayerNormalization with only one of segment_ids and segment_embedding: supported are "
                "both or neither")
    ids = _shape(node, 0)
    if ids is not None and len(ids) != 2:
        return f"EmbedLayerNormalization with input_ids of shape {list(ids)}: supported is 2-D (B, S)"
    for k, name in ((2, "word_embedding"), (3, "position_embedding"), (4, "segment_embedding")):
        s = _shape(node, k)
        if s is not None and len(s) != 2:
            return f"EmbedLayerNormalization with {name} of shape {list(s)}: supported is 2-D (rows, hidden)"
    pos = _shape(node, 8)
    if pos is not None and ids is not None and (len(pos) != 2 or pos[0] not in (1, ids[0])):
        return (f"EmbedLayerNormalization with position_ids of shape {list(pos)}: supported are (B, S) and "
                f"(1, S) (input_ids is {list(ids)})")
    mask = _shape(node, 7)
    if mask is not None and ids is not None and len(mask) != 2:
        return f"EmbedLayerNormalization with mask of shape {list(mask)}: supported is (B, S) like input_ids"
    return None


def _supports_embed(node: Node) -> str | None:
    return first_reason(check_dtypes(node, frozenset({"int32"}), (0, 1, 7, 8)),
                        check_dtypes(node, frozenset({"float32", "float16"}), (2, 3, 4, 5, 6), same=True),
                        _embed_reason(node))


def gather_rows(table: np.ndarray, ids: np.ndarray, what: str) -> np.ndarray:
    """``table[ids]`` in float64; raises where an id is outside the table."""
    rows = table.shape[0]
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= rows):
        bad = ids[(ids < 0) | (ids >= rows)]
        raise ValueError(f"EmbedLayerNormalization: {what} {int(bad.reshape(-1)[0])} is outside the "
                         f"embedding's {rows} rows")
    return table.astype(np.float64)[ids]


@impls.register("EmbedLayerNormalization", "ms_float64", domain=MS_DOMAIN, priority=Priority.DEFAULT,
                supports=_supports_embed)
def ms_embed_layer_norm(node: Node) -> Kernel:
    """com.microsoft EmbedLayerNormalization: summed embeddings, layer-normalized; mask_index."""
    eps = float(node.attr("epsilon", EMBED_EPSILON))
    n_out = len(node.outputs)

    def run(ids: np.ndarray, segment_ids: np.ndarray | None, word: np.ndarray, position: np.ndarray,
            segment: np.ndarray | None, gamma: np.ndarray, beta: np.ndarray, mask: np.ndarray | None = None,
            position_ids: np.ndarray | None = None) -> Any:
        batch, seq = ids.shape
        pos = (np.broadcast_to(np.arange(seq), (batch, seq)) if position_ids is None
               else np.broadcast_to(position_ids, (batch, seq)))
        s = gather_rows(word, ids, "input id") + gather_rows(position, pos, "position")
        if segment is not None and segment_ids is not None:
            s = s + gather_rows(segment, segment_ids, "segment id")
        centered = s - s.mean(axis=-1, keepdims=True)
        y = centered / np.sqrt((centered * centered).mean(axis=-1, keepdims=True) + eps)
        y = y * gamma.astype(np.float64) + beta.astype(np.float64)
        count = (np.zeros(batch, np.int32) if mask is None
                 else (mask.reshape(batch, -1) == 1).sum(axis=1).astype(np.int32))
        outs = (np.ascontiguousarray(y.astype(word.dtype)), count, np.ascontiguousarray(s.astype(word.dtype)))
        return outs[0] if n_out == 1 else outs[:n_out]

    return run


def _float_view(node: Node) -> Node:
    """The EmbedLayerNormalization that a QEmbedLayerNormalization computes once dequantized (its
    first eight inputs, its two outputs)."""
    return Node(name=node.name, op_type="EmbedLayerNormalization", inputs=list(node.inputs[:8]),
                outputs=list(node.outputs[:2]), attrs={"epsilon": node.attr("epsilon", EMBED_EPSILON)},
                domain=MS_DOMAIN, opset=node.opset)


def _supports_qembed(node: Node) -> str | None:
    return first_reason(check_dtypes(node, frozenset({"int32"}), (0, 1, 7)),
                        check_dtypes(node, frozenset({"int8", "uint8"}), (2, 3, 4, 5, 6, 13, 14, 15, 16, 17),
                                     same=True),
                        check_dtypes(node, frozenset({"float32"}), (8, 9, 10, 11, 12)),
                        _embed_reason(_float_view(node)))


def dequantize_per_tensor(q: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> np.ndarray:
    """``(q - zero) * scale`` in float32, scale and zero point one value each (onnxruntime's
    Dequantize)."""
    z = np.float32(np.asarray(zero).reshape(-1)[0])
    return (q.astype(np.float32) - z) * np.float32(np.asarray(scale).reshape(-1)[0])


@impls.register("QEmbedLayerNormalization", "ms_float64", domain=MS_DOMAIN, priority=Priority.DEFAULT,
                supports=_supports_qembed)
def ms_qembed_layer_norm(node: Node) -> Kernel:
    """com.microsoft QEmbedLayerNormalization: the tables, gamma and beta dequantized per tensor
    (``(q - zero) * scale``, float32, as onnxruntime does element by element), then
    EmbedLayerNormalization: ``layernorm_out`` and ``mask_index_out`` (zeros without a mask)."""
    embed = ms_embed_layer_norm(_float_view(node))

    def run(ids: np.ndarray, segment_ids: np.ndarray | None, word: np.ndarray, position: np.ndarray,
            segment: np.ndarray | None, gamma: np.ndarray, beta: np.ndarray, mask: np.ndarray | None,
            word_scale: np.ndarray, position_scale: np.ndarray, segment_scale: np.ndarray | None,
            gamma_scale: np.ndarray, beta_scale: np.ndarray, word_zero: np.ndarray, position_zero: np.ndarray,
            segment_zero: np.ndarray | None, gamma_zero: np.ndarray, beta_zero: np.ndarray) -> Any:
        seg = None if segment is None else dequantize_per_tensor(segment, segment_scale, segment_zero)
        return embed(ids, segment_ids, dequantize_per_tensor(word, word_scale, word_zero),
                     dequantize_per_tensor(position, position_scale, position_zero), seg,
                     dequantize_per_tensor(gamma, gamma_scale, gamma_zero),
                     dequantize_per_tensor(beta, beta_scale, beta_zero), mask)

    return run
