"""Re-tuning stability (issue 4, item 6): tune the same model several times on this machine,
each time into a fresh store (nothing reused), then time every resulting plan side by side,
interleaved round by round so that machine noise hits them alike. Each plan runs in its own
process (a Session from its store, as production runs it), so that the plans' library thread
pools never share a process: per round, each process in turn, after a 0.1 s pause (another
library's workers still spinning from the previous plan go to sleep), runs its plan twice
untimed and then three times timed (the round's figure is their median). (Sessions of three
plans in one process, as this script timed them before, measured identical one-region
onnxruntime plans 1.0 / 1.57 / 1.27x apart: the three sessions' spinning pools, not the plans.)

    python bench/retune_stability.py resnet50 squeezenet --tunes 5 --rounds 30
    python bench/retune_stability.py inception_v1 --tunes 3 --busy-last   # issue 13

``--busy-last`` runs the last tuning with a second process busy-looping on one core (the
timing afterwards is quiet): a plan tuned on a busy machine must still be the same plan, or
one as fast. A model is one of onnx's light architectures or the path of an ONNX file.

Prints a markdown table per model: for each tuning run, whether its plan equals the first
run's, its median latency and its ratio to the first plan's median; then how often the same
plan was chosen and the largest deviation from the first plan.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # before numpy (see dispatch.BLAS_SPIN_ENV)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import pandas as pd

from dispatch.zoo import light_model
from tuner.tune import TuneOptions, tune


def plan_signature(plan) -> tuple:
    """What makes two plans the same: every step's nodes, implementation and layouts."""
    return tuple((tuple(s.nodes), s.impl, tuple(s.layouts_in), tuple(s.layouts_out)) for s in plan.steps)


def stability(name: str, tunes: int, rounds: int, budget_s: float, busy_last: bool = False) -> str:
    model = name if name.endswith(".onnx") else _saved(light_model(name, seed=0))
    runs = []
    for k in range(tunes):
        store = os.path.join(tempfile.mkdtemp(prefix="opdispatch-retune-"), "plans.sqlite")
        busy = busy_last and k == tunes - 1
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        t0 = time.monotonic()
        try:
            result = tune(model, store=store, options=TuneOptions(budget_s=budget_s, progress=False, seed=k))
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
        runs.append({"run": k + 1, "store": store, "tune_s": time.monotonic() - t0, "busy": busy,
                     "signature": plan_signature(result.plan),
                     "winner": result.plan.provenance.get("winner")})
        print(f"{name}: tuning run {k + 1}/{tunes} took {runs[-1]['tune_s']:.1f} s", file=sys.stderr)
    times = _time_apart(model, [r["store"] for r in runs], rounds)
    medians = [float(np.median(t)) * 1e3 for t in times]
    first = runs[0]["signature"]
    table = pd.DataFrame([{
        "tuning run": r["run"],
        "tuned while busy": r["busy"],
        "same plan as run 1": r["signature"] == first,
        "winner": r["winner"],
        "tuning s": round(r["tune_s"], 1),
        "median ms": round(m, 2),
        "ratio to run 1": round(m / medians[0], 3),
    } for r, m in zip(runs, medians)])
    same = sum(r["signature"] == first for r in runs)
    worst = max(abs(m / medians[0] - 1) for m in medians)
    return (f"#### {name}\n\n{table.to_markdown(index=False)}\n\n"
            f"same plan as run 1: {same}/{len(runs)}; largest deviation from run 1's latency: "
            f"{100 * worst:.1f}% ({rounds} interleaved rounds, each plan in its own process)\n")


# a plan's own process: loads the Session from its store, then for each line "N" on stdin runs
# the plan twice untimed and N times timed and prints the median seconds
_CHILD = r"""
import sys
import time

import numpy as np

from dispatch import Session

sess = Session(sys.argv[1], store=sys.argv[2], require_plan=True)
inputs = sess.get_inputs()
rng = np.random.default_rng(0)
feeds = {i.name: rng.standard_normal(i.shape).astype(i.dtype) if np.dtype(i.dtype).kind == "f"
         else np.zeros(i.shape, i.dtype) for i in inputs}
for _ in range(3):
    sess.run(None, feeds)
print("ready", flush=True)
for line in sys.stdin:
    n = int(line)
    for _ in range(2):
        sess.run(None, feeds)
    block = []
    for _ in range(n):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        block.append(time.perf_counter() - t0)
    print(float(np.median(block)), flush=True)
"""


def _saved(model) -> str:
    import onnx

    path = os.path.join(tempfile.mkdtemp(prefix="opdispatch-retune-"), "model.onnx")
    onnx.save(model, path)
    return path


def _time_apart(path: str, stores: list[str], rounds: int, timed: int = 3) -> list[list[float]]:
    """Per plan (one store each), the round medians (s), each plan run by its own process."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, path, store], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env) for store in stores]
    try:
        for p in procs:
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a timing process for {path} did not start (exit {p.wait()})")
        times: list[list[float]] = [[] for _ in stores]
        for r in range(rounds):
            order = list(range(len(procs)))
            order = order[r % len(order):] + order[:r % len(order)]
            for k in order:
                time.sleep(0.1)
                procs[k].stdin.write(f"{timed}\n")
                procs[k].stdin.flush()
                times[k].append(float(procs[k].stdout.readline()))
        return times
    finally:
        for p in procs:
            p.kill()
            p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--tunes", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--budget", type=float, default=120.0)
    ap.add_argument("--busy-last", action="store_true",
                    help="tune the last time with a second process busy on one core")
    args = ap.parse_args()
    for name in args.models:
        print(stability(name, args.tunes, args.rounds, args.budget, args.busy_last))


if __name__ == "__main__":
    main()
