"""A copy of a batch-1 model whose inputs and outputs start with a symbolic ``batch`` dimension,
as a user exporting with ``dynamic_axes={name: {0: "batch"}}`` gets it, so that a server may
group requests into batches (``opdispatch serve --max-batch-size``) and the bench can measure
what that brings.

    python bench/models/symbolic_batch.py MODEL.onnx [OUT.onnx] [--check 4]

The graph is left as it is; only the first dimension of every graph input and output is
renamed to ``batch`` (and the inferred intermediate shapes dropped, so that nothing holds the
old size). A model whose graph bakes the batch size into a constant (a ``Reshape`` to
``[1, -1]``) would then compute wrongly for other sizes: the copy is checked by running it in
onnxruntime at batch ``--check`` (default 4) on seeded inputs against the batch-1 model run on
each sample alone, and refused (nothing written) when they differ or it does not run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

#: the symbolic name the first dimension gets
BATCH = "batch"
#: onnxruntime's names of the float types numpy spells otherwise
_ORT_FLOATS = {"float": "float32", "double": "float64"}
#: how far a batched output may be from the per-sample outputs (relative to their largest value)
TOLERANCE = 1e-4


def symbolic_batch(model):
    """``model`` (an ``onnx.ModelProto``, batch 1) with a symbolic first dimension on every graph
    input and output; raises ``ValueError`` when one does not start with 1."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    initializers = {t.name for t in out.graph.initializer}
    for value in [*out.graph.input, *out.graph.output]:
        if value.name in initializers:
            continue
        dims = value.type.tensor_type.shape.dim
        if not dims or (dims[0].HasField("dim_value") and dims[0].dim_value != 1):
            first = dims[0].dim_value if dims else "none (a scalar)"
            raise ValueError(f"{value.name}: the first dimension must be 1 to become the batch, "
                             f"received {first}")
        dims[0].Clear()
        dims[0].dim_param = BATCH
    del out.graph.value_info[:]
    return out


def _feeds(session, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in session.get_inputs():
        shape = [batch if k == 0 else int(d) for k, d in enumerate(i.shape)]
        name = i.type.removeprefix("tensor(").removesuffix(")")  # onnxruntime's "tensor(float)"
        dtype = np.dtype(_ORT_FLOATS.get(name, name))
        if dtype.kind in "iu":
            feeds[i.name] = rng.integers(0, 100, shape).astype(dtype)
        else:
            feeds[i.name] = rng.random(shape).astype(dtype)
    return feeds


def check(original: Path, batched: Path, batch: int) -> str | None:
    """Why the batched copy computes differently from the batch-1 model, else ``None``."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4  # the failure is reported here, not logged
    one = ort.InferenceSession(str(original), options, providers=["CPUExecutionProvider"])
    many = ort.InferenceSession(str(batched), options, providers=["CPUExecutionProvider"])
    feeds = _feeds(many, batch)
    try:
        got = many.run(None, feeds)
    except Exception as exc:
        return f"it does not run at batch {batch}: {type(exc).__name__}: {exc}"[:500]
    for k in range(batch):
        alone = one.run(None, {n: a[k:k + 1] for n, a in feeds.items()})
        for j, (a, b) in enumerate(zip(alone, got)):
            scale = max(float(np.abs(a).max()), 1e-6)
            diff = float(np.abs(a[0] - b[k]).max()) / scale
            if diff > TOLERANCE:
                return f"output {j} of sample {k} differs from the batch-1 model's by {diff:.3g} (relative)"
    return None


def main(argv: list[str] | None = None) -> int:
    import onnx

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a batch-1 .onnx model")
    ap.add_argument("out", nargs="?", help="where to write the copy (default: MODEL_batch.onnx beside it)")
    ap.add_argument("--check", type=int, default=4, help="the batch size the copy is checked at")
    args = ap.parse_args(argv)
    src = Path(args.model)
    out = Path(args.out) if args.out else src.with_name(f"{src.stem}_batch.onnx")
    try:
        model = symbolic_batch(onnx.load(str(src)))
    except (OSError, ValueError) as exc:
        print(f"error: {src}: {exc}", file=sys.stderr)
        return 2
    tmp = out.with_suffix(".onnx.tmp")
    onnx.save(model, str(tmp))
    why = check(src, tmp, args.check)
    if why is not None:
        tmp.unlink()
        print(f"error: {src} cannot take a symbolic batch: {why}", file=sys.stderr)
        return 1
    tmp.replace(out)
    print(f"{out}: inputs and outputs start with '{BATCH}'; checked at batch {args.check}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
