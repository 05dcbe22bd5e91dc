"""numpy reference kernels for shape and data-movement operators.

Every output is row-major contiguous. Where numpy can give that without copying (Reshape,
Flatten, Squeeze, Unsqueeze, a Slice or Split part that is already contiguous) the output is a
view sharing memory with the input; no kernel ever writes into its inputs. Attribute-or-input
forms follow
``node.opset``: Squeeze / Unsqueeze axes and Split's ``split`` become inputs at opset 13,
Slice's starts / ends / axes at 10, Pad's pads at 11.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dispatch.graph import Node
from dispatch.registry import Priority
from impls.numpy.misc import (
    ANY_TYPE,
    as_std,
    check_dtypes,
    first_reason,
    int_list,
    normalize_axes,
    normalize_axis,
)
from impls.numpy.table import impls

Kernel = Callable[..., Any]
INDEX_TYPES = frozenset({"int32", "int64"})
INT64 = frozenset({"int64"})


def _rank(node: Node, i: int = 0) -> int | None:
    v = node.input(i)
    return None if v is None or v.shape is None else len(v.shape)


def _axis_reason(node: Node, axis: int, rank: int | None) -> str | None:
    """Reason when attribute ``axis`` is outside ``[-rank, rank)``."""
    if rank is None:
        return None
    if not -rank <= axis < rank:
        return f"{node.op_type} axis {axis} is out of range for an input of rank {rank}"
    return None


def _needs_input(node: Node, i: int, what: str) -> str | None:
    if node.input(i) is None:
        return f"{node.op_type} at opset {node.opset} needs the {what} input (input {i})"
    return None


# -- Reshape ---------------------------------------------------------------------------------


def reshape_target(shape: Sequence[int], in_shape: Sequence[int], allowzero: bool) -> list[int]:
    """ONNX Reshape's output shape: 0 copies the input dim (unless ``allowzero``), one -1 is
    inferred from the remaining size."""
    dims = [int(d) for d in shape]
    if dims.count(-1) > 1:
        raise ValueError(f"Reshape shape {dims} has more than one -1")
    if any(d < -1 for d in dims):
        raise ValueError(f"Reshape shape {dims} has a negative dimension other than -1")
    if allowzero and 0 in dims and -1 in dims:
        raise ValueError(f"Reshape with allowzero=1 cannot combine 0 and -1 (shape {dims})")
    if not allowzero:
        for i, d in enumerate(dims):
            if d == 0:
                if i >= len(in_shape):
                    raise ValueError(
                        f"Reshape shape {dims} copies dim {i} (0) but the input has rank "
                        f"{len(in_shape)}"
                    )
                dims[i] = int(in_shape[i])
    total = math.prod(in_shape)
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        if known == 0 or total % known:
            raise ValueError(
                f"Reshape cannot infer -1 in {dims} for an input of shape {tuple(in_shape)}"
            )
        dims[dims.index(-1)] = total // known
    if math.prod(dims) != total:
        raise ValueError(f"Reshape cannot turn shape {tuple(in_shape)} into {dims}")
    return dims


def _supports_reshape(node: Node) -> str | None:
    return first_reason(_needs_input(node, 1, "shape"), check_dtypes(node, INT64, (1,)))


@impls.register("Reshape", "view", priority=Priority.DEFAULT, supports=_supports_reshape)
def reshape_view(node: Node) -> Kernel:
    """Reshape: a view with ONNX's 0 / -1 / allowzero rules."""
    allowzero = node.opset >= 14 and bool(node.attr("allowzero", 0))

    def run(x: np.ndarray, shape: np.ndarray) -> np.ndarray:
        return as_std(x.reshape(reshape_target(int_list(shape), x.shape, allowzero)))

    return run


# -- Flatten ---------------------------------------------------------------------------------


def _supports_flatten(node: Node) -> str | None:
    rank = _rank(node)
    axis = int(node.attr("axis", 1))
    if rank is not None and not -rank <= axis <= rank:
        return f"Flatten axis {axis} is out of range [-{rank}, {rank}]"
    return None


