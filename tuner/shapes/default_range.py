"""The shape range a model declares implicitly, for ``opdispatch tune MODEL`` without
``--shape`` on a model with symbolic dimensions (issue 51).

A transformer's sequence axis is bounded by its position-embedding table: the positions index a
table of ``P`` rows (a Gather from a constant ``[P, hidden]``, by position ids that are not the
token ids), so no request can be longer than ``P``. The batch axis (the first of every input)
is served at 1. When the model shows no such bound, there is no default and the user names the
range (``--shape input_ids=1x1..512``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dispatch.input_shapes import DeclaredInput

#: the largest table taken for a position-embedding table (larger ones are vocabularies)
MAX_POSITIONS = 16384


@dataclass(frozen=True)
class ModelRange:
    """A range spec read from a model, and what it was read from (for the report)."""

    spec: dict[str, list[Any]]
    source: str


def position_table(proto: Any) -> tuple[str, int] | None:
    """The position-embedding table of ``proto``: ``(name, rows)`` of the smallest constant
    ``[rows, hidden]`` table (``2 <= rows <= MAX_POSITIONS``) read by a Gather whose indices are
    not a graph input holding token ids (``*ids`` but not ``position*``), else ``None``."""
    graph = proto.graph
    tables = {t.name: list(t.dims) for t in graph.initializer}
    inputs = {i.name for i in graph.input} - set(tables)
    found = []
    for node in graph.node:
        if node.op_type != "Gather" or len(node.input) < 2 or node.domain not in ("", "ai.onnx"):
            continue
        data, indices = node.input[0], node.input[1]
        dims = tables.get(data)
        if dims is None or len(dims) != 2 or not 2 <= dims[0] <= MAX_POSITIONS:
            continue
        if indices in inputs and not indices.lower().startswith("position"):
            continue  # token ids (a vocabulary) or token types
        if any(a.name == "axis" and a.i not in (0,) for a in node.attribute):
            continue
        found.append((dims[0], data))
    if not found:
        return None
    rows, name = min(found)
    return name, rows


def range_from_model(proto: Any, declared: Sequence[DeclaredInput]) -> ModelRange | None:
    """The range ``proto`` implies (see the module docstring), else ``None``: every symbolic
    first axis at 1, every other symbolic axis ``1..P``."""
    table = position_table(proto)
    if table is None:
        return None
    name, rows = table
    spec: dict[str, list[Any]] = {}
    for decl in declared:
        if decl.dims is None:
            return None
        dims: list[Any] = []
        for k, d in enumerate(decl.dims):
            if isinstance(d, int):
                dims.append(d)
            elif k == 0 and len(decl.dims) > 1:
                dims.append(1)
            else:
                dims.append(f"1..{rows}")
        spec[decl.name] = dims
    return ModelRange(spec, f"the position-embedding table {name!r} ({rows} rows): sequences of "
                            f"1..{rows}, batch 1")
