"""The report's summary: the plan's figures as a whole, each with where it comes from. Total
latency and peak memory as validated end to end (the store's plan row, else the validation
record), the sum of isolated measurements split into kernels and converters, time per backend,
the speed-up against the heuristic plan (measured by the tuner's validation) and, estimated from
isolated measurements, against each single-backend plan; the tuning run, the plan key and
fingerprints. A figure the store does not hold is ``None`` with a note.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from dispatch.errors import OpDispatchError
from dispatch.heuristic import heuristic_plan
from tuner.report.sources import Sources, measured_ms, plan_backends, step_signature


def summarise(src: Sources, table: pd.DataFrame, times: list[dict[str, Any]],
              conv_times: list[dict[str, Any]], total_parts: float | None) -> dict[str, Any]:
    """The summary figures of the report (:attr:`PlanReport.summary`): ``table`` is the report
    table, ``times`` and ``conv_times`` are :meth:`Sources.step_times` and
    :meth:`Sources.conversion_times`, ``total_parts`` their sum (``None`` when any is not
    known)."""
    plan, prov, stored = src.plan, src.plan.provenance or {}, src.stored
    validated = list(prov.get("validated") or [])
    winner_label = prov.get("winner") or (stored.notes.get("winner") if stored else None)
    win = next((v for v in validated if v.get("label") == winner_label), None)
    latency = stored.latency_ms if stored is not None and stored.latency_ms is not None else (
        win.get("latency_ms") if win else None)
    spread = win.get("spread_ms") if win else None
    peak = stored.peak_bytes if stored is not None and stored.peak_bytes is not None else (
        win.get("peak_bytes") if win else None)
    nodes = table[table["kind"] == "node"]
    convs = table[(table["kind"] == "converter") & (table["when"] == "run")]
    kernel_known = all(t["median_ms"] is not None for t in times)
    conv_known = all(t["median_ms"] is not None for c, t in zip(plan.conversions, conv_times)
                     if not c.at_build)
    per_backend: dict[str, float | None] = {}
    steps_per_backend: dict[str, int] = {}
    for step, t in zip(plan.steps, times):
        steps_per_backend[step.backend] = steps_per_backend.get(step.backend, 0) + 1
        prev = per_backend.get(step.backend, 0.0)
        per_backend[step.backend] = None if prev is None or t["median_ms"] is None else prev + t["median_ms"]
    conv_ms = float(convs["median_ms"].sum()) if conv_known else None
    s: dict[str, Any] = {
        "model": plan.graph,
        "plan_id": stored.id if stored is not None else None,
        "source": prov.get("source", "unknown"),
        "winner": winner_label,
        "objective": prov.get("objective") or (src.key.objective if src.key else None),
        "plan_key": (src.key.digest() if src.key is not None else prov.get("plan_key")),
        "model_fingerprint": src.key.model if src.key is not None else None,
        "inputs": src.key.inputs if src.key is not None else None,
        "hardware": (src.key.hardware if src.key is not None else prov.get("hardware")),
        "software": (src.key.software if src.key is not None else prov.get("software")),
        "hardware_digest": src.m.hw, "software_digest": src.m.sw,
        "tuned_at": prov.get("tuned_at"),
        "stored_at": stored.created_at if stored is not None else None,
        "imported_at": stored.notes.get("imported_at") if stored is not None else None,
        "latency_ms": latency, "latency_spread_ms": spread, "peak_bytes": peak,
        "latency_basis": "validated end to end (median of runs)" if latency is not None else None,
        "steps": len(plan.steps), "nodes": len(nodes),
        "conversions_run": len(convs),
        "conversions_build": int(sum(1 for c in plan.conversions if c.at_build)),
        "kernels_ms": float(sum(t["median_ms"] for t in times)) if kernel_known else None,
        "converters_ms": conv_ms,
        "sum_of_parts_ms": total_parts,
        "converter_share": (conv_ms / total_parts) if conv_ms is not None and total_parts else None,
        "time_per_backend_ms": per_backend,
        "steps_per_backend": steps_per_backend,
        "nodes_per_backend": plan.backends_used(),
        "optimizer": prov.get("optimizer"),
        "validated": validated,
        "tuning": _tuning(src),
        "vs_heuristic": _vs_heuristic(src, validated, winner_label, latency),
        "vs_single_backend": _vs_single_backends(src, total_parts),
        "store": str(src.store.path) if src.store is not None else None,
        # the non-finite guard (dispatch.guard): what runs requests holding NaN or Inf
        "nonfinite_guard": plan.guard_label(),
        # a throughput plan: how it serves concurrent requests, and what it did under load
        "serving": _serving(plan),
        "throughput": prov.get("throughput"),
        # an accuracy objective: the precisions the steps compute in, the held-out evidence
        "precisions": plan.precisions(),
        "accuracy": prov.get("accuracy"),
    }
    return s


def _serving(plan: Any) -> str | None:
    """The plan's serving configuration in words, else ``None``."""
    try:
        config = plan.serving_config()
    except OpDispatchError as exc:
        return f"not readable: {exc}"
    if config is None:
        return None
    return f"{config.label()}, tuned for {config.concurrency} request(s) in flight"


