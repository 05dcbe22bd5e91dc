"""Check exported corpus files (bench/models/corpus_export.py) against onnxruntime: each file
loads, and its default plan, its kernel plan (native and numpy, no onnxruntime region) and its
tuned plan (tuned into a temporary store) match onnxruntime on every output. Prints one
markdown row per file (the table of bench/models/README.md).

    python bench/models/corpus_check.py                        # the tiny files of the tests
    python bench/models/corpus_check.py --dir ~/.cache/opdispatch/bench-models/corpus --budget 30
    python bench/models/corpus_check.py swin bert --no-tune
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.models.corpus import TINY_DIR, feeds_for

#: rtol, and atol as a fraction of the largest reference magnitude
RTOL, ATOL_OF_MAX = 1e-3, 1e-4


def reference(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime's outputs (CPU, graph optimisations off)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"]).run(None, feeds)


def worst_error(got: Sequence[np.ndarray], ref: Sequence[np.ndarray]) -> float:
    """The largest ``|got - ref| / max|ref|`` over every output; raises AssertionError when an
    output's shape differs or an element is outside rtol/atol."""
    assert len(got) == len(ref), f"{len(got)} outputs, onnxruntime {len(ref)}"
    worst = 0.0
    for k, (g, r) in enumerate(zip(got, ref)):
        assert g.shape == r.shape, f"output {k}: shape {g.shape}, onnxruntime {r.shape}"
        scale = float(np.max(np.abs(r))) or 1.0
        np.testing.assert_allclose(g, r, rtol=RTOL, atol=ATOL_OF_MAX * scale, err_msg=f"output {k}")
        worst = max(worst, float(np.max(np.abs(g.astype(np.float64) - r))) / scale)
    return worst


def check(path: Path, budget_s: float | None) -> dict[str, str]:
    """``{variant: "max error E" | "fails: why"}`` for the default, kernel and tuned plans."""
    from dispatch import Session
    from dispatch.backend import load_registry

    shapes, feeds = feeds_for(path)
    ref = reference(path, feeds)
    native = load_registry().backends.get("native")
    kernels = (["native"] if native is not None and native.available else []) + ["numpy"]
    out: dict[str, str] = {}
    variants: list[tuple[str, dict]] = [("default", {}), ("kernels", {"backends": kernels})]
    if budget_s:
        variants.append(("tuned", {}))
    for name, kwargs in variants:
        t0 = time.monotonic()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if name == "tuned":
                    store = os.path.join(tempfile.mkdtemp(prefix="opdispatch-corpus-"), "plans.sqlite")
                    sess = Session(str(path), input_shapes=shapes, store=store)
                    sess.tune(budget_s=budget_s, progress=False)
                else:
                    sess = Session(str(path), input_shapes=shapes, store=False, **kwargs)
                err = worst_error(sess.run(None, feeds), ref)
            out[name] = f"{err:.1e}"
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            out[name] = f"fails: {type(exc).__name__}: {first[:240]}"
        out[name + "_s"] = f"{time.monotonic() - t0:.1f}"
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module's docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", help="file stems or architecture names (default: all)")
    ap.add_argument("--dir", default=str(TINY_DIR), help=f"folder of .onnx files (default {TINY_DIR})")
    ap.add_argument("--budget", type=float, default=2.0, help="tuning budget in seconds")
    ap.add_argument("--no-tune", action="store_true", help="leave the tuned plan out")
    args = ap.parse_args(argv)
    files = sorted(Path(args.dir).expanduser().glob("*.onnx"))
    if args.models:
        files = [f for f in files if any(f.stem == m or f.stem.startswith(m + "_") for m in args.models)]
    if not files:
        print(f"no .onnx files in {args.dir}", file=sys.stderr)
        return 1
    print("| file | default plan | kernel plan | tuned plan |")
    print("|---|---|---|---|")
    failed = 0
    for f in files:
        res = check(f, None if args.no_tune else args.budget)
        failed += any(v.startswith("fails") for v in res.values())
        cells = [res.get(k, "-") for k in ("default", "kernels", "tuned")]
        print(f"| `{f.stem}` | " + " | ".join(cells) + " |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
