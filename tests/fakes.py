"""A FAKE backend for testing the planner, converters and executor without native code.

It is not a real backend and makes no speed claims: its layouts ("tcl": channels-last by
transpose, "blk4": channels blocked by 4 and zero-padded) are implemented in numpy so that
plans with conversions can be checked against the numpy reference deterministically.
"""

from __future__ import annotations

import numpy as np

from dispatch.backend import Backend
from dispatch.registry import ImplTable, Priority, Registry
from layouts.registry import Layout

table = ImplTable("fake")


def to_tcl(x: np.ndarray, shape) -> np.ndarray:
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1))


def from_tcl(x: np.ndarray, shape) -> np.ndarray:
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def to_blk4(x: np.ndarray, shape) -> np.ndarray:
    n, c, h, w = shape
    cb = -(-c // 4)
    out = np.zeros((n, cb * 4, h, w), x.dtype)
    out[:, :c] = x
    return np.ascontiguousarray(out.reshape(n, cb, 4, h, w).transpose(0, 1, 3, 4, 2))


def from_blk4(x: np.ndarray, shape) -> np.ndarray:
    n, c, h, w = shape
    return np.ascontiguousarray(x.transpose(0, 1, 4, 2, 3).reshape(n, -1, h, w)[:, :c])


def tcl_to_blk4(x: np.ndarray, shape) -> np.ndarray:
    return to_blk4(from_tcl(x, shape), shape)


def _rank4_f32(node) -> str | None:
    x = node.input(0)
    if x is None or x.shape is None or len(x.shape) != 4 or x.dtype != np.float32:
        return f"needs a rank-4 float32 input, received {x.shape if x else None}"
    if any(v is not None and v.shape != x.shape for v in node.inputs):
        return "needs inputs of the same shape"
    return None


for lay in ("tcl", "blk4"):

    @table.register("Relu", lay, priority=Priority.DEFAULT, supports=_rank4_f32,
                    layouts_in=(lay,), layouts_out=(lay,))
    def _relu(node):
        """Relu in a fake layout."""
        return lambda x: np.maximum(x, 0)

    @table.register("Add", lay, priority=Priority.DEFAULT, supports=_rank4_f32,
                    layouts_in=(lay, lay), layouts_out=(lay,))
    def _add(node):
        """Add in a fake layout."""
        return lambda a, b: a + b


def _add_relu_supports(node) -> str | None:
    return _rank4_f32(node)


@table.register_pattern(("Add", "Relu"), "tcl", priority=Priority.DEFAULT,
                        supports=_add_relu_supports, layouts_in=("tcl", "tcl"), layouts_out=("tcl",))
def _add_relu(fused):
    """Add then Relu in one step, in a fake layout."""
    assert [n.op_type for n in fused.nodes] == ["Add", "Relu"]
    return lambda a, b: np.maximum(a + b, 0)


@table.register_pattern(("Sigmoid", "Add"), "tcl", priority=Priority.DEFAULT,
                        supports=_add_relu_supports, layouts_in=("tcl", "tcl"), layouts_out=("tcl",))
def _sigmoid_add(fused):
    """Sigmoid then Add of another tensor (a residual-style join), in a fake layout."""
    return lambda x, other: 1 / (1 + np.exp(-x)) + other


def _bf16_edges(node) -> tuple[str, ...]:
    return tuple("bf16" if v is not None and v.dtype == np.float32 else "std" for v in node.inputs)


def _bf16_outs(node) -> tuple[str, ...]:
    return tuple("bf16" if v.dtype == np.float32 else "std" for v in node.outputs)


_BF16_OPS = {"Relu": lambda x: np.maximum(x, 0), "Neg": np.negative}


def _bf16_region_supports(region) -> str | None:
    other = sorted({n.op_type for n in region.nodes} - set(_BF16_OPS))
    if not other:
        return None
    return f"the fake bf16 region runs {', '.join(sorted(_BF16_OPS))}, not {', '.join(other)}"


@table.register_region("bf16", propose=lambda graph: [], priority=Priority.FALLBACK,
                       supports=_bf16_region_supports, precision="bf16",
                       layouts_in=_bf16_edges, layouts_out=_bf16_outs)
def _bf16_region(region):
    """A region of Relu / Neg nodes computed on bfloat16 arrays, reading and writing the bf16
    layout (a fake reduced-precision region: numpy, no speed claims); refuses other inputs."""
    import ml_dtypes

    def run(*arrays):
        for a in arrays:
            if a.dtype != ml_dtypes.bfloat16:
                raise TypeError(f"the fake bf16 region reads bfloat16 arrays, received {a.dtype}")
        env = {v.name: a for v, a in zip(region.inputs, arrays)}
        for n in region.nodes:
            env[n.outputs[0].name] = _BF16_OPS[n.op_type](env[n.inputs[0].name]).astype(ml_dtypes.bfloat16)
        return tuple(env[v.name] for v in region.outputs)

    return run


class FakeBackend(Backend):
    """FAKE backend for tests (see module docstring)."""

    name = "fake"

    def version(self) -> str:
        return "fake 1"

    def register(self, registry: Registry) -> None:
        four = lambda s: (s[0], -(-s[1] // 4), s[2], s[3], 4)  # noqa: E731
        registry.layouts.add_layout(
            Layout("tcl", "cpu", "fake", rank=4, dtypes=("float32",),
                   physical_shape=lambda s: (s[0], s[2], s[3], s[1])),
            to_standard=from_tcl, from_standard=to_tcl,
        )
        registry.layouts.add_layout(
            Layout("blk4", "cpu", "fake", rank=4, dtypes=("float32",), physical_shape=four),
            to_standard=from_blk4, from_standard=to_blk4,
        )
        registry.layouts.add_converter("tcl", "blk4", tcl_to_blk4, backend="fake")
        registry.add_table(table)


def registry_with_fake():
    """A fresh registry of every discovered backend plus the fake one."""
    from dispatch.backend import _activate, load_registry

    reg = load_registry(fresh=True)
    _activate(reg, FakeBackend, "tests.fakes")
    return reg
