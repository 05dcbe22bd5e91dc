"""A cache of imported and simplified graphs, so that a process that restarts does not redo
the work of its last start: reading, checking and shape inference of the ONNX file, constant
folding and the other graph passes (issue 13: start-up is part of a production process's
latency). A cached MobileNetV2 loads in a few ms where importing and folding it takes 0.3 s.

Only models given as a file path are cached. The key is the file's identity (resolved path,
size, modification time, inode), the input shapes given, and the versions of what builds
the graph: opdispatch's own modules (their modification times), onnx and numpy. Any change
misses and rebuilds. Each entry also holds the digests of the graph's large constants
(:mod:`dispatch.digests`), so that the compiled-region cache finds its entries without hashing
the weights at every start, and the graph's structural fingerprint (the plan key's model part,
:func:`tuner.fingerprint.model_fingerprint`: ~20 ms on a 600-node graph), remembered for the
loaded graph object (:func:`known_fingerprint`). An entry is a pickle (protocol 5) followed
by the arrays' bytes (:func:`write_entry`), mapped from the file, not read
(:func:`read_entry`). Entries are written atomically and read-only (temporary file and
rename) into the cache folder (``OPDISPATCH_GRAPH_CACHE``, default
``~/.cache/opdispatch/graphs``; ``off`` disables it); one that is damaged, of another
version, not a graph, or writable by other users is ignored and replaced. The folder keeps at
most :data:`MAX_ENTRIES` entries and :data:`MAX_BYTES` bytes, the least recently used
dropped first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.metadata
import mmap
import os
import pickle
import stat
import struct
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from dispatch.digests import IdentityMemo, array_digest, known_digest, large_constants, remember
from dispatch.graph import Graph
from dispatch.heuristic import check_supported_ops
from dispatch.registry import Registry

#: bumped whenever what is pickled changes shape
CACHE_FORMAT = 6
#: the first bytes of an entry file (see :func:`write_entry`)
MAGIC = b"opdispatch graph cache\n"
_HEAD = struct.Struct("<QQ")
_SPAN = struct.Struct("<QQ")
#: array data offsets in an entry are aligned to this many bytes
ALIGN = 64
MAX_ENTRIES = 64
MAX_BYTES = 4 * 2**30
#: the value of OPDISPATCH_GRAPH_CACHE that turns the cache off
OFF = "off"


def cache_dir(setting: str) -> Path | None:
    """The cache folder a ``graph_cache`` setting names, ``None`` when it is off."""
    if not setting or setting.strip().lower() in (OFF, "0", "false", "no"):
        return None
    return Path(setting).expanduser()


def _code_stamp() -> str:
    """What the graph depends on besides the model: opdispatch's modules that import and
    simplify graphs (the core and the numpy reference that folds constants) and the versions
    of onnx and numpy."""
    import numpy

    root = Path(__file__).resolve().parent.parent
    parts = [f"format {CACHE_FORMAT}", f"onnx {_onnx_version()}", f"numpy {numpy.__version__}"]
    for folder in ("dispatch", "layouts", "impls/numpy"):
        for path in sorted((root / folder).glob("*.py")):
            with contextlib.suppress(OSError):
                st = path.stat()
                parts.append(f"{path.name} {st.st_size} {st.st_mtime_ns}")
    return "\n".join(parts)


def _onnx_version() -> str:
    """onnx's version from its distribution's metadata: a process that finds its graph in the
    cache never imports onnx (~55 ms)."""
    try:
        return importlib.metadata.version("onnx")
    except importlib.metadata.PackageNotFoundError:  # not installed as a distribution
        import onnx

        return onnx.__version__


_STAMP: str | None = None


def key(model: Any, input_shapes: Mapping[str, Sequence[int]] | None) -> str | None:
    """The cache key of ``model`` (a file path; ``None`` for anything else, or a file that
    cannot be read)."""
    global _STAMP
    if not isinstance(model, str | os.PathLike):
        return None
    try:
        path = Path(model).resolve()
        st = path.stat()
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    if _STAMP is None:
        _STAMP = _code_stamp()
    shapes = sorted((k, [int(d) for d in v]) for k, v in (input_shapes or {}).items())
    text = f"{path}\n{st.st_size} {st.st_mtime_ns} {st.st_ino}\n{shapes}\n{_STAMP}"
    return hashlib.sha256(text.encode()).hexdigest()


def load(folder: Path, digest: str) -> tuple[Graph, dict[str, Any]] | None:
    """The cached (graph, simplify statistics) under ``digest``, or ``None`` (absent, damaged,
    of another format, or not safe to unpickle: not owned by this user, or writable by
    others)."""
    path = folder / f"{digest}.pkl"
    try:
        st = path.stat()
        if (hasattr(os, "getuid") and st.st_uid != os.getuid()) or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return None
        entry = read_entry(path)
    except Exception:  # absent, unreadable or damaged: rebuilt and replaced by the caller
        return None
    if not (isinstance(entry, tuple) and len(entry) == 5 and entry[0] == CACHE_FORMAT
            and isinstance(entry[1], Graph) and isinstance(entry[2], dict)
            and isinstance(entry[3], dict) and isinstance(entry[4], dict)):
        return None
    graph, digests = entry[1], entry[3]
    _remember_fingerprints(graph, entry[4])
    for name, digest in digests.items():  # the large constants' digests, hashed when saved
        value = graph.values.get(name)
        if value is not None and value.const is not None and isinstance(digest, str):
            remember(value.const, digest)
    with contextlib.suppress(OSError):
        os.utime(path)  # recently used: pruned last
    return graph, entry[2]


#: the fingerprints of the graphs loaded or saved here, per graph object
_FINGERPRINTS = IdentityMemo(prune_above=256)
#: the fingerprints kept with every entry: kind (version-tagged, e.g. ``"model v1"``, so that
#: a change of a fingerprint's definition is a miss, not a wrong key) -> the function of the
#: graph that computes it; registered by the layer that keys plans by it
#: (:mod:`tuner.fingerprint`), see :func:`register_fingerprint`
FINGERPRINTERS: dict[str, Callable[[Graph], str]] = {}


def register_fingerprint(kind: str, compute: Callable[[Graph], str]) -> None:
    """Keep ``compute(graph)`` with every entry written from now on, as fingerprint ``kind``
    (:func:`known_fingerprint` gives it back for the loaded graph)."""
    FINGERPRINTERS[kind] = compute


def _fingerprints(graph: Graph) -> dict[str, str]:
    """The fingerprints kept with ``graph``'s entry, remembered for ``graph`` too."""
    found = {kind: compute(graph) for kind, compute in FINGERPRINTERS.items()}
    _remember_fingerprints(graph, found)
    return found


