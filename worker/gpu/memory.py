"""GPU memory: pooled storage buffers, reused uniform and staging buffers, uploads and readbacks.

Buffers are rounded up to size classes (a power of two, or a quarter step between two) and
returned to a free list when the last array using them is collected, so a loop of kernels does
not allocate. Work on the queue runs in order, so a released buffer can be handed to the next
kernel at once: anything that writes it is submitted after everything that read it.
"""

from __future__ import annotations

import logging
import weakref
from collections import defaultdict
from typing import Any, Callable

import numpy as np
import wgpu
import xxhash

from .mapping import READ_AFTER_COPY

log = logging.getLogger(__name__)

STORAGE_USAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
UNIFORM_USAGE = wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST
STAGING_USAGE = wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST
MAPPABLE_STORAGE_USAGE = STORAGE_USAGE | wgpu.BufferUsage.MAP_READ
"""Storage buffers read back where they are (a device with ``mappable_storage``), with no staging copy."""

DIGEST_CHUNK_BYTES = 256 << 10
"""A readback that is digested too is copied and hashed this much at a time, so the hash reads what the copy has
just put in the cache instead of reading the whole array from memory a second time."""

MIN_BUFFER_BYTES = 256
"""Smallest buffer made; a zero-size binding is invalid, so empty arrays still get one."""

DEFAULT_POOL_BYTES = 1 << 30
"""Free buffers kept for reuse (1 GiB) before the pool starts destroying released ones."""


