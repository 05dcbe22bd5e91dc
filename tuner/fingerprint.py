"""Fingerprints that make up a plan key: model structure, inputs, hardware, software.

A stored plan is used only when every part of its :class:`PlanKey` matches the present
process exactly; when it does not, :meth:`PlanKey.explain_difference` says which part changed
(``native: build 1a2b -> build 3c4d``, ``hardware: threads 2 -> 4``, ...), so that a plan is
never used, nor ignored, silently.

What each fingerprint covers:

- :func:`model_fingerprint`: operator types, domains and opsets, attributes, the wiring by
  position (renaming tensors or nodes does not change it), every value's shape and dtype, and
  which inputs are constants by shape and dtype only: retrained weights reuse the plan. The
  exception is small ``int64`` constants (at most :data:`STRUCTURAL_CONST_MAX` elements, at
  most one dimension): in ONNX those are shapes, axes, pads and indices, which decide output
  shapes and which implementations support a node, so their values count as structure.
- :func:`input_signature`: the graph inputs' names, shapes and dtypes, human readable.
- :func:`hardware_fingerprint`: CPU model, the ISA flags kernels care about, core counts,
  the thread count in use, machine architecture, and GPU names when ``nvidia-smi`` answers.
- :func:`software_fingerprint`: the version of every backend involved (the native backend's
  includes its build id), opdispatch's own version and the plan format version.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import platform
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dispatch import graph_cache
from dispatch.errors import ArgumentError
from dispatch.objective import Objective

if TYPE_CHECKING:
    from dispatch.graph import Graph, Node, Value
    from dispatch.registry import Registry

#: Bump when the way a fingerprint is computed changes: every stored key then misses.
FINGERPRINT_VERSION = 1
#: ``int64`` constants with at most this many elements (and rank <= 1) are hashed by value.
STRUCTURAL_CONST_MAX = 64
#: Seconds ``nvidia-smi`` may take before the GPU part of the fingerprint is left empty.
GPU_QUERY_TIMEOUT_S = 5.0

#: x86 ISA flags (as /proc/cpuinfo spells them) that decide which kernels run, plus every flag
#: starting with one of :data:`_ISA_PREFIXES`.
_X86_FLAGS = frozenset({
    "sse2", "ssse3", "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "bmi2",
    "avx_vnni", "avx_vnni_int8", "avx_ne_convert", "avx_ifma",
})
_ISA_PREFIXES = ("avx512", "amx")
#: Arm feature names (``Features`` in /proc/cpuinfo on Linux).
_ARM_FLAGS = frozenset({
    "neon", "asimd", "asimdhp", "asimddp", "asimdfhm", "fphp", "sve", "sve2", "i8mm", "bf16",
    "svebf16", "svei8mm", "sme", "sme2",
})


# ------------------------------------------------------------------------------------------
# hashing helpers
# ------------------------------------------------------------------------------------------


def _canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _sha256(data: Any) -> str:
    return hashlib.sha256(_canonical_json(data).encode("ascii")).hexdigest()


def _array_digest(arr: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


def _dtype_name(dtype: Any) -> str | None:
    return None if dtype is None else np.dtype(dtype).name


def _shape_list(shape: Sequence[int] | None) -> list[int] | None:
    return None if shape is None else [int(d) for d in shape]


# ------------------------------------------------------------------------------------------
# model
# ------------------------------------------------------------------------------------------


def _canonical_attr(value: Any) -> Any:
    """An attribute value as JSON-able data; tensors by dtype, shape and a hash of their bytes."""
    if isinstance(value, np.ndarray):
        return {"tensor": _dtype_name(value.dtype), "shape": list(value.shape),
                "sha256": _array_digest(value)}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, list | tuple):
        return [_canonical_attr(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _canonical_attr(v) for k, v in value.items()}
    return {"repr": f"{type(value).__name__}:{value!r}"}


def _is_structural_const(arr: np.ndarray) -> bool:
    return arr.dtype == np.int64 and arr.ndim <= 1 and arr.size <= STRUCTURAL_CONST_MAX


def _const_descriptor(v: Value) -> dict[str, Any]:
    assert v.const is not None
    desc: dict[str, Any] = {"const": True, "shape": _shape_list(v.shape), "dtype": _dtype_name(v.dtype)}
    if _is_structural_const(v.const):
        desc["values"] = [int(x) for x in v.const.reshape(-1)]
    return desc


class _Wiring:
    """Positional ids for values: ``in{k}`` for graph inputs, ``c{k}`` for constants in order
    of first use, ``n{i}.{j}`` for output ``j`` of node ``i``; names never enter the hash."""

    def __init__(self, graph: Graph) -> None:
        self.ids: dict[int, str] = {}
        self.values: dict[str, dict[str, Any]] = {}
        self._consts = 0
        for k, v in enumerate(graph.inputs):
            self._assign(v, f"in{k}", {"shape": _shape_list(v.shape), "dtype": _dtype_name(v.dtype)})

    def _assign(self, v: Value, vid: str, desc: dict[str, Any]) -> str:
        self.ids[id(v)] = vid
        self.values[vid] = desc
        return vid

    def ref(self, v: Value | None) -> str | None:
        """The id of a value read by a node or listed as a graph output."""
        if v is None:
            return None
        if id(v) in self.ids:
            return self.ids[id(v)]
        if v.is_const:
            self._consts += 1
            return self._assign(v, f"c{self._consts - 1}", _const_descriptor(v))
        # read before any node produced it: only possible in a malformed graph
        return self._assign(v, f"u{len(self.ids)}", {"shape": _shape_list(v.shape),
                                                    "dtype": _dtype_name(v.dtype)})

    def produce(self, node_index: int, outputs: Iterable[Value]) -> list[str]:
        return [
            self._assign(v, f"n{node_index}.{j}", {"shape": _shape_list(v.shape),
                                                  "dtype": _dtype_name(v.dtype)})
            for j, v in enumerate(outputs)
        ]


def _node_record(node: Node, wiring: _Wiring, index: int) -> dict[str, Any]:
    inputs = [wiring.ref(v) for v in node.inputs]
    return {
        "op": node.op_type,
        "domain": node.domain,
        "opset": int(node.opset),
        "attrs": {k: _canonical_attr(node.attrs[k]) for k in sorted(node.attrs)},
        "in": inputs,
        "out": wiring.produce(index, node.outputs),
    }


def model_canonical(graph: Graph) -> dict[str, Any]:
    """The name-free, weight-free description of ``graph`` that :func:`model_fingerprint`
    hashes (useful for debugging why two fingerprints differ)."""
    wiring = _Wiring(graph)
    nodes = [_node_record(n, wiring, i) for i, n in enumerate(graph.nodes)]
    outputs = [wiring.ref(v) for v in graph.outputs]
    return {
        "fingerprint_version": FINGERPRINT_VERSION,
        "opsets": {k: int(v) for k, v in sorted(graph.opsets.items())},
        "inputs": [f"in{k}" for k in range(len(graph.inputs))],
        "nodes": nodes,
        "outputs": outputs,
        "values": wiring.values,
    }


#: the graph cache's name for the model fingerprint it keeps with each entry
CACHED_MODEL_FINGERPRINT = f"model v{FINGERPRINT_VERSION}"


def model_fingerprint(graph: Graph) -> str:
    """sha256 hex of the structure of ``graph`` (see the module docstring for what counts);
    a graph loaded from the graph cache brings it with it
    (:func:`dispatch.graph_cache.known_fingerprint`)."""
    known = graph_cache.known_fingerprint(graph, CACHED_MODEL_FINGERPRINT)
    return known if known is not None else _computed_fingerprint(graph)


def _computed_fingerprint(graph: Graph) -> str:
    return _sha256(model_canonical(graph))


graph_cache.register_fingerprint(CACHED_MODEL_FINGERPRINT, _computed_fingerprint)


def input_signature(graph: Graph) -> str:
    """Names, dtypes and shapes of the graph inputs, e.g. ``x:float32[1,3,224,224]``
    (``;``-separated, in input order; ``?`` for an unknown shape)."""
    parts = []
    for v in graph.inputs:
        shape = "?" if v.shape is None else ",".join(str(int(d)) for d in v.shape)
        parts.append(f"{v.name}:{_dtype_name(v.dtype) or '?'}[{shape}]")
    return ";".join(parts)


# ------------------------------------------------------------------------------------------
# hardware
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CpuInfo:
    """What :func:`parse_cpuinfo` reads from ``/proc/cpuinfo``."""

    model: str
    isa: tuple[str, ...]
    physical_cores: int | None


def _relevant_flag(flag: str) -> bool:
    return flag in _X86_FLAGS or flag in _ARM_FLAGS or flag.startswith(_ISA_PREFIXES)


def parse_cpuinfo(text: str) -> CpuInfo:
    """Parse the text of ``/proc/cpuinfo`` (x86 or Arm Linux)."""
    model = ""
    arm_ids: dict[str, str] = {}
    flags: set[str] = set()
    cores: set[tuple[str, str]] = set()
    physical_id = core_id = ""
    for line in [*text.splitlines(), ""]:
        if not line.strip():
            if core_id:
                cores.add((physical_id, core_id))
            physical_id = core_id = ""
            continue
        key, _, value = line.partition(":")
        key, value = key.strip().lower(), value.strip()
        if key in ("model name", "hardware", "cpu model") and not model:
            model = value
        elif key in ("cpu implementer", "cpu part", "cpu variant") and key not in arm_ids:
            arm_ids[key] = value
        elif key in ("flags", "features"):
            flags.update(f for f in value.split() if _relevant_flag(f))
        elif key == "physical id":
            physical_id = value
        elif key == "core id":
            core_id = value
    if not model and arm_ids:
        model = " ".join(f"{k.split()[-1]} {v}" for k, v in sorted(arm_ids.items()))
    return CpuInfo(model, tuple(sorted(flags)), len(cores) or None)


@functools.lru_cache(maxsize=1)
def _cpu_info() -> CpuInfo:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            info = parse_cpuinfo(f.read())
    except OSError:
        info = CpuInfo("", (), None)
    if not info.model:
        info = CpuInfo(platform.processor() or platform.machine() or "unknown", info.isa,
                       info.physical_cores)
    return info


@functools.lru_cache(maxsize=1)
def gpu_names() -> tuple[str, ...]:
    """Names of the NVIDIA GPUs ``nvidia-smi`` lists; empty when it is absent, fails or
    times out (never raises). Cached for the life of the process."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ()
    try:
        done = subprocess.run(
            [exe, "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=GPU_QUERY_TIMEOUT_S, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ()
    if done.returncode != 0:
        return ()
    return tuple(line.strip() for line in done.stdout.splitlines() if line.strip())


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS reports it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def threads_in_use() -> int:
    """The thread count native kernels use: the configured ``threads``, or every usable core
    when it is 0 (as ``NativeBackend.configure`` does). Falls back to the usable cores when
    the configuration cannot be read."""
    from dispatch.config import Config
    from dispatch.errors import ConfigError

    try:
        configured = Config.load().threads
    except ConfigError:
        configured = 0
    return configured or usable_cores()


def hardware_fingerprint(threads: int | None = None) -> dict[str, Any]:
    """The machine a plan was tuned on, as plain JSON-able data.

    ``threads`` is the thread count the kernels use; ``None`` reads it from the configuration
    (:func:`threads_in_use`). Never raises: missing facts are left empty.
    """
    cpu = _cpu_info()
    return {
        "arch": platform.machine() or "unknown",
        "system": platform.system() or "unknown",
        "cpu_model": cpu.model,
        "isa": list(cpu.isa),
        "physical_cores": cpu.physical_cores,
        "logical_cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "threads": int(threads) if threads is not None else threads_in_use(),
        "gpus": list(gpu_names()),
    }


def hardware_digest(hw: Mapping[str, Any]) -> str:
    """sha256 hex of a :func:`hardware_fingerprint` (key order does not matter)."""
    return _sha256(dict(hw))


# ------------------------------------------------------------------------------------------
# software
# ------------------------------------------------------------------------------------------


def opdispatch_version() -> str:
    """This opdispatch's version (``dispatch.__version__``)."""
    import dispatch

    return str(getattr(dispatch, "__version__", "unknown"))


def software_fingerprint(registry: Registry, backends: Sequence[str] | None = None) -> dict[str, Any]:
    """Versions of the software a plan depends on.

    ``{"backends": {name: version}, "opdispatch": ..., "plan_format": ...}`` for every
    available backend of ``registry`` (only those in ``backends`` when given; an unavailable
    one is left out). A backend's version is what its ``Backend.version()`` returned at
    discovery, which for the native backend includes the build id.
    """
    from dispatch.plan import PLAN_FORMAT_VERSION

    allowed = None if backends is None else set(backends)
    versions: dict[str, str] = {}
    for name, status in sorted(registry.backends.items()):
        if not status.available or (allowed is not None and name not in allowed):
            continue
        version = status.version
        if not version and status.backend is not None:
            try:
                version = str(status.backend.version())
            except Exception as exc:  # a broken version() must not stop planning
                version = f"unknown ({type(exc).__name__})"
        versions[name] = version or "unknown"
    return {"backends": versions, "implementations": implementation_digests(registry, versions),
            "opdispatch": opdispatch_version(), "plan_format": PLAN_FORMAT_VERSION}


def implementation_digests(registry: Registry, backends: Sequence[str]) -> dict[str, str]:
    """backend -> a short digest of the names of its registered implementations and layouts:
    a plan can only be built by a process that registered what it names, and a backend's
    Python registration can change (a new kernel wired in) without its library version
    changing."""
    names = registry.names_by_backend(backends)  # deferred registrations stay deferred
    return {b: hashlib.sha256("\n".join(sorted(n)).encode()).hexdigest()[:12] for b, n in names.items()}


def software_digest(sw: Mapping[str, Any]) -> str:
    """sha256 hex of a :func:`software_fingerprint`."""
    return _sha256(dict(sw))


# ------------------------------------------------------------------------------------------
# the plan key
# ------------------------------------------------------------------------------------------


#: the prefix of a range plan's input signature (``range input_ids=1x1..512 ...``:
#: :mod:`tuner.shapes.tune_range`)
RANGE_PREFIX = "range "
#: the input signature of a generation plan (:mod:`tuner.generation.tune_generate`): its model
#: is the model file's digest, its family the same
GENERATE_PREFIX = "generate"


@dataclass(frozen=True)
class PlanKey:
    """Everything a stored plan is valid for: a plan is used only on an exact match."""

    model: str
    inputs: str
    hardware: dict[str, Any]
    software: dict[str, Any]
    objective: str
    #: the model's structure with its input shapes left open
    #: (:attr:`dispatch.graph.Graph.family`): the same for the plans of every input shape of
    #: one model; not part of the key (two keys differing in it alone are equal)
    family: str = dataclasses.field(default="", compare=False)

    def __post_init__(self) -> None:
        # one objective, one key: any spelling of it (an Objective, or its parts in another
        # order) is stored and looked up as Objective's canonical form; a stored key that does
        # not parse is kept as it was (the store's integrity checks report it)
        try:
            canonical = str(Objective.parse(self.objective))
        except ArgumentError:
            canonical = str(self.objective)
        object.__setattr__(self, "objective", canonical)
        if not self.family and self.inputs.startswith(RANGE_PREFIX):
            # a range plan's model is its family (a bundle's keys carry no family)
            object.__setattr__(self, "family", self.model)

    def digest(self) -> str:
        """sha256 hex of the whole key (the store's unique ``key_digest``)."""
        return _sha256({
            "fingerprint_version": FINGERPRINT_VERSION,
            "model": self.model,
            "inputs": self.inputs,
            "hardware": hardware_digest(self.hardware),
            "software": software_digest(self.software),
            "objective": self.objective,
        })

    def explain_difference(self, other: PlanKey) -> list[str]:
        """Human-readable lines, one per change from ``self`` to ``other`` (e.g. a stored key to
        the present one): ``"model structure changed"``, ``"onnxruntime: 1.31.1 -> 1.32.0"``,
        ``"hardware: threads 2 -> 4"``, ``"objective: latency -> memory"``. Empty when equal."""
        lines: list[str] = []
        if self.model != other.model:
            lines.append("model structure changed")
        if self.inputs != other.inputs:
            lines.append(f"inputs: {self.inputs or '(none)'} -> {other.inputs or '(none)'}")
        lines += _hardware_differences(self.hardware, other.hardware)
        lines += _software_differences(self.software, other.software)
        if self.objective != other.objective:
            lines.append(f"objective: {self.objective} -> {other.objective}")
        if not lines and self.digest() != other.digest():
            lines.append("fingerprint format changed")
        return lines


_HW_LABELS = {
    "cpu_model": "CPU model",
    "arch": "architecture",
    "system": "operating system",
    "physical_cores": "physical cores",
    "logical_cores": "logical cores",
    "usable_cores": "usable cores",
    "threads": "threads",
}


def plan_key(graph: Graph, registry: Registry, backends: Sequence[str], objective: str) -> PlanKey:
    """The key a plan for ``graph`` is stored under on this machine with this software."""
    return PlanKey(
        model=model_fingerprint(graph),
        inputs=input_signature(graph),
        hardware=hardware_fingerprint(),
        software=software_fingerprint(registry, backends),
        objective=objective,
        family=graph.family,
    )


def _listed(items: Any) -> str:
    return ", ".join(map(str, items)) if items else "none"


def _hardware_differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    lines = []
    for field in sorted(set(old) | set(new), key=lambda f: (f not in _HW_LABELS, f)):
        a, b = old.get(field), new.get(field)
        if a == b:
            continue
        if field == "isa":
            gained = sorted(set(b or ()) - set(a or ()))
            lost = sorted(set(a or ()) - set(b or ()))
            change = ", ".join([f"+{f}" for f in gained] + [f"-{f}" for f in lost])
            lines.append(f"hardware: ISA flags {change}")
        elif field == "gpus":
            lines.append(f"hardware: GPU {_listed(a)} -> {_listed(b)}")
        else:
            lines.append(f"hardware: {_HW_LABELS.get(field, field)} {a} -> {b}")
    return lines


def _without_name(name: str, version: str) -> str:
    """``onnxruntime 1.17.0`` -> ``1.17.0`` for backend ``onnxruntime``; else unchanged."""
    prefix = f"{name} "
    return version[len(prefix):] if version.startswith(prefix) else version


def _software_differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    lines = []
    a_be: Mapping[str, str] = old.get("backends", {}) or {}
    b_be: Mapping[str, str] = new.get("backends", {}) or {}
    for name in sorted(set(a_be) | set(b_be)):
        a, b = a_be.get(name), b_be.get(name)
        if a == b:
            continue
        shown_a = "not used" if a is None else _without_name(name, a)
        shown_b = "not used" if b is None else _without_name(name, b)
        lines.append(f"{name}: {shown_a} -> {shown_b}")
    a_im: Mapping[str, str] = old.get("implementations", {}) or {}
    b_im: Mapping[str, str] = new.get("implementations", {}) or {}
    for name in sorted(set(a_im) & set(b_im)):
        if a_im[name] != b_im[name] and a_be.get(name) == b_be.get(name):
            lines.append(f"{name}: registered implementations or layouts changed "
                         f"({a_im[name]} -> {b_im[name]})")
    for field, label in (("opdispatch", "opdispatch"), ("plan_format", "plan format")):
        if old.get(field) != new.get(field):
            lines.append(f"{label}: {old.get(field)} -> {new.get(field)}")
    for field in sorted((set(old) | set(new)) - {"backends", "implementations", "opdispatch", "plan_format"}):
        if old.get(field) != new.get(field):
            lines.append(f"software: {field} {old.get(field)} -> {new.get(field)}")
    return lines
