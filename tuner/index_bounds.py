"""How large the random integers fed to a measured candidate or a validated plan may be.

The tuner measures on random inputs (it takes no feeds). Integers that end up as indices —
``token_type_ids`` gathered from a 2-row embedding, positions, class ids — must stay inside the
axis they index, or the model (correctly) raises. :func:`index_bounds` finds, for each value,
the smallest axis its integers index, following them back through the operators that pass
values on unchanged (casts and reshapes); everything else keeps the tuner's default range.
"""

from __future__ import annotations

from collections.abc import Iterable

from dispatch.graph import Node, Value

#: the tuner's range of random integers where nothing bounds them: [0, DEFAULT_HIGH)
DEFAULT_HIGH = 4
#: operators whose first input's values reach their output unchanged
PASS_THROUGH = frozenset({"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity",
                          "Expand", "Transpose", "Tile", "Concat", "Slice"})


def _axis_size(data: Value | None, axis: int) -> int | None:
    if data is None or data.shape is None or not data.shape:
        return None
    rank = len(data.shape)
    if not -rank <= axis < rank:
        return None
    return int(data.shape[axis])


#: com.microsoft's embedding operators: (input of ids, input of the table they index) pairs
#: (input_ids -> word_embedding, segment_ids -> segment_embedding, position_ids ->
#: position_embedding; QEmbedLayerNormalization has no position_ids)
EMBEDDING_IDS: dict[str, tuple[tuple[int, int], ...]] = {
    "EmbedLayerNormalization": ((0, 2), (1, 4), (8, 3)),
    "QEmbedLayerNormalization": ((0, 2), (1, 4)),
}


def _index_limits(node: Node) -> list[tuple[int, int]]:
    """(input position of the indices, how many values the indexed axis holds) of each index
    input of ``node``."""
    if node.domain == "com.microsoft" and node.op_type in EMBEDDING_IDS:
        return [(k, size) for k, table in EMBEDDING_IDS[node.op_type]
                if node.input(k) is not None and (size := _axis_size(node.input(table), 0)) is not None]
    limit = _index_limit(node)
    return [] if limit is None else [limit]


def _index_limit(node: Node) -> tuple[int, int] | None:
    """(input position of the indices, how many values the indexed axis holds) of ``node``."""
    op = node.op_type
    if op in ("Gather", "GatherElements", "ScatterElements"):
        size = _axis_size(node.input(0), int(node.attr("axis", 0)))
        return None if size is None else (1, size)
    if op in ("GatherND", "ScatterND"):
        data, idx = node.input(0), node.input(1)
        if data is None or data.shape is None or idx is None or idx.shape is None or not idx.shape:
            return None
        batch = int(node.attr("batch_dims", 0))
        dims = data.shape[batch: batch + int(idx.shape[-1])]
        return None if not dims else (1, int(min(dims)))
    return None


def index_bounds(nodes: Iterable[Node]) -> dict[str, int]:
    """Value name -> the exclusive upper bound its random integers need (only values that
    reach an index input of one of ``nodes``, directly or through :data:`PASS_THROUGH`)."""
    nodes = list(nodes)
    producer = {o.name: n for n in nodes for o in n.outputs}
    bounds: dict[str, int] = {}
    for node, (k, size) in ((n, limit) for n in nodes for limit in _index_limits(n)):
        if size <= 0:
            continue
        todo = [node.input(k)]
        seen: set[str] = set()
        while todo:
            v = todo.pop()
            if v is None or v.name in seen or v.is_const:
                continue
            seen.add(v.name)
            bounds[v.name] = min(bounds.get(v.name, size), size)
            src = producer.get(v.name)
            if src is not None and src.op_type in PASS_THROUGH:
                todo.append(src.input(0))
                if src.op_type == "Concat":
                    todo.extend(src.inputs[1:])
    return bounds
