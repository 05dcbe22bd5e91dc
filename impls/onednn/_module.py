"""Access to the compiled module ``_opdispatch_onednn``, with the reason when it is missing.

The module is built only when CMake finds oneDNN (``find_package(dnnl CONFIG)``): by default
oneDNN 3.2 from PyPI (``onednn-devel-cpu-gomp`` is a build requirement), linked against
``libdnnl.so.3`` of the ``onednn-cpu-gomp`` dependency, which the module finds through its
RPATH. Where that RPATH does not reach the library (an install laid out differently, e.g.
``pip install --target``), the library is loaded from the installed distribution first and the
import retried. A build without oneDNN has no module at all, which is told apart from a module
that fails to load.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from types import ModuleType

MODULE = "_opdispatch_onednn"
#: The PyPI distribution with oneDNN's runtime library (a dependency on Linux x86-64).
RUNTIME_DISTRIBUTION = "onednn-cpu-gomp"
#: What to do when the module was not built.
INSTALL_HINT = (
    "reinstall opdispatch with pip on Linux x86-64 (its build gets oneDNN 3.x from PyPI: "
    "onednn-devel-cpu-gomp), or apt-get install libdnnl-dev and reinstall with "
    "-C cmake.define.OPDISPATCH_ONEDNN_FROM=system"
)
#: What to do when the module does not load.
LOAD_HINT = (
    f"pip install {RUNTIME_DISTRIBUTION} (the oneDNN library the module was built against), or "
    "reinstall opdispatch"
)

_module: ModuleType | None = None
_error: str | None = None


def preload_runtime() -> str | None:
    """Load ``libdnnl.so.N`` from the installed ``onednn-cpu-gomp`` so that the module's own
    reference to it resolves; the path loaded, or ``None`` when that distribution (or the
    library in it) is not installed."""
    import ctypes
    from importlib import metadata

    try:
        dist = metadata.distribution(RUNTIME_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None
    for file in dist.files or ():
        if re.fullmatch(r"libdnnl\.so\.\d+", file.name):
            path = str(dist.locate_file(file))
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError:
                return None
            return path
    return None


def _import() -> ModuleType:
    try:
        return importlib.import_module(MODULE)
    except ImportError as exc:
        if "libdnnl" not in str(exc) or preload_runtime() is None:
            raise
    return importlib.import_module(MODULE)


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
            _module = _import()
        except ImportError as exc:
            _error = (
                f"the compiled module {MODULE} is installed but does not load ({exc}); the "
                f"oneDNN library it was built against may be missing: {LOAD_HINT}"
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
