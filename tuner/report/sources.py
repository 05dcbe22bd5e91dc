"""Where a report's numbers come from: the plan store, read under the plan's digests.
:class:`Sources` gathers what a report is made from (the plan, its graph, the registry, the
store opened read-only, the store's row of the plan, the plan key and its tuning run) and checks
that the plan matches the graph; :class:`Measurements` looks measurements up under the key's
hardware and software digests (cached), and :meth:`Sources.step_times` and
:meth:`Sources.conversion_times` say where each step's and converter's time comes from (the
store, the plan's own figure, or not known). Also the signatures the tuner records steps and
conversions under.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dispatch.errors import OpDispatchError
from dispatch.fusion import step_node
from tuner.plan_lookup import ReportError

if TYPE_CHECKING:
    from dispatch.graph import Graph, Value
    from dispatch.plan import Plan, PlanStep
    from dispatch.registry import Registry
    from tuner.fingerprint import PlanKey
    from tuner.store import PlanStore, StoredMeasurement, StoredPlan


def measured_ms(m: StoredMeasurement | None) -> float | None:
    """The median of a successful measurement in milliseconds, else ``None``."""
    if m is None or m.error is not None or m.median_s is None or not math.isfinite(m.median_s):
        return None
    return float(m.median_s) * 1e3


def measured_spread_ms(m: StoredMeasurement | None) -> float | None:
    """The spread of a successful measurement in milliseconds, else ``None``."""
    if m is None or m.error is not None or m.spread_s is None:
        return None
    return float(m.spread_s) * 1e3


def conversion_signature(value: Value, src: str, dst: str) -> str:
    """The measurement signature the tuner records a conversion of ``value`` under."""
    assert value.shape is not None and value.dtype is not None
    return (f"convert:{src}->{dst}:{'x'.join(map(str, value.shape))}:"
            f"{np.dtype(value.dtype).str}")


def conversion_label(value: Value, src: str, dst: str, registry: Registry) -> str | None:
    """The candidate label of the converter chain the tuner measures for ``value``."""
    assert value.shape is not None and value.dtype is not None
    try:
        chain = registry.layouts.path(src, dst, value.shape, value.dtype)
    except OpDispatchError:
        return None
    return " > ".join(c.name for c in chain)


def plan_backends(plan: Plan, key: PlanKey | None = None) -> list[str]:
    """The backends the plan was tuned over (its software fingerprint), else those it uses."""
    software = key.software if key is not None else plan.provenance.get("software") or {}
    names = list((software.get("backends") or {}).keys())
    if names:
        return names
    order = plan.provenance.get("backend_order") or (plan.provenance.get("baseline") or {}).get(
        "backend_order")
    return list(order) if order else list(plan.backends_used())


@contextlib.contextmanager
def opened_store(store: Any) -> Iterator[PlanStore | None]:
    """``store`` as an open PlanStore (a path is opened read-only and closed after)."""
    from tuner.store import PlanStore

    if store is None or store is False:
        yield None
        return
    if isinstance(store, PlanStore):
        yield store
        return
    if isinstance(store, str | os.PathLike):
        path = Path(os.fspath(store)).expanduser()
        if not path.is_file():
            raise ReportError(f"no plan store at {str(path)!r} (reports open it read-only and "
                              f"never create it)")
        with PlanStore(path, readonly=True) as opened:
            yield opened
        return
    raise ReportError(f"store must be a path or a tuner.store.PlanStore, received "
                      f"{type(store).__name__}")


class Measurements:
    """Store lookups under one hardware/software digest pair, cached."""

    def __init__(self, store: PlanStore | None, hw: str | None, sw: str | None,
                 registry: Registry | None) -> None:
        self.store = store
        self.hw = hw
        self.sw = sw
        self.registry = registry
        self._cache: dict[tuple[str, str], StoredMeasurement | None] = {}

    @property
    def usable(self) -> bool:
        return self.store is not None and self.hw is not None and self.sw is not None

    def get(self, sig: str | None, candidate: str) -> StoredMeasurement | None:
        if sig is None or not self.usable:
            return None
        k = (sig, candidate)
        if k not in self._cache:
            assert self.store is not None and self.hw is not None and self.sw is not None
            self._cache[k] = self.store.get_measurement(sig, candidate, self.hw, self.sw)
        return self._cache[k]

    def conversion(self, value: Value, src: str, dst: str,
                   chain: Sequence[str] | None = None) -> StoredMeasurement | None:
        """The measured cost of converting ``value`` from ``src`` to ``dst``: the chain's own
        measurement, else the cheapest chain measured for the same signature."""
        if src == dst or not self.usable or value.shape is None or value.dtype is None:
            return None
        sig = conversion_signature(value, src, dst)
        label = " > ".join(chain) if chain else (
            conversion_label(value, src, dst, self.registry) if self.registry else None)
        hit = self.get(sig, label) if label else None
        if hit is None:
            assert self.store is not None and self.hw is not None and self.sw is not None
            found = [m for m in self.store.measurements_for(sig, self.hw, self.sw) if m.ok]
            hit = found[0] if found else None
        return hit


def step_signature(graph: Graph, registry: Registry, step: PlanStep) -> str | None:
    """The measurement signature of a plan step (as the tuner computed it for its candidate),
    or ``None`` when its implementation is not registered here."""
    from tuner.candidates import signature

    try:
        impl = registry.impl(step.impl)
        node = step_node(graph, step.nodes, step.op)
    except OpDispatchError:
        return None
    return signature(impl, node, step.layouts_in, step.layouts_out)


def _stored_by_digest(store: PlanStore, digest: str) -> StoredPlan | None:
    """The store's row of the plan whose key digest is ``digest``."""
    rows = list(store.db.query("SELECT id FROM plans WHERE key_digest = ?", [digest]))
    return store.plan_by_id(int(rows[0]["id"])) if rows else None


