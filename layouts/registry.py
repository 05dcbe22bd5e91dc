"""Layouts, converters and the cheapest conversion chain between two layouts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from layouts.errors import LayoutError, known

#: The standard layout's name: row-major contiguous at any rank (``nchw`` for rank-4
#: activations). Every other layout converts to and from it; the one definition of the name.
STANDARD = "std"

#: the backend name of what the core itself registers (the standard layout, the reduced
#: precisions of :mod:`layouts.precision` and their converters): always installed
CORE = "core"

ConvertFn = Callable[[np.ndarray, tuple[int, ...]], np.ndarray]
"""``fn(array, logical_shape) -> array``: converts a tensor's physical array."""

PhysicalShapeFn = Callable[[tuple[int, ...]], tuple[int, ...]]


@dataclass(frozen=True)
class Layout:
    """A named physical arrangement of a tensor on a device.

    ``rank`` restricts the layout to tensors of that rank (``None``: any rank);
    ``physical_shape`` maps a logical shape to the shape of the stored array (identity by
    default); ``dtypes`` restricts the element types (empty: any); ``precision`` names a
    reduced precision the stored array holds (``None``: the tensor's own).
    """

    name: str
    device: str
    backend: str
    rank: int | None = None
    doc: str = ""
    physical_shape: PhysicalShapeFn | None = None
    dtypes: tuple[str, ...] = ()
    #: ``None``: the stored elements are the tensor's own (float32 stays float32). Else the
    #: reduced precision the stored array holds (``bf16``, ``fp16``, ``int8``: see
    #: :mod:`layouts.precision`), with ``stored_dtype`` its element type
    precision: str | None = None
    stored_dtype: str | None = None

    def applies(self, shape: tuple[int, ...], dtype: np.dtype | None) -> str | None:
        """``None`` when a tensor of this shape and dtype can be held in this layout."""
        if self.rank is not None and len(shape) != self.rank:
            return f"layout {self.name} holds rank-{self.rank} tensors, received rank {len(shape)}"
        if self.dtypes and dtype is not None and np.dtype(dtype).name not in self.dtypes:
            return (
                f"layout {self.name} holds {'/'.join(self.dtypes)} tensors, received "
                f"{np.dtype(dtype).name}"
            )
        return None

    def stored_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(self.physical_shape(shape)) if self.physical_shape else tuple(shape)

    def stored_type(self, dtype: np.dtype) -> np.dtype:
        """The element type of the stored array of a ``dtype`` tensor in this layout."""
        if self.stored_dtype is None:
            return np.dtype(dtype)
        if self.stored_dtype == "bfloat16":
            import ml_dtypes

            return np.dtype(ml_dtypes.bfloat16)
        return np.dtype(self.stored_dtype)


CostFn = Callable[["Converter", tuple[int, ...], np.dtype], float]


