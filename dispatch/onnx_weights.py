"""An ONNX model's weights: its initializers, kept out of onnx's checker and shape inference
and read into arrays.

Both the checker and shape inference serialise the whole model, weights included: 4 s of a
BERT-base import went to copying them. What they infer from a weight is its type and shape, so
the import hands them the model without its large initializers (:func:`split_weights`, each
declared as a graph input of its type and shape instead), checks each weight's size against its
dims itself (:func:`check_weight_size`, as onnx's checker would), and reads every initializer,
in the model or in external data files :func:`dispatch.onnx_import.read_model` loaded, into an
array (:func:`read_initializers`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from dispatch.errors import ModelLoadError

#: initializers of more elements than this are kept out of onnx's checker and shape inference
#: (both serialise the whole model: 4 s of a BERT-base import went to copying its weights);
#: what they infer from a weight is its type and shape, which the graph input standing in
#: for it declares. Shapes, axes and pads are far smaller.
WEIGHT_ELEMENTS = 4096


def split_weights(
    proto: onnx.ModelProto, check: bool = True
) -> tuple[onnx.ModelProto, list[onnx.TensorProto]]:
    """``proto`` without its large initializers (each declared as a graph input of its type and
    shape instead), and those, each size checked first with ``check`` (1.2 s of VGG-19: it
    copies them)."""
    g = proto.graph
    large = [t for t in g.initializer if math.prod(t.dims) > WEIGHT_ELEMENTS]
    if not large:
        return proto, []
    for t in large if check else ():  # what onnx's checker would have said of them
        check_weight_size(t)
    light = copy_fields(proto, onnx.ModelProto(), skip="graph")
    copy_fields(g, light.graph, skip="initializer")
    names = {t.name for t in large}
    light.graph.initializer.extend(t for t in g.initializer if t.name not in names)
    listed = {i.name for i in g.input}
    light.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                             for t in large if t.name not in listed)
    return light, large


#: the TensorProto field holding each data type's elements when not in raw_data
_TYPED_FIELDS = ("float_data", "int32_data", "string_data", "int64_data", "double_data",
                 "uint64_data")


#: the data types packing two elements per byte (raw_data and int32_data alike), low nibble first
PACKED_4BIT = frozenset(getattr(onnx.TensorProto, n) for n in ("INT4", "UINT4", "FLOAT4E2M1")
                        if hasattr(onnx.TensorProto, n))


def check_weight_size(t: onnx.TensorProto) -> None:
    """Raise when initializer ``t`` holds another number of elements than its dims claim
    (4-bit types hold two a byte: ``ceil(count / 2)`` bytes, or as many int32_data values)."""
    if t.data_location == onnx.TensorProto.EXTERNAL:
        return  # read_model loaded it, or numpy_helper says what is missing
    count = math.prod(t.dims)
    try:
        itemsize = helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except (KeyError, ValueError, TypeError):
        return  # an unknown type: the import says so
    if t.raw_data:
        have = len(t.raw_data)
        want = -(-count // 2) if t.data_type in PACKED_4BIT else count * itemsize
        if have != want and t.data_type != onnx.TensorProto.STRING:
            raise ModelLoadError(
                f"initializer {t.name!r} claims shape {list(t.dims)} ({want:,} bytes of "
                f"{helper.tensor_dtype_to_string(t.data_type).split('.')[-1].lower()}), but its "
                f"raw_data size ({have} bytes) is too small" if have < want else
                f"initializer {t.name!r} claims shape {list(t.dims)} ({want:,} bytes), but its "
                f"raw_data holds {have:,} bytes")
        return
    held = max(len(getattr(t, f)) for f in _TYPED_FIELDS)
    if t.data_type in PACKED_4BIT:
        count = -(-count // 2)
    if held and held < count:
        raise ModelLoadError(
            f"initializer {t.name!r} claims shape {list(t.dims)} ({count:,} elements), but "
            f"holds {held:,}")


def copy_fields(src: Any, dst: Any, skip: str) -> Any:
    """Copy every set field of protobuf message ``src`` but ``skip`` into ``dst``."""
    for field, value in src.ListFields():
        if field.name == skip:
            continue
        repeated = (field.is_repeated if hasattr(field, "is_repeated")
                    else field.label == field.LABEL_REPEATED)
        if repeated:
            getattr(dst, field.name).extend(value)
        elif field.type == field.TYPE_MESSAGE:
            getattr(dst, field.name).CopyFrom(value)
        else:
            setattr(dst, field.name, value)
    return dst


def read_initializers(graph: onnx.GraphProto,
                      weights: Sequence[onnx.TensorProto] = ()) -> dict[str, np.ndarray]:
    """The arrays of ``graph``'s initializers and of ``weights`` (those :func:`split_weights`
    took out), by name. One that cannot be read, and any sparse initializer, raise
    :class:`~dispatch.errors.ModelLoadError`."""
    arrays: dict[str, np.ndarray] = {}
    for init in [*graph.initializer, *weights]:
        try:
            arrays[init.name] = numpy_helper.to_array(init)
        except Exception as exc:
            raise ModelLoadError(f"initializer {init.name!r} cannot be read: {exc}") from None
    for sp in graph.sparse_initializer:
        raise ModelLoadError(f"sparse initializer {sp.values.name!r} is not supported")
    return arrays
