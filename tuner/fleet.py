"""Fleet tuning: one tuning run per distinct kind of node of a Ray cluster, the plans gathered
into one bundle (``opdispatch plans fleet-tune MODEL --ray-address ADDR -o plans.json``).

A plan is only valid on hardware with its fingerprint (:func:`tuner.fingerprint.hardware_digest`:
CPU model, ISA, cores, threads). A cluster mixing kinds of machine needs a plan per kind, and
tuning on every node would repeat the same work: the nodes are grouped by their fingerprint
(asked of each node by a task pinned to it), the model is tuned once on one node of each
group (its bytes shipped in the task: the nodes need not share a file system), and the plans
come back as bundles merged into one. ``opdispatch serve --ray --bundle plans.json`` (or
``opdispatch plans import`` on each node) then serves every replica the plan of its own node.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class NodeKind:
    """The nodes that share one hardware fingerprint."""

    digest: str
    summary: str
    nodes: list[str] = field(default_factory=list)


def _fingerprint() -> tuple[str, str]:
    from tuner.fingerprint import hardware_digest, hardware_fingerprint

    hw = hardware_fingerprint()
    isa = hw.get("isa", [])
    widest = ("avx512" if any(i.startswith("avx512") for i in isa)
              else "avx2" if "avx2" in isa else "no avx2")
    summary = f"{hw.get('cpu_model', '?')}, {hw.get('usable_cores', '?')} cores, {widest}"
    return hardware_digest(hw), summary


def _tune_here(model: bytes, name: str, shape_sets: Sequence[Mapping[str, Sequence[int]]],
               objective: str, budget_s: float) -> dict[str, Any]:
    """Tune ``model`` on this node (each set of shapes, else its own) into a fresh store and
    return the store's plans as a bundle."""
    # Ray gives a task's process OMP_NUM_THREADS = its CPUs: a plan is tuned, as it is served,
    # with the threads the machine's configuration gives
    os.environ.pop("OMP_NUM_THREADS", None)
    from dispatch.session import Session
    from tuner.store import PlanStore

    folder = tempfile.mkdtemp(prefix="opdispatch-fleet-")
    path = os.path.join(folder, name)
    Path(path).write_bytes(model)
    store = os.path.join(folder, "plans.sqlite")
    for shapes in shape_sets or [None]:
        Session(path, store=store, objective=objective,
                input_shapes=dict(shapes) if shapes else None).tune(budget_s=budget_s)
    with PlanStore(store) as plans:
        return plans.export_plans()


def node_kinds() -> list[NodeKind]:
    """The live nodes of the connected Ray cluster grouped by hardware fingerprint."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    task = ray.remote(num_cpus=0)(_fingerprint)
    answers = ray.get([task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        node, soft=False)).remote() for node in nodes])
    kinds: dict[str, NodeKind] = {}
    for node, (digest, summary) in zip(nodes, answers):
        kinds.setdefault(digest, NodeKind(digest, summary)).nodes.append(node)
    return list(kinds.values())


def fleet_tune(model: str | Path, *, address: str | None = None,
               shape_sets: Sequence[Mapping[str, Sequence[int]]] = (),
               objective: str = "latency", budget_s: float = 60.0,
               cpus: float = 1.0) -> tuple[dict[str, Any], list[NodeKind]]:
    """Tune ``model`` once per node kind of the Ray cluster at ``address`` (``None``: a local
    one); returns the merged bundle and the kinds (see the module docstring)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    data = Path(model).read_bytes()
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    kinds = node_kinds()
    task = ray.remote(num_cpus=cpus)(_tune_here)
    bundles = ray.get([task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        kind.nodes[0], soft=False)).remote(data, Path(model).name, [dict(s) for s in shape_sets],
                                           objective, budget_s) for kind in kinds])
    merged = dict(bundles[0])
    merged["plans"] = [plan for bundle in bundles for plan in bundle["plans"]]
    return merged, kinds
