"""What a report says of a graph's dynamic values (shapes the data decides), its control-flow
nodes and the producers' habits its import rewrote (issue 31)."""

from __future__ import annotations

from dispatch.graph import Graph
from dispatch.subgraph import CONTROL_FLOW_OPS, subgraphs_of

#: how many dynamic values a report names one by one
DYNAMIC_SHOWN = 8


def graph_notes(graph: Graph) -> list[str]:
    """Notes on ``graph``: control-flow nodes (bodies, outer-scope reads), dynamic values
    (each with why, the first :data:`DYNAMIC_SHOWN`) and import quirks."""
    notes = []
    for node in graph.nodes:
        if node.op_type not in CONTROL_FLOW_OPS or node.domain != "":
            continue
        bodies = ", ".join(f"{k}: {len(a.proto.node)} node(s)"
                           for k, a in node.attrs.items() if a in subgraphs_of(node.attrs))
        reads = f"; reads {', '.join(node.captures)} from the enclosing graph" if node.captures else ""
        notes.append(f"control flow: node {node.name!r} ({node.op_type}) runs its bodies "
                     f"({bodies}) per run{reads}")
    if graph.dynamic:
        names = list(graph.dynamic)
        shown = "; ".join(f"{n} ({graph.dynamic[n]})" for n in names[:DYNAMIC_SHOWN])
        more = f"; and {len(names) - DYNAMIC_SHOWN} more" if len(names) > DYNAMIC_SHOWN else ""
        notes.append(f"dynamic shapes: {len(names)} value(s) are sized when the model runs, "
                     f"not when it loads (their memory is not in the peak figure): {shown}{more}")
    notes += [f"import: {q}" for q in graph.quirks]
    return notes
