"""What a library region does inside: per-node time from the library's own profiler and the
memory the library allocates, shared by the onnxruntime and OpenVINO backends.

A library runs a region as its own graph, which it rewrites (fuses Conv and Relu into one
kernel, inserts layout reorders, drops Identity nodes, renames values). :func:`attribute`
maps the library's kernels back to the region's nodes: a kernel covers the region nodes whose
name, or the name of a value they produce, the kernel carries (its own name, its name without
a suffix the library adds, its output names); a region node that no kernel covers was fused
into the kernel of the nearest node downstream of it (upstream when there is none); a kernel
that covers no region node (a reorder the library inserted) is counted with the kernel that
reads its output (else the one that feeds it). A kernel covering several nodes has its time
spread over them by their work (multiply-adds for Conv, MatMul and Gemm, output elements for
the others), and :attr:`RegionProfile.shared` says which nodes share a kernel.

:class:`MemoryProbe` measures what a library allocates while a region's session is created
and first run: the growth of the C heap's bytes in use (glibc's ``mallinfo2``), else of the
process's resident memory.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from dispatch.fusion import FusedNode
from dispatch.graph import Node

#: suffixes libraries add to the names of the kernels they rewrite (onnxruntime's NCHWc
#: transformer names a kernel ``<output value>_nchwc``)
NAME_SUFFIXES = ("_nchwc",)


@dataclass
class Kernel:
    """One kernel the library ran: its name, op, median time per run (ms) and the names of
    the values it reads and writes in the library's rewritten graph."""

    name: str
    op: str
    ms: float
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    #: other names the kernel is known by (OpenVINO's original layer names)
    aliases: tuple[str, ...] = ()


@dataclass
class RegionProfile:
    """Per-node times of one region from its library's profiler (raw, not yet scaled to the
    region's measured time), and the bytes the library allocated for the region."""

    library: str
    #: region node -> median ms per run as the profiler saw it (shared kernels spread)
    node_ms: dict[str, float]
    #: the sum of the profiled kernels' medians (ms)
    kernels_ms: float
    #: the library's own time per run, median (ms; ``None`` when it reports none)
    run_ms: float | None
    runs: int
    #: region node -> the library kernel it shares with other nodes (fused by the library)
    shared: dict[str, str] = field(default_factory=dict)
    #: bytes the library allocated while the region was created and first run
    library_bytes: int | None = None
    memory_basis: str = ""
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (for a plan's provenance)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RegionProfile:
        """The profile of :meth:`to_dict`'s data (unknown keys are ignored)."""
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in names})

    def scaled(self, measured_ms: float | None) -> dict[str, float]:
        """Per-node ms scaled so that they sum to ``measured_ms`` (the region's measured
        median); the raw times when it is not known or the profile saw no time."""
        total = sum(self.node_ms.values())
        if measured_ms is None or total <= 0:
            return dict(self.node_ms)
        f = float(measured_ms) / total
        return {n: ms * f for n, ms in self.node_ms.items()}


def work(node: Node) -> float:
    """A node's work, to spread a shared kernel's time: multiply-adds for Conv, MatMul and
    Gemm, output elements for the others (at least 1)."""
    out = node.outputs[0] if node.outputs else None
    elems = float(np.prod(out.shape)) if out is not None and out.shape is not None else 1.0
    w = node.inputs[1] if len(node.inputs) > 1 else None
    if node.op_type in ("Conv", "ConvTranspose") and w is not None and w.shape is not None:
        return max(1.0, elems * float(np.prod(w.shape[1:])))
    if node.op_type in ("MatMul", "Gemm") and node.inputs[0] is not None and node.inputs[0].shape:
        a = node.inputs[0].shape
        k = a[0] if node.op_type == "Gemm" and node.attrs.get("transA") else a[-1]
        return max(1.0, elems * float(k))
    return max(1.0, elems)


