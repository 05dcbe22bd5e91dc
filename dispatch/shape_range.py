"""Input shape ranges: ``--shape input_ids=1x1..512`` (issue 51).

A plan for one concrete shape serves only requests of exactly that shape; real traffic changes
shape with every request. A :class:`ShapeRange` is the set of shapes a range plan serves: every
input's dimensions, each a size or an inclusive range ``LO..HI``. Inputs not given are sized from
the symbolic dimensions they share with those given (``attention_mask: [batch, sequence]``
follows ``input_ids``), as :func:`dispatch.input_shapes.bind` does for concrete shapes.

The dimensions that range are the range's *axes* (one per symbol, so ``input_ids`` and
``attention_mask`` share the axis ``sequence``); a concrete shape in the range is a *point* on
them, and its *size* (the product of the point's values) orders shapes from small to large,
which is the scale the tuner cuts into buckets (:mod:`dispatch.range_plan`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dispatch.errors import ArgumentError
from dispatch.input_shapes import DeclaredInput, ShapeSet

#: the largest size one ranged dimension may reach (a guard against typos like ``1..5120000``)
MAX_DIM = 1 << 20

#: one dimension: ``(lo, hi)``, equal for a fixed size
DimRange = tuple[int, int]


def parse_dim(value: Any, where: str) -> DimRange:
    """One dimension from ``128``, ``"128"`` or ``"1..512"``; raises
    :class:`~dispatch.errors.ArgumentError` saying what was received."""
    if isinstance(value, bool):
        value = None  # falls through to the error below
    if isinstance(value, int):
        lo = hi = value
    elif isinstance(value, str):
        lo_text, sep, hi_text = value.strip().partition("..")
        try:
            lo = int(lo_text)
            hi = int(hi_text) if sep else lo
        except ValueError:
            lo = hi = -1
    else:
        lo = hi = -1
    if lo < 0 or hi < lo or hi > MAX_DIM:
        raise ArgumentError(
            f"{where}: a dimension must be a size like 128 or an inclusive range LO..HI like "
            f"1..512 (0 <= LO <= HI <= {MAX_DIM}), received {value!r}")
    return lo, hi


def dim_text(dim: DimRange) -> str:
    """``128`` or ``1..512``."""
    return str(dim[0]) if dim[0] == dim[1] else f"{dim[0]}..{dim[1]}"


def has_range(spec: Mapping[str, Sequence[Any]] | None) -> bool:
    """Whether some dimension of ``spec`` (input name -> dimensions) is a range ``LO..HI``."""
    return any(isinstance(d, str) and ".." in d for dims in (spec or {}).values() for d in dims)


@dataclass(frozen=True)
class ShapeRange:
    """The shapes of a model's inputs a range plan serves.

    Attributes:
        inputs: per input, in the model's input order, its dimensions as ``(lo, hi)``.
        axes: the dimensions that range, one per symbol (``sequence``), each as
            ``(label, (lo, hi), [(input, axis), ...])``.
    """

    inputs: tuple[tuple[str, tuple[DimRange, ...]], ...]
    axes: tuple[tuple[str, DimRange, tuple[tuple[str, int], ...]], ...]

    # -- building -------------------------------------------------------------------------
    @classmethod
    def bind(cls, declared: Sequence[DeclaredInput],
             given: Mapping[str, Sequence[Any]]) -> ShapeRange:
        """The range ``given`` (input name -> dimensions, each a size or ``"LO..HI"``) spans
        on a model's ``declared`` inputs: inputs not given take their fixed dimensions and the
        symbols the given ones set. Raises :class:`~dispatch.errors.ArgumentError` for an
        unknown input, a rank or fixed size that does not fit the declaration, a symbol given
        two ranges, or an input left unsized."""
        by_name = {d.name: d for d in declared}
        unknown = sorted(set(given) - set(by_name))
        if unknown:
            raise ArgumentError(
                f"shape range names {unknown}, which are not inputs of the model; its inputs "
                f"are " + "; ".join(d.describe() for d in declared))
        parsed: dict[str, tuple[DimRange, ...]] = {}
        symbols: dict[str, tuple[DimRange, str]] = {}
        for name, dims in given.items():
            decl = by_name[name]
            where = f"shape range of input {name!r}"
            if isinstance(dims, str | bytes) or not isinstance(dims, Sequence):
                raise ArgumentError(f"{where}: expected a list of dimensions like [1, \"1..512\"], "
                                    f"received {dims!r}")
            got = tuple(parse_dim(d, where) for d in dims)
            if decl.dims is not None:
                if len(got) != len(decl.dims):
                    raise ArgumentError(f"{where}: rank {len(got)}, but the model declares "
                                        f"{decl.describe()}")
                for k, (d, (lo, hi)) in enumerate(zip(decl.dims, got)):
                    if isinstance(d, int) and (lo, hi) != (d, d):
                        raise ArgumentError(f"{where}: dimension {k} is {dim_text((lo, hi))}, "
                                            f"but the model fixes it to {d} ({decl.describe()})")
                    if isinstance(d, str):
                        seen = symbols.setdefault(d, ((lo, hi), name))
                        if seen[0] != (lo, hi):
                            raise ArgumentError(
                                f"dimension {d!r} is {dim_text(seen[0])} in input {seen[1]!r} "
                                f"and {dim_text((lo, hi))} in input {name!r}; inputs sharing a "
                                f"symbolic dimension must agree on it")
            parsed[name] = got
        for decl in declared:
            if decl.name in parsed:
                continue
            if decl.dims is not None and all(isinstance(d, int) or d in symbols
                                             for d in decl.dims):
                parsed[decl.name] = tuple((d, d) if isinstance(d, int) else symbols[d][0]
                                          for d in decl.dims)  # type: ignore[misc]
            else:
                raise ArgumentError(
                    f"the shape range given ({', '.join(sorted(given))}) does not size input "
                    f"{decl.describe()}; give it too, e.g. --shape {decl.name}=1x1..128")
        inputs = tuple((d.name, parsed[d.name]) for d in declared)
        return cls(inputs, _axes(declared, inputs))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ShapeRange:
        """A range from its JSON form (:meth:`to_dict`); raises ArgumentError when malformed."""
        try:
            inputs = tuple((str(n), tuple(parse_dim(d, f"range input {n!r}") for d in dims))
                           for n, dims in data["inputs"])
            axes = tuple((str(label), (int(lo), int(hi)), tuple((str(i), int(a)) for i, a in at))
                         for label, (lo, hi), at in data["axes"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ArgumentError(f"malformed shape range {data!r}: {type(exc).__name__}: {exc}") \
                from None
        return cls(inputs, axes)

    def to_dict(self) -> dict[str, Any]:
        return {"inputs": [[n, [dim_text(d) for d in dims]] for n, dims in self.inputs],
                "axes": [[label, list(dim), [list(a) for a in at]] for label, dim, at in self.axes]}

    # -- reading --------------------------------------------------------------------------
    def text(self) -> str:
        """``input_ids=1x1..512 attention_mask=1x1..512`` (the store key's form)."""
        return " ".join(f"{n}={'x'.join(dim_text(d) for d in dims)}" for n, dims in self.inputs)

    def axes_text(self) -> str:
        """``sequence 1..512``."""
        return ", ".join(f"{label} {dim_text(dim)}" for label, dim, _ in self.axes)

    def why_not(self, shapes: ShapeSet) -> str | None:
        """Why concrete ``shapes`` lie outside the range, else ``None``."""
        got = dict(shapes)
        for name, dims in self.inputs:
            shape = got.get(name)
            if shape is None:
                return f"input {name!r} is missing"
            if len(shape) != len(dims):
                return f"input {name!r} has rank {len(shape)}, the range rank {len(dims)}"
            for k, (n, (lo, hi)) in enumerate(zip(shape, dims)):
                if not lo <= n <= hi:
                    return f"input {name!r} dimension {k} is {n}, outside {dim_text((lo, hi))}"
        return None

    def contains(self, shapes: ShapeSet) -> bool:
        return self.why_not(shapes) is None

    def point(self, shapes: ShapeSet) -> tuple[int, ...]:
        """The values ``shapes`` give the range's axes."""
        got = dict(shapes)
        return tuple(got[at[0][0]][at[0][1]] for _, _, at in self.axes)

    def size(self, shapes: ShapeSet) -> int:
        """The product of :meth:`point` (1 for a range with no axis): the bucket scale."""
        return math.prod(self.point(shapes))

    def at(self, point: Sequence[int]) -> dict[str, list[int]]:
        """The concrete shapes at ``point`` (one value per axis)."""
        value = {(i, a): v for (_, _, at), v in zip(self.axes, point) for i, a in at}
        return {n: [value.get((n, k), lo) for k, (lo, _) in enumerate(dims)]
                for n, dims in self.inputs}

    def ends(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The smallest and the largest point."""
        return (tuple(lo for _, (lo, _), _ in self.axes),
                tuple(hi for _, (_, hi), _ in self.axes))

    def sample_points(self, count: int, extra: Sequence[Sequence[int]] = (),
                      align: Sequence[int] = ()) -> list[tuple[int, ...]]:
        """About ``count`` points spread over the range (both ends, the rest on a geometric
        scale from the small end to the large), plus ``extra`` points inside the range (the
        user's requests), sorted by size, duplicates dropped. ``align``: per axis, a step the
        spread points are rounded to (a detector that takes multiples of 32), kept inside."""
        small, large = self.ends()
        steps = list(align) or [1] * len(small)

        def snap(v: int, lo: int, hi: int, step: int) -> int:
            if step <= 1:
                return v
            up = -(-lo // step) * step
            down = hi // step * step
            return v if up > down else max(up, min(down, round(v / step) * step))

        points = {tuple(snap(v, lo, hi, st) for v, lo, hi, st in zip(p, small, large, steps))
                  for p in (small, large)}
        for k in range(1, max(count - 1, 1)):
            frac = k / max(count - 1, 1)
            points.add(tuple(snap(max(lo, min(hi, round(max(lo, 1) * (hi / max(lo, 1)) ** frac))),
                                  lo, hi, st)
                             for lo, hi, st in zip(small, large, steps)))
        inside = [tuple(int(v) for v in p) for p in extra
                  if len(p) == len(small) and all(lo <= v <= hi
                                                  for v, lo, hi in zip(p, small, large))]
        points.update(inside)
        return sorted(points, key=lambda p: (math.prod(p), p))


def _axes(declared: Sequence[DeclaredInput],
          inputs: tuple[tuple[str, tuple[DimRange, ...]], ...]
          ) -> tuple[tuple[str, DimRange, tuple[tuple[str, int], ...]], ...]:
    """The ranged dimensions, grouped by the symbol that names them (an unnamed one is an axis
    of its own, labelled ``input[axis]``)."""
    by_name = {d.name: d for d in declared}
    groups: dict[str, tuple[DimRange, list[tuple[str, int]]]] = {}
    for name, dims in inputs:
        decl = by_name[name].dims
        for k, dim in enumerate(dims):
            if dim[0] == dim[1]:
                continue
            symbol = decl[k] if decl is not None and isinstance(decl[k], str) else None
            label = str(symbol) if symbol else f"{name}[{k}]"
            groups.setdefault(label, (dim, []))[1].append((name, k))
    return tuple((label, dim, tuple(at)) for label, (dim, at) in groups.items())
