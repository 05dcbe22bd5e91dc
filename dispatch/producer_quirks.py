"""Producers' habits in declared shapes that onnxruntime and OpenVINO accept and ONNX itself
spells otherwise, rewritten when a model is imported (issue 31); each rewrite is recorded
(:attr:`dispatch.graph.Graph.quirks`) with the producer that made it, for reports.

- Paddle2ONNX writes a dynamic dimension as ``-1`` (``x: [-1, 3, -1, -1]``);
- Paddle2ONNX names unknown dimensions ``"?"`` (``[-1, 3, "?", "?"]``), which read literally
  would be one symbol shared by height and width.
"""

from __future__ import annotations

import onnx


def open_unknown_dims(proto: onnx.ModelProto) -> list[str]:
    """Rewrite, in place, negative dimensions (and ones named :data:`UNNAMED_DIMS`) of the
    graph's declared inputs, outputs and value_info as unknown ones, and say which were
    rewritten.

    Paddle2ONNX writes a dynamic dimension as ``-1`` (``x: [-1, 3, -1, -1]``), which
    onnxruntime and OpenVINO read as "any size"; ONNX itself has ``dim_param`` or an unset
    dimension for that. The rewritten dimension takes its size from ``input_shapes`` like
    any symbolic one."""
    found = []
    g = proto.graph
    for kind, items in (("input", g.input), ("output", g.output), ("value_info", g.value_info)):
        for vi in items:
            if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
                continue
            dims = vi.type.tensor_type.shape.dim
            negative = [d for d in dims if d.HasField("dim_value") and d.dim_value < 0]
            unnamed = [d for d in dims if d.HasField("dim_param") and d.dim_param in UNNAMED_DIMS]
            if not negative and not unnamed:
                continue
            before = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "") for d in dims]
            for d in negative:
                d.ClearField("dim_value")
            for d in unnamed:
                d.ClearField("dim_param")
            what = " and ".join(
                w for w, on in (("negative dimensions", negative),
                                (f"dimensions named {sorted({repr(n) for n in UNNAMED_DIMS})}",
                                 unnamed)) if on)
            found.append(f"{kind} {vi.name!r} declared {before}: {what} read as dynamic, each "
                         f"independently (as Paddle2ONNX writes them; producer "
                         f"{proto.producer_name or 'unnamed'} {proto.producer_version})".rstrip())
    return found


#: symbolic dimension names that mean "unknown", not a symbol shared by the dimensions that
#: carry it (Paddle2ONNX declares a classifier's input ``[-1, 3, "?", "?"]``, whose height
#: and width differ)
UNNAMED_DIMS = frozenset({"?"})
