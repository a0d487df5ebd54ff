"""Everything that belongs to one wgpu device: buffers, pipelines, timer, and dispatching.

When a device is lost the runtime drops its :class:`DeviceContext` and makes a new one; arrays
remember the context their buffer came from, so a stale buffer is never bound to a new device.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Mapping, Union

import numpy as np

from remote_magic.errors import GpuLimitError
from remote_magic.wire.sizes import human_size

from .device import GpuDevice
from .memory import UNIFORM_USAGE, Allocation, BufferPool, Transfers
from .pipelines import Pipelines
from .stats import GpuTimer, Stats

log = logging.getLogger(__name__)

Binding = Union[Allocation, tuple[Allocation, int, int]]
"""A whole allocation, or (allocation, byte offset, byte size) for a slice of it."""

MIB = 1 << 20


class DeviceContext:
    """A device with its buffer pool, transfers, pipeline cache and GPU timer."""

    def __init__(self, device: GpuDevice, stats: Stats, max_binding_bytes: int | None = None) -> None:
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
        self.pool = BufferPool(self.handle)
        self.transfers = Transfers(self.handle, self.pool, self._count)
        self.pipelines = Pipelines(self.handle)
        self.timer = GpuTimer(self.handle, device.timestamps, stats)

    @property
    def lost(self) -> bool:
        """True once the device is lost or closed."""
        return self.device.lost

    def _count(self, direction: str, nbytes: int) -> None:
        if direction == "up":
            self.stats.bytes_uploaded += nbytes
        else:
            self.stats.bytes_downloaded += nbytes

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
        """Copy a float32 array to a new buffer on this device."""
        self.check_buffer("an array", host.nbytes)
        with self.device.guard("an upload"):
            return self.transfers.upload(host)

    def download(self, alloc: Allocation, count: int) -> np.ndarray:
        """Read ``count`` float32 values back from ``alloc`` (waits for the GPU)."""
        with self.device.guard("a readback"):
            data = self.transfers.download(alloc, count)
        self.timer.note_wait()
        return data

    def empty(self, nbytes: int) -> Allocation:
        """A new (dirty) buffer for ``nbytes`` of results."""
        self.check_buffer("a result", nbytes)
        with self.device.guard("allocating GPU memory"):
            return self.pool.allocate(nbytes)

    def zeros(self, nbytes: int) -> Allocation:
        """A new buffer for ``nbytes``, filled with zeros."""
        alloc = self.empty(nbytes)
        with self.device.guard("clearing GPU memory"):
            self.transfers.clear(alloc)
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
            uniform = None
            if params is not None:
                uniform = self.pool.take(len(params), UNIFORM_USAGE)
                self.transfers.write(uniform, params)
                entries.append({"binding": params_at, "resource": {"buffer": uniform, "offset": 0,
                                                                    "size": len(params)}})
            group = self.handle.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries)
            encoder = self.handle.create_command_encoder()
            writes = self.timer.pass_writes()
            compute = (encoder.begin_compute_pass(timestamp_writes=writes) if writes
                       else encoder.begin_compute_pass())
            compute.set_pipeline(pipeline)
            compute.set_bind_group(0, group)
            compute.dispatch_workgroups(*counts)
            compute.end()
            self.handle.queue.submit([encoder.finish()])
            if uniform is not None:
                self.pool.release(uniform)  # queue order keeps the next write after this kernel
        self.stats.kernels[name] += 1

    def wait(self) -> None:
        """Block until all submitted work is done."""
        self.device.wait()
        self.timer.note_wait()

    def flush_timer(self) -> None:
        """Fold pending GPU timestamps into the stats."""
        if not self.lost:
            with self.device.guard("reading GPU timestamps"):
                self.timer.flush()

    def close(self) -> None:
        """Free the pool and the device."""
        self.pool.close()
        self.device.close()


def _resource(binding: Binding) -> dict[str, Any]:
    if isinstance(binding, Allocation):
        return {"buffer": binding.buffer, "offset": 0, "size": max(4, binding.nbytes)}
    alloc, offset, size = binding
    return {"buffer": alloc.buffer, "offset": offset, "size": max(4, size)}
