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
stretch of tinygrad work instead of one per kernel. A jitted step's kernels replay through
``tinygrad_graph.py``, their buffers and programs looked up once; on a GPU each batch of them is submitted
as soon as it is recorded.

Where WebGPU implementations differ, it does what a browser tab must: a kernel binding one buffer twice reads a
copy (WebGPU forbids the aliasing, and Chrome enforces it), and ``log2``, ``exp2``, ``sqrt`` are NaN outside their
domain (WGSL leaves them open). Values a GPU cell already keeps on the device (``resident.py``) are copied into
tinygrad's buffers there instead of uploaded; allocations are counted, so running out of memory names the sizes.
tinygrad's plain float32 matrix products run this project's tuned matmul where it measures faster
(``tinygrad_matmul.py``).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
import wgpu
from tinygrad.device import Allocator, BufferSpec, Compiled, Program, TinyELF
from tinygrad.dtype import dtypes
from tinygrad.renderer.wgsl import WGSLRenderer
from tinygrad.uop import Ops
from tinygrad.uop.ops import UOp

from remote_magic.errors import GpuError
from remote_magic.wire.sizes import human_size

from .context import DeviceContext
from .device import GpuDevice
from .mapping import READ_AFTER_COPY
from .memory import STAGING_USAGE, STORAGE_USAGE, UNIFORM_USAGE, BufferPool, round_up
from .resident import content_key
from .stats import GpuTimer, Stats
from .tab_device import record_dispatches
from .tinygrad_graph import BoundDispatch, WebGpuGraph
from .tinygrad_hook import executor_context, executor_gpu_device
from .tinygrad_matmul import Launch, TunedMatmulProgram, install as install_tuned_matmul, tuned_context
from .tinygrad_programs import ProgramCache

MAX_UNIFORMS = 1024
"""Uniform buffers of kernels' variables kept for reuse, by value."""

MAX_BIND_GROUPS = 4096
"""Bind groups kept for reuse, by layout and buffers: a jitted step binds the same buffers to the same kernels each
time, and a browser tab pays for each new one (a call the tab runs, and an object it holds)."""


def _is_nan(x: str) -> str:
    """WGSL that is true where the f32 ``x`` is NaN, from its bits: a compiler may assume ``x != x`` false."""
    return f"((bitcast<u32>({x}) & 0x7fffffffu) > 0x7f800000u)"


def _nan_outside(builtin: str, *, below_zero: bool) -> Callable[[str, Any], str]:
    """How to render ``builtin(x)``: for f32, NaN where x is NaN (or, ``below_zero``, negative), as IEEE has it."""
    def code(x: str, dtype: Any) -> str:
        if dtype != dtypes.float:
            return f"{builtin}({x})"
        below = f"(({x}) < 0.0) || " if below_zero else ""
        return f"select({builtin}({x}), nan(), {below}{_is_nan(x)})"
    return code


class WebGpuWGSLRenderer(WGSLRenderer):
    """tinygrad's WGSL renderer, with a named error for what WGSL has no type for (float64), and its ``log2``,
    ``exp2`` and ``sqrt`` NaN outside their domain. WGSL leaves those open ("indeterminate"): naga's lavapipe gives
    NaN, Chrome's SwiftShader gives ``exp2(NaN) = inf`` and ``log2(-x) = log2(x)``, so without this a tab's
    tinygrad differed from the worker's (tinygrad's ``test_exp`` and ``test_log`` in a tab)."""

    code_for_op = {**WGSLRenderer.code_for_op, Ops.LOG2: _nan_outside("log2", below_zero=True),
                   Ops.SQRT: _nan_outside("sqrt", below_zero=True), Ops.EXP2: _nan_outside("exp2", below_zero=False)}
    revision = 5
    """Bumped when the WGSL this renders changes, or the tuned matmul that may run in its place (5: split-K): programs
    saved by another revision, with the kernel measured faster for each product, are generated and measured anew."""

    def render(self, uops: list[UOp]) -> str:
        if any(u.dtype == dtypes.float64 for u in uops):
            raise GpuError("WebGPU has no float64, so tinygrad can't compute float64 tensors on the worker's GPU: "
                           "make them float32 (`.float()`, or `Tensor(array.astype(np.float32))`: a numpy "
                           "float64 array becomes a float64 Tensor)")
        rendered: str = super().render(uops)
        return rendered


