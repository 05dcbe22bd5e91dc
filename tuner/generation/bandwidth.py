"""The memory-bandwidth bound of a decoder's token steps.

A token step of a decoder reads every weight of the model once (a matrix-vector product per
layer) and writes one row per layer to its key/value cache: on a CPU it is bound by memory
bandwidth, not arithmetic, so tokens/s can be at most ``bandwidth / bytes read per token``.
:func:`stream_bandwidth` measures the bandwidth two ways, on arrays far larger than the caches,
on as many threads as give the most, best of several: STREAM's *copy* (bytes read plus bytes
written over the time; a copy also reads what it overwrites, which STREAM does not count, so it
understates the machine) and a *read* as a token step reads its weights (a matrix-vector
product of the array with a vector that stays in cache); the bound takes the larger.
:func:`bytes_per_token` counts what a step reads from the model's weights (a table that a
``Gather`` reads, such as a token or position embedding, costs one row; every other weight its
whole size).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

#: bytes of each array copied (well past the last-level cache of the CPUs this runs on)
STREAM_BYTES = 256 * 2**20
#: timed copies per thread count; the best is kept (STREAM's rule)
STREAM_REPEATS = 5


@dataclass(frozen=True)
class Bandwidth:
    """A measured memory bandwidth."""

    gb_per_s: float
    threads: int
    array_mb: float
    #: what gave ``gb_per_s``: ``read`` (matrix-vector) or ``copy``
    how: str = "copy"
    copy_gb_per_s: float = 0.0

    def describe(self) -> str:
        other = f"; copy {self.copy_gb_per_s:.1f} GB/s" if self.how == "read" else ""
        return (f"{self.gb_per_s:.1f} GB/s ({self.how} of {self.array_mb:.0f} MB, best of "
                f"{STREAM_REPEATS}, {self.threads} thread(s){other})")


def _best(counts: Sequence[int], repeats: int, parts_of: Any, work: Any, nbytes: int) -> tuple[float, int]:
    best = (0.0, 1)
    for n in counts:
        parts = parts_of(n)
        with ThreadPoolExecutor(n) as pool:
            for _ in range(repeats):
                t0 = time.perf_counter()
                list(pool.map(work, parts))
                rate = nbytes / (time.perf_counter() - t0) / 1e9
                if rate > best[0]:
                    best = (rate, n)
    return best


def stream_bandwidth(nbytes: int = STREAM_BYTES, repeats: int = STREAM_REPEATS,
                     threads: Iterable[int] | None = None) -> Bandwidth:
    """The machine's memory bandwidth (see the module docstring): the larger of a streaming
    copy (``2 * nbytes`` per pass) and a streaming read by a matrix-vector product (``nbytes``
    per pass), the best over ``threads`` (default: 1 up to the CPUs this process may use; numpy
    releases the GIL while it copies and multiplies)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    counts = sorted(set(threads or range(1, cores + 1)))
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    dst.fill(0.0)  # touch every page before timing
    pairs = {n: list(zip(np.array_split(dst, n), np.array_split(src, n))) for n in counts}
    copy = _best(counts, repeats, pairs.__getitem__, lambda p: np.copyto(p[0], p[1]), 2 * src.nbytes)
    pairs.clear()
    dst = None
    width = 1024
    rows = src.size // width
    matrix = src[: rows * width].reshape(rows, width)
    vector = np.ones(width, dtype=np.float32)
    read = _best(counts, repeats, lambda n: np.array_split(matrix, n),
                 lambda m: m @ vector, matrix.nbytes)
    mb = src.nbytes / 2**20
    if read[0] >= copy[0]:
        return Bandwidth(read[0], read[1], mb, "read", copy[0])
    return Bandwidth(copy[0], copy[1], mb, "copy", copy[0])


@dataclass(frozen=True)
class WeightBytes:
    """What one token step reads from a model's weights."""

    per_token: int
    total: int
    gathered: int  # bytes of tables read a row per token (counted a row each in per_token)


def bytes_per_token(model_path: str) -> WeightBytes:
    """Bytes of weights one token step reads (see the module docstring); the weights' data is
    not loaded (external data is sized from its tensors' shapes)."""
    import onnx
    from onnx import helper

    model = onnx.load(model_path, load_external_data=False)
    sizes: dict[str, tuple[int, int]] = {}  # name -> (bytes, bytes of one row)

    def note(graph: onnx.GraphProto) -> None:
        for init in graph.initializer:
            itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type)).itemsize
            count = int(np.prod(init.dims)) if init.dims else 1
            row = count // init.dims[0] if init.dims and init.dims[0] else count
            sizes[init.name] = (count * itemsize, row * itemsize)

    note(model.graph)
    gathered, full = set(), set()
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            if name in sizes:
                (gathered if node.op_type == "Gather" and i == 0 else full).add(name)
    per_token = sum(sizes[n][0] for n in full) + sum(sizes[n][1] for n in gathered - full)
    return WeightBytes(per_token=per_token, total=sum(b for b, _ in sizes.values()),
                       gathered=sum(sizes[n][0] for n in gathered - full))


def bound_tokens_per_s(bandwidth: Bandwidth, weights: WeightBytes) -> float:
    """The most tokens per second the bandwidth allows a step reading ``weights``."""
    return bandwidth.gb_per_s * 1e9 / max(weights.per_token, 1)
