"""The past keys and values of one generation, allocated once at the maximum length.

Each past tensor has two flat buffers of ``capacity`` positions (ping-pong). A step reads its
past as a contiguous view of the front of one buffer and the library writes the present (past
plus the new positions) into the front of the other; then the two swap, and the present just
written is the next step's past. Nothing is copied on the Python side and nothing is allocated
per step: the views are numpy views of the same two buffers, whatever the length (a view of the
first ``n`` elements of a flat buffer is contiguous at any shape).

:attr:`KVCache.allocations` counts the buffers allocated over the cache's life, so that a test
(or a curious caller) can check that a generation allocated its buffers once.
"""

from __future__ import annotations

import numpy as np

from dispatch.errors import ArgumentError
from dispatch.generation.decoder_io import CacheTensor, DecoderIO


class CapacityError(ArgumentError):
    """A generation would outgrow the positions its cache was allocated for."""


class KVCache:
    """The ping-pong past buffers of a decoder (see the module docstring).

    Args:
        io: the decoder's signature.
        capacity: the most positions (prompt and generated tokens) a generation holds.
        batch: the rows of every tensor.
    """

    def __init__(self, io: DecoderIO, capacity: int, batch: int = 1) -> None:
        self.io = io
        self.batch = int(batch)
        self.capacity = 0
        self.length = 0
        #: buffers allocated since the cache was made (two per past tensor per allocation)
        self.allocations = 0
        self._front: list[np.ndarray] = []
        self._back: list[np.ndarray] = []
        # per tensor: the elements of one position, and its shape with the length left to fill
        self._per_position = [t.elements(self.batch, 1) for t in io.cache]
        self._shapes = [list(t.dims(self.batch, 0)) for t in io.cache]
        self.ensure(capacity)

    def ensure(self, capacity: int) -> None:
        """Make room for ``capacity`` positions and start empty; the buffers are allocated
        again only when the capacity grows beyond the allocated one."""
        if capacity < 1:
            raise ArgumentError(f"a cache capacity must be at least 1 position, received {capacity}")
        self.length = 0
        if capacity <= self.capacity:
            return
        self._front = [self._allocate(t, capacity) for t in self.io.cache]
        self._back = [self._allocate(t, capacity) for t in self.io.cache]
        self.capacity = int(capacity)

    def _allocate(self, tensor: CacheTensor, capacity: int) -> np.ndarray:
        self.allocations += 1
        return np.empty(tensor.elements(self.batch, capacity), dtype=self.io.dtype)

    def reset(self) -> None:
        """Forget the past (a new generation), keeping the buffers."""
        self.length = 0

    def check_room(self, new: int) -> None:
        """Raise :class:`CapacityError` when ``new`` more positions do not fit."""
        if self.length + new > self.capacity:
            raise CapacityError(
                f"the key/value cache holds at most {self.capacity} positions (prompt plus new "
                f"tokens); it holds {self.length} and {new} more were asked for; make the "
                f"generator with a larger capacity (max_length)")

    def _views(self, buffers: list[np.ndarray], length: int) -> list[np.ndarray]:
        out = []
        for buffer, tensor, per, shape in zip(buffers, self.io.cache, self._per_position, self._shapes):
            shape[tensor.past_axis] = length
            out.append(buffer[: per * length].reshape(shape))
        return out

    def pasts(self) -> list[np.ndarray]:
        """The past of every tensor (at the current length), views of the front buffers."""
        return self._views(self._front, self.length)

    def presents(self, new: int) -> list[np.ndarray]:
        """Where the library writes every present of a step adding ``new`` positions: views of
        the back buffers at the current length plus ``new``."""
        self.check_room(new)
        return self._views(self._back, self.length + new)

    def advance(self, new: int) -> None:
        """The presents of a step adding ``new`` positions were written: they become the past."""
        self.check_room(new)
        self._front, self._back = self._back, self._front
        self.length += new

    def buffers(self) -> list[np.ndarray]:
        """Every buffer (front and back), for identity checks."""
        return [*self._front, *self._back]

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers())


class CacheHolder:
    """What a step runner that writes into a :class:`KVCache` shares: the cache (made by the
    first :meth:`begin`, then reused: its buffers grow only when a generation needs more) and the
    positions it holds. Subclasses set ``io`` and start with ``kv = None``."""

    io: DecoderIO
    kv: KVCache | None

    @property
    def length(self) -> int:
        return self.kv.length if self.kv is not None else 0

    def begin(self, capacity: int) -> None:
        if self.kv is None:
            self.kv = KVCache(self.io, capacity)
        else:
            self.kv.ensure(capacity)
