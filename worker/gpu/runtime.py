"""GpuRuntime: the executor's handle on the GPU, created once when the executor starts.

Modes:

* ``off``: never touches wgpu; ``capabilities()`` says so and the ``gpu`` object computes with
  numpy. (The executor makes no runtime for ``--gpu off``: a cell's ``gpu`` there raises GpuError.)
* ``on``: kernels always run on the adapter, software or not; no adapter is an error.
* ``auto``: kernels run on the GPU only when the adapter is hardware. On a software adapter
  (lavapipe, ~100x slower than numpy on the same CPU) or without any adapter, operations
  compute with numpy and a one-time notice says so. Custom kernels still run on a software
  adapter, as they have no numpy version.

Arrays stay on the device between cells, by content (``resident.py``): up to ``gpu_memory``
bytes (``remote-worker --gpu-memory``; by default half the adapter's largest buffer, at most
:data:`MAX_DEFAULT_GPU_MEMORY`), so an unchanged input is not uploaded again.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import numpy as np

from remote_magic.errors import GpuError
from remote_magic.wire.sizes import human_size

from . import custom, tinygrad_hook
from .arrays import DeviceArray, leave_as_numpy
from .context import DeviceContext
from .device import GpuDevice, open_device
from .dispatch import Dispatcher
from .host_ops import GROUPS, KERNEL_NAMES
from .namespace import BUILTIN_NAMES, GpuNamespace
from .notices import Notices
from .stats import Stats
from .tab_device import open_tab_device

log = logging.getLogger(__name__)

MODES = ("auto", "on", "off")
DEFAULT_MATMUL_THREADS = 16
"""The largest matmul workgroup side: tiles up to 128x128 (16x16 invocations); ``matmul.py`` picks
the tiling for each product's shape within that (8 caps tiles at 64x64)."""
MIN_BINDING_BYTES = 1024
"""Smallest ``max_binding_bytes`` accepted (tests lower the limit to force split matmuls)."""
AUTO_MIN_VALUES = 16384
"""In mode ``auto``, operations on fewer values than this (64 KiB of float32) run with numpy: a kernel's
launch and readback cost more. Mode ``on`` sends every operation to the adapter."""
MAX_DEFAULT_GPU_MEMORY = 2 * 10**9
"""The default resident budget's ceiling (2 GB): wgpu reports no adapter memory size, only its
largest buffer, which some drivers give as the whole of their memory."""


