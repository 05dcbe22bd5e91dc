"""Turn a pytest-benchmark JSON file into the markdown tables of bench/README.md.

    python -m pytest bench -q --benchmark-enable --benchmark-json=bench.json
    python bench/report.py bench.json

Sections: the GEMM peak; per-layer Conv GFLOP/s (best native implementation, numpy im2col,
onnxruntime, best oneDNN implementation) with ratios and fractions of peak; converter GB/s
against a plain copy; the exported models of bench/test_bench_models.py (groups
``models-NAME``: every variant's median, ratio to onnxruntime and start time, and the tuned
plan's predicted against measured latency); start-up from the store (groups ``startup-NAME``
of bench/test_bench_startup.py: creation against onnxruntime's, with issue 13's bound); and
the remaining groups (end to end) as medians side by side with ratios to onnxruntime.
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
            # bench/test_bench_models.py names its variants (e.g. ``native_plan``) in extra_info
            "variant": info.get("variant") or name,
            "param": b.get("param") or "",
            "median_ms": b["stats"]["median"] * 1e3,
            "iqr_ms": b["stats"]["iqr"] * 1e3,
            "rounds": b["stats"]["rounds"],
            "flops": info.get("flops"),
            "bytes": info.get("bytes"),
            "impl": info.get("impl", ""),
            "start_s": info.get("start_s"),
            "predicted_ms": info.get("predicted_ms"),
            "validated_ms": info.get("validated_ms"),
            "winner": info.get("winner"),
            "tune_s": info.get("tune_s"),
            "plan": info.get("plan"),
            "create_s": info.get("create_s"),
            "first_run_s": info.get("first_run_s"),
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
        copy_gbs = (float(copy["bytes"].iloc[0] / (copy["median_ms"].iloc[0] * 1e-3) / 1e9)
                    if len(copy) else None)
        row = {"shape (C x H x W)": group.removeprefix("layout "), "copy GB/s": copy_gbs}
        for _, r in sub[sub["variant"] == "convert"].iterrows():
            gbs = r["bytes"] / (r["median_ms"] * 1e-3) / 1e9
            pair = r["param"].split("-", 1)[-1] if "-" in r["param"] else r["param"]
            row[f"{pair} GB/s"] = gbs
            row[f"{pair} / copy"] = gbs / copy_gbs if copy_gbs else None
        out.append(row)
    return pd.DataFrame(out).round(2).to_markdown(index=False, floatfmt=".2f")


#: the group prefix of bench/test_bench_models.py
MODELS_PREFIX = "models-"
#: the order of its variants in the tables (others, e.g. new backends' plans, follow by name)
MODELS_ORDER = ("onnxruntime", "openvino", "tuned_plan", "default_session")


def _variant_order(v: str) -> tuple:
    return (MODELS_ORDER.index(v), "") if v in MODELS_ORDER else (len(MODELS_ORDER) + (v == "numpy_plan"), v)


def _plan_text(plan) -> str:
    return ", ".join(f"{b} {n}" for b, n in plan.items()) if isinstance(plan, dict) else ""


def models_tables(df: pd.DataFrame, baseline: str = "onnxruntime") -> str:
    """Per exported model: every variant's median, IQR, rounds, ratio to ``baseline``, start
    (session creation) time and what the plan runs on; then one table of the tuned plans'
    predicted latency (the optimiser's estimate of the winner), the tuner's own validation
    median and the median measured here."""
    mod = df[df["group"].str.startswith(MODELS_PREFIX)]
    if not len(mod):
        return ""
    out, tuned = [], []
    for g, sub in mod.groupby("group", sort=True):
        model = g.removeprefix(MODELS_PREFIX)
        base = sub[sub["variant"] == baseline]
        ref = float(base["median_ms"].iloc[0]) if len(base) else float(sub["median_ms"].min())
        sub = sub.assign(ratio=(sub["median_ms"] / ref).round(2), plan=sub["plan"].map(_plan_text),
                         order=sub["variant"].map(_variant_order)).sort_values("order")
        out.append(f"#### {model}\n")
        out.append(sub[["variant", "median_ms", "iqr_ms", "rounds", "ratio", "start_s", "plan"]]
                   .round({"median_ms": 2, "iqr_ms": 2, "start_s": 2}).to_markdown(index=False))
        out.append(f"\nratio = median / median of `{baseline if len(base) else 'fastest'}`; "
                   "start_s = model load and session creation (once)\n")
        for _, r in sub[sub["variant"] == "tuned_plan"].iterrows():
            pred = r["predicted_ms"]
            has_pred = pred is not None and not pd.isna(pred)
            tuned.append({
                "model": model, "winner": r["winner"], "plan": r["plan"],
                "predicted_ms": pred if has_pred else None,
                "tuner_validated_ms": r["validated_ms"],
                "measured_ms": r["median_ms"],
                "measured / predicted": r["median_ms"] / pred if has_pred and pred else None,
                "measured / onnxruntime": r["median_ms"] / ref if len(base) else None,
                "tune_s": r["tune_s"],
            })
    if tuned:
        out.append("#### tuned plans: predicted against measured\n")
        table = pd.DataFrame(tuned).round(2)
        table = table.astype(object).where(table.notna(), None)  # missing values print as "-"
        out.append(table.to_markdown(index=False, floatfmt=".2f", missingval="-"))
        out.append("\npredicted_ms: the optimiser's estimate of the winning plan (empty when the "
                   "winner is a baseline plan the optimiser did not produce); tuner_validated_ms: "
                   "the tuner's end-to-end validation median; measured_ms: the median here\n")
    return "\n".join(out)


#: the group prefix of bench/test_bench_startup.py
STARTUP_PREFIX = "startup-"
#: issue 13's start-up bound: a Session from the store within 1.2x onnxruntime's creation, or
#: at most 100 ms above it
STARTUP_RATIO, STARTUP_SLACK_S = 1.2, 0.100


def startup_table(df: pd.DataFrame) -> str:
    """One row per model of bench/test_bench_startup.py: onnxruntime's InferenceSession
    creation against a Session from the store (medians of the children's own clocks), the
    bound, the first run and the whole child process (pytest-benchmark's median)."""
    st = df[df["group"].str.startswith(STARTUP_PREFIX)]
    if not len(st):
        return ""
    rows = []
    for g, sub in st.groupby("group", sort=False):
        by = {r["variant"]: r for _, r in sub.iterrows()}
        ort, ours = by.get("onnxruntime"), by.get("tuned_from_store")
        if ort is None or ours is None:
            continue
        a, b = float(ort["create_s"]), float(ours["create_s"])
        ok = b <= STARTUP_RATIO * a or b - a <= STARTUP_SLACK_S
        rows.append({
            "model": g.removeprefix(STARTUP_PREFIX),
            "tuned plan": ours["plan"] or "",
            "onnxruntime create s": f"{a:.3f}",
            "tuned from store create s": f"{b:.3f}",
            "ratio": f"{b / a:.2f}",
            "difference ms": f"{(b - a) * 1e3:+.0f}",
            "within 1.2x or +100 ms": "yes" if ok else "**no**",
            "first run ms: onnxruntime / tuned":
                f"{float(ort['first_run_s']) * 1e3:.0f} / {float(ours['first_run_s']) * 1e3:.0f}",
            "whole process s: onnxruntime / tuned":
                f"{ort['median_ms'] / 1e3:.2f} / {ours['median_ms'] / 1e3:.2f}",
        })
    if not rows:
        return ""
    met = sum(r["within 1.2x or +100 ms"] == "yes" for r in rows)
    return (pd.DataFrame(rows).to_markdown(index=False)
            + f"\n\nwithin the bound: {met} of {len(rows)} models\n")


def other_tables(df: pd.DataFrame, baseline: str = "onnxruntime") -> str:
    rest = df[~df["group"].str.startswith(("conv ", "layout ", "peak", MODELS_PREFIX, STARTUP_PREFIX))]
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
                        ("Exported models", models_tables(df)),
                        ("Start-up from the store", startup_table(df)), ("End to end", other_tables(df))):
        if body:
            parts.append(f"### {title}\n\n{body}\n")
    m = data.get("machine_info", {})
    parts.append(f"machine: {m.get('cpu', {}).get('brand_raw', '?')}, "
                 f"{m.get('cpu', {}).get('count', '?')} cores, python {m.get('python_version', '?')}; "
                 f"{data.get('datetime', '')}")
    return "\n".join(parts)


if __name__ == "__main__":
    print(report(sys.argv[1]))
