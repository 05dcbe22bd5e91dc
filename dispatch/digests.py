"""Content digests of constant arrays, computed once per array and remembered.

A compiled library region is found in its cache by the digest of the weights it bakes in
(:mod:`impls.openvino.compiled_cache`). Hashing GPT-2's 500 MB of weights costs ~0.7 s, at
every start of a production process. The graph cache (:mod:`dispatch.graph_cache`) therefore
stores the digests of a graph's large constants with the graph, computed once when the entry
is written, and :func:`remember` gives them back to the loaded arrays: a restarting process
hashes nothing. The memo is keyed by array identity (a weak reference: a dead array's id may be
reused), so a digest is only ever returned for the very array object it was computed or given
for.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import weakref
from collections.abc import Iterator, Mapping

import numpy as np

#: constants smaller than this are hashed when asked (cheap); larger ones are worth storing
STORED_DIGEST_BYTES = 1 << 16


class IdentityMemo:
    """Values remembered per object identity: a value is only ever given back for the very
    object it was remembered for (a weak reference checks it: a dead object's id may be
    reused). Thread-safe; dead entries are dropped once more than ``prune_above`` are held.
    Objects that take no weak reference are not remembered."""

    def __init__(self, prune_above: int = 4096) -> None:
        self._entries: dict[int, tuple[weakref.ref, object]] = {}
        self._lock = threading.Lock()
        self._prune_above = prune_above

    def get(self, obj: object) -> object | None:
        """The value remembered for this very ``obj``, else ``None``."""
        with self._lock:
            hit = self._entries.get(id(obj))
        return hit[1] if hit is not None and hit[0]() is obj else None

    def put(self, obj: object, value: object) -> None:
        """Remember ``value`` for ``obj``."""
        with contextlib.suppress(TypeError):
            ref = weakref.ref(obj)
            with self._lock:
                self._entries[id(obj)] = (ref, value)
                if len(self._entries) > self._prune_above:
                    for k in [k for k, (r, _) in self._entries.items() if r() is None]:
                        del self._entries[k]


_DIGESTS = IdentityMemo()


def _compute(arr: np.ndarray) -> str:
    h = hashlib.sha256(f"{arr.dtype.str}{arr.shape}".encode())
    h.update(np.ascontiguousarray(arr).data)
    return h.hexdigest()


def known_digest(arr: np.ndarray) -> str | None:
    """The remembered digest of this very array object, else ``None``."""
    digest = _DIGESTS.get(arr)
    return digest if isinstance(digest, str) else None


def remember(arr: np.ndarray, digest: str) -> None:
    """Remember ``digest`` as the digest of ``arr`` (what :func:`array_digest` computes for it).
    Arrays that take no weak reference are not remembered."""
    _DIGESTS.put(arr, digest)


def array_digest(arr: np.ndarray) -> str:
    """sha256 of ``arr``'s dtype, shape and bytes, remembered per array object (a plan's
    regions share constants; the tuner builds a region many times)."""
    digest = known_digest(arr)
    if digest is None:
        digest = _compute(arr)
        remember(arr, digest)
    return digest


def large_constants(consts: Mapping[str, np.ndarray | None]) -> Iterator[tuple[str, np.ndarray]]:
    """The entries of ``consts`` (name -> array) worth a stored digest."""
    for name, arr in consts.items():
        if isinstance(arr, np.ndarray) and arr.nbytes >= STORED_DIGEST_BYTES:
            yield name, arr