def round_up(nbytes: int, multiple: int) -> int:
    """``nbytes`` rounded up to a multiple of ``multiple`` (a binding's size: WebGPU's are multiples of 4, a vec4
    kernel's of 16)."""
    return -(-nbytes // multiple) * multiple


def size_class(nbytes: int) -> int:
    """``nbytes`` rounded up to a pooled size: a power of two or a quarter step past one."""
    if nbytes <= MIN_BUFFER_BYTES:
        return MIN_BUFFER_BYTES
    top = 1 << (nbytes - 1).bit_length()  # next power of two
    step = top // 8  # quarter steps between top/2 and top
    return -(-nbytes // step) * step


class Allocation:
    """A pooled GPU buffer holding ``nbytes`` of data; goes back to its pool when collected."""

    __slots__ = ("buffer", "nbytes", "pool", "__weakref__")

    def __init__(self, buffer: Any, nbytes: int, pool: "BufferPool") -> None:
        self.buffer = buffer
        self.nbytes = nbytes
        self.pool = pool
        weakref.finalize(self, pool.release, buffer)


class BufferPool:
    """Free lists of buffers per (usage, size class), bounded by ``max_free_bytes``."""

    def __init__(self, device: Any, max_free_bytes: int = DEFAULT_POOL_BYTES,
                 storage_usage: int = STORAGE_USAGE) -> None:
        self._device = device
        self.storage_usage = storage_usage
        """The usage of :meth:`allocate`'s buffers (:data:`MAPPABLE_STORAGE_USAGE` where the device allows it)."""
        self._free: dict[tuple[int, int], list[Any]] = defaultdict(list)
        self._free_bytes = 0
        self.max_free_bytes = max_free_bytes
        self.closed = False

    def take(self, nbytes: int, usage: int | None = None) -> Any:
        """A buffer of at least ``nbytes`` with ``usage`` (default: the pool's storage usage): a free one if any,
        else a new one."""
        usage = self.storage_usage if usage is None else usage
        size = size_class(nbytes)
        free = self._free.get((int(usage), size))
        if free:
            self._free_bytes -= size
            return free.pop()
        return self._device.create_buffer(size=size, usage=usage)

    def allocate(self, nbytes: int) -> Allocation:
        """A storage buffer for ``nbytes`` of array data, returned to the pool when collected."""
        return Allocation(self.take(nbytes), nbytes, self)

    def release(self, buffer: Any) -> None:
        """Give ``buffer`` back for reuse, or destroy it when the pool is full or closed."""
        if self.closed:
            return
        if self._free_bytes + buffer.size > self.max_free_bytes:
            buffer.destroy()
            return
        self._free[(int(buffer.usage), buffer.size)].append(buffer)
        self._free_bytes += buffer.size

    def close(self) -> None:
        """Drop every free buffer; later releases are ignored (the device is going away)."""
        self.closed = True
        for buffers in self._free.values():
            for buffer in buffers:
                buffer.destroy()
        self._free.clear()
        self._free_bytes = 0


class HostCopies:
    """Copies between the executor's memory and the device's: uploads through the queue, readbacks of mapped
    buffers (the result's own, or a reused staging buffer)."""

    def __init__(self, device: Any, pool: BufferPool, count: Callable[[str, int], None]) -> None:
        self._device = device
        self._pool = pool
        self._count = count  # count("up" | "down", nbytes)

    def upload(self, host: np.ndarray) -> Allocation:
        """Copy a contiguous float32 array into a new pooled buffer."""
        data = np.ascontiguousarray(host, dtype=np.float32)
        alloc = self._pool.allocate(data.nbytes)
        if data.nbytes:
            self._device.queue.write_buffer(alloc.buffer, 0, data)
            self._count("up", data.nbytes)
        return alloc

    def write(self, buffer: Any, data: bytes | np.ndarray) -> None:
        """Write small bookkeeping data (uniforms); not counted as user traffic."""
        self._device.queue.write_buffer(buffer, 0, data)

    def download(self, alloc: Allocation, count: int, offset_bytes: int = 0, *, encoder: Any = None,
                 digest: bool = False) -> tuple[np.ndarray, bytes | None]:
        """Read ``count`` float32 values from ``alloc`` (a copy), and with ``digest`` the xxh3-128 digest of their
        bytes, hashed as they are copied.

        ``encoder``: work recorded before, submitted with the copy (in one command buffer). A mappable
        storage buffer is read where it is; any other goes through a reused staging buffer.
        """
        nbytes = 4 * count
        if nbytes == 0:
            if encoder is not None:
                self._device.queue.submit([encoder.finish()])
            return np.empty(0, np.float32), (xxhash.xxh3_128_digest(b"") if digest else None)
        if alloc.buffer.usage & wgpu.BufferUsage.MAP_READ and offset_bytes % 8 == 0:
            if encoder is not None:
                self._device.queue.submit([encoder.finish()])
            result = _read_mapped(alloc.buffer, offset_bytes, nbytes, digest, wgpu.MapMode.READ)
        else:
            staging = self._pool.take(nbytes, STAGING_USAGE)
            try:
                encoder = encoder or self._device.create_command_encoder()
                encoder.copy_buffer_to_buffer(alloc.buffer, offset_bytes, staging, 0, nbytes)
                self._device.queue.submit([encoder.finish()])
                result = _read_mapped(staging, 0, nbytes, digest, READ_AFTER_COPY)
            finally:
                self._pool.release(staging)
        self._count("down", nbytes)
        return result


def _read_mapped(buffer: Any, offset: int, nbytes: int, digest: bool, mode: Any) -> tuple[np.ndarray, bytes | None]:
    """Map ``nbytes`` of ``buffer`` at ``offset`` in ``mode`` (waits for the GPU work that writes it), copy them out
    as float32 values, unmap; with ``digest``, hash the copy chunk by chunk while it is in the cache."""
    buffer.map_sync(mode, offset, nbytes)  # slow: waits for the GPU
    try:
        mapped = np.frombuffer(buffer.read_mapped(offset, nbytes, copy=False), np.uint8)  # wgpu has no type hints
        data = np.empty(nbytes // 4, np.float32)
        if not digest:
            np.copyto(data.view(np.uint8), mapped)
            return data, None
        out, hasher = data.view(np.uint8), xxhash.xxh3_128()
        for start in range(0, nbytes, DIGEST_CHUNK_BYTES):
            chunk = slice(start, start + DIGEST_CHUNK_BYTES)
            np.copyto(out[chunk], mapped[chunk])
            hasher.update(out[chunk].data)
        return data, hasher.digest()
    finally:
        buffer.unmap()