@impls.register("Flatten", "view", priority=Priority.DEFAULT, supports=_supports_flatten)
def flatten_view(node: Node) -> Kernel:
    """Flatten: a 2-D view (prod(dims[:axis]), prod(dims[axis:]))."""
    axis = int(node.attr("axis", 1))

    def run(x: np.ndarray) -> np.ndarray:
        a = axis + x.ndim if axis < 0 else axis
        if not 0 <= a <= x.ndim:
            raise ValueError(f"Flatten axis {axis} is out of range for rank {x.ndim}")
        return as_std(x.reshape(math.prod(x.shape[:a]), math.prod(x.shape[a:])))

    return run


# -- Transpose -------------------------------------------------------------------------------


def _supports_transpose(node: Node) -> str | None:
    perm = node.attr("perm")
    rank = _rank(node)
    if perm is None or rank is None:
        return None
    if sorted(int(p) for p in perm) != list(range(rank)):
        return f"Transpose perm {list(perm)} is not a permutation of the {rank} input axes"
    return None


@impls.register("Transpose", "copy", priority=Priority.DEFAULT, supports=_supports_transpose)
def transpose_copy(node: Node) -> Kernel:
    """Transpose: np.transpose copied into a contiguous array (perm defaults to reversed)."""
    perm = node.attr("perm")
    axes = None if perm is None else tuple(int(p) for p in perm)

    def run(x: np.ndarray) -> np.ndarray:
        return as_std(np.transpose(x, axes))

    return run


# -- Squeeze / Unsqueeze ---------------------------------------------------------------------


def _squeeze_axes_reason(node: Node) -> str | None:
    if node.opset < 13 and node.input(1) is not None:
        return f"{node.op_type} at opset {node.opset} takes axes as an attribute, not an input"
    return check_dtypes(node, INT64, (1,))


