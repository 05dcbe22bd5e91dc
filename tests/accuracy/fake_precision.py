"""A FAKE backend with a reduced-precision region variant of known error and known cost, for
testing the accuracy objective's search (choice, back-off, never storing over budget).

It is not a real backend and makes no speed claims: its float32 region runs the numpy reference
kernels of the region's nodes and then sleeps :data:`FLOAT32_SLEEP_S` per node (a deterministic
cost);
its ``int8`` variant runs the same kernels without sleeping and scales every output by
``(1 + ERROR) ** nodes`` (an error per node it computes) — so alone it adds exactly that minus 1
to the ``max-rel`` metric, and several in a chain compound. With ``bf16=True`` (a table of its
own, so that the other tests see one variant) a ``bf16`` variant adds :data:`BF16_ERROR` per node
and sleeps half the float32 time: less error, less speed, what the back-off steps down to.
"""

from __future__ import annotations

import time

import numpy as np

from dispatch.backend import Backend
from dispatch.executor import reference_kernels, run_reference
from dispatch.registry import ImplTable, Priority, Registry

table = ImplTable("fakeprec")
FLOAT32_SLEEP_S = 0.0005
#: the relative error the int8 variant adds per node of its region
ERROR = {"value": 0.0013}
#: the relative error the bf16 variant (``bf16=True``) adds per node of its region
BF16_ERROR = {"value": 0.0008}
_REGISTRY: list[Registry] = []
bf16_table = ImplTable("fakeprec")


def _whole(graph) -> list[list[str]]:
    return [[n.name for n in graph.nodes]]


def _runner(region, scale: float | None, sleep_s: float):
    kernels = reference_kernels(_REGISTRY[-1], region.nodes)

    def run(*arrays):
        env = {v.name: a for v, a in zip(region.inputs, arrays)}
        run_reference(kernels, env)
        if sleep_s:
            time.sleep(sleep_s)
        factor = 1.0 if scale is None else (1.0 + scale) ** len(region.nodes)
        return tuple(np.asarray(env[v.name] * np.float32(factor), dtype=np.float32) for v in region.outputs)

    return run


@table.register_region("exact", propose=_whole, priority=Priority.DEFAULT)
def _exact(region):
    """FAKE float32 region: the reference kernels, then a fixed sleep."""
    return _runner(region, None, FLOAT32_SLEEP_S * len(region.nodes))


@table.register_region("scaled", propose=_whole, priority=Priority.FALLBACK, precision="int8")
def _scaled(region):
    """FAKE int8 region: the reference kernels, outputs scaled by 1 + ERROR, no sleep."""
    assert region.attrs.get("precision", {}).get("dtype") == "int8"
    return _runner(region, ERROR["value"], 0.0)


@bf16_table.register_region("halved", propose=_whole, priority=Priority.FALLBACK, precision="bf16")
def _halved(region):
    """FAKE bf16 region: the reference kernels, outputs scaled by 1 + BF16_ERROR, half the sleep."""
    assert region.attrs.get("precision", {}).get("dtype") == "bf16"
    return _runner(region, BF16_ERROR["value"], FLOAT32_SLEEP_S * len(region.nodes) / 2)


class FakePrecisionBackend(Backend):
    """FAKE backend for the accuracy objective's tests (see the module docstring)."""

    name = "fakeprec"
    process_pools = False

    def version(self) -> str:
        return "fakeprec 1"

    def register(self, registry: Registry) -> None:
        _REGISTRY.append(registry)
        registry.add_table(table)


def registry_with_fake_precision(bf16: bool = False) -> Registry:
    """A fresh registry of every discovered backend plus the fake one (with its bf16 variant
    when ``bf16``)."""
    from dispatch.backend import _activate, load_registry

    reg = load_registry(fresh=True)
    _activate(reg, FakePrecisionBackend, "tests.accuracy.fake_precision")
    if bf16:
        reg.add_table(bf16_table)
    return reg
