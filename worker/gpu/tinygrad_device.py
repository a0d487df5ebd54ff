"""tinygrad's ``WEBGPU`` device, run on the executor's own GPU device (wgpu's, or a browser tab's).

tinygrad renders its whole op set (autograd and optimizers included) to WGSL with its
``WGSLRenderer``; its own WebGPU runtime then needs the native ``libwebgpu_dawn``. This module is that
runtime written over the wgpu-py API instead, on the same :class:`GpuDevice` the cell's other GPU work
uses, so a browser tab's :class:`TabDevice` (which mirrors wgpu-py) runs it too. Keeping tinygrad's
``WEBGPU`` name keeps tinygrad's WebGPU rules (at most 8 buffers per kernel, no sub-buffer views, no
float64).

``tinygrad_hook.install`` makes ``import tinygrad`` in a cell find this runtime under
``tinygrad.runtime.ops_webgpu`` (an import hook: tinygrad itself is not patched, and not imported until
a cell does) and makes ``WEBGPU`` tinygrad's default device.

Kernels are recorded into one compute pass and submitted together when the host needs a value
(a read, a write, a free, a synchronize), as a browser tab batches every call: one submission per
stretch of tinygrad work instead of one per kernel.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import wgpu
from tinygrad.device import Allocator, BufferSpec, Compiled, Program, TinyELF
from tinygrad.dtype import dtypes
from tinygrad.renderer.wgsl import WGSLRenderer
from tinygrad.uop.ops import UOp

from remote_magic.errors import GpuError

from .device import GpuDevice
from .memory import STAGING_USAGE, STORAGE_USAGE, UNIFORM_USAGE, BufferPool
from .tinygrad_hook import executor_gpu_device
from .tinygrad_programs import ProgramCache

MAX_UNIFORMS = 1024
"""Uniform buffers of kernels' variables kept for reuse, by value."""


class WebGpuWGSLRenderer(WGSLRenderer):
    """tinygrad's WGSL renderer, with a named error for what WGSL has no type for (float64)."""

    def render(self, uops: list[UOp]) -> str:
        if any(u.dtype == dtypes.float64 for u in uops):
            raise GpuError("WebGPU has no float64, so tinygrad can't compute float64 tensors on the worker's GPU: "
                           "make them float32 (`.float()`, or `Tensor(array.astype(np.float32))`: a numpy "
                           "float64 array becomes a float64 Tensor)")
        rendered: str = super().render(uops)
        return rendered


class WebGpuAllocator(Allocator["WebGpuDevice"]):
    """tinygrad buffers as wgpu storage buffers (sizes rounded up to 4 bytes, as WebGPU wants)."""

    def _alloc(self, size: int, options: BufferSpec) -> Any:
        # tinygrad binds whole buffers to its kernels, so the binding limit is the size limit
        limit = self.dev.gpu.limits.get("max_storage_buffer_binding_size", 0)
        if limit and size > limit:
            raise GpuError(f"a tinygrad tensor of {size:,} bytes is larger than one kernel may bind on "
                           f"{self.dev.gpu.info.name} ({limit:,} bytes, WebGPU's max_storage_buffer_binding_size): "
                           "split it into smaller tensors")
        with self.dev.gpu.guard("allocating a tinygrad buffer"):
            return self.dev.gpu.handle.create_buffer(size=_round4(size), usage=STORAGE_USAGE)

    def _free(self, opaque: Any, options: BufferSpec) -> None:
        self.dev.submit()  # a buffer that recorded kernels use can't go before they are submitted
        if not self.dev.gpu.lost:
            opaque.destroy()

    def _copyin(self, dest: Any, src: memoryview) -> None:
        data = bytes(src)
        if len(data) % 4:
            data += bytes(4 - len(data) % 4)
        self.dev.submit()  # the queue's writes run before anything submitted after them
        with self.dev.gpu.guard("copying a tinygrad buffer to the GPU"):
            self.dev.gpu.handle.queue.write_buffer(dest, 0, data)

    def _copyout(self, dest: memoryview, src: Any) -> None:
        size = _round4(dest.nbytes)
        if not size:
            return
        gpu = self.dev.gpu
        with gpu.guard("reading a tinygrad buffer back"):
            staging = self.dev.staging.take(size, STAGING_USAGE)  # reused: a training loop reads every step
            try:
                self.dev.encoder().copy_buffer_to_buffer(src, 0, staging, 0, size)
                self.dev.submit()
                staging.map_sync(wgpu.MapMode.READ, 0, size)
                try:
                    dest[:] = staging.read_mapped(0, size, copy=False)[:dest.nbytes]
                finally:
                    staging.unmap()
            finally:
                self.dev.staging.release(staging)


