"""The formats oneDNN picks, as layouts of the layout registry, with reorders as converters.

oneDNN names a memory format by a tag over the logical dims ``a, b, c, ...``: a lowercase
letter is a dim, an uppercase one a dim split into blocks, and each trailing ``{size}{dim}``
an inner block (``aBcd16b`` = nChw16c; ``Acdb64a`` = Ohwi64o). Every format here is held in
a numpy array whose shape is the format's *physical shape*: the outer (padded, blocked) dims
in memory order, then the inner blocks; padding is zero.

Activations (rank 4, N, C, H, W). oneDNN's ``acdb``, ``aBcd8b`` and ``aBcd16b`` are byte for
byte the native backend's ``nhwc``, ``nchw8c`` and ``nchw16c`` (the same physical shapes,
channels zero-padded to the block), so they are registered under those names: a tensor a
oneDNN convolution writes in ``nhwc`` feeds a native kernel (and back) with no converter at
all, and the optimiser prices such a chain at zero. When the native backend is active it
registers these three layouts (with its own, faster converters) and this backend reuses them;
when it is not, this backend registers them itself with oneDNN reorders. ``aBcd4b``, which
oneDNN picks for some grouped convolutions, has no native twin: ``dnnl:aBcd4b``.

Weights. Conv weights ``(M, C/group, KH, KW)`` in the formats oneDNN 2.x/3.x picks for f32
on x86 (AVX-512 brgconv: ``Acdb{16,32,48,64}a``, ``Abcd16a``; AVX2 brgconv, oneDNN 3.x only:
``Acdb24a``, ``Abcd16a``; AVX2/SSE4.1 jit: ``Acdb8a``, ``ABcd8b8a``, ``Abcd8a``; jit AVX-512:
``ABcd16b16a``; gemm: ``acdb``, ``cdba``, ``bcda``): ``dnnl:{tag}``. Depthwise weights use
oneDNN's 5-D grouped view, one output channel per group: the weight ``(M, C/g, KH, KW)`` of a
convolution with ``group == M`` is the tensor ``(M, 1, C/g, KH, KW)`` in a 5-letter tag
(``dnnl:decbA16a``, ``dnnl:decbA8a`` (AVX2 brdgmm, 3.x only), ``dnnl:Abcde16a``,
``dnnl:Abcde8a``, ``dnnl:decab``). Other grouped weights stay in ``std`` and are reordered when
the plan is built. Formats that the oneDNN the module was built against cannot name
(:data:`ONLY_3X` under 2.x) are not registered. Matmul weights ``(K, N)``
(``BA16a{16,32,48,64}b`` and the like, see impls/onednn/gemm.py) are ``dnnl:{tag}`` over the
ONNX tensor's own dims.

A plan converts constant weights to these layouts once, when it is built (``at_build``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from dispatch.registry import STANDARD, Registry
from impls.common import as_f32
from impls.onednn._module import onednn
from layouts.registry import ConvertFn, Layout, LayoutRegistry

BACKEND = "onednn"
PREFIX = "dnnl:"
F32 = ("float32",)

#: Activation tags -> layout names (rank 4). The first three are shared with the native
#: backend (identical memory), ``abcd`` is the standard layout.
ACTIVATIONS: dict[str, str] = {
    "abcd": STANDARD,
    "acdb": "nhwc",
    "aBcd8b": "nchw8c",
    "aBcd16b": "nchw16c",
    "aBcd4b": f"{PREFIX}aBcd4b",
}
#: The native backend's layouts that oneDNN formats share (see the module docstring).
SHARED = ("nhwc", "nchw8c", "nchw16c")
#: The native backend's name: while it is about to register, the shared layouts are its.
NATIVE_BACKEND = "native"

#: Conv weight formats over (M, C, KH, KW) (group 1).
CONV_WEIGHTS = (
    "Acdb8a", "Acdb16a", "Acdb24a", "Acdb32a", "Acdb48a", "Acdb64a", "Abcd8a", "Abcd16a",
    "ABcd8b8a", "ABcd16b16a", "acdb", "cdba", "bcda",
)
#: Depthwise weight formats over the grouped view (M, 1, C/g, KH, KW).
DEPTHWISE_WEIGHTS = ("Abcde8a", "Abcde16a", "decbA8a", "decbA16a", "decab")
#: The formats above that only oneDNN 3.x names (AVX2 brgemm convolutions).
ONLY_3X = frozenset({"Acdb24a", "decbA8a"})
#: Matmul weight formats over the (K, N) (or (N, K) with transB) ONNX tensor.
MATMUL_WEIGHTS = (
    "ba", "AB16b16a", "AB16b32a", "AB16b64a", "BA16a16b", "BA16a32b", "BA16a48b", "BA16a64b",
)
#: The plain tag of each rank (the standard layout).
PLAIN = {1: "a", 2: "ab", 3: "abc", 4: "abcd", 5: "abcde"}


def layout_name(tag: str) -> str:
    """The registry name of weight format ``tag``."""
    return f"{PREFIX}{tag}"


def tag_rank(tag: str) -> int:
    """The number of dims a tag describes (its distinct letters)."""
    return len({ch.lower() for ch in tag if ch.isalpha()})


def view_dims(tag: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The dims oneDNN sees for a tensor of logical ``shape`` held in ``tag``: the shape
    itself, or for a 5-letter tag on a rank-4 conv weight the grouped view (M, 1, C/g, KH, KW)."""
    rank = tag_rank(tag)
    if rank == len(shape):
        return tuple(int(d) for d in shape)
    if rank == 5 and len(shape) == 4:
        m, cg, kh, kw = (int(d) for d in shape)
        return (m, 1, cg, kh, kw)
    raise ValueError(f"format {tag!r} describes rank-{rank} tensors, received shape {tuple(shape)}")