class WebGpuAllocator(Allocator["WebGpuDevice"]):
    """tinygrad buffers as wgpu storage buffers (sizes rounded up to 16 bytes: whole vec4s, as the tuned matmul
    reads them), counted, so that running out of GPU memory (or past :attr:`WebGpuDevice.memory_limit`) says what
    was asked and what is held."""

    def __init__(self, dev: "WebGpuDevice") -> None:
        super().__init__(dev)
        self.held: dict[int, int] = {}
        """Bytes of each buffer tinygrad holds on the device, by ``id`` of the wgpu buffer."""
        self.held_by_programs: dict[int, int] = {}
        """Bytes of each buffer a program keeps for itself (the tuned matmul's, for work fused around a product), by
        ``id`` of the wgpu buffer: counted against :attr:`WebGpuDevice.memory_limit` beside tensors'."""

    def _alloc(self, size: int, options: BufferSpec) -> Any:
        # tinygrad binds whole buffers to its kernels, so the binding limit is the size limit
        limit = self.dev.gpu.limits.get("max_storage_buffer_binding_size", 0)
        if limit and size > limit:
            raise GpuError(f"a tinygrad tensor of {size:,} bytes is larger than one kernel may bind on "
                           f"{self.dev.gpu.info.name} ({limit:,} bytes, WebGPU's max_storage_buffer_binding_size): "
                           "split it into smaller tensors")
        buffer = self._bounded(size, "a tensor")
        self.held[id(buffer)] = buffer.size
        return buffer

    def program_buffer(self, size: int) -> Any:
        """A buffer a program keeps for itself while it lives, counted (:attr:`held_by_programs`) until
        :meth:`free_program_buffer`."""
        buffer = self._bounded(size, "the tuned matmul's own buffer (for work fused around a product)")
        self.held_by_programs[id(buffer)] = buffer.size
        return buffer

    def free_program_buffer(self, buffer: Any) -> None:
        self.held_by_programs.pop(id(buffer), None)
        self._destroy(buffer)

    def _bounded(self, size: int, what: str) -> Any:
        """A new storage buffer of ``size`` bytes (rounded up), within :attr:`WebGpuDevice.memory_limit`; running out
        of either says what ``what`` asked for and what is held."""
        padded = round_up(max(size, 1), 16)
        bound = self.dev.memory_limit
        if bound is not None and self.held_bytes + padded > bound:
            raise GpuError(self._out_of_memory(size, what, f"past the {human_size(bound)} its tensors may hold "
                                                           f"(Device['WEBGPU'].memory_limit = {bound:,})"))
        try:
            with self.dev.gpu.guard("allocating a tinygrad buffer"):
                return self.dev.gpu.handle.create_buffer(size=padded, usage=STORAGE_USAGE)
        except GpuError as exc:
            if self.dev.gpu.lost:
                raise
            raise GpuError(self._out_of_memory(size, what, f"({exc})")) from exc

    @property
    def held_bytes(self) -> int:
        """Bytes held on the device: tensors' buffers and programs'."""
        return sum(self.held.values()) + sum(self.held_by_programs.values())

    def _out_of_memory(self, size: int, what: str, why: str) -> str:
        largest = ", ".join(f"{human_size(nbytes)} x {count}" for nbytes, count
                            in sorted(Counter(self.held.values()).items(), reverse=True)[:4])
        programs = sum(self.held_by_programs.values())
        by_programs = f" and {programs:,} bytes in the tuned matmul's own buffers" if programs else ""
        return (f"tinygrad ran out of GPU memory on {self.dev.gpu.info.name}: {what} of {size:,} bytes was asked "
                f"for, {why}, with {sum(self.held.values()):,} bytes in {len(self.held)} tensors' buffers held "
                f"already{f' (the largest: {largest})' if largest else ''}{by_programs}. "
                "Free tensors the cell no longer needs (del them, or keep .numpy() copies), or make the batch or the "
                "model smaller")

    def _free(self, opaque: Any, options: BufferSpec) -> None:
        self.held.pop(id(opaque), None)
        self._destroy(opaque)

    def _destroy(self, opaque: Any) -> None:
        self.dev.forget_bindings(opaque)
        self.dev.submit()  # a buffer that recorded kernels use can't go before they are submitted
        if not self.dev.gpu.lost:
            opaque.destroy()

    def _copyin(self, dest: Any, src: memoryview) -> None:
        self.dev.submit()  # the queue's writes run before anything submitted after them
        if self._copy_resident(dest, src):
            return
        data = bytes(src)
        if len(data) % 4:
            data += bytes(4 - len(data) % 4)
        with self.dev.gpu.guard("copying a tinygrad buffer to the GPU"):
            self.dev.gpu.handle.queue.write_buffer(dest, 0, data)
        context = executor_context()
        if context is not None:
            context.stats.uploads += 1
            context.stats.bytes_uploaded += src.nbytes

    def _copy_resident(self, dest: Any, src: memoryview) -> bool:
        """Copy ``src``'s values into ``dest`` on the GPU from the GPU cell's buffer already holding them (an array
        a kernel used, kept by digest: ``resident.py``), if there is one; False if not."""
        context = executor_context()
        if context is None or context.device is not self.dev.gpu or not context.resident.budget_bytes:
            return False
        values = src.cast("B")
        if not values.nbytes or values.nbytes % 4:
            return False
        kept = context.resident.get(content_key(np.frombuffer(values, np.float32)))
        if kept is None:
            return False
        with self.dev.gpu.guard("copying an array already on the GPU into a tinygrad buffer"):
            self.dev.encoder().copy_buffer_to_buffer(kept.buffer, 0, dest, 0, values.nbytes)
            self.dev.submit()  # now, while ``kept`` holds the buffer: once released it may be written again
        context.stats.resident_hits += 1
        context.stats.bytes_resident += values.nbytes
        return True

    def _copyout(self, dest: memoryview, src: Any) -> None:
        size = round_up(dest.nbytes, 4)
        if not size:
            return
        gpu = self.dev.gpu
        with gpu.guard("reading a tinygrad buffer back"):
            staging = self.dev.staging.take(size, STAGING_USAGE)  # reused: a training loop reads every step
            try:
                self.dev.encoder().copy_buffer_to_buffer(src, 0, staging, 0, size)
                self.dev.submit()
                staging.map_sync(READ_AFTER_COPY, 0, size)
                try:
                    dest[:] = staging.read_mapped(0, size, copy=False)[:dest.nbytes]
                finally:
                    staging.unmap()
            finally:
                self.dev.staging.release(staging)
        context = executor_context()
        if context is not None:
            context.stats.readbacks += 1
            context.stats.bytes_downloaded += dest.nbytes


