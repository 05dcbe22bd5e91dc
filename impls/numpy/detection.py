"""numpy reference kernel of the object-detection operator NonMaxSuppression.

NonMaxSuppression selects, for every batch and class, the boxes of highest score whose
overlap (intersection over union) with every box already selected for that class does not
exceed ``iou_threshold``. The number of selected boxes depends on the values of the inputs,
so the output's shape is known only when the kernel runs: nothing here needs a static shape
(a value may carry ``shape=None``); the shapes are checked on the arrays.

The arithmetic follows onnx's reference evaluator step by step (in the boxes' float32, the
same comparisons in the same order, so that NaN coordinates behave alike), so the selection
and its order match it exactly: per batch, per class, the boxes by descending score, equal
scores by the lower box index, each appended when it survives the boxes selected before it.
A NaN score ranks below every number (the reference's order for NaN scores is whatever its
sort makes of inconsistent comparisons); a score threshold drops it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dispatch.graph import Node
from dispatch.registry import Priority
from impls.numpy.misc import check_dtypes, first_reason
from impls.numpy.table import impls

Kernel = Callable[..., Any]
FLOAT32 = frozenset({"float32"})
INT64 = frozenset({"int64"})


# -- supports --------------------------------------------------------------------------------


def _rank_reason(node: Node, i: int, what: str, rank: int) -> str | None:
    v = node.input(i)
    if v is not None and v.shape is not None and len(v.shape) != rank:
        return (f"NonMaxSuppression {what} (input {i}) must have rank {rank}; received shape "
                f"{list(v.shape)}")
    return None


def _one_element_reason(node: Node, i: int, what: str) -> str | None:
    """Why input ``i`` (a scalar parameter) cannot hold one element, when its shape is known.
    An empty tensor counts as omitted, as onnx's reference and onnxruntime take it."""
    v = node.input(i)
    if v is None or v.shape is None:
        return None
    if math.prod(v.shape) > 1:
        return (f"NonMaxSuppression {what} (input {i}) must hold one element; received shape "
                f"{list(v.shape)}")
    return None


def _box_shape_reason(node: Node) -> str | None:
    """Why the static shapes of boxes [B, N, 4] and scores [B, C, N] do not fit (only the
    dimensions that are known are compared)."""
    boxes, scores = node.input(0), node.input(1)
    bs = None if boxes is None or boxes.shape is None else tuple(boxes.shape)
    ss = None if scores is None or scores.shape is None else tuple(scores.shape)
    if bs is not None and bs[2] != 4:
        return f"NonMaxSuppression boxes must have shape [batches, boxes, 4]; received {list(bs)}"
    if bs is None or ss is None:
        return None
    if bs[0] != ss[0] or bs[1] != ss[2]:
        return (f"NonMaxSuppression boxes {list(bs)} and scores {list(ss)} disagree: expected "
                f"scores of shape [{bs[0]}, classes, {bs[1]}]")
    return None


def _supports_nms(node: Node) -> str | None:
    if node.opset < 10:
        return f"NonMaxSuppression exists from opset 10; the node has opset {node.opset}"
    if node.input(0) is None or node.input(1) is None:
        return "NonMaxSuppression needs the boxes and scores inputs (inputs 0 and 1)"
    cpb = int(node.attr("center_point_box", 0))
    if cpb not in (0, 1):
        return f"NonMaxSuppression center_point_box must be 0 or 1; received {cpb}"
    return first_reason(
        check_dtypes(node, FLOAT32, (0, 1)),
        check_dtypes(node, INT64, (2,)),
        check_dtypes(node, FLOAT32, (3, 4)),
        _rank_reason(node, 0, "boxes", 3),
        _rank_reason(node, 1, "scores", 3),
        _box_shape_reason(node),
        _one_element_reason(node, 2, "max_output_boxes_per_class"),
        _one_element_reason(node, 3, "iou_threshold"),
        _one_element_reason(node, 4, "score_threshold"),
    )


# -- geometry --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Corners:
    """The boxes of one batch as corner coordinates and areas (float32, one entry per box)."""

    x_min: np.ndarray
    x_max: np.ndarray
    y_min: np.ndarray
    y_max: np.ndarray

    @property
    def area(self) -> np.ndarray:
        return (self.x_max - self.x_min) * (self.y_max - self.y_min)

    def take(self, i: Any) -> Corners:
        return Corners(self.x_min[i], self.x_max[i], self.y_min[i], self.y_max[i])