@impls.register("Squeeze", "view", priority=Priority.DEFAULT, supports=_squeeze_axes_reason)
def squeeze_view(node: Node) -> Kernel:
    """Squeeze: drop the listed 1-dims (all 1-dims without axes)."""
    from_input = node.opset >= 13
    attr_axes = None if from_input else node.attr("axes")

    def run(x: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
        listed = axes if from_input else attr_axes
        if listed is None or len(int_list(listed)) == 0:
            return as_std(x.reshape([d for d in x.shape if d != 1]))
        ax = normalize_axes(int_list(listed), x.ndim)
        bad = [a for a in ax if x.shape[a] != 1]
        if bad:
            raise ValueError(f"Squeeze axes {bad} of shape {x.shape} are not of size 1")
        return as_std(x.reshape([d for i, d in enumerate(x.shape) if i not in ax]))

    return run


def _supports_unsqueeze(node: Node) -> str | None:
    if node.opset >= 13:
        return first_reason(_needs_input(node, 1, "axes"), check_dtypes(node, INT64, (1,)))
    if node.attr("axes") is None:
        return f"Unsqueeze at opset {node.opset} needs the axes attribute"
    return _squeeze_axes_reason(node)


@impls.register("Unsqueeze", "view", priority=Priority.DEFAULT, supports=_supports_unsqueeze)
def unsqueeze_view(node: Node) -> Kernel:
    """Unsqueeze: insert 1-dims at the listed axes of the output."""
    from_input = node.opset >= 13
    attr_axes = None if from_input else node.attr("axes")

    def run(x: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
        listed = int_list(axes if from_input else attr_axes)
        out_rank = x.ndim + len(listed)
        ax = set(normalize_axes(listed, out_rank))
        dims = iter(x.shape)
        return as_std(x.reshape([1 if i in ax else next(dims) for i in range(out_rank)]))

    return run


# -- Concat ----------------------------------------------------------------------------------


def _supports_concat(node: Node) -> str | None:
    if not node.inputs or any(v is None for v in node.inputs):
        return "Concat needs one or more (non-omitted) inputs"
    if node.attr("axis") is None:
        return "Concat needs the axis attribute"
    return first_reason(
        _axis_reason(node, int(node.attr("axis")), _rank(node)),
        check_dtypes(node, ANY_TYPE, range(len(node.inputs)), same=True),
    )


@impls.register("Concat", "concatenate", priority=Priority.DEFAULT, supports=_supports_concat)
def concat_concatenate(node: Node) -> Kernel:
    """Concat: np.concatenate along axis (negative counts from the end)."""
    axis = int(node.attr("axis"))

    def run(*xs: np.ndarray) -> np.ndarray:
        a = normalize_axis(axis, xs[0].ndim)
        return as_std(np.concatenate(xs, axis=a))

    return run


# -- Split -----------------------------------------------------------------------------------


def split_sizes(
    dim: int, split: Sequence[int] | None, n_out: int, num_outputs: int | None
) -> list[int]:
    """Chunk sizes of Split: the explicit ``split``, else equal chunks (the last one smaller
    when ``dim`` does not divide, as opset 18 defines)."""
    if split is not None and len(split) > 0:
        sizes = [int(s) for s in split]
        if sum(sizes) != dim or any(s < 0 for s in sizes):
            raise ValueError(f"Split sizes {sizes} do not add up to the dimension {dim}")
        if len(sizes) != n_out:
            raise ValueError(f"Split has {len(sizes)} sizes but {n_out} outputs")
        return sizes
    n = num_outputs if num_outputs is not None else n_out
    if n != n_out:
        raise ValueError(f"Split num_outputs={n} but the node has {n_out} outputs")
    if dim % n == 0:
        return [dim // n] * n
    chunk = -(-dim // n)
    last = dim - chunk * (n - 1)
    if last < 0:  # e.g. 5 into 4: chunks of 2 leave -1 for the last one
        raise ValueError(f"Split cannot cut a dimension of {dim} into {n} chunks of {chunk}")
    return [chunk] * (n - 1) + [last]


def _supports_split(node: Node) -> str | None:
    if node.opset < 13 and node.input(1) is not None:
        return f"Split at opset {node.opset} takes split as an attribute, not an input"
    return first_reason(
        _axis_reason(node, int(node.attr("axis", 0)), _rank(node)),
        check_dtypes(node, INT64, (1,)),
    )


@impls.register("Split", "slices", priority=Priority.DEFAULT, supports=_supports_split)
def split_slices(node: Node) -> Kernel:
    """Split: consecutive slices along axis (uneven last chunk per opset 18)."""
    axis = int(node.attr("axis", 0))
    n_out = len(node.outputs)
    from_input = node.opset >= 13
    attr_split = None if from_input else node.attr("split")
    num_outputs = node.attr("num_outputs") if node.opset >= 18 else None

    def run(x: np.ndarray, split: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
        a = normalize_axis(axis, x.ndim)
        listed = split if from_input else attr_split
        sizes = split_sizes(
            x.shape[a], None if listed is None else int_list(listed), n_out, num_outputs
        )
        bounds = np.cumsum([0, *sizes]).tolist()
        index: list[slice] = [slice(None)] * x.ndim
        outs = []
        for lo, hi in itertools.pairwise(bounds):
            index[a] = slice(lo, hi)
            outs.append(as_std(x[tuple(index)]))
        return tuple(outs)

    return run


# -- Slice -----------------------------------------------------------------------------------


def _slice_bounds(dim: int, start: int, end: int, step: int) -> slice:
    """One axis of ONNX Slice: negative starts/ends count from the end, then starts clamp to
    [0, dim] (step > 0) or [0, dim-1] (step < 0) and ends to [0, dim] or [-1, dim-1].

    Python's own slice clamping differs for a negative step with ``start < -dim`` (Python
    yields nothing, ONNX starts at 0), so the bounds are clamped here explicitly.
    """
    if start < 0:
        start += dim
    if end < 0:
        end += dim
    if step > 0:
        return slice(min(max(start, 0), dim), min(max(end, 0), dim), step)
    start = min(max(start, 0), dim - 1)
    end = min(max(end, -1), dim - 1)
    if start < 0:  # dim == 0: nothing to take
        return slice(0, 0, step)
    return slice(start, None if end < 0 else end, step)


def slice_index(
    shape: Sequence[int],
    starts: Sequence[int],
    ends: Sequence[int],
    axes: Sequence[int] | None,
    steps: Sequence[int] | None,
) -> tuple[slice, ...]:
    """The numpy index of an ONNX Slice of a tensor of ``shape``."""
    rank = len(shape)
    if len(starts) != len(ends):
        raise ValueError(f"Slice starts {list(starts)} and ends {list(ends)} differ in length")
    ax = list(range(len(starts))) if axes is None or len(axes) == 0 else list(axes)
    st = [1] * len(starts) if steps is None or len(steps) == 0 else list(steps)
    if not len(ax) == len(st) == len(starts):
        raise ValueError(f"Slice axes {ax} / steps {st} do not match starts {list(starts)}")
    index = [slice(None)] * rank
    for a, b, e, s in zip(normalize_axes(ax, rank), starts, ends, st, strict=True):
        if s == 0:
            raise ValueError("Slice step cannot be 0")
        index[a] = _slice_bounds(int(shape[a]), int(b), int(e), int(s))
    return tuple(index)


def _supports_slice(node: Node) -> str | None:
    if node.opset < 10:
        if node.attr("starts") is None or node.attr("ends") is None:
            return f"Slice at opset {node.opset} needs the starts and ends attributes"
        return None
    return first_reason(
        _needs_input(node, 1, "starts"),
        _needs_input(node, 2, "ends"),
        check_dtypes(node, INDEX_TYPES, (1, 2, 3, 4), same=True),
    )


def _opt_list(x: Any) -> list[int] | None:
    return None if x is None else int_list(x)


@impls.register("Slice", "basic", priority=Priority.DEFAULT, supports=_supports_slice)
def slice_basic(node: Node) -> Kernel:
    """Slice: numpy basic indexing with ONNX clamping (negative steps too), made contiguous."""
    if node.opset < 10:
        starts, ends = int_list(node.attr("starts")), int_list(node.attr("ends"))
        axes = _opt_list(node.attr("axes"))

        def run_attr(x: np.ndarray) -> np.ndarray:
            return as_std(x[slice_index(x.shape, starts, ends, axes, None)])

        return run_attr

    def run(
        x: np.ndarray,
        starts: np.ndarray,
        ends: np.ndarray,
        axes: np.ndarray | None = None,
        steps: np.ndarray | None = None,
    ) -> np.ndarray:
        index = slice_index(
            x.shape, int_list(starts), int_list(ends), _opt_list(axes), _opt_list(steps)
        )
        return as_std(x[index])

    return run


# -- Gather ----------------------------------------------------------------------------------


def _supports_gather(node: Node) -> str | None:
    return first_reason(
        _needs_input(node, 1, "indices"),
        _axis_reason(node, int(node.attr("axis", 0)), _rank(node)),
        check_dtypes(node, INDEX_TYPES, (1,)),
    )


@impls.register("Gather", "take", priority=Priority.DEFAULT, supports=_supports_gather)
def gather_take(node: Node) -> Kernel:
    """Gather: np.take along axis (negative indices count from the end)."""
    axis = int(node.attr("axis", 0))

    def run(x: np.ndarray, indices: np.ndarray) -> np.ndarray:
        a = normalize_axis(axis, x.ndim)
        n = x.shape[a]
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"Gather indices outside [-{n}, {n - 1}] along axis {axis}")
        return as_std(np.take(x, idx, axis=a))

    return run


# -- Shape / Size ----------------------------------------------------------------------------


@impls.register("Shape", "static", priority=Priority.DEFAULT)
def shape_static(node: Node) -> Kernel:
    """Shape: the input's dims as int64, sliced by start / end (opset 15)."""
    start = int(node.attr("start", 0)) if node.opset >= 15 else 0
    end = node.attr("end") if node.opset >= 15 else None
    stop = None if end is None else int(end)

    def run(x: np.ndarray) -> np.ndarray:
        return np.array(x.shape[start:stop], dtype=np.int64)

    return run


@impls.register("Size", "static", priority=Priority.DEFAULT)
def size_static(node: Node) -> Kernel:
    """Size: the number of elements as an int64 scalar."""

    def run(x: np.ndarray) -> np.ndarray:
        return np.array(x.size, dtype=np.int64)

    return run


# -- Expand / Tile ---------------------------------------------------------------------------


def _supports_expand(node: Node) -> str | None:
    return first_reason(_needs_input(node, 1, "shape"), check_dtypes(node, INT64, (1,)))


@impls.register("Expand", "broadcast", priority=Priority.DEFAULT, supports=_supports_expand)
def expand_broadcast(node: Node) -> Kernel:
    """Expand: np.broadcast_to the bidirectional broadcast of input and shape, copied."""

    def run(x: np.ndarray, shape: np.ndarray) -> np.ndarray:
        out = np.broadcast_shapes(x.shape, tuple(int_list(shape)))
        return np.array(np.broadcast_to(x, out), order="C")

    return run


def _supports_tile(node: Node) -> str | None:
    return first_reason(_needs_input(node, 1, "repeats"), check_dtypes(node, INT64, (1,)))


@impls.register("Tile", "tile", priority=Priority.DEFAULT, supports=_supports_tile)
def tile_tile(node: Node) -> Kernel:
    """Tile: np.tile with one repeat count per axis."""

    def run(x: np.ndarray, repeats: np.ndarray) -> np.ndarray:
        reps = int_list(repeats)
        if len(reps) != x.ndim or any(r < 0 for r in reps):
            raise ValueError(f"Tile repeats {reps} must hold {x.ndim} non-negative counts")
        return as_std(np.tile(x, reps))

    return run


# -- Pad -------------------------------------------------------------------------------------

_PAD_MODES = ("constant", "reflect", "edge", "wrap")


def _supports_pad(node: Node) -> str | None:
    mode = node.attr("mode", "constant")
    if mode not in _PAD_MODES or (mode == "wrap" and node.opset < 19):
        return (f"Pad mode {mode!r} is not supported at opset {node.opset}; "
                "modes: constant, reflect, edge (wrap from 19)")
    if node.opset < 11:
        return None if node.attr("pads") is not None else "Pad needs the pads attribute"
    return first_reason(
        _needs_input(node, 1, "pads"),
        check_dtypes(node, INT64, (1,)),
        check_dtypes(node, INDEX_TYPES, (3,)),
    )


def pad_array(
    x: np.ndarray, pads: Sequence[int], mode: str, value: Any, axes: Sequence[int] | None
) -> np.ndarray:
    """ONNX Pad: ``pads`` = [begin per axis..., end per axis...]; negative pads crop first."""
    ax = list(range(x.ndim)) if axes is None else list(normalize_axes(axes, x.ndim))
    if len(pads) != 2 * len(ax):
        raise ValueError(f"Pad pads {list(pads)} must hold 2 x {len(ax)} values")
    width = [(0, 0)] * x.ndim
    crop = [slice(None)] * x.ndim
    for k, a in enumerate(ax):
        b, e = int(pads[k]), int(pads[k + len(ax)])
        crop[a] = slice(max(-b, 0), x.shape[a] - max(-e, 0))
        width[a] = (max(b, 0), max(e, 0))
    y = x[tuple(crop)]
    if mode == "constant":
        with np.errstate(all="ignore"):
            fill = np.asarray(value).astype(x.dtype)
        return np.pad(y, width, mode="constant", constant_values=fill)
    return np.pad(y, width, mode=mode)


@impls.register("Pad", "pad", priority=Priority.DEFAULT, supports=_supports_pad)
def pad_pad(node: Node) -> Kernel:
    """Pad: np.pad (constant / reflect / edge / wrap) after cropping negative pads."""
    mode = node.attr("mode", "constant")
    if node.opset < 11:
        pads = int_list(node.attr("pads"))
        value = float(node.attr("value", 0.0))

        def run_attr(x: np.ndarray) -> np.ndarray:
            return as_std(pad_array(x, pads, mode, value, None))

        return run_attr

    def run(
        x: np.ndarray,
        pads: np.ndarray,
        constant_value: np.ndarray | None = None,
        axes: np.ndarray | None = None,
    ) -> np.ndarray:
        value = 0 if constant_value is None or np.size(constant_value) == 0 else constant_value
        value = np.asarray(value).reshape(-1)[0] if np.ndim(value) else value
        return as_std(pad_array(x, int_list(pads), mode, value, _opt_list(axes)))

    return run