@functools.lru_cache(maxsize=4096)
def physical_shape(tag: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Shape of the array holding a tensor of logical ``shape`` in ``tag`` (from oneDNN's own
    memory descriptor)."""
    return tuple(onednn().physical_shape(list(view_dims(tag, shape)), tag))


_c = as_f32


def _to_standard(tag: str) -> ConvertFn:
    def fn(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        dims = view_dims(tag, shape)
        return onednn().reorder(_c(x), list(dims), tag, PLAIN[len(dims)]).reshape(shape)

    return fn


def _from_standard(tag: str) -> ConvertFn:
    def fn(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        dims = view_dims(tag, shape)
        return onednn().reorder(_c(x), list(dims), PLAIN[len(dims)], tag)

    return fn


def _shape_fn(tag: str) -> Callable[[tuple[int, ...]], tuple[int, ...]]:
    def fn(shape: tuple[int, ...]) -> tuple[int, ...]:
        return physical_shape(tag, tuple(int(d) for d in shape))

    return fn


def _native_pending(registry: Registry) -> bool:
    """Whether the native backend was accepted but has not registered yet (it will register
    the shared layouts itself)."""
    st = registry.backends.get(NATIVE_BACKEND)
    return st is not None and st.backend is not None and not st.available and st.reason is None


def _add(layouts: LayoutRegistry, tag: str, rank: int, doc: str) -> None:
    layouts.add_layout(
        Layout(layout_name(tag), "cpu", BACKEND, rank=rank, dtypes=F32,
               physical_shape=_shape_fn(tag), doc=doc),
        to_standard=_to_standard(tag),
        from_standard=_from_standard(tag),
    )


def register_layouts(registry: Registry) -> None:
    """Add the activation layouts oneDNN shares with the native backend (unless the native
    backend brings them), ``dnnl:aBcd4b``, and the weight formats."""
    layouts = registry.layouts
    known = set(onednn().known_tags())
    if not _native_pending(registry):
        for tag, name in ACTIVATIONS.items():
            if name in SHARED and name not in layouts.layouts:
                layouts.add_layout(
                    Layout(name, "cpu", BACKEND, rank=4, dtypes=F32, physical_shape=_shape_fn(tag),
                           doc=f"oneDNN {tag} (the native backend's {name}, registered by oneDNN "
                               f"because the native backend is not active)"),
                    to_standard=_to_standard(tag),
                    from_standard=_from_standard(tag),
                )
    _add(layouts, "aBcd4b", 4, "oneDNN aBcd4b activations: channels blocked by 4, zero-padded "
                               "(N, C/4, H, W, 4)")
    for tag in CONV_WEIGHTS:
        if tag in known:
            _add(layouts, tag, 4, f"oneDNN conv weight (M, C, KH, KW) in {tag}")
    for tag in DEPTHWISE_WEIGHTS:
        if tag in known:
            _add(layouts, tag, 4, f"oneDNN depthwise conv weight (M, C/g, KH, KW), group == M, "
                                  f"as the grouped view (M, 1, C/g, KH, KW) in {tag}")
    for tag in MATMUL_WEIGHTS:
        _add(layouts, tag, 2, f"oneDNN matmul weight (2-D) in {tag}")


def activation_layout(tag: str) -> str | None:
    """The layout name of a rank-4 activation format, or ``None`` when it has none."""
    return ACTIVATIONS.get(tag)


def activation_tag(layout: str) -> str:
    """The oneDNN tag of a rank-4 activation layout."""
    for tag, name in ACTIVATIONS.items():
        if name == layout:
            return tag
    raise ValueError(f"layout {layout!r} is not a oneDNN activation format; known: "
                     f"{', '.join(ACTIVATIONS.values())}")
