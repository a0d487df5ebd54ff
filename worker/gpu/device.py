"""The wgpu adapter and device: choosing an adapter, asking for its real limits, noticing loss.

This is the only module that talks to wgpu's adapter and device objects directly; it turns
wgpu's exceptions into :class:`~remote_magic.errors.GpuError` at its boundary (:meth:`guard`).
"""

from __future__ import annotations

import logging
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import wgpu

from remote_magic.errors import GpuError

from . import wgpu_types
from .mapping import READ_AFTER_COPY

log = logging.getLogger(__name__)

ADAPTER_TYPES = {
    "DiscreteGPU": "discrete",
    "IntegratedGPU": "integrated",
    "VirtualGPU": "virtual",
    "CPU": "software",
    "Unknown": "unknown",
}
"""wgpu's adapter types, in the words the worker listing uses."""

PREFERENCE = ("discrete", "integrated", "virtual", "unknown", "software")
"""Which adapter wins when several match: real GPUs first, software rasterisers last."""

BACKENDS = {"vulkan": "Vulkan", "metal": "Metal", "d3d12": "D3D12", "dx12": "D3D12"}
"""Backend names a user may type, mapped to wgpu's ``backend_type``."""

REPORTED_LIMITS = (
    "max-storage-buffer-binding-size",
    "max-buffer-size",
    "max-compute-workgroup-size-x",
    "max-compute-workgroup-size-y",
    "max-compute-workgroup-size-z",
    "max-compute-invocations-per-workgroup",
    "max-compute-workgroups-per-dimension",
    "max-compute-workgroup-storage-size",
    "max-storage-buffers-per-shader-stage",
    "max-uniform-buffer-binding-size",
)
"""The limits that matter for compute; requested explicitly if asking for all of them fails."""

MAPPABLE_STORAGE_FEATURE = "mappable-primary-buffers"
"""wgpu-native's feature that lets a storage buffer be mapped for reading: results are read where they were written,
with no copy into a staging buffer first. Used on adapters that share the host's memory (integrated and software),
where such a buffer costs kernels nothing; a discrete GPU would put it in slower host-visible memory."""

SHARED_MEMORY_TYPES = ("integrated", "software")
"""Adapter types whose memory is the host's."""

SUBGROUP_FEATURES = ("subgroups", "subgroup")
"""WebGPU's "subgroups" feature as an adapter may list it: wgpu-native (wgpu-py 0.32) lists its own "subgroup"."""

_LOST = re.compile(r"\b(lost|device is invalid|invalid device)\b", re.IGNORECASE)
_instance_configured = False


def is_device_loss(exc: BaseException) -> bool:
    """True if ``exc`` says the device is gone (a browser tab's loss, or wgpu's "device is lost")."""
    return (isinstance(exc, DeviceCallError) and exc.lost) or bool(_LOST.search(str(exc)))


class DeviceCallError(Exception):
    """A call on a device that is not wgpu's (a browser tab's) failed; ``lost``: the device is gone for good.
    :meth:`GpuDevice.guard` turns it into :class:`GpuError` as it does wgpu's errors."""

    def __init__(self, message: str, *, lost: bool = False) -> None:
        super().__init__(message)
        self.lost = lost


@dataclass(frozen=True)
class AdapterInfo:
    """What the worker reports about its adapter."""

    name: str
    backend: str
    adapter_type: str
    vendor: str
    description: str
    limits: dict[str, int] = field(default_factory=dict)
    browser_tab: str | None = None
    """The worker name of the browser tab whose WebGPU this is (None: wgpu on this machine)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form, with limit names in snake_case."""
        info = {"adapter": self.name, "backend": self.backend, "adapter_type": self.adapter_type,
                "vendor": self.vendor, "description": self.description, "limits": dict(self.limits)}
        return info if self.browser_tab is None else {**info, "browser_tab": self.browser_tab}


def _configure_instance() -> None:
    """Restrict wgpu to the primary backends (Vulkan, Metal, D3D12) before it probes any.

    OpenGL cannot run these kernels well and probing it prints noise on headless machines. The
    instance is process-wide; if something created it already, we keep what it chose.
    """
    global _instance_configured
    if _instance_configured:
        return
    _instance_configured = True
    try:
        from wgpu.backends.wgpu_native import ffi
        from wgpu.backends.wgpu_native.extras import set_instance_extras

        wgpu_types.install(ffi)  # (before wgpu-py names its first C type)
        set_instance_extras(backends=["Primary"])
    except (ImportError, RuntimeError) as exc:  # instance already made, or another backend
        log.debug("kept the existing wgpu instance: %s", exc)


