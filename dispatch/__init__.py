"""opdispatch: a tuning-driven operator dispatcher for ONNX models with a layout registry.

Importing this package does not import optional heavy libraries (onnxruntime).
"""

from __future__ import annotations

import os as _os
import sys as _sys

#: OpenBLAS worker threads spin for 2**28 cycles (~0.1 s) after each call before they sleep.
#: In a plan that mixes numpy (OpenBLAS) kernels with native (OpenMP) kernels the spinning
#: threads hold the cores the next native kernel needs, and a 1 ms kernel takes 4-8 ms (the
#: scheduler's time slice): measured on resnet50, a mixed plan ran in 276 ms instead of 62 ms.
#: 2**4 cycles makes them sleep at once. It only works if set before numpy loads OpenBLAS, so
#: it is a default here (the CLI imports this first); a program that imports numpy before
#: dispatch should set the variable itself (``dispatch.blas_threads_settled()`` tells).
BLAS_SPIN_ENV = ("OPENBLAS_THREAD_TIMEOUT", "4")
_BLAS_SETTLED = "numpy" not in _sys.modules or BLAS_SPIN_ENV[0] in _os.environ
if "numpy" not in _sys.modules:
    _os.environ.setdefault(*BLAS_SPIN_ENV)

from dispatch.config import Config  # noqa: E402  (after the BLAS default)
from dispatch.errors import OpDispatchError  # noqa: E402
from dispatch.plan import Plan  # noqa: E402
from dispatch.session import Session  # noqa: E402

__version__ = "0.1.0"


def blas_threads_settled() -> bool:
    """Whether OpenBLAS worker threads sleep right after each call in this process (see
    ``BLAS_SPIN_ENV``): False when numpy was imported before dispatch without the variable."""
    return _BLAS_SETTLED


__all__ = ["BLAS_SPIN_ENV", "Config", "OpDispatchError", "Plan", "Session", "__version__", "blas_threads_settled"]
