"""Compiling regions for OpenVINO quickly, and once per machine (issue 13: start-up).

A region reaches OpenVINO as an ONNX file whose large constants sit next to it in one raw
``weights.bin`` (external data, written straight from the arrays): OpenVINO's ONNX frontend
maps that file instead of parsing the weights out of a serialised protobuf. For BERT-base
that is 0.4 s of writing where serialising the model and parsing it took 4 s.

With the compiled cache on (``OPDISPATCH_COMPILED_CACHE``, default
``~/.cache/opdispatch/compiled``; ``off`` disables it), the files are kept in a folder named by
the region's digest — its structure, the bytes of every constant, OpenVINO's version and the
compile settings — and OpenVINO's own model cache (``CACHE_DIR``) keeps the compiled blob
there: a process that builds the same region again (a production process starting from a
stored plan) imports the blob instead of converting and compiling. Any change of model,
weights, OpenVINO or settings gives another digest. Entries are written into a temporary
folder and renamed into place; one that does not compile, or that is writable by other users,
is removed and rebuilt. The cache keeps at most :data:`MAX_BYTES` bytes, the least recently
used entries dropped first. With the cache off, the files go to a temporary folder removed
once the model is compiled.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import os
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from dispatch.digests import array_digest
from dispatch.fusion import FusedNode
from impls import regions as regions_module
from impls.regions import region_model

#: bumped whenever what an entry holds or how it is named changes
CACHE_FORMAT = 2
MAX_BYTES = 8 * 2**30
#: external data offsets are aligned to this many bytes (for OpenVINO's mapping of the file)
ALIGN = 64
OFF = ("off", "0", "false", "no", "")



def cache_dir(setting: str) -> Path | None:
    """The folder a ``compiled_cache`` setting names, ``None`` when it is off."""
    if setting is None or setting.strip().lower() in OFF:
        return None
    return Path(setting).expanduser()


def _write_entry(folder: Path, model: Any, weights: dict[str, np.ndarray]) -> None:
    """Write ``model`` (its large constants external) as ``model.onnx`` and the constants'
    bytes into ``weights.bin`` in ``folder``."""
    offset = 0
    with open(folder / "weights.bin", "wb") as f:
        for init in model.graph.initializer:
            arr = weights.get(init.name)
            if arr is None:
                continue
            pad = -offset % ALIGN
            if pad:
                f.write(b"\0" * pad)
                offset += pad
            data = np.ascontiguousarray(arr)
            f.write(data.data)
            for entry in init.external_data:
                if entry.key == "location":
                    entry.value = "weights.bin"
                elif entry.key == "offset":
                    entry.value = str(offset)
            offset += data.nbytes
    (folder / "model.onnx").write_bytes(model.SerializeToString())


def _usable(entry: Path) -> bool:
    """Whether ``entry`` is a complete cache entry owned by this user, writable by no other."""
    try:
        st = entry.stat()
        if (hasattr(os, "getuid") and st.st_uid != os.getuid()) or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return False
        return (entry / "model.onnx").is_file() and (entry / "weights.bin").is_file()
    except OSError:
        return False


@functools.cache
def _code_digest() -> str:
    """The digest of the code that writes an entry's model (:func:`impls.regions.region_model`
    and this module): an entry is named by what the region is, so a change of how a region
    becomes a model must change every name."""
    h = hashlib.sha256()
    for module in (regions_module, sys.modules[__name__]):
        h.update(Path(inspect.getfile(module)).read_bytes())
    return h.hexdigest()


def _attr_text(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"array {array_digest(value)}"
    if hasattr(value, "SerializeToString"):  # a graph or tensor proto
        return "proto " + hashlib.sha256(value.SerializeToString(deterministic=True)).hexdigest()
    return f"{type(value).__name__} {value!r}"


def region_digest(region: FusedNode, config: dict[str, Any], version: str) -> str:
    """The name of ``region``'s cache entry: the format and the code that writes entries,
    OpenVINO's ``version``, the compile ``config``, and everything :func:`region_model` builds
    the region's model from -- each node's operator, opset, names and attributes, the
    region's inputs and outputs with their types and shapes, and every constant's digest
    (remembered with the graph: :mod:`dispatch.digests`). Computed without building the
    model, so that a process starting from a stored plan finds its entry without converting
    the region to ONNX and checking it (~20 ms on ShuffleNet, more on large graphs)."""
    h = hashlib.sha256(f"format {CACHE_FORMAT}\ncode {_code_digest()}\nopenvino {version}\n".encode())
    h.update(json.dumps(config, sort_keys=True, default=str).encode())
    lines: list[str] = []
    seen: set[str] = set()
    for n in region.nodes:
        lines.append(f"node {n.name!r} {n.domain!r} {n.op_type} {n.opset}")
        for v in n.inputs:
            if v is None:
                lines.append("  in -")
                continue
            lines.append(f"  in {v.name!r}")
            if v.is_const and v.name not in seen:
                seen.add(v.name)
                lines.append(f"  const {array_digest(np.asarray(v.const))}")
        lines.extend(f"  out {v.name!r}" for v in n.outputs)
        lines.extend(f"  attr {k} {_attr_text(a)}" for k, a in sorted(n.attrs.items()))
    for kind, values in (("input", region.inputs), ("output", region.outputs)):
        lines.extend(f"{kind} {v.name!r} {np.dtype(v.dtype).str} {list(v.shape)}" for v in values)
    h.update("\n".join(lines).encode())
    return h.hexdigest()


def with_edges(model: Any, edges: str) -> Any:
    """``model`` (an ``openvino.Model``) reading and writing its float32 inputs and outputs in
    ``edges`` (``bf16``: the plugin takes and gives bfloat16 tensors, converting nothing at
    the region's edges when it computes in bf16)."""
    import openvino as ov
    from openvino.preprocess import PrePostProcessor

    if edges != "bf16":
        raise ValueError(f"OpenVINO regions' edges are float32 or bf16, received {edges!r}")
    ppp = PrePostProcessor(model)
    for k, port in enumerate(model.inputs):
        if port.get_element_type() == ov.Type.f32:
            ppp.input(k).tensor().set_element_type(ov.Type.bf16)
    for k, port in enumerate(model.outputs):
        if port.get_element_type() == ov.Type.f32:
            ppp.output(k).tensor().set_element_type(ov.Type.bf16)
    return ppp.build()


def _compile(core: Any, path: Path, config: dict[str, Any], edges: str | None) -> Any:
    if edges is None:
        return core.compile_model(str(path), "CPU", config)
    return core.compile_model(with_edges(core.read_model(str(path)), edges), "CPU", config)


def compile_region(core: Any, region: FusedNode, config: dict[str, Any], setting: str,
                   edges: str | None = None) -> Any:
    """``region`` compiled by ``core`` for the CPU plugin with ``config``, through the
    compiled cache in the folder ``setting`` names (see the module docstring). An entry that
    exists is compiled from as it is: the region's model is only built to write one.
    ``edges``: ``None`` (the model's float32 at the edges) or ``bf16`` (:func:`with_edges`)."""
    import openvino as ov

    folder = cache_dir(setting)
    if folder is None:
        weights: dict[str, np.ndarray] = {}
        model = region_model(region, weights)
        with tempfile.TemporaryDirectory(prefix="opdispatch-ov-") as tmp:
            _write_entry(Path(tmp), model, weights)
            return _compile(core, Path(tmp) / "model.onnx", config, edges)
    entry = folder / region_digest(region, dict(config, edges=edges) if edges else config, ov.__version__)
    cached = dict(config, CACHE_DIR=str(entry / "blobs"))
    if _usable(entry):
        try:
            compiled = _compile(core, entry / "model.onnx", cached, edges)
            with contextlib.suppress(OSError):
                os.utime(entry)  # recently used: pruned last
            return compiled
        except Exception:  # damaged: rebuilt below
            shutil.rmtree(entry, ignore_errors=True)
    elif entry.exists():
        shutil.rmtree(entry, ignore_errors=True)
    weights = {}
    model = region_model(region, weights)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder, prefix=".entry-"))
        try:
            _write_entry(tmp, model, weights)
            os.rename(tmp, entry)
        except OSError:  # another process put the entry in place first, or the disk is full
            shutil.rmtree(tmp, ignore_errors=True)
        if not _usable(entry):
            raise OSError(f"no usable entry at {entry}")
    except OSError:  # the cache cannot be written: compile from a temporary folder
        return compile_region(core, region, config, "off", edges)
    compiled = _compile(core, entry / "model.onnx", cached, edges)
    prune(folder)
    return compiled


def prune(folder: Path, max_bytes: int = MAX_BYTES) -> int:
    """Drop the least recently used entries beyond ``max_bytes`` in all (and temporary
    folders of writers that died an hour ago or more); returns how many."""
    entries = []
    dropped = 0
    now = time.time()
    with contextlib.suppress(OSError):
        for path in folder.iterdir():
            with contextlib.suppress(OSError):
                st = path.stat()
                if path.name.startswith(".entry-"):
                    if st.st_mtime < now - 3600:
                        shutil.rmtree(path, ignore_errors=True)
                        dropped += 1
                    continue
                size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
                entries.append((st.st_mtime, size, path))
    entries.sort(reverse=True)  # newest first
    total = 0
    for _, size, path in entries:
        total += size
        if total > max_bytes:
            shutil.rmtree(path, ignore_errors=True)
            dropped += 1
    return dropped
