"""What a Session says of its inputs and outputs (:meth:`dispatch.session.Session.get_inputs`):
:class:`IOInfo`, and onnxruntime's type strings of numpy dtypes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class IOInfo:
    """Name, shape and ONNX type string of a model input or output (like ``NodeArg``); a
    symbolic dimension is its name (``"batch"``) or ``None`` while nothing is planned."""

    name: str
    shape: list[Any]
    type: str
    dtype: np.dtype


#: numpy dtype name -> ONNX element type name, for the common dtypes (checked against onnx's
#: own mapping in tests/unit/test_start_imports.py): a Session from the graph cache and the
#: store describes its inputs without importing onnx (~55 ms)
_ONNX_TYPES = {name: name for name in (
    "float16", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool",
    "complex64", "complex128")} | {"float32": "float", "float64": "double"}


def type_string(dtype: np.dtype) -> str:
    """ONNX Runtime's type string of ``dtype`` (``tensor(float)``, ``tensor(int64)``, ...)."""
    known = _ONNX_TYPES.get(np.dtype(dtype).name)
    if known is not None:
        return f"tensor({known})"
    from onnx import helper

    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return f"tensor({helper.tensor_dtype_to_string(elem).split('.')[-1].lower()})"
