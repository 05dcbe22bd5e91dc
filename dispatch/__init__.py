"""opdispatch: a tuning-driven operator dispatcher for ONNX models with a layout registry.

Importing this package does not import optional heavy libraries (onnxruntime).
"""

from __future__ import annotations

from dispatch.config import Config
from dispatch.errors import OpDispatchError
from dispatch.plan import Plan
from dispatch.session import Session

__version__ = "0.1.0"

__all__ = ["Config", "OpDispatchError", "Plan", "Session", "__version__"]
