"""The user's data for an accuracy objective: samples of the model's inputs, loaded from a
``.npz`` file (arrays named like the inputs, first axis = samples), a folder of them (their
samples concatenated in file-name order), or an iterable of feeds (``Session.tune``); checked
against the graph's inputs; split into a calibration part (what the search measures errors
and calibrates on) and a held-out part (what the winner is checked on); and digested, for the
plan key: a plan tuned on other data is another plan.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dispatch.graph import Graph
from tuner.errors import TuningError

Feeds = dict[str, np.ndarray]
#: the fewest samples an accuracy objective accepts: some to search on, some held out
MIN_SAMPLES = 4
#: the share of the samples used for calibration and the search (the rest is held out)
CALIBRATION_SHARE = 0.5

DataLike = str | os.PathLike | Iterable[Mapping[str, np.ndarray]]


@dataclass
class AccuracyData:
    """The samples, split: ``calibration`` (searched on) and ``held_out`` (the winner is
    checked on them, never chosen on them), and the digest of all of them."""

    calibration: list[Feeds]
    held_out: list[Feeds]
    digest: str
    source: str

    def describe(self) -> str:
        return (f"{len(self.calibration) + len(self.held_out)} samples from {self.source}: "
                f"{len(self.calibration)} to search on, {len(self.held_out)} held out")


def _from_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: np.asarray(z[k]) for k in z.files}
    except Exception as exc:
        raise TuningError(f"cannot read accuracy data {str(path)!r}: {type(exc).__name__}: {exc} "
                          "(expected an .npz file of arrays named like the model's inputs)") from None


def _batched(arrays: Mapping[str, np.ndarray], graph: Graph, where: str) -> list[Feeds]:
    """Split arrays of samples (first axis) into one feeds dict per sample, each fitted to the
    graph's inputs (an array whose samples lack the input's leading batch dimension of 1 gets
    it)."""
    names = [v.name for v in graph.inputs]
    missing = [n for n in names if n not in arrays]
    extra = sorted(set(arrays) - set(names))
    if missing or extra:
        raise TuningError(f"{where}: arrays {sorted(arrays)}; the model's inputs are {names}"
                          + (f" (missing {missing})" if missing else "")
                          + (f" (not inputs: {extra})" if extra else ""))
    counts = {n: (np.asarray(arrays[n]).shape[:1] or (0,))[0] for n in names}
    if len(set(counts.values())) != 1:
        raise TuningError(f"{where}: every array needs the same number of samples (first axis), "
                          f"received {counts}")
    samples: list[Feeds] = [{} for _ in range(next(iter(counts.values())))]
    for v in graph.inputs:
        arr = np.asarray(arrays[v.name])
        want = np.dtype(v.dtype) if v.dtype is not None else arr.dtype
        if arr.dtype != want and not (arr.dtype.kind == want.kind and np.can_cast(arr.dtype, want)):
            raise TuningError(f"{where}: input {v.name!r} is {arr.dtype}, expected {want}")
        per = arr.shape[1:]
        if v.shape is not None and len(per) == len(v.shape) - 1 and tuple(v.shape[:1]) == (1,):
            arr = arr[:, None]
            per = arr.shape[1:]
        if v.shape is not None and (len(per) != len(v.shape) or any(
                isinstance(d, int | np.integer) and d > 0 and d != s for d, s in zip(v.shape, per))):
            raise TuningError(f"{where}: input {v.name!r} holds samples of shape {list(per)}, "
                              f"expected {list(v.shape)} (first axis = samples)")
        for k in range(len(samples)):
            samples[k][v.name] = np.ascontiguousarray(arr[k], dtype=want)
    return samples


def read_arrays(data: DataLike) -> tuple[list[tuple[str, dict[str, np.ndarray]]], str]:
    """``data`` as it was given: ``(where, arrays of samples)`` per file (a folder's .npz files
    in name order) or per feeds dict (each array one sample), and where they came from."""
    if isinstance(data, str | os.PathLike):
        path = Path(data).expanduser()
        if path.is_dir():
            files = sorted(path.glob("*.npz"))
            if not files:
                raise TuningError(f"accuracy data folder {str(path)!r} holds no .npz file")
            return [(f"accuracy data {f}", _from_npz(f)) for f in files], f"{path} ({len(files)} files)"
        if not path.is_file():
            raise TuningError(f"accuracy data {str(path)!r} does not exist "
                              "(expected an .npz file or a folder of them)")
        return [(f"accuracy data {path}", _from_npz(path))], str(path)
    if isinstance(data, Mapping):
        raise TuningError("accuracy data is one dict of arrays; expected an .npz file, a folder of "
                          "them, or an iterable of feeds (one dict of input arrays per sample)")
    parts = []
    for k, feeds in enumerate(data):
        if not isinstance(feeds, Mapping):
            raise TuningError(f"accuracy data item {k} is {type(feeds).__name__}; "
                              "expected a dict of input arrays")
        parts.append((f"accuracy data item {k}", {n: np.asarray(a)[None] for n, a in feeds.items()}))
    return parts, "the given feeds"


def digest(parts: Sequence[tuple[str, Mapping[str, np.ndarray]]]) -> str:
    """A digest of the data as given (:func:`read_arrays`): the order, names, dtypes, shapes
    and bytes of its arrays."""
    h = hashlib.sha256()
    for _, arrays in parts:
        for name in sorted(arrays):
            a = np.ascontiguousarray(arrays[name])
            h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
            h.update(a.tobytes())
    return h.hexdigest()[:16]


def data_digest(data: DataLike) -> str:
    """The digest plan keys name ``data`` by (an accuracy plan is looked up with it)."""
    return digest(read_arrays(data)[0])


def load_data(data: DataLike | AccuracyData, graph: Graph) -> AccuracyData:
    """The samples of ``data``, checked against ``graph``'s inputs and split: the first
    :data:`CALIBRATION_SHARE` to search on, the rest held out."""
    if isinstance(data, AccuracyData):
        return data
    parts, source = read_arrays(data)
    samples = [s for where, arrays in parts for s in _batched(arrays, graph, where)]
    if len(samples) < MIN_SAMPLES:
        raise TuningError(f"accuracy data from {source} holds {len(samples)} sample(s); at least "
                          f"{MIN_SAMPLES} are needed (half to search on, half held out), a few dozen "
                          "for a figure that holds")
    cut = max(1, min(len(samples) - 1, round(len(samples) * CALIBRATION_SHARE)))
    return AccuracyData(samples[:cut], samples[cut:], digest(parts), source)