@dataclass(frozen=True)
class Converter:
    """A function between two layouts of the same device."""

    name: str
    src: str
    dst: str
    fn: ConvertFn
    backend: str
    direct: bool = False

    def __call__(self, array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return self.fn(array, shape)


@dataclass
class LayoutRegistry:
    """Layouts by name and converters between them.

    ``cost_model`` prices one converter for a tensor shape and dtype; the default counts the
    bytes read plus the bytes written (:func:`bytes_moved`). The tuner replaces it with
    measured costs.

    The registry of a process whose backends registered lazily
    (:class:`dispatch.registry.Registry`) completes the backend that brings a layout or
    converter when it is looked up, and every backend when all of them are listed
    (:attr:`layouts`, :attr:`converters`, paths).
    """

    _layouts: dict[str, Layout] = field(default_factory=dict)
    _converters: dict[tuple[str, str], list[Converter]] = field(default_factory=dict)
    cost_model: CostFn | None = None
    _paths: dict[tuple, tuple[float, tuple[Converter, ...]]] = field(default_factory=dict)
    #: ``resolve(kind, name)``: completes deferred registrations (set by the Registry)
    _resolve: Callable[..., None] | None = field(default=None, repr=False, compare=False)

    @property
    def layouts(self) -> dict[str, Layout]:
        """Every layout by name."""
        if self._resolve is not None:
            self._resolve("all")
        return self._layouts

    @property
    def converters(self) -> dict[tuple[str, str], list[Converter]]:
        """Every converter by ``(src, dst)``."""
        if self._resolve is not None:
            self._resolve("all")
        return self._converters

    def has_layout(self, name: str) -> bool:
        """Whether layout ``name`` is registered."""
        if name not in self._layouts and self._resolve is not None:
            self._resolve("layout", name)
        return name in self._layouts

    def add_layout(
        self,
        layout: Layout,
        *,
        to_standard: ConvertFn | None = None,
        from_standard: ConvertFn | None = None,
    ) -> None:
        """Register ``layout``; every non-standard layout must bring both standard converters."""

        if layout.name in self._layouts:
            other = self._layouts[layout.name]
            raise LayoutError(
                f"duplicate layout {layout.name!r}: already registered by backend "
                f"{other.backend!r}, received again from backend {layout.backend!r}"
            )
        if layout.name != STANDARD and (to_standard is None or from_standard is None):
            raise LayoutError(
                f"layout {layout.name!r} of backend {layout.backend!r} must register both "
                f"to_standard and from_standard converters"
            )
        self._layouts[layout.name] = layout
        if layout.name != STANDARD:
            assert to_standard is not None and from_standard is not None
            self.add_converter(layout.name, STANDARD, to_standard, backend=layout.backend)
            self.add_converter(STANDARD, layout.name, from_standard, backend=layout.backend)

    def add_converter(
        self, src: str, dst: str, fn: ConvertFn, *, backend: str, name: str | None = None
    ) -> Converter:
        """Register a converter ``src -> dst`` (a direct shortcut when neither end is standard)."""

        for lay in (src, dst):
            if not self.has_layout(lay):
                raise LayoutError(
                    f"converter {src}->{dst} names unknown layout {lay!r}; known layouts: "
                    f"{known(self.layouts)}"
                )
        if src == dst:
            raise LayoutError(f"a converter must change the layout, received {src}->{dst}")
        conv = Converter(
            name=name or f"{src}->{dst}.{backend}",
            src=src,
            dst=dst,
            fn=fn,
            backend=backend,
            direct=STANDARD not in (src, dst),
        )
        self._converters.setdefault((src, dst), []).append(conv)
        self._paths.clear()
        return conv

    def layout(self, name: str) -> Layout:
        if self.has_layout(name):
            return self._layouts[name]
        raise LayoutError(f"unknown layout {name!r}; known layouts: {known(self.layouts)}")

    def find_converter(self, name: str) -> Converter | None:
        """The converter named ``name``, or ``None``."""
        found = self.registered_converter(name)
        if found is None and self._resolve is not None:
            self._resolve("converter", name)
            found = self.registered_converter(name)
        return found

    def registered_converter(self, name: str) -> Converter | None:
        """The converter named ``name`` among those registered so far (a deferred backend's
        are not looked for: :mod:`dispatch.backend_manifest`), or ``None``."""
        for convs in self._converters.values():
            for c in convs:
                if c.name == name:
                    return c
        return None

    def converter(self, name: str) -> Converter:
        found = self.find_converter(name)
        if found is not None:
            return found
        raise LayoutError(
            f"unknown converter {name!r}; known: "
            f"{known(c.name for cs in self.converters.values() for c in cs)}"
        )

    def cost(self, conv: Converter, shape: tuple[int, ...], dtype: np.dtype) -> float:
        model = self.cost_model or bytes_moved
        return float(model(conv, shape, np.dtype(dtype)))

    def set_cost_model(self, model: CostFn | None) -> None:
        self.cost_model = model
        self._paths.clear()

    def path(
        self, src: str, dst: str, shape: tuple[int, ...], dtype: np.dtype
    ) -> tuple[Converter, ...]:
        """The cheapest chain of converters from ``src`` to ``dst`` for this tensor."""
        return self.path_and_cost(src, dst, shape, dtype)[1]

    def path_and_cost(
        self, src: str, dst: str, shape: tuple[int, ...], dtype: np.dtype
    ) -> tuple[float, tuple[Converter, ...]]:
        """Shortest path (Dijkstra, scipy) over the converters that apply to this tensor."""
        dtype = np.dtype(dtype)
        key = (src, dst, tuple(shape), dtype.str)
        hit = self._paths.get(key)
        if hit is not None:
            return hit
        for lay in (src, dst):
            reason = self.layout(lay).applies(tuple(shape), dtype)
            if reason:
                raise LayoutError(f"cannot convert {src}->{dst}: {reason}")
        if src == dst:
            result: tuple[float, tuple[Converter, ...]] = (0.0, ())
        else:
            result = self._dijkstra(src, dst, tuple(shape), dtype)
        self._paths[key] = result
        return result

    def _dijkstra(
        self, src: str, dst: str, shape: tuple[int, ...], dtype: np.dtype
    ) -> tuple[float, tuple[Converter, ...]]:
        from scipy.sparse import csr_array
        from scipy.sparse.csgraph import dijkstra

        # a chain never passes through a reduced precision: precision is lost only where a
        # plan asks for it (at an end of the chain)
        names = [n for n, lay in self.layouts.items() if lay.applies(shape, dtype) is None
                 and (lay.precision is None or n in (src, dst))]
        index = {n: k for k, n in enumerate(names)}
        best: dict[tuple[int, int], tuple[float, Converter]] = {}
        for (a, b), convs in self.converters.items():
            if a not in index or b not in index:
                continue
            for c in convs:
                # a zero weight means "no edge" to scipy: keep every edge strictly positive
                w = max(self.cost(c, shape, dtype), 1e-9)
                k = (index[a], index[b])
                if k not in best or w < best[k][0]:
                    best[k] = (w, c)
        if not best:
            raise LayoutError(f"no converter path {src}->{dst} for shape {shape}")
        rows, cols = zip(*best)
        weights = [best[k][0] for k in zip(rows, cols)]
        mat = csr_array((weights, (rows, cols)), shape=(len(names), len(names)))
        dist, pred = dijkstra(mat, directed=True, indices=index[src], return_predecessors=True)
        target = index[dst]
        if not np.isfinite(dist[target]):
            raise LayoutError(
                f"no converter path from layout {src!r} to {dst!r} for a tensor of shape "
                f"{shape} ({dtype}); converters registered: "
                f"{known(f'{a}->{b}' for a, b in self.converters)}"
            )
        chain: list[Converter] = []
        node = target
        while node != index[src]:
            prev = int(pred[node])
            chain.append(best[(prev, node)][1])
            node = prev
        return float(dist[target]), tuple(reversed(chain))


def bytes_moved(conv: Converter, shape: tuple[int, ...], dtype: np.dtype) -> float:
    """Default converter cost: bytes read plus bytes written, from the stored shapes."""
    n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return float(2 * n)