class Sources:
    """What a report is made from (see :func:`tuner.report.build_report`), with the store's
    row of the plan, its key and tuning run found, and notes on what is missing."""

    def __init__(self, plan: Plan, graph: Graph | None, store: PlanStore | None,
                 registry: Registry | None, stored: StoredPlan | None,
                 key: PlanKey | None) -> None:
        from tuner.fingerprint import hardware_digest, software_digest

        self.plan = plan
        self.graph = graph
        self.store = store
        self.notes: list[str] = []
        if registry is None and graph is not None:
            from dispatch.backend import load_registry

            registry = load_registry()
        self.registry = registry
        prov = plan.provenance or {}
        if stored is None and store is not None and prov.get("plan_key"):
            stored = _stored_by_digest(store, str(prov["plan_key"]))
        self.stored = stored
        self.key = key or (stored.key if stored is not None else None)
        hw = sw = None
        if self.key is not None:
            hw, sw = hardware_digest(self.key.hardware), software_digest(self.key.software)
        elif prov.get("hardware") and prov.get("software"):
            hw, sw = hardware_digest(prov["hardware"]), software_digest(prov["software"])
        self.m = Measurements(store, hw, sw, registry)
        if store is None:
            self.notes.append("no plan store given: times are the plan's own figures; spreads, "
                              "converter costs and alternatives' times are not known")
        elif hw is None:
            self.notes.append("the plan carries no hardware/software fingerprint: the store's "
                              "measurements cannot be matched to it")
        self.run = None
        if store is not None:
            run_id = stored.run_id if stored is not None else prov.get("tuning_run")
            if run_id is not None:
                self.run = next((r for r in store.runs() if r.id == run_id), None)
        if graph is not None:
            self._check_graph()

    def _check_graph(self) -> None:
        assert self.graph is not None
        planned = [n for s in self.plan.steps for n in s.nodes]
        names = {n.name for n in self.graph.nodes}
        missing = [n.name for n in self.graph.nodes if n.name not in planned]
        extra = [n for n in planned if n not in names]
        if missing or extra:
            raise ReportError(
                f"the plan does not match graph {self.graph.name!r}: graph nodes without a "
                f"step: {missing[:8]}; steps for nodes not in the graph: {extra[:8]}")

    def step_times(self) -> list[dict[str, Any]]:
        """Per plan step: its signature, median, spread, samples and where the time comes
        from (``store``, ``plan`` or ``not measured``)."""
        out = []
        for step in self.plan.steps:
            sig = None
            if self.graph is not None and self.registry is not None:
                sig = step_signature(self.graph, self.registry, step)
            m = self.m.get(sig, step.impl)
            if measured_ms(m) is not None:
                assert m is not None
                out.append({"sig": sig, "median_ms": measured_ms(m),
                            "spread_ms": measured_spread_ms(m), "samples": m.samples,
                            "source": "store"})
            elif step.cost_ms is not None:
                out.append({"sig": sig, "median_ms": float(step.cost_ms), "spread_ms": None,
                            "samples": None, "source": "plan"})
            else:
                out.append({"sig": sig, "median_ms": None, "spread_ms": None, "samples": None,
                            "source": "not measured"})
        return out

    def conversion_times(self) -> list[dict[str, Any]]:
        """Per plan conversion: median, spread, samples and where the time comes from
        (``store``, ``build time`` or ``not measured``)."""
        out = []
        for c in self.plan.conversions:
            rec: dict[str, Any] = {"median_ms": None, "spread_ms": None, "samples": None,
                                   "source": "build time" if c.at_build else "not measured"}
            if not c.at_build and self.graph is not None:
                m = self.m.conversion(self.graph.value(c.value), c.src, c.dst, c.chain)
                if measured_ms(m) is not None:
                    assert m is not None
                    rec.update(median_ms=measured_ms(m), spread_ms=measured_spread_ms(m),
                               samples=m.samples, source="store")
            out.append(rec)
        return out
