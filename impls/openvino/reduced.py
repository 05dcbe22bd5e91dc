"""OpenVINO regions in reduced precision: the region compiled with the CPU plugin's inference
precision hint set to ``bf16`` where the CPU computes bf16 natively (AVX512_BF16 or AMX: the
plugin's ``OPTIMIZATION_CAPABILITIES`` name ``BF16``). The region still reads and writes the
model's float32 tensors (the plugin converts at its edges), so the variant is a drop-in for the
float32 region; only accuracy-objective tuning offers it (:mod:`tuner.accuracy`), which
measures the error it adds on the user's data.
"""

from __future__ import annotations

import functools

from dispatch.fusion import FusedNode
from dispatch.registry import Priority
from impls.openvino.region import _supports, build_compiled, core, impls, propose


@functools.cache
def capabilities() -> frozenset[str]:
    """The CPU plugin's optimisation capabilities on this machine (``FP32``, ``BF16``, ``INT8``,
    ``FP16``, ...)."""
    return frozenset(str(c) for c in core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


def _bf16_supports(region: FusedNode) -> str | None:
    if "BF16" not in capabilities():
        return (f"this CPU does not compute bf16 natively (OpenVINO's CPU plugin lists "
                f"{', '.join(sorted(capabilities()))}; bf16 needs AVX512_BF16 or AMX)")
    return _supports(region)


@impls.register_region("compiled_bf16", propose=propose, priority=Priority.FALLBACK,
                       supports=_bf16_supports, settings={"inference_precision": "bf16"},
                       precision="bf16")
def build_region_bf16(region: FusedNode):
    """A region compiled by OpenVINO's CPU plugin computing in bf16 (float32 at its edges)."""
    return build_compiled(region, "bf16")