def _info(adapter: Any) -> AdapterInfo:
    info = adapter.info
    limits = {k.replace("-", "_"): int(adapter.limits[k]) for k in REPORTED_LIMITS if k in adapter.limits}
    return AdapterInfo(
        name=str(info.get("device") or adapter.summary),
        backend=str(info.get("backend_type", "unknown")),
        adapter_type=ADAPTER_TYPES.get(str(info.get("adapter_type", "Unknown")), "unknown"),
        vendor=str(info.get("vendor", "")),
        description=str(info.get("description", "")),
        limits=limits,
    )


def select_adapter(substring: str | None = None, backend: str | None = None) -> tuple[Any, AdapterInfo]:
    """The best adapter whose name contains ``substring`` on ``backend`` (both optional).

    Raises :class:`GpuError` naming the adapters that were found when none matches.
    """
    if backend is not None and backend.lower() not in BACKENDS:
        raise GpuError(f"unknown GPU backend {backend!r}; choose one of: vulkan, metal, d3d12")
    _configure_instance()
    try:
        adapters = list(wgpu.gpu.enumerate_adapters_sync())
    except Exception as exc:  # wgpu raises plain exceptions when no driver loads at all
        raise GpuError(f"no GPU adapter could be listed ({exc}); install a Vulkan, Metal or D3D12 "
                       "driver (on Linux without a GPU: mesa-vulkan-drivers), or run with --gpu off") from exc
    found = [(a, _info(a)) for a in adapters]
    if not found:
        raise GpuError("no GPU adapter found: no Vulkan, Metal or D3D12 driver is usable. Install one "
                       "(on Linux without a GPU: mesa-vulkan-drivers for lavapipe), or run with --gpu off")
    matches = found
    if backend is not None:
        wanted = BACKENDS[backend.lower()]
        matches = [m for m in matches if m[1].backend.lower() == wanted.lower()]
    if substring:
        needle = substring.lower()
        matches = [m for m in matches
                   if needle in f"{m[1].name} {m[1].description} {m[1].vendor}".lower()]
    if not matches:
        seen = "; ".join(f"{i.name} ({i.adapter_type}, {i.backend})" for _, i in found)
        wanted_text = " ".join(filter(None, [f"matching {substring!r}" if substring else "",
                                             f"on {backend}" if backend else ""]))
        raise GpuError(f"no GPU adapter {wanted_text}; adapters found: {seen}. "
                       "Change --adapter/--backend, or run with --gpu off")
    matches.sort(key=lambda m: PREFERENCE.index(m[1].adapter_type))
    return matches[0]


