"""Turn a pytest-benchmark JSON file into the markdown table of bench/README.md:
medians per group, side by side, with ratios to a baseline (onnxruntime when present).

    python -m pytest bench -q --benchmark-enable --benchmark-json=bench.json
    python bench/report.py bench.json
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

import pandas as pd


def table(path: str, baseline: str = "onnxruntime") -> str:
    with open(path) as f:
        data = json.load(f)
    rows = []
    for b in data["benchmarks"]:
        name = b["name"].split("[")[0].removeprefix("test_")
        param = b.get("param") or ""
        rows.append({
            "group": b["group"],
            "variant": name,
            "param": param,
            "median_ms": b["stats"]["median"] * 1e3,
            "iqr_ms": b["stats"]["iqr"] * 1e3,
            "rounds": b["stats"]["rounds"],
        })
    df = pd.DataFrame(rows)
    out = []
    groups: dict[str, pd.DataFrame] = defaultdict(pd.DataFrame)
    for g, sub in df.groupby("group", sort=True):
        groups[g] = sub
        base = sub[sub["variant"] == baseline]
        ref = float(base["median_ms"].iloc[0]) if len(base) else float(sub["median_ms"].min())
        sub = sub.assign(ratio=(sub["median_ms"] / ref).round(2))
        out.append(f"### {g}\n")
        out.append(sub[["variant", "median_ms", "iqr_ms", "rounds", "ratio"]]
                   .round({"median_ms": 2, "iqr_ms": 2}).to_markdown(index=False))
        out.append(f"\nratio = median / median of `{baseline if len(base) else 'fastest'}`\n")
    m = data.get("machine_info", {})
    out.append(f"machine: {m.get('cpu', {}).get('brand_raw', '?')}, {m.get('cpu', {}).get('count', '?')} cores, "
               f"python {m.get('python_version', '?')}; {data.get('datetime', '')}")
    return "\n".join(out)


if __name__ == "__main__":
    print(table(sys.argv[1]))
