"""Access to the compiled module ``_opdispatch_native``, with the reason when it is missing."""

from __future__ import annotations

import importlib
from types import ModuleType

_module: ModuleType | None = None
_error: str | None = None


def load() -> ModuleType | None:
    """The compiled module, or ``None`` when it cannot be imported (see :func:`error`)."""
    global _module, _error
    if _module is None and _error is None:
        try:
            _module = importlib.import_module("_opdispatch_native")
        except ImportError as exc:
            _error = (
                f"the compiled module _opdispatch_native is not importable ({exc}); "
                f"install the package with `pip install .` so that CMake builds it"
            )
    return _module


def error() -> str | None:
    """Why the compiled module is unavailable, or ``None``."""
    load()
    return _error


def native() -> ModuleType:
    """The compiled module; raises ImportError with the reason when it is missing."""
    mod = load()
    if mod is None:
        raise ImportError(_error)
    return mod