def default_gpu_memory(device: GpuDevice) -> int:
    """Bytes of arrays kept on ``device`` between cells when ``--gpu-memory`` isn't given."""
    largest = device.limits.get("max_buffer_size") or device.info.limits.get("max_buffer_size", 0)
    return min(largest // 2, MAX_DEFAULT_GPU_MEMORY)


class GpuRuntime:
    """The GPU of one executor process; see the module docstring. Make one with :meth:`create`."""

    def __init__(self, mode: str, device: GpuDevice | None, *, adapter: str | None = None,
                 backend: str | None = None, tab: str | None = None, max_binding_bytes: int | None = None,
                 matmul_threads: int | None = None, gpu_memory: int | None = None, reason: str = "") -> None:
        self.mode = mode
        self._adapter = adapter
        self._backend = backend
        self._tab = tab
        self._max_binding_bytes = max_binding_bytes
        self._device = device
        self._reason = reason
        self.gpu_memory = (gpu_memory if gpu_memory is not None
                           else default_gpu_memory(device) if device is not None else 0)
        """Bytes of arrays kept on the device between cells (resident buffers)."""
        self.notices = Notices()
        self._stats = Stats()
        self._totals = Stats()
        self.custom_kernels: dict[str, custom.KernelSpec] = {}
        self._views: dict[int, tuple[DeviceArray, np.ndarray]] = {}
        """The running GPU cell's input views: id(view) -> (view, the input it views)."""
        self._fresh_references = eval(compile("count(new())", "<calibration>", "eval"),  # noqa: S307
                                      {"count": self._references, "new": lambda: np.empty(0)})
        """What :meth:`made_by_the_cell` counts of a new array's references, on this Python, when a cell's
        compiled code hands it over as it hands every call's result."""
        software = device is not None and device.info.adapter_type == "software"
        self.active = device is not None and (mode == "on" or not software)
        if mode == "auto" and software and device is not None:
            self._reason = (f"the adapter {device.info.name} is a software renderer, slower than numpy "
                            "on this CPU (start remote-worker with --gpu on to use it anyway)")
        threads = matmul_threads or DEFAULT_MATMUL_THREADS
        self.dispatcher = Dispatcher(self._open_context if device is not None else None, self._stats, self.notices,
                             array_type=DeviceArray, active=self.active, matmul_threads=threads,
                             min_values=AUTO_MIN_VALUES if mode == "auto" else 1)
        if not self.active and mode != "off":
            self.dispatcher.inactive_notice = f"this GPU cell computes with numpy, not the GPU: {self._reason}"
        self.gpu = GpuNamespace(self)
        self._closed = False
        if device is not None:
            self.dispatcher.ctx  # noqa: B018 - make the device context now, not in the first cell
            log.info("GPU %s (%s, %s): %s; keeps up to %s of arrays on it between cells (--gpu-memory)",
                     device.info.name, device.info.adapter_type, device.info.backend,
                     "kernels run on it" if self.active else "computing with numpy", human_size(self.gpu_memory))

    @classmethod
    def create(cls, mode: str = "auto", adapter: str | None = None, backend: str | None = None, *,
               tab: str | None = None, max_binding_bytes: int | None = None, matmul_threads: int | None = None,
               gpu_memory: int | None = None) -> "GpuRuntime":
        """Open the GPU for ``mode`` (auto/on/off), choosing the adapter by name substring and backend.

        ``tab``: use the WebGPU of the browser tab whose bridge listens at this endpoint instead (mode
        ``on`` always: a tab is there for its GPU, software or not).

        ``max_binding_bytes`` lowers the per-binding limit below the device's (for tests);
        ``matmul_threads`` (8 or 16) caps the matmul workgroup's side (default 16: tiles up to 128x128).
        ``gpu_memory`` bounds the bytes of arrays kept on the device between cells (0: none; None:
        :func:`default_gpu_memory`).
        Raises :class:`GpuError` in mode ``on`` when no adapter can be had.
        """
        if mode not in MODES:
            raise GpuError(f"unknown GPU mode {mode!r}; choose auto, on or off")
        if max_binding_bytes is not None and max_binding_bytes < MIN_BINDING_BYTES:
            raise GpuError(f"max_binding_bytes must be at least {MIN_BINDING_BYTES}")
        if matmul_threads not in (None, 8, 16):
            raise GpuError("matmul_threads must be 8 or 16")
        if gpu_memory is not None and gpu_memory < 0:
            raise GpuError("gpu_memory must be 0 or more bytes")
        if tab is not None:
            mode = "on"
        options: dict[str, Any] = {"adapter": adapter, "backend": backend, "tab": tab,
                                   "max_binding_bytes": max_binding_bytes, "matmul_threads": matmul_threads,
                                   "gpu_memory": gpu_memory}
        if mode == "off":
            return cls(mode, None, **options, reason="the worker runs with --gpu off")
        try:
            device = _open_device(adapter, backend, tab)
        except GpuError as exc:
            if mode == "on":
                raise GpuError(f"--gpu on, but {exc}") from exc
            log.warning("no GPU: %s", exc)
            return cls(mode, None, **options, reason=str(exc))  # auto: numpy, with a notice
        return cls(mode, device, **options)

    # -- device ----------------------------------------------------------------------------
    def _open_context(self) -> DeviceContext:
        if self._closed:
            raise GpuError("the GPU runtime is closed")
        device = self._device
        if device is None or device.lost:
            device = self._device = _open_device(self._adapter, self._backend, self._tab)
        return DeviceContext(device, self._stats, self._max_binding_bytes, self.gpu_memory)

    @property
    def device(self) -> GpuDevice | None:
        """The current wgpu device wrapper (None in mode off or without an adapter)."""
        ctx = self.dispatcher.current_context
        return ctx.device if ctx is not None else self._device

    def capabilities(self) -> dict[str, Any]:
        """What the worker announces: mode, whether kernels run on the GPU, adapter and limits."""
        if self._device is None:
            caps: dict[str, Any] = {"mode": self.mode, "active": False}
            if self.mode != "off":
                caps["reason"] = self._reason
            return caps
        device = self.device or self._device
        caps = {"mode": self.mode, "active": self.active, **device.info.as_dict(),
                "limits": {**device.info.limits, **{k: v for k, v in device.limits.items()
                                                   if k in device.info.limits}},
                "timestamp_query": device.timestamps}
        if self._max_binding_bytes:
            caps["max_binding_bytes"] = self._max_binding_bytes
        caps["gpu_memory"] = self.gpu_memory
        if not self.active:
            caps["reason"] = self._reason
        return caps

    # -- values in and out of a GPU cell -------------------------------------------------
    def to_device(self, values: dict[str, Any], kernels: list[str] | None = None) -> dict[str, Any]:
        """The cell's inputs with numeric numpy arrays viewed as DeviceArrays (same memory; one view
        per array, so names that share an array still do); other values untouched.

        ``kernels`` None enables every built-in kernel; a list enables only those (names from
        :data:`KERNEL_NAMES`, or ``elementwise``/``reductions``/``all``), and every other
        operation on these arrays computes with numpy, silently. Call :meth:`end_cell` after the cell.
        """
        enabled = self._enabled(kernels)
        dispatcher = self.dispatcher
        dispatcher.lossy.clear()
        dispatcher.cell_inputs = {}
        converted: dict[str, Any] = {}
        views: dict[int, DeviceArray] = {}
        for name, value in values.items():
            if _is_numeric_array(value):
                dispatcher.cell_inputs[name] = value
                view = views.setdefault(id(value), dispatcher.wrap(value, enabled))
                self._views[id(view)] = (view, value)
                value = view
            converted[name] = value
        return converted

    def _enabled(self, kernels: list[str] | None) -> frozenset[str] | None:
        if kernels is None:
            return None
        names: set[str] = set()
        for kernel in kernels:
            if kernel in GROUPS:
                names.update(GROUPS[kernel])
            elif kernel in KERNEL_NAMES or kernel in self.custom_kernels:
                names.add(kernel)
            else:
                raise GpuError(f"unknown kernel {kernel!r}; built-in kernels are {', '.join(KERNEL_NAMES)} "
                               f"(or the groups {', '.join(GROUPS)})")
        return frozenset(names)

    def made_by_the_cell(self, value: Any) -> Any:
        """A call's result in a GPU cell (``worker/cell_calls.py``). A plain view laid exactly over a
        DeviceArray (``np.asarray(x)``) is that DeviceArray itself, as numpy returns ``x`` itself for a
        plain ``x``. A new plain numeric ndarray that nothing else holds (``np.zeros(n)``) becomes a
        DeviceArray viewing it, so its operations may use kernels; one something else holds too (an
        attribute a method returned) stays as it is, so it stays one object."""
        if not _is_numeric_array(value):
            return value
        if value.base is not None:  # numpy's base may skip past the DeviceArray: compared by layout
            layout = (value.ctypes.data, value.shape, value.strides, value.dtype)
            for candidate in (value.base, *(view for view, _ in self._views.values())):
                if isinstance(candidate, DeviceArray) and (
                        candidate.ctypes.data, candidate.shape, candidate.strides, candidate.dtype) == layout:
                    return candidate
        if sys.getrefcount(value) > self._fresh_references:
            return value
        return self.dispatcher.wrap(value)

    def _references(self, value: Any) -> int:
        return sys.getrefcount(value)

    def end_cell(self, namespace: dict[str, Any], value: Any = None) -> Any:
        """After a cell: names still bound to an input's view are bound to the input itself again, every
        other DeviceArray the namespace holds becomes the plain ndarray viewing its memory
        (:func:`arrays.leave_as_numpy`), and one notice names the float64 arrays the cell computed with
        in float32; the programs tinygrad generated for the GPU are saved for the next executor. Returns the
        cell's ``value`` the same way."""
        def original(item: Any) -> Any:
            view, input_array = self._views.get(id(item), (None, None))
            return input_array if view is item else item

        for name, item in namespace.items():
            namespace[name] = original(item)
        value = original(value)
        if self.dispatcher.made:  # (device arrays that views of arrays made in other cells keep aren't walked)
            value = leave_as_numpy(namespace, value)
            self.dispatcher.made = 0
        self._views = {}
        lossy = list(self.dispatcher.lossy)
        if lossy:
            them = "it" if len(lossy) == 1 else "them"
            self.notices.say(f"{', '.join(lossy)}: the GPU computed float64 results from {them} in float32 "
                             "(WebGPU has no float64), so those results hold float32 precision")
        self.dispatcher.lossy.clear()
        self.dispatcher.cell_inputs = {}
        tinygrad_hook.after_cell()
        return value

    def to_host(self, values: dict[str, Any]) -> dict[str, Any]:
        """``values`` with the DeviceArrays they hold as plain ndarrays (:func:`arrays.leave_as_numpy`)."""
        values = dict(values)
        leave_as_numpy(values)
        return values

    # -- tinygrad -----------------------------------------------------------------------------
    def serve_tinygrad(self) -> None:
        """Make tinygrad's ``WEBGPU`` device this runtime's GPU device (``tinygrad_device.py``), and tinygrad's
        default device when kernels run on the GPU (:attr:`active`). Without a device, tinygrad keeps its own."""
        if self._device is not None:
            tinygrad_hook.install(lambda: self.dispatcher.ctx.device, default=self.active,
                                  context=lambda: self.dispatcher.current_context)

    def before_cell(self) -> None:
        """Before each cell: a tinygrad device on a lost GPU device is dropped (the next use opens one)."""
        tinygrad_hook.forget_lost_device()

    # -- custom kernels --------------------------------------------------------------------
    def register_kernel(self, name: str, source: str) -> None:
        """Compile WGSL ``source`` as ``gpu.NAME``; a compile error raises ShaderError(line, column)."""
        custom.check_name(name, sorted(BUILTIN_NAMES))
        if self._device is None:
            raise GpuError(f"kernel {name} cannot be compiled: {self._reason}")
        spec = custom.parse(name, source)
        custom.compile_spec(self.dispatcher.ctx, spec)
        self.custom_kernels[name] = spec
        log.info("registered GPU kernel %s (%d inputs, %d outputs)", name, spec.inputs, spec.outputs)

    # -- counters --------------------------------------------------------------------------
    def _flush(self) -> None:
        ctx = self.dispatcher.current_context
        if ctx is not None and not ctx.lost:
            try:
                ctx.flush_timer()
            except GpuError as exc:  # a lost device has no timestamps to give; say so in the log
                log.warning("GPU timestamps lost: %s", exc)

    def take_stats(self) -> dict[str, Any]:
        """Counters since the last call: kernel dispatches, GPU time, bytes moved, numpy fallbacks."""
        self._flush()
        taken = self._stats.take()
        self._totals.add(taken)
        return taken.as_dict()

    def totals(self) -> dict[str, Any]:
        """The same counters since the runtime started."""
        self._flush()
        total = Stats()
        total.add(self._totals)
        total.add(self._stats)
        return total.as_dict()

    def close(self) -> None:
        """Release the device; the runtime cannot be used afterwards."""
        if self._closed:
            return
        self._closed = True
        self.dispatcher.close()
        if self._device is not None:
            self._device.close()

    def __enter__(self) -> "GpuRuntime":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _open_device(adapter: str | None, backend: str | None, tab: str | None) -> GpuDevice:
    """A device on the browser tab whose bridge listens at ``tab``, else on the wgpu adapter by name and backend."""
    return open_tab_device(tab) if tab is not None else open_device(adapter, backend)


def _is_numeric_array(value: Any) -> bool:
    """A plain numpy array of numbers or booleans (not a subclass: a masked array keeps its own rules)."""
    return type(value) is np.ndarray and value.dtype.kind in "fiub"
