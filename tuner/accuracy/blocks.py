"""The regions an accuracy objective chooses precisions for: a library's float32 plan (the
library first, the reference for what it cannot run) with each of its region steps cut into
*blocks* where the fewest tensors are live (between residual blocks, transformer sub-layers:
:func:`pieces`), small blocks merged into their neighbours and at most
:data:`MAX_BLOCKS` kept. Every block computes in float32 or in one of the library's
reduced-precision variants; the variants searched read and write float32 tensors, so any mix
is a valid plan (the library's quantize / dequantize / cast happen inside each block and are
measured with it). A variant that reads and writes its precision's layout (OpenVINO's bf16
regions with bf16 edges: :mod:`layouts.precision`) is not measured alone; a plan found with its
float32-edged twin is offered again with it (:func:`with_reduced_edges`), the plan's converters
at the boundaries where a neighbour holds float32 and none between two such regions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from dispatch.errors import OpDispatchError
from dispatch.fusion import REGION_OP, region_node
from dispatch.graph import Graph
from dispatch.heuristic import heuristic_plan
from dispatch.plan import Plan, PlanStep
from dispatch.plan_assembly import order_steps, plan_conversions
from dispatch.registry import REFERENCE_BACKEND, Implementation, Registry
from impls.regions import live_counts

#: the most blocks one library's plan is cut into (each costs a build and a few runs per
#: variant while searching)
MAX_BLOCKS = 24
#: blocks of fewer nodes are merged into a neighbour
MIN_BLOCK_NODES = 3
#: fewer blocks than this: the region is cut where more tensors are live (:func:`pieces`)
MIN_BLOCKS = 4


@dataclass
class BlockPlan:
    """One library's float32 plan cut into blocks, with the reduced variants of each block."""

    library: str
    plan: Plan
    #: the region steps of :attr:`plan` a precision is chosen for
    blocks: list[PlanStep]
    #: per block: the reduced-precision implementations that support it
    variants: list[list[Implementation]] = field(default_factory=list)
    #: the plan before cutting (the library's regions whole), its region steps
    whole: Plan | None = None
    #: per block: the index of the whole region step it was cut from (in :attr:`whole`)
    origins: list[int] = field(default_factory=list)


def pieces(graph: Graph, names: Sequence[str]) -> list[list[str]]:
    """A region (``names``, in graph order) cut into blocks after the nodes where the fewest
    tensors are live inside it (a ResNet's bottlenecks), or one or two more when that leaves
    fewer than :data:`MIN_BLOCKS` blocks (a transformer's attention mask stays live across
    every layer, so its sub-layers meet where two tensors are live). Any contiguous range is
    a valid block; the few-tensor points keep the blocks' boundaries cheap."""
    counts = dict(zip((n.name for n in graph.nodes), live_counts(graph)))
    inside = [counts[n] for n in names[:-1]]
    if not inside:
        return [list(names)]
    fewest = min(inside)
    found: list[list[str]] = [list(names)]
    for extra in (0, 1, 2):
        found = _split(names, {n for n in names[:-1] if counts[n] <= fewest + extra})
        if len(found) >= MIN_BLOCKS:
            break
    return found


def _split(names: Sequence[str], cuts: set[str]) -> list[list[str]]:
    """``names`` (a region's nodes in graph order) cut after every node in ``cuts``, pieces
    joined until each holds :data:`MIN_BLOCK_NODES` nodes, then the smallest neighbours merged until at most
    :data:`MAX_BLOCKS` remain."""
    pieces: list[list[str]] = [[]]
    for n in names:
        pieces[-1].append(n)
        if n in cuts and n != names[-1]:
            pieces.append([])
    merged: list[list[str]] = []
    for p in pieces:  # pieces joined until each holds MIN_BLOCK_NODES
        if merged and len(merged[-1]) < MIN_BLOCK_NODES:
            merged[-1] += p
        else:
            merged.append(p)
    if len(merged) > 1 and len(merged[-1]) < MIN_BLOCK_NODES:
        tail = merged.pop()
        merged[-1] += tail
    while len(merged) > MAX_BLOCKS:
        k = min(range(len(merged) - 1), key=lambda j: len(merged[j]) + len(merged[j + 1]))
        merged[k: k + 2] = [merged[k] + merged[k + 1]]
    return merged


