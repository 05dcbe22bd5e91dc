"""The native backend: C++ kernels compiled into ``_opdispatch_native``."""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING

from dispatch.backend import Backend
from dispatch.registry import Registry
from impls.native import _module

if TYPE_CHECKING:
    from dispatch.config import Config


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1

#: The modules whose implementations (and layouts) this backend registers, imported
#: explicitly. A module may define ``register_layouts(layouts)`` for its own layouts (e.g.
#: packed weight layouts); it is called before the implementations are added.
MODULES = (
    "layouts",
    "elementwise",
    # conv modules
    "conv",
    # gemm modules
    "gemm",
    "conv_nhwc",
    # pool/norm/concat modules
    "pool",
    "norm",
    "concat",
)


class NativeBackend(Backend):
    """This project's C++ kernels: blocked (nchw8c, nchw16c) and channels-last (nhwc) layouts,
    OpenMP threads, AVX2/AVX-512 code chosen at run time with a portable fallback."""

    name = "native"
    registration_needs = ()
    device = "cpu"

    def availability(self) -> str | None:
        return _module.error()

    def version(self) -> str:
        mod = _module.native()
        return f"native build {mod.build_id} ({mod.compiler}, isa {mod.isa()})"

    def configure(self, config: Config) -> None:
        """Apply the configured thread count (0: every core this process may use)."""
        threads = config.threads or _cores()
        _module.native().set_num_threads(int(threads))

    def register(self, registry: Registry) -> None:
        from impls.native.table import impls

        for name in MODULES:
            mod = importlib.import_module(f"impls.native.{name}")
            hook = getattr(mod, "register_layouts", None)
            if hook is not None:
                hook(registry.layouts)
        registry.add_table(impls)
