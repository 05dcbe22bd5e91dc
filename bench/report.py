"""Turn a pytest-benchmark JSON file into the markdown tables of bench/README.md.

    python -m pytest bench -q --benchmark-enable --benchmark-json=bench.json
    python bench/report.py bench.json

Sections: the GEMM peak; per-layer Conv GFLOP/s (best native implementation, numpy im2col,
onnxruntime, best oneDNN implementation) with ratios and fractions of peak; converter GB/s against a plain copy; and the
remaining groups (end to end) as medians side by side with ratios to onnxruntime.
"""

from __future__ import annotations

import json
import sys

import pandas as pd


def _rows(data: dict) -> pd.DataFrame:
    rows = []
    for b in data["benchmarks"]:
        name = b["name"].split("[")[0].removeprefix("test_")
        info = b.get("extra_info", {})
        rows.append({
            "group": b["group"] or "",
            "variant": name,
            "param": b.get("param") or "",
            "median_ms": b["stats"]["median"] * 1e3,
            "iqr_ms": b["stats"]["iqr"] * 1e3,
            "rounds": b["stats"]["rounds"],
            "flops": info.get("flops"),
            "bytes": info.get("bytes"),
            "impl": info.get("impl", ""),
        })
    return pd.DataFrame(rows)


def _peak(df: pd.DataFrame) -> float | None:
    p = df[df["group"] == "peak"]
    if not len(p):
        return None
    return float(p["flops"].iloc[0] / (p["median_ms"].iloc[0] * 1e-3) / 1e9)


def conv_table(df: pd.DataFrame, peak: float | None) -> str:
    conv = df[df["group"].str.startswith("conv ")]
    if not len(conv):
        return ""
    out = []
    for group, sub in conv.groupby("group", sort=False):
        def gflops(variant: str, _sub=sub):
            r = _sub[_sub["variant"] == variant]
            if not len(r):
                return None, ""
            r = r.iloc[0]
            return r["flops"] / (r["median_ms"] * 1e-3) / 1e9, r["impl"]

        nat, impl = gflops("native")
        npy, _ = gflops("numpy_im2col")
        ort, _ = gflops("onnxruntime")
        dnn, _ = gflops("onednn")
        out.append({
            "layer": group.removeprefix("conv "),
            "native impl": impl.removeprefix("Conv.native.") if impl else "-",
            "native GFLOP/s": nat,
            "numpy GFLOP/s": npy,
            "ort GFLOP/s": ort,
            "onednn GFLOP/s": dnn,
            "native/ort": nat / ort if nat and ort else None,
            "native/numpy": nat / npy if nat and npy else None,
            "onednn/ort": dnn / ort if dnn and ort else None,
            "native % peak": 100 * nat / peak if nat and peak else None,
        })
    table = pd.DataFrame(out).round(2)
    return table.to_markdown(index=False, floatfmt=".2f")


def layout_table(df: pd.DataFrame) -> str:
    lay = df[df["group"].str.startswith("layout ")]
    if not len(lay):
        return ""
    out = []
    for group, sub in lay.groupby("group", sort=False):
        copy = sub[sub["variant"] == "copy"]
        copy_gbs = float(copy["bytes"].iloc[0] / (copy["median_ms"].iloc[0] * 1e-3) / 1e9) if len(copy) else None
        row = {"shape (C x H x W)": group.removeprefix("layout "), "copy GB/s": copy_gbs}
        for _, r in sub[sub["variant"] == "convert"].iterrows():
            gbs = r["bytes"] / (r["median_ms"] * 1e-3) / 1e9
            pair = r["param"].split("-", 1)[-1] if "-" in r["param"] else r["param"]
            row[f"{pair} GB/s"] = gbs
            row[f"{pair} / copy"] = gbs / copy_gbs if copy_gbs else None
        out.append(row)
    return pd.DataFrame(out).round(2).to_markdown(index=False, floatfmt=".2f")


def other_tables(df: pd.DataFrame, baseline: str = "onnxruntime") -> str:
    rest = df[~df["group"].str.startswith(("conv ", "layout ", "peak"))]
    out = []
    for g, sub in rest.groupby("group", sort=True):
        base = sub[sub["variant"] == baseline]
        ref = float(base["median_ms"].iloc[0]) if len(base) else float(sub["median_ms"].min())
        sub = sub.assign(ratio=(sub["median_ms"] / ref).round(2))
        out.append(f"#### {g}\n")
        out.append(sub[["variant", "median_ms", "iqr_ms", "rounds", "ratio"]]
                   .round({"median_ms": 2, "iqr_ms": 2}).to_markdown(index=False))
        out.append(f"\nratio = median / median of `{baseline if len(base) else 'fastest'}`\n")
    return "\n".join(out)


def report(path: str) -> str:
    with open(path) as f:
        data = json.load(f)
    df = _rows(data)
    peak = _peak(df)
    parts = []
    if peak:
        parts.append(f"GEMM peak (numpy float32 2048x2048 matmul): **{peak:.1f} GFLOP/s**\n")
    for title, body in (("Conv layers", conv_table(df, peak)), ("Layout converters", layout_table(df)),
                        ("End to end", other_tables(df))):
        if body:
            parts.append(f"### {title}\n\n{body}\n")
    m = data.get("machine_info", {})
    parts.append(f"machine: {m.get('cpu', {}).get('brand_raw', '?')}, "
                 f"{m.get('cpu', {}).get('count', '?')} cores, python {m.get('python_version', '?')}; "
                 f"{data.get('datetime', '')}")
    return "\n".join(parts)


if __name__ == "__main__":
    print(report(sys.argv[1]))