def _ordered(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(min, max) of two coordinates as the reference orders them (``lo >= hi`` swaps; a NaN
    keeps the order given)."""
    swap = lo >= hi
    return np.where(swap, hi, lo), np.where(swap, lo, hi)


def corners(boxes: np.ndarray, center_point_box: bool) -> Corners:
    """Corner form of ``boxes`` [N, 4]: [y1, x1, y2, x2] (either diagonal) or, with
    ``center_point_box``, [x_center, y_center, width, height]."""
    b = boxes
    if center_point_box:
        half_w, half_h = b[:, 2] / 2, b[:, 3] / 2
        return Corners(b[:, 0] - half_w, b[:, 0] + half_w, b[:, 1] - half_h, b[:, 1] + half_h)
    x_min, x_max = _ordered(b[:, 1], b[:, 3])
    y_min, y_max = _ordered(b[:, 0], b[:, 2])
    return Corners(x_min, x_max, y_min, y_max)


def _larger(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Python's ``max(a, b)`` elementwise: ``b`` only where it compares greater."""
    return np.where(b > a, b, a)


def _smaller(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Python's ``min(a, b)`` elementwise: ``b`` only where it compares smaller."""
    return np.where(b < a, b, a)


def suppressed_by(box: Corners, kept: Corners, iou_threshold: Any) -> np.ndarray:
    """Per box of ``kept``: whether it suppresses ``box`` (one box), i.e. their intersection
    over union exceeds ``iou_threshold``; boxes that do not overlap, or of no area, never do."""
    ix_min, ix_max = _larger(box.x_min, kept.x_min), _smaller(box.x_max, kept.x_max)
    iy_min, iy_max = _larger(box.y_min, kept.y_min), _smaller(box.y_max, kept.y_max)
    inter = (ix_max - ix_min) * (iy_max - iy_min)
    area1, area2 = box.area, kept.area
    union = area1 + area2 - inter
    overlap = ~(ix_max <= ix_min) & ~(iy_max <= iy_min) & ~(inter <= 0)
    valid = ~(area1 <= 0) & ~(area2 <= 0) & ~(union <= 0)
    with np.errstate(all="ignore"):
        iou = inter / union
    return overlap & valid & (iou > iou_threshold)


# -- selection -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """The run-time parameters of one NonMaxSuppression call."""

    max_per_class: int
    iou_threshold: Any
    score_threshold: Any | None


def _optional_scalar(x: np.ndarray | None, what: str) -> Any | None:
    """The single element of an optional scalar input; ``None`` when absent or empty."""
    if x is None:
        return None
    a = np.asarray(x)
    if a.size == 0:
        return None
    if a.size != 1:
        raise ValueError(f"NonMaxSuppression {what} must hold one element; received shape "
                         f"{a.shape}")
    return a.reshape(())[()]


def limits(max_output: np.ndarray | None, iou: np.ndarray | None,
           score: np.ndarray | None) -> Limits:
    """The parameters with ONNX's defaults: no box (max 0), IoU threshold 0, no score
    filter. A negative maximum selects nothing."""
    m = _optional_scalar(max_output, "max_output_boxes_per_class")
    t = _optional_scalar(iou, "iou_threshold")
    return Limits(
        max_per_class=0 if m is None else max(int(m), 0),
        iou_threshold=np.float32(0) if t is None else t,
        score_threshold=_optional_scalar(score, "score_threshold"),
    )


def candidates(scores: np.ndarray, score_threshold: Any | None) -> np.ndarray:
    """Box indices by descending score, equal scores by the lower index, keeping only the
    scores above ``score_threshold`` (all of them without one)."""
    idx = np.arange(scores.shape[0], dtype=np.int64)
    if score_threshold is not None:
        idx = idx[scores > score_threshold]
    s = scores[idx]
    order = np.lexsort((idx, -s))
    return idx[order]


def select_class(box: Corners, scores: np.ndarray, lim: Limits) -> list[int]:
    """The box indices selected for one (batch, class), in selection order."""
    kept: list[int] = []
    if lim.max_per_class == 0:
        return kept
    for i in candidates(scores, lim.score_threshold):
        if kept and suppressed_by(box.take(int(i)), box.take(kept), lim.iou_threshold).any():
            continue
        kept.append(int(i))
        if len(kept) >= lim.max_per_class:
            break
    return kept


def _check_shapes(boxes: np.ndarray, scores: np.ndarray) -> None:
    if boxes.ndim != 3 or boxes.shape[2] != 4:
        raise ValueError(f"NonMaxSuppression boxes must have shape [batches, boxes, 4]; "
                         f"received {boxes.shape}")
    if scores.ndim != 3 or scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise ValueError(f"NonMaxSuppression scores must have shape [{boxes.shape[0]}, classes, "
                         f"{boxes.shape[1]}] for boxes {boxes.shape}; received {scores.shape}")


def non_max_suppression(boxes: np.ndarray, scores: np.ndarray, lim: Limits,
                        center_point_box: bool) -> np.ndarray:
    """ONNX NonMaxSuppression: int64 [num_selected, 3] rows (batch, class, box), batch-major,
    then class, then selection order."""
    _check_shapes(boxes, scores)
    rows: list[tuple[int, int, int]] = []
    for b in range(boxes.shape[0]):
        box = corners(boxes[b], center_point_box)
        for c in range(scores.shape[1]):
            rows.extend((b, c, i) for i in select_class(box, scores[b, c], lim))
    return np.array(rows, dtype=np.int64).reshape(len(rows), 3)


@impls.register("NonMaxSuppression", "greedy", priority=Priority.DEFAULT, supports=_supports_nms)
def nms_greedy(node: Node) -> Kernel:
    """NonMaxSuppression: per batch and class, greedy selection by descending score of the
    boxes whose IoU with the boxes kept so far is at most iou_threshold (center_point_box 0:
    [y1, x1, y2, x2], 1: [x_c, y_c, w, h]); output int64 [num_selected, 3]."""
    center = bool(int(node.attr("center_point_box", 0)))

    def run(
        boxes: np.ndarray,
        scores: np.ndarray,
        max_output_boxes_per_class: np.ndarray | None = None,
        iou_threshold: np.ndarray | None = None,
        score_threshold: np.ndarray | None = None,
    ) -> np.ndarray:
        lim = limits(max_output_boxes_per_class, iou_threshold, score_threshold)
        with np.errstate(all="ignore"):
            return non_max_suppression(np.asarray(boxes), np.asarray(scores), lim, center)

    return run
