"""Resident buffers: GPU copies of arrays kept between cells, found again by content digest.

A notebook sends the same array to cell after cell; each cell's executor sees a new numpy
array with the same bytes. Keyed by the xxh3-128 digest of its float32 bytes (and their
length), the GPU buffer uploaded for the first cell serves the next one without an upload,
and a buffer read back at the end of a cell serves the next cell that sends that result back.
Shape and dtype live on the DeviceArray, not the buffer: the same bytes are the same buffer.

Entries go least recently used first once their bytes pass the budget (``--gpu-memory``). A
kept buffer is never written again: every kernel writes a fresh buffer (DeviceArrays are
immutable, ``out=`` is refused, custom kernels' inputs are ``var<storage, read>``), so sharing
one between arrays and cells is safe. The cache belongs to one device context; a lost device
takes it along.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import xxhash

from .memory import Allocation, size_class

Key = tuple[bytes, int]
"""(xxh3-128 digest, byte length) of an array's float32 values."""


def content_key(data: np.ndarray) -> Key:
    """The key of a float32 array's values (hashes at memory speed; no copy when contiguous)."""
    contiguous = np.ascontiguousarray(data, dtype=np.float32)
    return xxhash.xxh3_128_digest(contiguous.data.cast("B")), contiguous.nbytes


class ResidentBuffers:
    """GPU buffers by content key, least recently used first out past ``budget_bytes``."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = max(0, budget_bytes)
        self.used_bytes = 0
        self._entries: OrderedDict[Key, Allocation] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Key) -> bool:
        return key in self._entries

    def get(self, key: Key) -> Allocation | None:
        """The buffer holding ``key``'s values, now the most recently used; None if not kept."""
        alloc = self._entries.get(key)
        if alloc is not None:
            self._entries.move_to_end(key)
        return alloc

    def keep(self, key: Key, alloc: Allocation) -> None:
        """Keep ``alloc`` as the holder of ``key``'s values, evicting the least recently used past the budget.

        A buffer larger than the whole budget is not kept (it would evict everything for itself).
        """
        if key in self._entries:
            self._entries.move_to_end(key)
            return
        if size_class(alloc.nbytes) > self.budget_bytes:
            return
        self._entries[key] = alloc
        self.used_bytes += size_class(alloc.nbytes)  # what the buffer takes, not just its values
        while self.used_bytes > self.budget_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.used_bytes -= size_class(evicted.nbytes)  # back to the pool once no array holds it either

    def clear(self) -> None:
        """Forget every buffer (the device is going away)."""
        self._entries.clear()
        self.used_bytes = 0
