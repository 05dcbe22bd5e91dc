"""Access to the compiled module ``_opdispatch_onednn``, with the reason when it is missing.

The module is built only when CMake finds oneDNN (``find_package(dnnl CONFIG)``); a build
without it has no module at all, which is told apart from a module that fails to load.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

MODULE = "_opdispatch_onednn"
#: What to do when the module was not built.
INSTALL_HINT = "apt-get install libdnnl-dev, then reinstall opdispatch"

_module: ModuleType | None = None
_error: str | None = None


def load() -> ModuleType | None:
    """The compiled module, or ``None`` when it cannot be imported (see :func:`error`)."""
    global _module, _error
    if _module is None and _error is None:
        if importlib.util.find_spec(MODULE) is None:
            _error = (
                f"oneDNN was not found at build time, so the module {MODULE} was not built: "
                f"{INSTALL_HINT} (or it was disabled with -DOPDISPATCH_ONEDNN=OFF)"
            )
            return None
        try:
            _module = importlib.import_module(MODULE)
        except ImportError as exc:
            _error = (
                f"the compiled module {MODULE} is installed but does not load ({exc}); the "
                f"oneDNN library it was built against may be missing: {INSTALL_HINT}"
            )
    return _module


def error() -> str | None:
    """Why the compiled module is unavailable, or ``None``."""
    load()
    return _error


def onednn() -> ModuleType:
    """The compiled module; raises ImportError with the reason when it is missing."""
    mod = load()
    if mod is None:
        raise ImportError(_error)
    return mod