def _strip(name: str) -> str:
    for suffix in NAME_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def attribute(region: FusedNode,
              kernels: Sequence[Kernel]) -> tuple[dict[str, float], dict[str, str], list[str]]:
    """``(node -> ms, node -> shared kernel, notes)``: the kernels' times on the region's
    nodes (see the module docstring); every region node gets a time."""
    nodes = list(region.nodes)
    by_name = {n.name: n for n in nodes}
    producer = {v.name: n.name for n in nodes for v in n.outputs}
    covers: dict[int, list[str]] = {}
    owner: dict[str, int] = {}
    for k, kern in enumerate(kernels):
        keys = [kern.name, _strip(kern.name), *kern.aliases, *kern.outputs]
        for key in keys:
            node = key if key in by_name else producer.get(key)
            if node is not None and node not in owner:
                owner[node] = k
                covers.setdefault(k, []).append(node)
    consumers: dict[str, list[str]] = {}
    for n in nodes:
        for v in n.inputs:
            if v is not None and v.name in producer:
                consumers.setdefault(producer[v.name], []).append(n.name)
    notes: list[str] = []
    fused_away = [n.name for n in nodes if n.name not in owner]
    for name in fused_away:  # downstream first, then upstream
        k = _nearest(name, consumers, owner) or _nearest(name, _parents(nodes, producer), owner)
        if k is not None:
            owner[name] = k[0]
            covers.setdefault(k[0], []).append(name)
    # kernels of the library's own (reorders, casts): with their reader, else their feeder
    readers: dict[str, list[int]] = {}
    writers: dict[str, int] = {}
    for k, kern in enumerate(kernels):
        for v in kern.inputs:
            readers.setdefault(v, []).append(k)
        for v in kern.outputs:
            writers[v] = k
    extra: dict[int, float] = {}
    orphans = []
    for k, kern in enumerate(kernels):
        if k in covers:
            continue
        target = _neighbour_kernel(k, kernels, readers, writers, covers)
        if target is None:
            orphans.append(k)
        else:
            extra[target] = extra.get(target, 0.0) + kern.ms
    node_ms: dict[str, float] = {}
    shared: dict[str, str] = {}
    for k, names in covers.items():
        total = kernels[k].ms + extra.get(k, 0.0)
        weights = [work(by_name[n]) for n in names]
        wsum = sum(weights)
        for n, w in zip(names, weights):
            node_ms[n] = node_ms.get(n, 0.0) + total * w / wsum
        if len(names) > 1:
            for n in names:
                shared[n] = kernels[k].name
    if orphans:  # nothing to attach them to: spread over every node by work
        spill = sum(kernels[k].ms for k in orphans)
        wsum = sum(work(n) for n in nodes)
        for n in nodes:
            node_ms[n.name] = node_ms.get(n.name, 0.0) + spill * work(n) / wsum
        notes.append(f"{len(orphans)} library kernel(s) matched no node and were spread over "
                     f"the region by work: {', '.join(kernels[k].name for k in orphans[:5])}")
    for n in nodes:
        node_ms.setdefault(n.name, 0.0)
    if shared:
        notes.append(f"{len(shared)} node(s) share a library kernel (fused by the library); "
                     "its time is spread over them by work (multiply-adds, else output elements)")
    return {n.name: node_ms[n.name] for n in nodes}, shared, notes


def _parents(nodes: Sequence[Node], producer: Mapping[str, str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for n in nodes:
        out[n.name] = [producer[v.name] for v in n.inputs if v is not None and v.name in producer]
    return out


def _nearest(start: str, edges: Mapping[str, Sequence[str]],
             owner: Mapping[str, int]) -> tuple[int] | None:
    """The kernel owning the nearest node reached from ``start`` along ``edges`` (breadth
    first), as a 1-tuple, else ``None``."""
    seen = {start}
    frontier = list(edges.get(start, ()))
    while frontier:
        nxt: list[str] = []
        for n in frontier:
            if n in seen:
                continue
            seen.add(n)
            if n in owner:
                return (owner[n],)
            nxt.extend(edges.get(n, ()))
        frontier = nxt
    return None


def _neighbour_kernel(k: int, kernels: Sequence[Kernel], readers: Mapping[str, list[int]],
                      writers: Mapping[str, int], covers: Mapping[int, list[str]]) -> int | None:
    """The covering kernel nearest to kernel ``k`` in the library's graph: downstream
    (readers of its outputs) first, then upstream (writers of its inputs)."""
    for direction in ("down", "up"):
        seen = {k}
        frontier = [k]
        while frontier:
            nxt = []
            for j in frontier:
                names = kernels[j].outputs if direction == "down" else kernels[j].inputs
                for v in names:
                    cands = readers.get(v, []) if direction == "down" else (
                        [writers[v]] if v in writers else [])
                    for c in cands:
                        if c in seen:
                            continue
                        if c in covers:
                            return c
                        seen.add(c)
                        nxt.append(c)
            frontier = nxt
    return None


# ------------------------------------------------------------------------------------------
# memory
# ------------------------------------------------------------------------------------------


def first_run(pending: list[bool]) -> bool:
    """Whether this call is a region's first run, whose allocations are measured
    (``pending`` holds one ``True`` until it is taken; of threads racing for it, one wins)."""
    try:
        return pending.pop()
    except IndexError:
        return False


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _mallinfo2() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    return fn


_MALLINFO2 = _mallinfo2()


def heap_in_use() -> int | None:
    """Bytes the C heap has handed out and not taken back (glibc's ``mallinfo2``: in-use
    chunks plus mmapped blocks), ``None`` where there is no glibc."""
    if _MALLINFO2 is None:
        return None
    info = _MALLINFO2()
    return int(info.uordblks) + int(info.hblkhd)


def resident_bytes() -> int | None:
    """The process's resident memory (``/proc/self/statm``), ``None`` where there is none."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class MemoryProbe:
    """What a library allocated between :meth:`start` and :meth:`stop`: the growth of the C
    heap in use (glibc), else of the resident memory. The heap figure is steady (measured on
    resnet50's onnxruntime region built three times in one process: 118, 112, 112 MB) where
    the resident one is not (177, 150, 239 MB: freed memory reused or kept by the allocator);
    it misses memory a library maps itself, outside malloc."""

    BASIS = "library allocations: growth of the C heap in use (else of resident memory)"

    def __init__(self) -> None:
        self.heap0: int | None = None
        self.rss0: int | None = None
        self.bytes: int | None = None

    def start(self) -> MemoryProbe:
        self.heap0, self.rss0 = heap_in_use(), resident_bytes()
        return self

    def stop(self) -> int | None:
        """The bytes allocated since :meth:`start` (``None`` when neither figure exists)."""
        heap, rss = heap_in_use(), resident_bytes()
        if self.heap0 is not None and heap is not None:
            self.bytes = max(0, heap - self.heap0)
        elif self.rss0 is not None and rss is not None:
            self.bytes = max(0, rss - self.rss0)
        return self.bytes