def _region_step(graph: Graph, impl: Implementation, names: list[str],
                 precision: dict | None = None) -> PlanStep:
    node = region_node(graph, names)
    return PlanStep(nodes=list(names), op=REGION_OP, impl=impl.name, backend=impl.backend,
                    layouts_in=list(impl.input_layouts(node)), layouts_out=list(impl.output_layouts(node)),
                    why="float32 block" if precision is None else "", precision=precision)


def assemble(graph: Graph, registry: Registry, steps: Sequence[PlanStep],
             provenance: dict | None = None) -> Plan:
    """A plan of ``steps`` (ordered, with its conversions)."""
    ordered = order_steps(graph, steps)
    return Plan(graph=graph.name, steps=ordered, conversions=plan_conversions(graph, registry, ordered),
                provenance=dict(provenance or {}))


def precision_of(impl: Implementation) -> dict | None:
    """What a plan step of ``impl`` records of its precision (``None`` for float32)."""
    if impl.precision == "float32":
        return None
    return {"dtype": impl.precision, **{k: str(v) for k, v in impl.settings.items()}}


def block_plan(graph: Graph, registry: Registry, library: str) -> BlockPlan | None:
    """``library``'s float32 plan cut into blocks (see the module docstring), ``None`` when
    the library has no reduced-precision variant or runs no region of ``graph``."""
    reduced = [i for i in registry.regions([library], precisions=None) if i.precision != "float32"]
    if not reduced:
        return None
    try:
        whole = heuristic_plan(graph, registry, [library, REFERENCE_BACKEND])
    except OpDispatchError:
        return None
    steps: list[PlanStep] = []
    blocks: list[PlanStep] = []
    origins: list[int] = []
    for j, s in enumerate(whole.steps):
        if s.op != REGION_OP or s.backend != library:
            steps.append(s)
            continue
        impl = registry.impl(s.impl)
        blocks_of = pieces(graph, s.nodes)
        cut = [_region_step(graph, impl, p) for p in blocks_of]
        if len(cut) > 1 and any(impl.supports(region_node(graph, p)) is not None for p in blocks_of):
            cut = [_region_step(graph, impl, list(s.nodes))]  # a piece the library refuses: kept whole
        steps += cut
        blocks += cut
        origins += [j] * len(cut)
    if not blocks:
        return None
    variants = []
    for b in blocks:
        node = region_node(graph, b.nodes)
        # swapped in place, so of the block's layouts; an edge twin only where it pays
        variants.append([i for i in reduced if i.supports(node) is None and not i.settings.get("edges")
                         and list(i.input_layouts(node)) == b.layouts_in
                         and list(i.output_layouts(node)) == b.layouts_out])
    plan = assemble(graph, registry, steps, {"label": f"{library} float32 blocks"})
    return BlockPlan(library, plan, blocks, variants, whole, origins)


def with_precisions(graph: Graph, registry: Registry, bp: BlockPlan,
                    chosen: Mapping[int, tuple[Implementation, dict | None]], label: str) -> Plan:
    """``bp``'s plan with block ``k`` run by ``chosen[k]`` (a reduced variant and the precision
    its step records: :func:`precision_of`, with its calibration where it has one), the
    others in float32."""
    index = {id(b): k for k, b in enumerate(bp.blocks)}
    steps = []
    for s in bp.plan.steps:
        k = index.get(id(s))
        if k is None or k not in chosen:
            steps.append(s)
        else:
            impl, precision = chosen[k]
            steps.append(_region_step(graph, impl, list(s.nodes), precision))
    return assemble(graph, registry, steps, {"label": label})


