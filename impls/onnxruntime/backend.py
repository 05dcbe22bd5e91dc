"""The onnxruntime backend: regions of the graph compiled into InferenceSessions.

onnxruntime is imported only when a region is built, never by discovery, so that listing the
backends (or importing ``dispatch``) stays cheap; availability and version come from the
installed distribution's metadata.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from typing import TYPE_CHECKING

from dispatch.backend import Backend
from dispatch.registry import Registry

if TYPE_CHECKING:
    from dispatch.config import Config


class OnnxRuntimeBackend(Backend):
    """onnxruntime's CPU execution provider on connected regions of the graph, offered to the
    tuner at several granularities (single nodes, residual blocks, stages, maximal regions)."""

    name = "onnxruntime"
    registration_needs = ()
    #: its regions run on onnxruntime's own intra-op pool, not on numpy's BLAS or an OpenMP runtime
    process_pools = False
    device = "cpu"

    def availability(self) -> str | None:
        if importlib.util.find_spec("onnxruntime") is None:
            return "onnxruntime is not installed (pip install 'opdispatch[onnxruntime]')"
        return None

    def version(self) -> str:
        return f"onnxruntime {importlib.metadata.version('onnxruntime')}"

    def configure(self, config: Config) -> None:
        """Intra-op threads of the sessions built from now on (0: every core this process may
        use)."""
        from impls.onnxruntime.settings import SETTINGS

        SETTINGS["intra_op_threads"] = int(config.threads or 0)

    def model_ways(self) -> list:
        """The whole model in one library session, dynamic dimensions (range plans)."""
        from impls.onnxruntime.whole_model import ways

        return ways()

    def register(self, registry: Registry) -> None:
        from impls.onnxruntime import quantized  # noqa: F401  (registers the int8 variants)
        from impls.onnxruntime.region import impls

        registry.add_table(impls)

    def region_refusals(self) -> dict[str, str]:
        from impls.onnxruntime.region import CONTRIB_REFUSED, UNSUPPORTED_OPS

        return {**{op: "not offered to onnxruntime" for op in UNSUPPORTED_OPS}, **CONTRIB_REFUSED}

    def region_extra_ops(self) -> frozenset[str]:
        """The operators of other domains than ONNX's that its regions take (``domain::op``):
        onnxruntime's contrib operators whose schemas the import knows."""
        from impls.onnxruntime.region import CONTRIB_OPS

        return CONTRIB_OPS