def _remember_fingerprints(graph: Graph, found: Mapping[str, Any]) -> None:
    _FINGERPRINTS.put(graph, {k: v for k, v in found.items() if isinstance(v, str)})


def known_fingerprint(graph: Graph, kind: str) -> str | None:
    """The fingerprint ``kind`` (e.g. ``"model v1"``) of this very graph object as its cache
    entry holds it, else ``None``. A graph from the cache is planned as loaded: nothing
    changes its structure between its load and its plan's lookup."""
    found = _FINGERPRINTS.get(graph)
    return found.get(kind) if isinstance(found, dict) else None


def write_entry(f: BinaryIO, entry: Any) -> None:
    """Write ``entry`` to ``f`` in the entry layout: :data:`MAGIC`, the pickle's length and
    the number of its buffers, each buffer's (offset, length), the pickle (protocol 5, the
    arrays' data out of band), then each array's bytes at an offset aligned to
    :data:`ALIGN`."""
    buffers: list[pickle.PickleBuffer] = []
    body = pickle.dumps(entry, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    at = end = len(MAGIC) + _HEAD.size + _SPAN.size * len(raws) + len(body)
    spans = []
    for raw in raws:
        end += -end % ALIGN
        spans.append((end, raw.nbytes))
        end += raw.nbytes
    f.write(MAGIC + _HEAD.pack(len(body), len(raws)) + b"".join(_SPAN.pack(*s) for s in spans))
    f.write(body)
    for (start, _), raw in zip(spans, raws):
        f.write(b"\0" * (start - at))
        f.write(raw)
        at = start + raw.nbytes


def read_entry(path: Path) -> Any:
    """The entry :func:`write_entry` wrote to ``path``, its arrays' bytes mapped from the file
    (copy-on-write: an array written to in place gets private pages; the file never changes),
    so that a start reads only the weights it touches. A plan that runs the whole model as
    one library region never touches them: reading vit's 343 MB into fresh memory took
    0.1-0.9 s (page faults and, with transparent huge pages, compaction stalls), mapping it
    nothing. Entries are replaced by rename and pruned by unlink, which a mapping survives;
    a file truncated in place by another program while mapped would raise SIGBUS on access,
    the risk onnxruntime (external data) and OpenVINO (``enable_mmap``) take with the model
    files they map, and the reason entries are written read-only. Raises ``ValueError`` on a
    file of another layout or cut short."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < len(MAGIC) + _HEAD.size:
            raise ValueError(f"{path} is cut short")
        view = memoryview(mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY))
    if bytes(view[:len(MAGIC)]) != MAGIC:
        raise ValueError(f"{path} is not a graph-cache entry")
    at = len(MAGIC)
    body_len, n = _HEAD.unpack_from(view, at)
    at += _HEAD.size
    if at + n * _SPAN.size > len(view):
        raise ValueError(f"{path} is cut short")
    spans = [_SPAN.unpack_from(view, at + k * _SPAN.size) for k in range(n)]
    at += n * _SPAN.size
    if at + body_len > len(view) or any(start + size > len(view) for start, size in spans):
        raise ValueError(f"{path} is cut short")
    return pickle.loads(view[at:at + body_len], buffers=[view[start:start + size] for start, size in spans])


def save(folder: Path, digest: str, graph: Graph, stats: Mapping[str, Any]) -> None:
    """Cache ``graph`` under ``digest`` (atomically; a folder that cannot be written is left
    alone: the cache is an optimisation, never a reason to fail), then prune the folder."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".graph-", suffix=".tmp")
        try:
            # digests of the large constants (dispatch.digests), so that a restarting process
            # finds its compiled library regions without hashing the weights again
            digests = {name: known_digest(arr) or array_digest(arr) for name, arr in
                       large_constants({n: v.const for n, v in graph.values.items()})}
            fingerprints = _fingerprints(graph)
            with os.fdopen(fd, "wb") as f:
                write_entry(f, (CACHE_FORMAT, graph, dict(stats), digests, fingerprints))
            os.chmod(tmp, stat.S_IRUSR)  # read-only: readers map it (read_entry)
            os.replace(tmp, folder / f"{digest}.pkl")
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        prune(folder)
    except (OSError, pickle.PicklingError, TypeError, AttributeError):
        return


def prune(folder: Path, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> int:
    """Drop the least recently used entries beyond ``max_entries`` or ``max_bytes`` (and
    temporary files of writers that died an hour ago or more); returns how many."""
    entries = []
    dropped = 0
    for path in folder.glob("*.pkl"):
        with contextlib.suppress(OSError):
            st = path.stat()
            entries.append((st.st_mtime, st.st_size, path))
    for path in folder.glob(".graph-*.tmp"):
        with contextlib.suppress(OSError):
            if path.stat().st_mtime < time.time() - 3600:
                path.unlink()
                dropped += 1
    entries.sort(reverse=True)  # newest first
    total = 0
    for k, (_, size, path) in enumerate(entries):
        total += size
        if k >= max_entries or total > max_bytes:
            with contextlib.suppress(OSError):
                path.unlink()
                dropped += 1
    return dropped


@dataclasses.dataclass
class LoadedGraph:
    """A graph ready to plan (see :func:`load_graph`), and where its time went."""

    graph: Graph
    simplify_stats: dict[str, Any]
    #: whether it came from the cache (nothing imported or simplified)
    cached: bool
    import_s: float
    simplify_s: float


def load_graph(
    model: Any,
    input_shapes: Mapping[str, Sequence[int]] | None,
    registry: Registry,
    backends: Sequence[str],
    setting: str,
) -> LoadedGraph:
    """``model`` imported, checked against ``backends`` and simplified, through the cache in
    the folder ``setting`` names (:func:`cache_dir`) when the model is a file: what a Session
    and the tuner both start with."""
    t0 = time.perf_counter()
    folder = cache_dir(setting)
    digest = key(model, input_shapes) if folder is not None else None
    hit = load(folder, digest) if folder is not None and digest else None
    if hit is not None:
        check_supported_ops(hit[0], registry, backends)
        return LoadedGraph(hit[0], hit[1], True, time.perf_counter() - t0, 0.0)
    # imported on a miss only: a graph from the cache needs none of onnx (issue 13: start-up)
    from dispatch.input_shapes import family_digest
    from dispatch.onnx_import import import_model
    from dispatch.passes import simplify

    graph = import_model(model, input_shapes)
    graph.family = family_digest(graph, graph.declared)
    check_supported_ops(graph, registry, backends)
    t1 = time.perf_counter()
    stats = simplify(graph, registry)
    if folder is not None and digest:
        save(folder, digest, graph, stats)
    return LoadedGraph(graph, stats, False, t1 - t0, time.perf_counter() - t1)