class GpuDevice:
    """One device (``handle``) on an adapter, which :func:`open_device` creates with the adapter's real
    limits; a browser tab's is a :class:`~remote_magic.worker.gpu.tab_device.TabDevice`.

    After the device is lost, :attr:`lost` is True and every :meth:`guard` block raises; the owner
    makes a new :class:`GpuDevice`.
    """

    def __init__(self, handle: Any, info: AdapterInfo, *, timestamps: bool = False, subgroups: bool = False,
                 mappable_storage: bool = False, adapter: Any = None) -> None:
        self.adapter = adapter
        self.info = info
        self.timestamps = timestamps
        self.subgroups = subgroups
        """True if the device has WebGPU's "subgroups" feature (never for a browser tab's)."""
        self.mappable_storage = mappable_storage
        """True if storage buffers may be mapped for reading (:data:`MAPPABLE_STORAGE_FEATURE`; never for a tab's)."""
        self.handle = handle
        self.limits: dict[str, int] = {k.replace("-", "_"): int(v) for k, v in handle.limits.items()
                                       if isinstance(v, int)}
        self.lost = False
        self.lost_reason = ""
        self._fence_src = self.handle.create_buffer(size=4, usage=wgpu.BufferUsage.COPY_SRC)
        self._fence_dst = self.handle.create_buffer(size=4, usage=wgpu.BufferUsage.COPY_DST
                                                    | wgpu.BufferUsage.MAP_READ)
        log.info("GPU device on %s (%s, %s), max binding %d bytes", info.name, info.adapter_type,
                 info.backend, self.limits.get("max_storage_buffer_binding_size", 0))

    @classmethod
    def on_adapter(cls, adapter: Any, info: AdapterInfo) -> "GpuDevice":
        """A device on wgpu ``adapter``, with all its limits (or, if the driver refuses, its compute ones)."""
        timestamps = "timestamp-query" in adapter.features
        features = ["timestamp-query"] if timestamps else []
        subgroups = next((f for f in SUBGROUP_FEATURES if f in adapter.features), None)
        if subgroups is not None:
            features.append(subgroups)
        mappable = MAPPABLE_STORAGE_FEATURE in adapter.features and info.adapter_type in SHARED_MEMORY_TYPES
        if mappable:
            features.append(MAPPABLE_STORAGE_FEATURE)
        try:
            handle = adapter.request_device_sync(required_features=features, required_limits=dict(adapter.limits))
        except Exception as exc:  # some drivers refuse limits they report; ask for the compute ones
            log.debug("device with all adapter limits refused (%s); asking for compute limits only", exc)
            limits = {k: adapter.limits[k] for k in REPORTED_LIMITS if k in adapter.limits}
            try:
                handle = adapter.request_device_sync(required_features=features, required_limits=limits)
            except Exception as exc2:
                raise GpuError(f"the GPU adapter {info.name} refused to create a device: {exc2}") from exc2
        return cls(handle, info, timestamps=timestamps, subgroups=subgroups is not None, mappable_storage=mappable,
                   adapter=adapter)

    @contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """Run wgpu calls for ``what``, turning wgpu errors into :class:`GpuError`.

        A lost device is remembered (``lost``) and reported as such; the next call gets a new
        device from the runtime.
        """
        if self.lost:
            raise GpuError(self._lost_message(what))
        try:
            yield
        except GpuError:
            raise
        except Exception as exc:
            if not self._is_wgpu_error(exc):
                raise
            if isinstance(exc, DeviceCallError) and exc.lost:  # a browser tab: its message says what happened
                self.lost = True
                raise GpuError(f"{exc}, during {what}; arrays that lived only on its GPU are gone: run the cell "
                               "again") from exc
            if _LOST.search(str(exc)):
                self.lost = True
                self.lost_reason = str(exc).strip().splitlines()[-1].strip()
                log.warning("GPU device lost during %s: %s", what, exc)
                raise GpuError(self._lost_message(what)) from exc
            raise GpuError(f"the GPU failed during {what}: {_first_line(exc)}") from exc

    def _lost_message(self, what: str) -> str:
        reason = f" ({self.lost_reason})" if self.lost_reason else ""
        return (f"the GPU device was lost{reason} during {what}; the next GPU call creates a new "
                "device. Arrays that lived only on the lost device are gone: run the cell again")

    @staticmethod
    def _is_wgpu_error(exc: BaseException) -> bool:
        return (isinstance(exc, wgpu.GPUError) or type(exc).__module__.startswith("wgpu")
                or isinstance(exc, DeviceCallError))

    def wait(self) -> None:
        """Block until the GPU has finished all work submitted so far."""
        with self.guard("waiting for the GPU"):
            encoder = self.handle.create_command_encoder()
            encoder.copy_buffer_to_buffer(self._fence_src, 0, self._fence_dst, 0, 4)
            self.handle.queue.submit([encoder.finish()])
            self._fence_dst.map_sync(READ_AFTER_COPY)
            self._fence_dst.unmap()

    def close(self) -> None:
        """Release the device; safe to call twice."""
        handle, self.handle = self.handle, None
        if handle is not None and not self.lost:
            try:
                handle.destroy()
            except Exception as exc:  # closing a device that wgpu already dropped
                log.debug("device destroy: %s", exc)
        self.lost = True
        self.lost_reason = "closed"


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    interesting = [ln for ln in lines if ln not in ("Validation Error", "Caused by:")]
    return "; ".join(interesting[:3]) or type(exc).__name__


def open_device(substring: str | None = None, backend: str | None = None) -> GpuDevice:
    """Choose an adapter (see :func:`select_adapter`) and create a device on it."""
    adapter, info = select_adapter(substring, backend)
    return GpuDevice.on_adapter(adapter, info)
