"""The oneDNN backend: oneDNN's CPU primitives compiled into ``_opdispatch_onednn``.

Threads. Debian's oneDNN (and the default oneDNN build) uses the OpenMP runtime, where a
primitive runs on ``omp_get_max_threads()`` threads of the thread that executes it; there is
no per-primitive thread count. :meth:`OneDnnBackend.configure` stores the configured count in
the module, and every execution applies it to the executing thread with
``omp_set_num_threads`` first (OpenMP's setting is per thread, so plans run from another
thread get it too). With a TBB or threadpool build of oneDNN the setting is recorded but
oneDNN's runtime decides (``cpu_runtime()`` says which runtime the library has).
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING

from dispatch.backend import Backend
from dispatch.registry import Registry
from impls.onednn import _module

if TYPE_CHECKING:
    from dispatch.config import Config

#: The modules whose implementations (and layouts) this backend registers, imported
#: explicitly. A module may define ``register_layouts(layouts)`` for its own layouts (e.g.
#: weight formats); it is called before the implementations are added.
MODULES = (
    "layouts",
    "conv",
    "gemm",
    "pool",
    "elementwise",
    "norm",
)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class OneDnnBackend(Backend):
    """oneDNN's primitives: convolutions in the formats oneDNN picks (``format_tag::any``),
    matmul, pooling, eltwise, batch normalization and binary ops, with post-op fusions;
    primitives and reordered weights are created once per plan."""

    name = "onednn"
    device = "cpu"
    #: its layouts registration reads whether the native backend brings the shared layouts
    registration_needs = ("native",)

    def availability(self) -> str | None:
        return _module.error()

    def version(self) -> str:
        mod = _module.onednn()
        major, minor, patch, _ = mod.dnnl_version()
        return f"oneDNN {major}.{minor}.{patch} (build {mod.build_id})"

    def configure(self, config: Config) -> None:
        """Apply the configured thread count (0: every core this process may use)."""
        threads = config.threads or _cores()
        _module.onednn().set_num_threads(int(threads))

    def register(self, registry: Registry) -> None:
        from impls.onednn.table import impls

        for name in MODULES:
            mod = importlib.import_module(f"impls.onednn.{name}")
            hook = getattr(mod, "register_layouts", None)
            if hook is not None:
                hook(registry)
        registry.add_table(impls)
