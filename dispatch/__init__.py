"""opdispatch: a tuning-driven operator dispatcher for ONNX models with a layout registry.

The ``dispatch`` package is the core: graph import, registries, plans, the executor and the
Session. Importing it is cheap and imports neither the tuner nor optional heavy libraries
(onnxruntime): ``Session``, ``Plan``, ``Objective``, ``Config`` and ``OpDispatchError`` are
resolved on first use. The import order does not matter: the BLAS and OpenMP thread settings a
plan runs with are put in force around each run and restored after it (:mod:`dispatch.blas`);
the only thing done at import is the ``OPENBLAS_THREAD_TIMEOUT`` default for the program's own
numpy calls, set when numpy is not loaded yet.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dispatch.blas import BLAS_SPIN_ENV

if TYPE_CHECKING:
    from dispatch.config import Config
    from dispatch.errors import OpDispatchError
    from dispatch.objective import Objective
    from dispatch.plan import Plan
    from dispatch.session import Session

__version__ = "0.1.0"

#: public name -> the module that defines it (imported on first use)
_LAZY = {
    "Config": "dispatch.config",
    "Objective": "dispatch.objective",
    "OpDispatchError": "dispatch.errors",
    "Plan": "dispatch.plan",
    "Session": "dispatch.session",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dispatch' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["BLAS_SPIN_ENV", "Config", "Objective", "OpDispatchError", "Plan", "Session",
           "__version__"]