class WebGpuProgram(Program["WebGpuDevice"]):
    """One tinygrad kernel: its WGSL compiled once, a pipeline per binding layout, dispatches recorded."""

    def __init__(self, dev: "WebGpuDevice", name: str, source: str) -> None:
        self.dev = dev
        self.name = name
        self.written = written_buffers(source)
        """Which of the kernel's buffers (0: its first) it stores to."""
        with dev.gpu.guard(f"compiling tinygrad's kernel {name}"):
            self.module = dev.gpu.handle.create_shader_module(code=source)
        self._pipelines: dict[tuple[int, int], tuple[Any, Any]] = {}

    def _pipeline(self, buffers: int, values: int) -> tuple[Any, Any]:
        key = (buffers, values)
        if key not in self._pipelines:
            layout, pipeline_layout = self.dev.layout(buffers, values)
            pipeline = self.dev.gpu.handle.create_compute_pipeline(
                layout=pipeline_layout, compute={"module": self.module, "entry_point": self.name})
            self._pipelines[key] = (layout, pipeline)
        return self._pipelines[key]

    def _unaliased(self, bufs: tuple[Any, ...]) -> list[Any]:
        """``bufs`` with no buffer bound twice: WebGPU (Chrome enforces it, wgpu doesn't) rejects a dispatch that
        binds one buffer twice where either binding is writable, and tinygrad declares every buffer
        ``read_write``. Where the kernel stores through at most one of the bindings, the others read a copy made
        just before it (the values it would have read first); storing through two is refused, on the worker as in
        a tab."""
        places: dict[int, list[int]] = {}
        for n, buffer in enumerate(bufs):
            places.setdefault(id(buffer), []).append(n)
        bound = list(bufs)
        for same in (p for p in places.values() if len(p) > 1):
            stores = [n for n in same if n in self.written]
            if len(stores) > 1:
                raise GpuError(f"tinygrad's kernel {self.name} would store into one buffer through two of its "
                               f"bindings (its buffers {', '.join(map(str, stores))}), which WebGPU forbids (a "
                               "browser rejects it; wgpu would compute it racily): give the tensors it writes "
                               "storage of their own (.contiguous() or .clone() one of them)")
            for n in same:
                if n not in stores:
                    bound[n] = self.dev.copy_for_reading(bufs[n])
        return bound

    def bound(self, bufs: tuple[Any, ...], global_size: tuple[int, ...], local_size: tuple[int, ...] | None,
              vals: tuple[int, ...]) -> tuple[BoundDispatch, ...] | None:
        """A run over ``bufs`` and ``vals``, made once for a dispatch a jitted step replays as it is
        (``tinygrad_graph.py``); None where a buffer is bound twice (each run reads a fresh copy)."""
        if _binds_one_buffer_twice(bufs):
            return None
        layout, pipeline = self._pipeline(len(bufs), len(vals))
        group = self.dev.bind_group(layout, self._resources(bufs, vals), keep=False)
        return (BoundDispatch(self.name, pipeline, group, global_size),)

    def _resources(self, storage: tuple[Any, ...] | list[Any], vals: tuple[int, ...]) -> tuple[Any, ...]:
        """What a run binds, in binding order: tinygrad's infinity, the kernel's buffers, a uniform per variable."""
        return (self.dev.infinity, *storage, *(self.dev.uniform(v) for v in vals))

    def __call__(self, *bufs: Any, global_size: tuple[int, int, int] = (1, 1, 1),
                 local_size: tuple[int, int, int] = (1, 1, 1), vals: tuple[int, ...] = (),
                 wait: bool = False, **_: Any) -> float | None:
        dev = self.dev
        with dev.gpu.guard(f"running tinygrad's kernel {self.name}"):
            layout, pipeline = self._pipeline(len(bufs), len(vals))
            storage = self._unaliased(bufs) if _binds_one_buffer_twice(bufs) else bufs
            group = dev.bind_group(layout, self._resources(storage, vals), keep=storage is bufs)
            return dev.dispatch(self.name, pipeline, group, global_size, wait)


