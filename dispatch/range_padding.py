"""Padding a request up to a coarser length, only where the outputs stay exact (issue 51).

A model that takes an attention mask ignores the positions the mask zeroes, so a request can
be padded (ids, mask and every other input of the ranged axis with zeros) to the next multiple
of a step and its outputs cut back to the real length: the way then meets a handful of shapes
instead of every length (fewer first runs, fewer shapes to keep warm). Whether the outputs stay
the same is never assumed: the tuner runs both at every sample shape and rejects the padded way,
with the reason, wherever the outputs at the real positions differ
(:mod:`tuner.shapes.measure`). Only ranges of one axis are padded.

A padded way is named ``BASE+padSTEP`` (``onnxruntime+pad16``); which output axes follow the
ranged axis (cut back after the run) is found by the tuner and kept in the range plan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from dispatch.errors import PlanError
from dispatch.model_ways import WayRunner
from dispatch.shape_range import ShapeRange

#: the step padded ways round lengths up to
PAD_STEP = 16
#: ``BASE+padSTEP``
PAD_MARK = "+pad"


def padded_name(base: str, step: int = PAD_STEP) -> str:
    return f"{base}{PAD_MARK}{step}"


def split_name(name: str) -> tuple[str, int]:
    """``("onnxruntime", 16)`` for ``onnxruntime+pad16``; ``(name, 0)`` for an unpadded way."""
    base, mark, step = name.partition(PAD_MARK)
    if not mark:
        return name, 0
    try:
        value = int(step)
    except ValueError:
        value = 0
    if value < 2:
        raise PlanError(f"malformed padded way {name!r}: expected BASE{PAD_MARK}STEP, STEP >= 2")
    return base, value


def mask_inputs(names: Sequence[str]) -> list[str]:
    """The inputs that look like an attention mask (what makes padding worth trying)."""
    return [n for n in names if "mask" in n.lower()]


def padded_length(value: int, step: int, hi: int) -> int:
    """``value`` rounded up to a multiple of ``step``, at most ``hi``."""
    return min(hi, -(-value // step) * step)


def pad_feeds(shape_range: ShapeRange, feeds: Mapping[str, np.ndarray], value: int,
              target: int) -> dict[str, np.ndarray]:
    """``feeds`` (at length ``value`` on the range's one axis) padded with zeros to ``target``."""
    (_, _, at), = shape_range.axes
    out = dict(feeds)
    for name, axis in at:
        arr = np.asarray(feeds[name])
        width = [(0, 0)] * arr.ndim
        width[axis] = (0, target - value)
        out[name] = np.pad(arr, width)
    return out


def unpad(outputs: Sequence[np.ndarray], names: Sequence[str],
          axes: Mapping[str, Sequence[int]], value: int) -> list[np.ndarray]:
    """The outputs of a padded run cut back to length ``value`` on the ``axes`` that follow the
    ranged axis (output name -> axes)."""
    out = []
    for name, arr in zip(names, outputs):
        for axis in axes.get(name, ()):
            arr = np.take(arr, np.arange(value), axis=axis)
        out.append(arr)
    return out


def following_axes(padded: Sequence[np.ndarray], plain: Sequence[np.ndarray],
                   names: Sequence[str], value: int, target: int) -> dict[str, list[int]] | str:
    """Which output axes follow the ranged axis (size ``target`` padded, ``value`` plain), or
    why the outputs cannot be cut back (an axis that changed some other way)."""
    found: dict[str, list[int]] = {}
    for name, a, b in zip(names, padded, plain):
        a, b = np.asarray(a), np.asarray(b)
        if a.ndim != b.ndim:
            return f"output {name!r} has rank {a.ndim} padded, {b.ndim} not"
        axes = []
        for k, (m, n) in enumerate(zip(a.shape, b.shape)):
            if m == n:
                continue
            if (m, n) != (target, value):
                return (f"output {name!r} axis {k} is {m} padded to {target} and {n} at "
                        f"{value}: it does not follow the padded axis one to one")
            axes.append(k)
        found[name] = axes
    return found


def padded_runner(base: WayRunner, shape_range: ShapeRange, step: int,
                  axes: Mapping[str, Sequence[int]], names: Sequence[str]) -> WayRunner:
    """``base`` fed padded requests, its outputs cut back."""
    (_, (_, hi), at), = shape_range.axes
    first_input, first_axis = at[0]

    def run(feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        value = int(np.shape(feeds[first_input])[first_axis])
        target = padded_length(value, step, hi)
        if target == value:
            return list(base(feeds))
        outs = base(pad_feeds(shape_range, feeds, value, target))
        return unpad(outs, names, axes, value)

    return run
