"""Several requests in one call: :meth:`Session.run_batch`, the entry point a server's batcher
calls (a mixin of :class:`dispatch.session.Session`).

A model whose inputs all start with the same symbolic dimension (``batch``) runs a group of
requests as one batch: their inputs concatenated along it, one run at the batch's shape (its
own plan: stored for that shape, else the untuned one, as for any shape), and every output
that starts with that dimension split back. A model exported with a fixed batch is never
re-batched behind the user's back: its requests run one by one. Either way each request is
checked on its own first, so a bad request fails alone, not the group it came with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dispatch.errors import ArgumentError, FeedError
from dispatch.feeds import check_declared_feeds

#: what :meth:`BatchMixin.run_batch` gives for each request: its outputs, or the exception
#: that request alone raised
BatchItem = list[np.ndarray] | Exception


def batch_dimension(declared: Sequence[Any]) -> str | None:
    """The symbol every declared input starts with (``"batch"``), else ``None``: only then may
    requests be concatenated."""
    firsts = {d.dims[0] if d.dims else None for d in declared}
    if len(firsts) != 1:
        return None
    (first,) = firsts
    return first if isinstance(first, str) and first else None


def concatenate(group: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The feeds of ``group`` (requests with the same inputs) as one batch: each input
    concatenated along its first axis, in the group's order."""
    return {name: np.concatenate([f[name] for f in group]) for name in group[0]}


def split_outputs(outputs: Sequence[Any], sizes: Sequence[int]) -> list[list[np.ndarray]] | None:
    """The outputs of one batched run split back per request, ``sizes[k]`` rows each (what
    :func:`concatenate` joined); ``None`` when an output does not carry the batch (a scalar,
    or a first axis other than the sum of ``sizes``): then nothing can be split."""
    total = sum(sizes)
    if any(np.ndim(o) == 0 or np.shape(o)[0] != total for o in outputs):
        return None
    bounds = np.cumsum(sizes)[:-1]
    split = [np.split(np.asarray(o), bounds) for o in outputs]
    return [[s[k] for s in split] for k in range(len(sizes))]


class BatchMixin:
    """:meth:`run_batch` for :class:`dispatch.session.Session`."""

    def run_batch(self, requests: Sequence[Mapping[str, Any]],
                  output_names: Sequence[str] | None = None) -> list[BatchItem]:
        """Run several requests (each a feed dict, as :meth:`run` takes) and return, in
        order, each one's outputs, or the exception it alone raised (see the module
        docstring: requests are concatenated along the model's symbolic batch dimension when
        it has one, else run one by one; a bad request never fails the others)."""
        if isinstance(requests, Mapping) or not isinstance(requests, Sequence):
            raise ArgumentError(f"run_batch takes a sequence of feed dicts, received "
                                f"{type(requests).__name__}")
        results: list[BatchItem | None] = [None] * len(requests)
        checked: dict[int, dict[str, np.ndarray]] = {}
        for k, feeds in enumerate(requests):
            try:
                if not isinstance(feeds, Mapping):
                    raise FeedError(f"request {k}: a feed dict is expected, received "
                                    f"{type(feeds).__name__}")
                checked[k] = check_declared_feeds(self.declared, feeds)  # type: ignore[attr-defined]
            except Exception as exc:
                results[k] = exc
        for group in self._batch_groups(checked):
            if len(group) > 1:
                try:
                    outs = self._run_concatenated([checked[k] for k in group], output_names)
                except Exception:  # the group as one failed: each request on its own says why
                    outs = None
                if outs is not None:
                    for k, got in zip(group, outs):
                        results[k] = got
                    continue
            for k in group:
                try:
                    results[k] = self.run(output_names, checked[k])  # type: ignore[attr-defined]
                except Exception as exc:
                    results[k] = exc
        return [r if r is not None else ArgumentError("not run") for r in results]

    def _batch_groups(self, checked: Mapping[int, Mapping[str, np.ndarray]]) -> list[list[int]]:
        """The requests that can run as one batch, grouped (same shapes after the batch
        dimension); each request alone when the model has no symbolic batch dimension."""
        if batch_dimension(self.declared) is None:  # type: ignore[attr-defined]
            return [[k] for k in checked]
        groups: dict[tuple, list[int]] = {}
        for k, feeds in checked.items():
            sig = tuple((name, a.dtype.str, a.shape[1:]) for name, a in sorted(feeds.items()))
            groups.setdefault(sig, []).append(k)
        return list(groups.values())

    def _run_concatenated(self, group: Sequence[Mapping[str, np.ndarray]],
                          output_names: Sequence[str] | None) -> list[list[np.ndarray]] | None:
        """One run of ``group`` concatenated along the batch dimension, its outputs split
        back; ``None`` when an output does not carry the batch (then nothing is split)."""
        sizes = [next(iter(f.values())).shape[0] for f in group]
        if any(f[name].shape[0] != n for f, n in zip(group, sizes) for name in f):
            return None
        outs = self.run(output_names, concatenate(group))  # type: ignore[attr-defined]
        return split_outputs(outs, sizes)