def _binds_one_buffer_twice(bufs: tuple[Any, ...]) -> bool:
    return len({id(b) for b in bufs}) < len(bufs)


def written_buffers(source: str) -> frozenset[int]:
    """The buffers (0: the first ``read_write`` binding) that a kernel of tinygrad's ``WGSLRenderer`` stores to:
    its stores are statements ``name[index] = value;`` or atomics on ``&name[index]``."""
    names = re.findall(r"var<storage,\s*read_write>\s*(\w+)\s*:", source)
    return frozenset(n for n, name in enumerate(names)
                     if re.search(rf"^\s*{name}\[.*\]\s*=[^=]|atomic\w*\(&{name}\b", source, re.MULTILINE))


@dataclass
class KernelTimes:
    """The GPU time of each kernel that ran in :meth:`WebGpuDevice.kernel_times`'s block, by kernel name."""

    seconds: Counter[str] = field(default_factory=Counter)
    """GPU seconds, summed over the kernel's dispatches (from the timestamps its pass wrote at its start and end)."""
    dispatches: Counter[str] = field(default_factory=Counter)
    """How many times it ran."""

    @property
    def total_s(self) -> float:
        """The GPU seconds of all of them."""
        return sum(self.seconds.values())


class WebGpuDevice(Compiled):
    """tinygrad's ``WEBGPU`` device on the executor's :class:`GpuDevice` (wgpu's or a browser tab's)."""

    allocator: WebGpuAllocator

    def __init__(self, device: str) -> None:
        self.gpu: GpuDevice = executor_gpu_device()
        self._encoder: Any = None
        self._pass: Any = None
        self._timer: GpuTimer | None = None
        self._uniforms: dict[int, Any] = {}
        self._copies: list[Any] = []
        self._layouts: dict[tuple[int, int], tuple[Any, Any]] = {}
        # (its layout and buffers held in the value, so that their ids in its key stay theirs)
        self._bind_groups: dict[tuple[int, ...], tuple[Any, Any, tuple[Any, ...]]] = {}
        self._bound_in: dict[int, set[tuple[int, ...]]] = {}  # a buffer's id: the keys of the groups that bind it
        self.memory_limit: int | None = None
        """Bytes tinygrad's tensors (and the tuned matmul's own buffers) may hold on this GPU (None: what the GPU
        gives); past it, an allocation fails saying what was asked and what is held. Set it in a cell to share the
        GPU: ``Device['WEBGPU'].memory_limit = 2 * 10**9``."""
        self.staging = BufferPool(self.gpu.handle)
        """Staging buffers for readbacks, kept for reuse (``memory.py``'s pool)."""
        with self.gpu.guard("opening tinygrad's WEBGPU device"):
            self.infinity = self.uniform_bytes(np.float32(np.inf).tobytes())
        adapter = f"{self.gpu.info.name} {self.gpu.info.backend} {self.gpu.info.browser_tab or ''}"
        self.adapter = adapter
        """The adapter, as the programs saved for it are named."""
        self.renderer_class: type = WebGpuWGSLRenderer
        self.tuned_matmuls = 0
        """Products the tuned matmul ran in tinygrad's place (``tinygrad_matmul.py``)."""
        self.tuned_matmul = "measure"
        """Which kernel runs tinygrad's plain products compiled from now on (``tinygrad_matmul.py``): ``"measure"``
        (the faster on this adapter, timed once per product), ``"always"`` the tuned matmul, ``"never"``
        tinygrad's. A measured choice is saved with the program, for the next executor too; a forced one is not."""
        self.submits_each_batch = self.gpu.info.adapter_type != "software"
        """Whether a jitted step's batch of kernels goes to the GPU as soon as it is recorded (``tinygrad_graph.py``),
        so the GPU runs it while tinygrad's Python records the next batch or reads the loss (``item()`` of a loss
        already computed: 1.5-2.3 ms of CPU on a 2-core VM, its copy included), as tinygrad's Metal graph commits
        its command buffer; else at the next submission, as tinygrad's other kernels go. Not on a software adapter,
        whose "GPU" is the cores the Python runs on: there a warm MLP step took about 10% longer so."""
        self._matmul_context: DeviceContext | None = None
        self.programs = ProgramCache(adapter, WebGpuWGSLRenderer)
        self.programs.load()
        super().__init__(device, WebGpuAllocator(self), [WebGpuWGSLRenderer], WebGpuProgram, WebGpuGraph)
        # tinygrad keys the kernel search's results (BEAM=n, in its disk cache) by device name and this suffix: by
        # adapter and what the renderer renders, as the programs are, not one WEBGPU for lavapipe and every tab
        self.renderer.suffix = f"{adapter} revision {WebGpuWGSLRenderer.revision}"
        install_tuned_matmul(self)

    def runtime(self, obj: TinyELF) -> Any:
        """The program for a compiled kernel: tinygrad's, or the tuned matmul in its place (``tinygrad_matmul.py``)."""
        launch = Launch.parse(obj.lib)
        if launch is None:
            return WebGpuProgram(self, obj.name, obj.lib.decode())
        return TunedMatmulProgram(self, launch, obj.name, lambda stage: WebGpuProgram(self, stage.name, stage.source))

    def matmul_context(self) -> DeviceContext:
        """The tuned matmul's pipelines and tiling limits on this GPU."""
        if self._matmul_context is None:
            self._matmul_context = tuned_context(self.gpu)
        return self._matmul_context

    def layout(self, buffers: int, values: int) -> tuple[Any, Any]:
        """The bind group layout and pipeline layout of kernels binding ``buffers`` storage buffers and ``values``
        variables (after the ``INFINITY`` uniform), made once for all the kernels that share them."""
        key = (buffers, values)
        if key not in self._layouts:
            handle = self.gpu.handle
            kinds = ["uniform"] + ["storage"] * buffers + ["uniform"] * values
            layout = handle.create_bind_group_layout(entries=[
                {"binding": n, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": kind}}
                for n, kind in enumerate(kinds)])
            self._layouts[key] = (layout, handle.create_pipeline_layout(bind_group_layouts=[layout]))
        return self._layouts[key]

    def encoder(self) -> Any:
        """The command encoder recording until the next :meth:`submit`, for a copy (its compute pass ended)."""
        if self._pass is not None:
            self._pass.end()
            self._pass = None
        if self._encoder is None:
            self._encoder = self.gpu.handle.create_command_encoder()
        return self._encoder

    def dispatch(self, kernel: str, pipeline: Any, group: Any, groups: tuple[int, ...],
                 wait: bool = False) -> float | None:
        """Record a dispatch of ``kernel`` (its pipeline and bind group) into the compute pass that every kernel
        shares until a copy or :meth:`submit` (WebGPU makes each dispatch's writes visible to the next in the same
        pass); while :meth:`kernel_times` times them, into a timed pass of its own. With ``wait`` (tinygrad's, for
        a kernel it times), submit and wait for it: the seconds waited."""
        if self._timer is not None:
            if self._timer.full:  # (its timestamps are resolved in a submission after those that write them)
                self.submit()
                self._timer.flush()
            self._pass = self.encoder().begin_compute_pass(timestamp_writes=self._timer.pass_writes(kernel))
        elif self._pass is None:
            self._pass = self.encoder().begin_compute_pass()
        record_dispatches(self._pass, ((pipeline, group, groups),))
        if self._timer is not None:
            self.encoder()  # (ends the timed pass)
        if not wait:
            return None
        start = time.perf_counter()
        self.synchronize()
        return time.perf_counter() - start

    def dispatch_bound(self, runs: tuple[BoundDispatch, ...]) -> None:
        """Record dispatches made once (a jitted step's, ``tinygrad_graph.py``) as :meth:`dispatch` records each; into
        a browser tab's pass as one call."""
        if self._timer is not None:
            for run in runs:
                self.dispatch(run.kernel, run.pipeline, run.group, run.groups)
            return
        if self._pass is None:
            self._pass = self.encoder().begin_compute_pass()
        record_dispatches(self._pass, ((run.pipeline, run.group, run.groups) for run in runs))

    @property
    def recording(self) -> bool:
        """True while kernels or copies are recorded that :meth:`submit` hasn't sent to the GPU yet."""
        return self._encoder is not None

    @property
    def timing_kernels(self) -> bool:
        """True inside :meth:`kernel_times`'s block."""
        return self._timer is not None

    @contextmanager
    def kernel_times(self) -> Iterator[KernelTimes]:
        """Time each kernel run inside the block on the GPU, for finding where a step's time goes: the
        :class:`KernelTimes` yielded is filled in when the block ends (unless it raises). Meanwhile each kernel runs
        in a compute pass of its own whose start and end write GPU timestamps, so the block's steps run somewhat
        slower than untimed ones. A GPU without timestamp queries (a browser tab's, say) raises :class:`GpuError`."""
        if not self.gpu.timestamps:
            raise GpuError(f"the GPU {self.gpu.info.name} doesn't offer timestamp queries, so its kernels can't be "
                           "timed; time whole steps instead (tinygrad's DEBUG=2 waits for each kernel)")
        if self._timer is not None:
            raise GpuError("kernel_times() is already timing this device's kernels: nest no second one")
        self.synchronize()
        timer = GpuTimer(self.gpu.handle, True, Stats())
        self._timer = timer
        times = KernelTimes()
        try:
            yield times
        finally:  # (a block that failed, on a lost device say, leaves its times unread)
            self._timer = None
        self.synchronize()
        with self.gpu.guard("reading the kernels' GPU timestamps"):
            timer.flush()
        times.seconds.update(timer.seconds)
        times.dispatches.update(timer.passes)

    def submit(self) -> None:
        """Send what was recorded to the GPU's queue (one command buffer for all of it)."""
        if self._encoder is None:
            return
        encoder = self.encoder()  # (its pass ended)
        self._encoder = None
        copies, self._copies = self._copies, []
        if not self.gpu.lost:
            with self.gpu.guard("running tinygrad's kernels"):
                self.gpu.handle.queue.submit([encoder.finish()])
                for copy in copies:  # (WebGPU keeps a destroyed buffer until the work submitted with it is done)
                    copy.destroy()

    def copy_for_reading(self, buffer: Any) -> Any:
        """A copy of ``buffer`` as it is when the next kernel recorded runs (destroyed at the next :meth:`submit`),
        for a kernel that would bind ``buffer`` twice."""
        copy = self.gpu.handle.create_buffer(size=buffer.size, usage=STORAGE_USAGE)
        self.encoder().copy_buffer_to_buffer(buffer, 0, copy, 0, buffer.size)
        self._copies.append(copy)
        return copy

    def synchronize(self) -> None:
        """Submit what was recorded and wait for the GPU to finish it."""
        self.submit()
        self.gpu.wait()

    def bind_group(self, layout: Any, resources: tuple[Any, ...], keep: bool = True,
                   bindings: tuple[int, ...] | None = None) -> Any:
        """A bind group of ``resources`` (whole buffers, at ``bindings``, by default 0, 1, ...) for ``layout``: the
        one made before for them, while ``keep`` (False: buffers made for this one dispatch) and none of them was
        freed."""
        key = (id(layout), *map(id, resources))
        if (found := self._bind_groups.get(key)) is not None:
            return found[0]
        group = self.gpu.handle.create_bind_group(layout=layout, entries=[
            {"binding": n, "resource": {"buffer": buffer, "offset": 0, "size": buffer.size}}
            for n, buffer in zip(bindings or range(len(resources)), resources)])
        if keep:
            if len(self._bind_groups) >= MAX_BIND_GROUPS:
                self._bind_groups.clear()
                self._bound_in.clear()
            self._bind_groups[key] = (group, layout, resources)
            for buffer in resources:
                self._bound_in.setdefault(id(buffer), set()).add(key)
        return group

    def forget_bindings(self, buffer: Any) -> None:
        """``buffer`` is freed: the bind groups that bind it go (a new buffer may take its id)."""
        for key in self._bound_in.pop(id(buffer), ()):
            _, _, resources = self._bind_groups.pop(key)
            for other in resources:
                if other is not buffer and (keys := self._bound_in.get(id(other))) is not None:
                    keys.discard(key)
                    if not keys:  # (a buffer no kept group binds any more, a uniform say, isn't remembered)
                        del self._bound_in[id(other)]

    def uniform(self, value: int) -> Any:
        """A uniform buffer holding the 32-bit integer ``value`` (a kernel's variable), kept for reuse."""
        if value not in self._uniforms:
            if len(self._uniforms) >= MAX_UNIFORMS:  # (commands recorded with them keep them alive)
                self._uniforms.clear()
            self._uniforms[value] = self.uniform_bytes(int(value).to_bytes(4, "little", signed=value < 0))
        return self._uniforms[value]

    def uniform_bytes(self, data: bytes) -> Any:
        """A uniform buffer holding ``data``."""
        buffer = self.gpu.handle.create_buffer(size=len(data), usage=UNIFORM_USAGE)
        self.gpu.handle.queue.write_buffer(buffer, 0, data)
        return buffer