def _tuning(src: Sources) -> dict[str, Any] | None:
    """The tuning run of the plan and its statistics, when the store has it."""
    r = src.run
    if r is None:
        return None
    stats = r.stats or {}
    return {"run_id": r.id, "status": r.status, "started_at": r.started_at,
            "finished_at": r.finished_at, "budget_s": r.budget_s,
            "tuning_s": stats.get("tuning_s"), "measured": stats.get("measured"),
            "reused": stats.get("reused"), "skipped_budget": stats.get("skipped_budget"),
            "skipped_alternatives": stats.get("skipped_alternatives"),
            "skipped_validation": stats.get("skipped_validation"),
            "others_cpu_share": stats.get("others_cpu_share"),
            "conversions_measured": stats.get("conversions_measured"),
            "conversions_estimated": stats.get("conversions_estimated"),
            "wrong": stats.get("wrong"), "candidates": stats.get("candidates"),
            "winner_note": stats.get("winner_note")}


def _vs_heuristic(src: Sources, validated: list[dict[str, Any]], winner: str | None,
                  latency: float | None) -> dict[str, Any]:
    """The speed-up against the heuristic plan, as the tuner's validation measured it."""
    heur = next((v for v in validated if str(v.get("label", "")).startswith("untuned")), None)
    if heur is None:
        why = ("this plan is not a tuned plan" if (src.plan.provenance or {}).get("source") != "tuned"
               else "the tuner's validation did not record the heuristic plan")
        return {"speedup": None, "heuristic_ms": None, "note": f"not known: {why}"}
    if heur.get("error") or heur.get("latency_ms") is None:
        return {"speedup": None, "heuristic_ms": None,
                "note": f"not known: the heuristic plan failed validation ({heur.get('error')})"}
    if latency is None:
        return {"speedup": None, "heuristic_ms": heur["latency_ms"],
                "note": "not known: this plan's end-to-end latency is not recorded"}
    note = "measured end to end by the tuner's validation, interleaved"
    if winner == heur.get("label"):
        note += "; the heuristic plan itself won"
    return {"speedup": float(heur["latency_ms"]) / float(latency),
            "heuristic_ms": float(heur["latency_ms"]), "note": note}


def _vs_single_backends(src: Sources, own_parts: float | None) -> dict[str, dict[str, Any]]:
    """Each single-backend plan's estimated time: the sum of the store's isolated
    measurements of its steps and run-time conversions (never run end to end)."""
    out: dict[str, dict[str, Any]] = {}
    if src.graph is None or src.registry is None:
        return out
    available = src.registry.available_backends()
    for b in plan_backends(src.plan, src.key):
        if b not in available:
            out[b] = {"estimated_ms": None, "speedup": None,
                      "note": "not known: the backend is not available here"}
            continue
        try:
            single = heuristic_plan(src.graph, src.registry, [b])
        except OpDispatchError as exc:
            first = str(exc).splitlines()[0].split(". Allowed backends")[0]
            out[b] = {"estimated_ms": None, "speedup": None,
                      "note": f"cannot run the whole model alone: {first[:300]}"}
            continue
        total, missing = 0.0, 0
        for step in single.steps:
            ms = measured_ms(src.m.get(step_signature(src.graph, src.registry, step), step.impl))
            if ms is None:
                missing += 1
            else:
                total += ms
        conv_missing = 0
        for c in single.conversions:
            if c.at_build:
                continue
            ms = measured_ms(src.m.conversion(src.graph.value(c.value), c.src, c.dst, c.chain))
            if ms is None:
                conv_missing += 1
            else:
                total += ms
        if missing or conv_missing:
            out[b] = {"estimated_ms": None, "speedup": None, "steps": len(single.steps),
                      "note": f"not known: {missing} of {len(single.steps)} step(s) and "
                              f"{conv_missing} conversion(s) of the {b}-only plan were never "
                              f"measured here"}
            continue
        out[b] = {"estimated_ms": total, "steps": len(single.steps),
                  "speedup": total / own_parts if own_parts else None,
                  "note": "estimated: sum of isolated measurements, against this plan's sum "
                          "of parts (not run end to end)"}
    return out