def merged(graph: Graph, registry: Registry, bp: BlockPlan,
           chosen: Mapping[int, tuple[Implementation, dict | None]], label: str) -> Plan | None:
    """:func:`with_precisions`' plan with each run of consecutive blocks of one region that
    compute alike (float32, or one variant whose step records no calibration: bf16, fp16) run
    as one region: the same arithmetic in fewer library calls, and the library fuses across the
    cuts. ``None`` when no two neighbours compute alike. (Consecutive pieces of a convex region
    form a convex region; a union the library refuses stays cut.)"""
    def kind(k: int) -> tuple | None:
        if k not in chosen:
            return ("float32", bp.blocks[k].impl, "")
        impl, precision = chosen[k]
        if precision and "calibration" in precision:
            return None  # calibrated per block: a union would need its own calibration
        return (impl.precision, impl.name, repr(sorted((precision or {}).items())))

    runs: list[list[int]] = []
    for k in range(len(bp.blocks)):
        if (runs and kind(k) is not None and kind(k) == kind(runs[-1][-1])
                and bp.origins[k] == bp.origins[runs[-1][-1]]):
            runs[-1].append(k)
        else:
            runs.append([k])
    if all(len(r) == 1 for r in runs):
        return None
    replaced: dict[int, PlanStep] = {}
    for run in runs:
        if len(run) == 1:
            continue
        names = [n for k in run for n in bp.blocks[k].nodes]
        impl, precision = (chosen[run[0]] if run[0] in chosen
                           else (registry.impl(bp.blocks[run[0]].impl), None))
        if impl.supports(region_node(graph, names)) is not None:
            continue
        replaced[run[0]] = _region_step(graph, impl, names, precision)
        replaced.update({k: None for k in run[1:]})  # type: ignore[misc]
    if not replaced:
        return None
    block_of = {tuple(b.nodes): k for k, b in enumerate(bp.blocks)}
    steps = []
    for s in with_precisions(graph, registry, bp, chosen, label).steps:
        k = block_of.get(tuple(s.nodes)) if s.op == REGION_OP else None
        if k is None or k not in replaced:
            steps.append(s)
        elif replaced[k] is not None:
            steps.append(replaced[k])
    return assemble(graph, registry, steps, {"label": f"{label}, like neighbours merged"})


def library_regions(bp: BlockPlan) -> list[PlanStep]:
    """The library's whole region steps (of :attr:`BlockPlan.whole`)."""
    assert bp.whole is not None
    return [s for s in bp.whole.steps if s.op == REGION_OP and s.backend == bp.library]


def whole_in(graph: Graph, registry: Registry, bp: BlockPlan, impl: Implementation,
             precision_for: Callable[[PlanStep], dict | None]) -> Plan | None:
    """The library's plan with every region whole in ``impl``'s precision (whole-model reduced
    precision, as the libraries' own tools do it; ``precision_for(step)``: what each step
    records), ``None`` when ``impl`` refuses one."""
    assert bp.whole is not None
    regions = {id(s) for s in library_regions(bp)}
    steps = []
    for s in bp.whole.steps:
        if id(s) in regions:
            if impl.supports(region_node(graph, s.nodes)) is not None:
                return None
            steps.append(_region_step(graph, impl, list(s.nodes), precision_for(s)))
        else:
            steps.append(s)
    return assemble(graph, registry, steps, {"label": f"{bp.library} whole {impl.precision}"})


def edge_twin(registry: Registry, impl: Implementation) -> Implementation | None:
    """The variant of ``impl`` that reads and writes its reduced precision's layout (same
    backend, precision and settings, plus ``edges``), ``None`` when there is none."""
    if impl.precision == "float32" or impl.settings.get("edges"):
        return None
    for other in registry.regions([impl.backend], precisions=[impl.precision]):
        rest = {k: v for k, v in other.settings.items() if k != "edges"}
        if other.settings.get("edges") and rest == dict(impl.settings):
            return other
    return None


def with_reduced_edges(graph: Graph, registry: Registry, plan: Plan) -> Plan | None:
    """``plan`` with each reduced region that has an :func:`edge_twin` run by the twin, when
    at least one tensor goes straight from one such region to another (elsewhere the twin only
    moves the conversion out of the library); ``None`` when none does."""
    twins = {k: t for k, s in enumerate(plan.steps) if s.op == REGION_OP
             and (t := edge_twin(registry, registry.impl(s.impl))) is not None}
    made = {v for k in twins for v in plan.steps[k].nodes}
    produced = {v.name for k in twins for v in region_node(graph, plan.steps[k].nodes).outputs}
    read = {v.name for k in twins for v in region_node(graph, plan.steps[k].nodes).inputs if v is not None}
    if not made or not produced & read:
        return None
    steps = []
    for k, s in enumerate(plan.steps):
        if k not in twins:
            steps.append(s)
            continue
        twin = twins[k]
        node = region_node(graph, s.nodes)
        steps.append(PlanStep(nodes=list(s.nodes), op=REGION_OP, impl=twin.name, backend=twin.backend,
                              layouts_in=list(twin.input_layouts(node)),
                              layouts_out=list(twin.output_layouts(node)), why=s.why,
                              precision={**(s.precision or {}), "edges": str(twin.settings["edges"])}))
    label = f"{plan.provenance.get('label', 'plan')}, reduced precision between regions"
    return assemble(graph, registry, steps, {"label": label})