class WebGpuProgram(Program["WebGpuDevice"]):
    """One tinygrad kernel: its WGSL compiled once, a pipeline per binding layout, dispatches recorded."""

    def __init__(self, dev: "WebGpuDevice", obj: TinyELF) -> None:
        self.dev = dev
        self.name = obj.name
        with dev.gpu.guard(f"compiling tinygrad's kernel {obj.name}"):
            self.module = dev.gpu.handle.create_shader_module(code=obj.lib.decode())
        self._pipelines: dict[tuple[int, int], tuple[Any, Any]] = {}

    def _pipeline(self, buffers: int, values: int) -> tuple[Any, Any]:
        key = (buffers, values)
        if key not in self._pipelines:
            handle = self.dev.gpu.handle
            kinds = ["uniform"] + ["storage"] * buffers + ["uniform"] * values
            layout = handle.create_bind_group_layout(entries=[
                {"binding": n, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": kind}}
                for n, kind in enumerate(kinds)])
            pipeline = handle.create_compute_pipeline(
                layout=handle.create_pipeline_layout(bind_group_layouts=[layout]),
                compute={"module": self.module, "entry_point": self.name})
            self._pipelines[key] = (layout, pipeline)
        return self._pipelines[key]

    def __call__(self, *bufs: Any, global_size: tuple[int, int, int] = (1, 1, 1),
                 local_size: tuple[int, int, int] = (1, 1, 1), vals: tuple[int, ...] = (),
                 wait: bool = False, **_: Any) -> float | None:
        dev = self.dev
        with dev.gpu.guard(f"running tinygrad's kernel {self.name}"):
            layout, pipeline = self._pipeline(len(bufs), len(vals))
            resources = [dev.infinity, *bufs, *(dev.uniform(v) for v in vals)]
            group = dev.gpu.handle.create_bind_group(layout=layout, entries=[
                {"binding": n, "resource": {"buffer": buffer, "offset": 0, "size": buffer.size}}
                for n, buffer in enumerate(resources)])
            compute = dev.compute_pass()
            compute.set_pipeline(pipeline)
            compute.set_bind_group(0, group)
            compute.dispatch_workgroups(*global_size)
            if not wait:
                return None
            start = time.perf_counter()
            dev.synchronize()
            return time.perf_counter() - start


class WebGpuDevice(Compiled):
    """tinygrad's ``WEBGPU`` device on the executor's :class:`GpuDevice` (wgpu's or a browser tab's)."""

    def __init__(self, device: str) -> None:
        self.gpu: GpuDevice = executor_gpu_device()
        self._encoder: Any = None
        self._pass: Any = None
        self._uniforms: dict[int, Any] = {}
        self.staging = BufferPool(self.gpu.handle)
        """Staging buffers for readbacks, kept for reuse (``memory.py``'s pool)."""
        with self.gpu.guard("opening tinygrad's WEBGPU device"):
            self.infinity = self._uniform_bytes(np.float32(np.inf).tobytes())
        self.programs = ProgramCache(f"{self.gpu.info.name} {self.gpu.info.backend} {self.gpu.info.browser_tab or ''}",
                                     WebGpuWGSLRenderer)
        self.programs.load()
        super().__init__(device, WebGpuAllocator(self), [WebGpuWGSLRenderer], WebGpuProgram)

    def encoder(self) -> Any:
        """The command encoder recording until the next :meth:`submit`, for a copy (its compute pass ended)."""
        if self._pass is not None:
            self._pass.end()
            self._pass = None
        if self._encoder is None:
            self._encoder = self.gpu.handle.create_command_encoder()
        return self._encoder

    def compute_pass(self) -> Any:
        """The compute pass kernels are recorded into: one for every kernel until a copy or :meth:`submit`
        (WebGPU makes each dispatch's writes visible to the next in the same pass)."""
        if self._pass is None:
            self._pass = self.encoder().begin_compute_pass()
        return self._pass

    def submit(self) -> None:
        """Send what was recorded to the GPU's queue (one command buffer for all of it)."""
        if self._encoder is None:
            return
        encoder = self.encoder()  # (its pass ended)
        self._encoder = None
        if not self.gpu.lost:
            with self.gpu.guard("running tinygrad's kernels"):
                self.gpu.handle.queue.submit([encoder.finish()])

    def synchronize(self) -> None:
        """Submit what was recorded and wait for the GPU to finish it."""
        self.submit()
        self.gpu.wait()

    def uniform(self, value: int) -> Any:
        """A uniform buffer holding the 32-bit integer ``value`` (a kernel's variable), kept for reuse."""
        if value not in self._uniforms:
            if len(self._uniforms) >= MAX_UNIFORMS:  # (commands recorded with them keep them alive)
                self._uniforms.clear()
            self._uniforms[value] = self._uniform_bytes(int(value).to_bytes(4, "little", signed=value < 0))
        return self._uniforms[value]

    def _uniform_bytes(self, data: bytes) -> Any:
        buffer = self.gpu.handle.create_buffer(size=4, usage=UNIFORM_USAGE)
        self.gpu.handle.queue.write_buffer(buffer, 0, data)
        return buffer


def _round4(size: int) -> int:
    return -(-size // 4) * 4
