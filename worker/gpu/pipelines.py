"""Compiling WGSL: shader modules and compute pipelines, cached; compile errors with positions.

A pipeline is keyed by (shader, entry point, override constants): shapes travel in uniforms,
so one pipeline serves every shape and a kernel compiles once per device.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Mapping

from remote_magic import shaders
from remote_magic.errors import ShaderError

from .device import GpuDevice, is_device_loss

log = logging.getLogger(__name__)

_POSITION = re.compile(r"wgsl:(\d+):(\d+)")
_NOISE = ("Validation Error", "Caused by:")


def shader_error(exc: BaseException, label: str) -> ShaderError:
    """A :class:`ShaderError` for wgpu's compile error ``exc``, with line and column if given."""
    text = str(exc)
    match = _POSITION.search(text)
    line, column = (int(match.group(1)), int(match.group(2))) if match else (None, None)
    lines = [ln.rstrip() for ln in text.splitlines()]
    meaningful = [ln.strip() for ln in lines
                  if ln.strip() and ln.strip() not in _NOISE and not ln.strip().startswith("In wgpu")]
    fallback = meaningful[0] if meaningful else type(exc).__name__
    reason = next((ln for ln in meaningful if "error" in ln.lower()), fallback)
    reason = re.sub(r"^Shader '[^']*' ", "", reason)
    frame = "\n".join(ln for ln in lines if ln.strip().startswith(("┌", "│", "=")) or re.match(r"^\s*\d+\s*│", ln))
    where = f" at line {line}, column {column}" if line is not None else ""
    message = f"WGSL of {label} failed to compile{where}: {reason}"
    if frame:
        message += "\n" + frame
    return ShaderError(message, line, column)


def compile_module(device: Any, source: str, label: str) -> Any:
    """Compile ``source``; a compile error becomes :class:`ShaderError` with line and column."""
    try:
        return device.create_shader_module(label=label, code=source)
    except Exception as exc:  # wgpu raises GPUValidationError (or a plain error on old versions)
        raise _compile_error(exc, label) from exc


def create_pipeline(device: Any, module: Any, entry: str, label: str,
                    constants: Mapping[str, float] | None = None, layout: Any = "auto") -> Any:
    """A compute pipeline for ``entry`` of ``module``; errors become :class:`ShaderError`."""
    stage: dict[str, Any] = {"module": module, "entry_point": entry}
    if constants:
        stage["constants"] = dict(constants)
    try:
        return device.create_compute_pipeline(label=label, layout=layout, compute=stage)
    except Exception as exc:
        raise _compile_error(exc, label) from exc


def _compile_error(exc: Exception, label: str) -> Exception:
    """What compiling ``label`` failing with ``exc`` is: the shader's fault, or (as it is) a device that is gone,
    for :meth:`GpuDevice.guard` to see."""
    if is_device_loss(exc):
        return exc
    return shader_error(exc, label)


class Pipelines:
    """The built-in kernels' compiled pipelines on one device, created on first use."""

    def __init__(self, device: GpuDevice) -> None:
        self._device = device
        self._modules: dict[str, Any] = {}
        self._pipelines: dict[tuple[str, str, tuple[tuple[str, float], ...]], Any] = {}

    def get(self, shader: str, entry: str, constants: Mapping[str, float] | None = None) -> Any:
        """The pipeline for ``entry`` in ``shaders/<shader>.wgsl`` with these override constants."""
        key = (shader, entry, tuple(sorted((constants or {}).items())))
        pipeline = self._pipelines.get(key)
        if pipeline is None:
            module = self._modules.get(shader)
            with self._device.guard(f"the compiling of {shader}.wgsl"):
                if module is None:
                    module = compile_module(self._device.handle, shaders.source(shader), f"{shader}.wgsl")
                    self._modules[shader] = module
                pipeline = create_pipeline(self._device.handle, module, entry, f"{shader}.wgsl:{entry}", constants)
            self._pipelines[key] = pipeline
            log.debug("compiled %s:%s %s", shader, entry, dict(constants or {}))
        return pipeline

    def __len__(self) -> int:
        return len(self._pipelines)
