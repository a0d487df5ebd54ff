"""Makes ``import tinygrad`` in a cell use the worker's GPU, without importing tinygrad until a cell does.

tinygrad finds a device's runtime by importing ``tinygrad.runtime.ops_<name>``. :func:`install` puts a
finder first on ``sys.meta_path`` that answers ``tinygrad.runtime.ops_webgpu`` with
:mod:`.tinygrad_device` (tinygrad's WebGPU device written over wgpu-py), so tinygrad's own runtime
for it, which needs a native library, is never loaded.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Any, Callable, Sequence

from remote_magic.errors import GpuError
from remote_magic.wire import module_state

TINYGRAD_MODULE = "tinygrad.runtime.ops_webgpu"
"""The module tinygrad imports for its ``WEBGPU`` device."""

DEVICE_MODULE = f"{__package__}.tinygrad_device"
DEVICE_NAME = "WEBGPU"

_gpu_device: Callable[[], Any] | None = None
"""Gives the executor's GPU device (set by :func:`install`)."""
_context: Callable[[], Any] | None = None
"""Gives the executor's current device context, or None (set by :func:`install`)."""


class _RuntimeFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None,
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname != TINYGRAD_MODULE:
            return None
        return importlib.util.spec_from_loader(fullname, _DeviceModuleLoader())


class _DeviceModuleLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(DEVICE_MODULE)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module was imported under its own name."""


def install(gpu_device: Callable[[], Any], *, default: bool, context: Callable[[], Any] | None = None) -> None:
    """Make tinygrad's ``WEBGPU`` device run on ``gpu_device()`` (the executor's
    :class:`~.device.GpuDevice`); ``default``: and make it tinygrad's default device, unless the worker's
    environment names another with ``DEV``. ``context``: gives the GPU cell's
    :class:`~.context.DeviceContext` (or None), whose arrays already on the device tinygrad copies there instead
    of uploading them again, and whose stats count tinygrad's uploads. Call before any cell runs."""
    global _gpu_device, _context
    _gpu_device, _context = gpu_device, context
    # (tinygrad's compile pool would leave threads running)
    module_state.set_at_start({"PARALLEL": "0", **({"DEV": DEVICE_NAME} if default else {})})
    if not any(isinstance(finder, _RuntimeFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RuntimeFinder())


def executor_gpu_device() -> Any:
    """The executor's GPU device, for tinygrad's ``WEBGPU`` device."""
    if _gpu_device is None:  # (the finder is installed only with it: a bug if seen)
        raise GpuError("tinygrad's WEBGPU device is the worker's GPU, and this worker computes without one "
                       "(start remote-worker with --gpu on, or use tinygrad's CPU device: DEV=CPU)")
    return _gpu_device()


def executor_context() -> Any:
    """The GPU cell's :class:`~.context.DeviceContext` (its resident arrays and stats), or None."""
    return _context() if _context is not None else None


def opened_device() -> Any:
    """tinygrad's ``WEBGPU`` device if a cell opened it, else None."""
    device_module = sys.modules.get("tinygrad.device")
    if device_module is None or DEVICE_NAME not in device_module.Device._opened_devices:
        return None
    return device_module.Device[DEVICE_NAME]


def after_cell() -> None:
    """After each cell: the programs tinygrad generated for the GPU are saved for the next executor."""
    device = opened_device()
    if device is not None and not device.gpu.lost:
        device.programs.save()


def forget_lost_device() -> None:
    """If tinygrad's ``WEBGPU`` device is on a lost GPU device, drop it: tinygrad opens a new one on next use."""
    device = opened_device()
    if device is not None and device.gpu.lost:
        devices: Any = sys.modules["tinygrad.device"].Device
        devices._Device__get_canonicalized_item.cache_clear()
        devices._opened_devices.discard(DEVICE_NAME)
