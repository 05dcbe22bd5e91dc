"""The OpenVINO backend's discovery, availability, version and configuration: regions of the
graph compiled by OpenVINO's CPU plugin. OpenVINO is imported only when a region is built,
never by discovery, so that listing the backends (or importing ``dispatch``) stays cheap;
availability and version come from the installed distribution's metadata.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from typing import TYPE_CHECKING

from dispatch.backend import Backend
from dispatch.registry import Registry

if TYPE_CHECKING:
    from dispatch.config import Config


class OpenVinoBackend(Backend):
    """OpenVINO's CPU plugin on connected regions of the graph, offered to the tuner at several
    granularities (single nodes, residual blocks, stages, maximal regions)."""

    name = "openvino"
    registration_needs = ()
    #: its regions run on OpenVINO's own (TBB) pool, not on numpy's BLAS or an OpenMP runtime
    process_pools = False
    device = "cpu"

    def availability(self) -> str | None:
        if importlib.util.find_spec("openvino") is None:
            return "openvino is not installed (pip install 'opdispatch[openvino]')"
        return None

    def version(self) -> str:
        return f"openvino {importlib.metadata.version('openvino')}"

    def configure(self, config: Config) -> None:
        """Inference threads of the models compiled from now on (0: every core this process
        may use)."""
        from impls.openvino.settings import SETTINGS

        SETTINGS["threads"] = int(config.threads or 0)
        SETTINGS["compiled_cache"] = config.compiled_cache

    def model_ways(self) -> list:
        """The whole model in one library session, dynamic dimensions (range plans)."""
        from impls.openvino.whole_model import ways

        return ways()

    def register(self, registry: Registry) -> None:
        from impls.openvino import reduced  # noqa: F401  (registers the reduced-precision variants)
        from impls.openvino.region import impls

        registry.add_table(impls)

    def region_refusals(self) -> dict[str, str]:
        from impls.openvino.region import UNSUPPORTED_OPS

        return dict(UNSUPPORTED_OPS)

    def region_extra_ops(self) -> frozenset[str]:
        """The operators of other domains than ONNX's that its regions take (``domain::op``):
        the contrib activations and normalizations its ONNX front end converts as the
        references compute them."""
        from impls.openvino.region import CONTRIB_OPS

        return CONTRIB_OPS
