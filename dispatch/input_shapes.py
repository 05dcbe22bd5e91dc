"""Declared input shapes with symbolic dimensions, and the concrete shapes they are bound to.

Exported models declare their inputs with symbolic dimensions (``input_ids: int64 [batch,
sequence]``); a plan is made for concrete shapes. This module holds what links the two (issue
14, "one Session, many shapes"):

- :func:`declared_inputs`: the model's inputs as declared, symbols kept;
- :func:`bind`: complete concrete shapes from the ones given, each symbol taking the value
  that the given shapes give it (``--shape input_ids=4x64`` also sizes ``attention_mask:
  [batch, sequence]``), checked against the declaration;
- :func:`feed_shapes`: the concrete shapes of a run's feeds, checked the same way;
- :func:`family_digest`: the identity of a model's structure *before* its shapes are fixed,
  shared by all the plans tuned for its shapes (the plan key's model fingerprint is taken
  after folding, so it differs from shape to shape);
- :func:`format_shapes`: how errors and reports write a set of shapes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dispatch.errors import FeedError, ShapeInferenceError

if TYPE_CHECKING:
    import onnx

    from dispatch.graph import Graph

#: a declared dimension: a size, a symbol (``"batch"``), or ``None`` (unnamed, unknown)
Dim = int | str | None
#: concrete shapes of a model's inputs, in input order: ``((name, (d0, d1, ...)), ...)``
ShapeSet = tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True)
class DeclaredInput:
    """A model input as the model declares it.

    Attributes:
        name: the input's name.
        dims: the declared dimensions (sizes, symbols or ``None``); ``None`` for an input
            declared without a shape (unknown rank).
        dtype: the element type.
    """

    name: str
    dims: tuple[Dim, ...] | None
    dtype: np.dtype

    @property
    def symbolic(self) -> bool:
        """Whether the declaration leaves some dimension (or the rank) open."""
        return self.dims is None or any(not isinstance(d, int) for d in self.dims)

    def dims_text(self) -> str:
        """``[batch, 128]``; ``[?]`` for an unnamed dimension; ``(any rank)`` without a shape."""
        if self.dims is None:
            return "(any rank)"
        return "[" + ", ".join("?" if d is None else str(d) for d in self.dims) + "]"

    def describe(self) -> str:
        """``input_ids: int64 [batch, sequence]``."""
        return f"{self.name}: {np.dtype(self.dtype).name} {self.dims_text()}"


def declared_inputs(proto: onnx.ModelProto) -> list[DeclaredInput]:
    """The real inputs of ``proto`` (initializers listed as inputs left out), as declared.
    Inputs that are no tensor, or of an element type numpy has no dtype for, are left out
    (the import says what is wrong with them)."""
    from onnx import helper

    from dispatch.op_schema import shape_of

    init = {i.name for i in proto.graph.initializer}
    out = []
    for vi in proto.graph.input:
        if vi.name in init:
            continue
        got = shape_of(vi.type)
        if got is None or not got[1]:
            continue
        dims, elem = got
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem))
        except (KeyError, ValueError, TypeError):
            continue
        has_shape = vi.type.tensor_type.HasField("shape")
        out.append(DeclaredInput(vi.name, tuple(dims) if has_shape else None, dtype))
    return out


def declared_in_file(path: str) -> list[DeclaredInput]:
    """:func:`declared_inputs` of the model file at ``path`` (its weights left unread); raises
    :class:`~dispatch.errors.ArgumentError` naming the file when it cannot be read."""
    import onnx

    from dispatch.errors import ArgumentError

    try:
        proto = onnx.load(path, load_external_data=False)
    except Exception as exc:  # a missing file, or not an ONNX model
        raise ArgumentError(f"cannot read the model {path}: {exc}") from None
    return declared_inputs(proto)


def is_dynamic(declared: Iterable[DeclaredInput]) -> bool:
    """Whether some input leaves a dimension open (so more than one shape can be fed)."""
    return any(d.symbolic for d in declared)


def mismatch(decl: DeclaredInput, shape: Sequence[int]) -> str | None:
    """Why concrete ``shape`` does not fit ``decl`` (rank, or a fixed dimension), else ``None``."""
    if decl.dims is None:
        return None
    if len(shape) != len(decl.dims):
        return f"rank {len(shape)}, but the model declares rank {len(decl.dims)}"
    for k, (d, n) in enumerate(zip(decl.dims, shape)):
        if isinstance(d, int) and d != n:
            return f"dimension {k} is {n}, but the model fixes it to {d}"
    return None


def _symbol_values(
    declared: Sequence[DeclaredInput], shapes: Mapping[str, Sequence[int]]
) -> dict[str, int]:
    """The value each symbol takes in ``shapes``; raises when one symbol takes two values."""
    seen: dict[str, tuple[int, str]] = {}
    by_name = {d.name: d for d in declared}
    for name, shape in shapes.items():
        decl = by_name.get(name)
        if decl is None or decl.dims is None:
            continue
        for d, n in zip(decl.dims, shape):
            if not isinstance(d, str):
                continue
            if d in seen and seen[d][0] != int(n):
                raise ShapeInferenceError(
                    f"dimension {d!r} is {seen[d][0]} in input {seen[d][1]!r} and {int(n)} in "
                    f"input {name!r}; inputs sharing a symbolic dimension must agree on it"
                )
            seen.setdefault(d, (int(n), name))
    return {k: v for k, (v, _) in seen.items()}


def bind(
    declared: Sequence[DeclaredInput], given: Mapping[str, Sequence[int]] | None
) -> dict[str, list[int]]:
    """Concrete shapes for the inputs ``given`` shapes determine.

    A symbol takes the value a given shape gives it, and an input that was not given gets its
    shape from its fixed dimensions and those symbols. Inputs that stay open (a symbol nobody
    gave, an unnamed dimension) are left out, and the given shapes are not checked against
    their declarations: the import says what is wrong with them. Raises
    :class:`ShapeInferenceError` when one symbol is given two values."""
    given = {k: [int(d) for d in v] for k, v in (given or {}).items()}
    values = _symbol_values(declared, given)
    out = dict(given)
    for decl in declared:
        if decl.name in out or decl.dims is None:
            continue
        if decl.symbolic and all(isinstance(d, int) or (isinstance(d, str) and d in values)
                                 for d in decl.dims):
            out[decl.name] = [d if isinstance(d, int) else values[d] for d in decl.dims]  # type: ignore[misc]
    return out


def feed_shapes(declared: Sequence[DeclaredInput], feeds: Mapping[str, Any]) -> ShapeSet:
    """The concrete shapes of ``feeds`` (arrays or anything with a ``shape``), in the model's
    input order, checked against the declaration: a feed of another rank or another fixed
    dimension, a missing or unknown name raise :class:`~dispatch.errors.FeedError` naming
    the declaration (dtypes and values are left to the feed check of the plan that runs)."""
    unknown = [k for k in feeds if k not in {d.name for d in declared}]
    missing = [d.name for d in declared if d.name not in feeds]
    if unknown or missing:
        parts = ([f"unknown input name(s) {unknown}"] if unknown else []) + (
            [f"missing input(s) {missing}"] if missing else [])
        raise FeedError(f"{'; '.join(parts)}; the model expects "
                        + (", ".join(d.describe() for d in declared) or "no inputs"))
    out = []
    for decl in declared:
        if decl.name not in feeds:
            continue
        value = feeds[decl.name]
        shape = tuple(int(d) for d in np.shape(value))
        why = mismatch(decl, shape)
        if why:
            raise FeedError(
                f"input {decl.name!r}: received shape {list(shape)}, which does not fit the "
                f"model's input {decl.describe()}: {why}"
            )
        out.append((decl.name, shape))
    try:
        _symbol_values(declared, dict(out))
    except ShapeInferenceError as exc:
        raise FeedError(f"the feeds' shapes disagree: {exc}") from None
    return tuple(out)


def shape_set(shapes: Mapping[str, Sequence[int]], order: Sequence[str]) -> ShapeSet:
    """``shapes`` as a :data:`ShapeSet` in input order ``order`` (inputs absent left out)."""
    return tuple((n, tuple(int(d) for d in shapes[n])) for n in order if n in shapes)


def format_shapes(shapes: ShapeSet | Mapping[str, Sequence[int]]) -> str:
    """``input_ids[4,64], attention_mask[4,64]``."""
    items = shapes.items() if isinstance(shapes, Mapping) else shapes
    return ", ".join(f"{n}[{','.join(str(int(d)) for d in s)}]" for n, s in items)


def _canonical(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return {"dtype": value.dtype.str, "shape": list(value.shape),
                "sha256": hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in sorted(value.items())}
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    return repr(value)


def family_digest(graph: Graph, declared: Sequence[DeclaredInput]) -> str:
    """sha256 hex of ``graph``'s structure with its input shapes left open: operators,
    attributes, wiring, the inputs' names, dtypes and declared dimensions, and the constants'
    dtypes and shapes (not their values, as the plan key's model fingerprint). Computed on
    the imported graph before folding, it is the same for every shape the model is given."""
    record = {
        "inputs": [[d.name, np.dtype(d.dtype).str, None if d.dims is None else list(d.dims)]
                   for d in declared],
        "opsets": sorted(graph.opsets.items()),
        "constants": sorted([v.name, v.const.dtype.str, list(v.const.shape)]
                            for v in graph.values.values() if v.const is not None),
        "nodes": [[n.domain, n.op_type, int(n.opset), [i.name if i else "" for i in n.inputs],
                   [o.name for o in n.outputs], _canonical(dict(n.attrs))] for n in graph.nodes],
        "outputs": [v.name for v in graph.outputs],
    }
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=repr).encode()).hexdigest()
