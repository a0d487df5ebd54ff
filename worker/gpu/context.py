"""Everything that belongs to one wgpu device: buffers, pipelines, timer, and dispatching.

When a device is lost the runtime drops its :class:`DeviceContext` and makes a new one; arrays
remember the context their buffer came from, so a stale buffer is never bound to a new device.
The context also holds the device's resident buffers (``resident.py``): uploads and readbacks
go through them, so an array whose values are already on the device is not uploaded again.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Mapping, Union

import numpy as np

from remote_magic.errors import GpuLimitError
from remote_magic.wire.sizes import human_size

from .device import GpuDevice
from .memory import MAPPABLE_STORAGE_USAGE, STORAGE_USAGE, UNIFORM_USAGE, Allocation, BufferPool, HostCopies
from .pipelines import Pipelines
from .resident import ResidentBuffers, content_key
from .stats import GpuTimer, Stats

log = logging.getLogger(__name__)

Binding = Union[Allocation, tuple[Allocation, int, int]]
"""A whole allocation, or (allocation, byte offset, byte size) for a slice of it."""

MIB = 1 << 20
MIN_KEPT_VALUES = 1024
"""Results read back are kept on the device (by digest) from this many values: smaller ones cost
less to upload again than the room they would take."""


class DeviceContext:
    """A device with its buffer pool, resident buffers, host copies, pipeline cache and GPU timer.

    ``resident_bytes`` bounds the buffers kept by content between cells (0: none kept).
    """

    def __init__(self, device: GpuDevice, stats: Stats, max_binding_bytes: int | None = None,
                 resident_bytes: int = 0) -> None:
        self.device = device
        self.handle = device.handle
        self.stats = stats
        limits = device.limits
        device_binding = limits.get("max_storage_buffer_binding_size", 128 * MIB)
        self.max_binding = min(device_binding, max_binding_bytes) if max_binding_bytes else device_binding
        self.max_binding -= self.max_binding % 256
        self.max_buffer = limits.get("max_buffer_size", self.max_binding)
        self.max_groups = limits.get("max_compute_workgroups_per_dimension", 65535)
        self.offset_alignment = limits.get("min_storage_buffer_offset_alignment", 256)
        self.pool = BufferPool(self.handle, storage_usage=MAPPABLE_STORAGE_USAGE if device.mappable_storage
                               else STORAGE_USAGE)
        self.resident = ResidentBuffers(resident_bytes)
        self.copies = HostCopies(self.handle, self.pool, self._count)
        self.pipelines = Pipelines(device)
        self.timer = GpuTimer(self.handle, device.timestamps, stats)
        self._encoder: Any = None
        """The work recorded since the last submission (None: nothing recorded)."""
        self._held: list[Any] = []
        """What that work binds, kept from the pool until it is submitted (uniforms, and the
        allocations themselves, whose buffers would go back to the pool when collected)."""

    @property
    def lost(self) -> bool:
        """True once the device is lost or closed."""
        return self.device.lost

    def _count(self, direction: str, nbytes: int) -> None:
        if direction == "up":
            self.stats.bytes_uploaded += nbytes
            self.stats.uploads += 1
        else:
            self.stats.bytes_downloaded += nbytes
            self.stats.readbacks += 1

    def check_buffer(self, what: str, nbytes: int) -> None:
        """Refuse a buffer larger than the device's ``max_buffer_size``."""
        if nbytes > self.max_buffer:
            raise GpuLimitError(f"{what} needs a buffer of {human_size(nbytes)}, but this GPU allows at most "
                                f"{human_size(self.max_buffer)} per buffer (max_buffer_size); use smaller arrays "
                                "or compute this with numpy")

    def check_binding(self, what: str, nbytes: int) -> None:
        """Refuse to bind more than one binding may hold (``max_storage_buffer_binding_size``)."""
        if nbytes > self.max_binding:
            raise GpuLimitError(f"{what} needs {human_size(nbytes)} in one binding, but this GPU binds at most "
                                f"{human_size(self.max_binding)} at once (max_storage_buffer_binding_size) and "
                                "this kernel cannot split its work; use smaller arrays or compute this with numpy")

    def upload(self, host: np.ndarray) -> Allocation:
        """A buffer on this device holding a float32 array's values: a resident one with the same
        values if kept (no upload), else a new one, uploaded and kept for the next cell."""
        data = np.ascontiguousarray(host, dtype=np.float32)  # hashed and uploaded from the same bytes
        self.check_buffer("an array", data.nbytes)
        key = content_key(data) if data.size and self.resident.budget_bytes else None
        if key is not None:
            kept = self.resident.get(key)
            if kept is not None:
                self.stats.resident_hits += 1
                self.stats.bytes_resident += kept.nbytes
                return kept
        with self.device.guard("an upload"):
            alloc = self.copies.upload(data)
        if key is not None:
            self.resident.keep(key, alloc)
        return alloc

    def download(self, alloc: Allocation, count: int) -> np.ndarray:
        """Read ``count`` float32 values back from ``alloc`` (waits for the GPU), submitting the work
        recorded so far together with the copy: one submission per value the host needs.

        A whole buffer read back (of at least :data:`MIN_KEPT_VALUES`) is kept as resident under its
        values' digest: a later operation or cell that uses these values finds them on the device.
        """
        encoder, held = self._take_recorded()
        keep = count >= MIN_KEPT_VALUES and 4 * count == alloc.nbytes and self.resident.budget_bytes > 0
        with self.device.guard("a readback"):
            data, digest = self.copies.download(alloc, count, encoder=encoder, digest=keep)
        self._release(held)
        self.timer.note_wait()
        if digest is not None:
            self.resident.keep((digest, data.nbytes), alloc)
        return data

    def download_indices(self, alloc: Allocation, count: int) -> np.ndarray:
        """Read ``count`` uint32 indices back from ``alloc`` (an arg_reduce or sort result) as int64,
        numpy's index dtype."""
        return self.download(alloc, count).view(np.uint32).astype(np.int64)

    def empty(self, nbytes: int) -> Allocation:
        """A new (dirty) buffer for ``nbytes`` of results."""
        self.check_buffer("a result", nbytes)
        with self.device.guard("allocating GPU memory"):
            return self.pool.allocate(nbytes)

    def zeros(self, nbytes: int) -> Allocation:
        """A new buffer for ``nbytes``, filled with zeros (recorded with the work that follows)."""
        alloc = self.empty(nbytes)
        if alloc.nbytes:
            with self.device.guard("clearing GPU memory"):
                self._recording().clear_buffer(alloc.buffer, 0, alloc.buffer.size)
            self._held.append(alloc)
        return alloc

    def fold(self, groups: int) -> tuple[int, int, int]:
        """Workgroup counts for ``groups`` workgroups, folded into y past the per-dimension limit."""
        if groups <= self.max_groups:
            return (groups, 1, 1)
        y = math.ceil(groups / self.max_groups)
        if y > self.max_groups:
            raise GpuLimitError(f"{groups:,} workgroups exceed this GPU's {self.max_groups:,}^2 limit "
                                "(max_compute_workgroups_per_dimension)")
        return (math.ceil(groups / y), y, 1)

    def dispatch(self, name: str, pipeline: Any, bindings: Mapping[int, Binding], params: bytes | None,
                 params_at: int, groups: int | tuple[int, int, int]) -> None:
        """Run ``pipeline`` once: bind ``bindings`` (+ ``params`` as a uniform), dispatch ``groups``.

        ``groups`` as an int is a linear workgroup count, folded with :meth:`fold`; the kernel
        numbers its workgroups ``x + y * num_workgroups.x``. ``name`` is what the stats count.
        """
        counts = self.fold(groups) if isinstance(groups, int) else groups
        if min(counts) == 0:
            return
        with self.device.guard(f"the {name} kernel"):
            entries = [{"binding": index, "resource": _resource(binding)} for index, binding in bindings.items()]
            if params is not None:
                uniform = self.pool.take(len(params), UNIFORM_USAGE)
                self.copies.write(uniform, params)
                self._held.append(uniform)  # back to the pool once submitted: a later write would overtake it
                entries.append({"binding": params_at, "resource": {"buffer": uniform, "offset": 0,
                                                                    "size": len(params)}})
            group = self.handle.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries)
            if self.timer.full:
                self.submit()  # the timer reads its queries back before it reuses them
            encoder = self._recording()
            writes = self.timer.pass_writes()
            compute = (encoder.begin_compute_pass(timestamp_writes=writes) if writes
                       else encoder.begin_compute_pass())
            compute.set_pipeline(pipeline)
            compute.set_bind_group(0, group)
            compute.dispatch_workgroups(*counts)
            compute.end()
            self._held.extend(bindings.values())
        self.stats.kernels[name] += 1

    def _recording(self) -> Any:
        """The command encoder the next work is recorded into."""
        if self._encoder is None:
            self._encoder = self.handle.create_command_encoder()
        return self._encoder

    def _take_recorded(self) -> tuple[Any, list[Any]]:
        """The recorded work and what it holds, leaving nothing recorded."""
        encoder, held = self._encoder, self._held
        self._encoder, self._held = None, []
        return encoder, held

    def _release(self, held: list[Any]) -> None:
        for item in held:
            if not isinstance(item, (Allocation, tuple)):
                self.pool.release(item)  # a uniform; allocations go back when collected

    def submit(self) -> None:
        """Submit the work recorded so far, as one command buffer."""
        encoder, held = self._take_recorded()
        if encoder is not None:
            with self.device.guard("submitting GPU work"):
                self.handle.queue.submit([encoder.finish()])
        self._release(held)

    def wait(self) -> None:
        """Submit what is recorded and block until all of it is done."""
        self.submit()
        self.device.wait()
        self.timer.note_wait()

    def flush_timer(self) -> None:
        """Fold pending GPU timestamps into the stats."""
        if not self.lost:
            self.submit()
            with self.device.guard("reading GPU timestamps"):
                self.timer.flush()

    def close(self) -> None:
        """Forget the resident buffers, free the pool and the device."""
        self.resident.clear()
        self.pool.close()
        self.device.close()


def _resource(binding: Binding) -> dict[str, Any]:
    if isinstance(binding, Allocation):
        return {"buffer": binding.buffer, "offset": 0, "size": max(4, binding.nbytes)}
    alloc, offset, size = binding
    return {"buffer": alloc.buffer, "offset": offset, "size": max(4, size)}
