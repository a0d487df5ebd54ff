"""The ``gpu`` object every offloaded cell sees: explicit kernels, arrays, custom kernels.

``gpu.matmul(a, b)``, ``gpu.softmax(x, axis=-1)``, ``gpu.exp(x)``... always run their kernel
(whatever kernels the cell enabled) and return DeviceArrays; ``gpu.array(x)`` puts data on the
GPU and ``gpu.asnumpy(x)`` brings it back. A kernel registered with ``%%offload_kernel NAME``
is ``gpu.NAME(*inputs, out_shape=..., params=..., workgroups=...)``. When the runtime computes
with numpy (``--gpu auto`` on a software adapter), the same calls compute with numpy.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol

import numpy as np

from . import custom
from .arrays import DeviceArray
from .dispatch import Dispatcher
from .host_ops import BINARY, UNARY


class KernelRuntime(Protocol):
    """What the ``gpu`` object needs of its runtime; ``runtime.GpuRuntime`` is the one it gets."""

    @property
    def dispatcher(self) -> Dispatcher:
        """Where operations run."""

    @property
    def custom_kernels(self) -> Mapping[str, custom.KernelSpec]:
        """Registered custom kernels by name."""

    def capabilities(self) -> dict[str, Any]:
        """Mode, adapter and whether kernels run on the GPU."""


class GpuNamespace:
    """Explicit GPU calls for cell code; see the module docstring."""

    def __init__(self, runtime: KernelRuntime) -> None:
        self._runtime = runtime

    @property
    def _dispatcher(self) -> Dispatcher:
        return self._runtime.dispatcher

    def array(self, x: Any) -> Any:
        """``x`` copied to a DeviceArray (float32; float64 with a notice, integers only when exact)."""
        return self._dispatcher.asarray(x, "gpu.array's argument", copy=True)

    def asnumpy(self, x: Any) -> np.ndarray:
        """``x`` as a numpy array, read back from the GPU if it is a DeviceArray."""
        return x.numpy() if isinstance(x, DeviceArray) else np.asarray(x)

    def matmul(self, a: Any, b: Any) -> Any:
        """``a @ b`` with numpy's matmul semantics, on the GPU."""
        return self._dispatcher.matmul(a, b, explicit=True)

    def softmax(self, x: Any, axis: int = -1) -> Any:
        """Numerically stable softmax along ``axis``."""
        return self._dispatcher.softmax(x, axis, explicit=True)

    def transpose(self, x: Any, axes: Any = None) -> Any:
        """``x`` with axes permuted (reversed by default)."""
        return self._dispatcher.transpose(x, None if axes is None else tuple(axes), explicit=True)

    def sum(self, x: Any, axis: Any = None, keepdims: bool = False) -> Any:
        """Sum over ``axis`` (None: all)."""
        return self._dispatcher.reduce("sum", x, axis, keepdims, explicit=True)

    def mean(self, x: Any, axis: Any = None, keepdims: bool = False) -> Any:
        """Mean over ``axis`` (None: all)."""
        return self._dispatcher.reduce("mean", x, axis, keepdims, explicit=True)

    def max(self, x: Any, axis: Any = None, keepdims: bool = False) -> Any:
        """Maximum over ``axis`` (None: all); NaN if any value is NaN."""
        return self._dispatcher.reduce("max", x, axis, keepdims, explicit=True)

    def min(self, x: Any, axis: Any = None, keepdims: bool = False) -> Any:
        """Minimum over ``axis`` (None: all); NaN if any value is NaN."""
        return self._dispatcher.reduce("min", x, axis, keepdims, explicit=True)

    def synchronize(self) -> None:
        """Wait until the GPU has finished everything submitted (for timing cell code)."""
        if self._dispatcher.active:
            self._dispatcher.ctx.wait()

    @property
    def kernels(self) -> list[str]:
        """Names of the registered custom kernels."""
        return sorted(self._runtime.custom_kernels)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        spec = self._runtime.custom_kernels.get(name)
        if spec is None or name.startswith("_"):
            known = ", ".join(sorted(self._runtime.custom_kernels)) or "none registered"
            raise AttributeError(f"gpu has no kernel {name!r} (custom kernels: {known})")

        def call(*inputs: Any, out_shape: Any = None, params: Any = None, workgroups: Any = None) -> Any:
            return custom.run(self._dispatcher, spec, inputs, out_shape, params, workgroups)

        call.__name__ = name
        call.__doc__ = f"Custom kernel {name}: {spec.inputs} input(s), {spec.outputs} output(s)."
        return call

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._runtime.custom_kernels))

    def __repr__(self) -> str:
        caps = self._runtime.capabilities()
        where = "GPU" if caps.get("active") else "numpy"
        adapter = caps.get("adapter")
        on = f" on {adapter} ({caps.get('adapter_type')}, {caps.get('backend')})" if adapter else ""
        return f"<gpu: kernels run with {where}{on}>"


def _unary(name: str) -> Callable[..., Any]:
    def method(self: GpuNamespace, x: Any) -> Any:
        return self._dispatcher.elementwise(name, x, explicit=True)
    method.__name__ = name
    method.__doc__ = f"Elementwise {name}, on the GPU."
    return method


def _binary(name: str) -> Callable[..., Any]:
    def method(self: GpuNamespace, a: Any, b: Any) -> Any:
        return self._dispatcher.elementwise(name, a, b, explicit=True)
    method.__name__ = name
    method.__doc__ = f"Elementwise {name} with numpy broadcasting, on the GPU."
    return method


for _name in UNARY:
    setattr(GpuNamespace, _name, _unary(_name))
for _name in BINARY:
    setattr(GpuNamespace, _name, _binary(_name))

BUILTIN_NAMES: frozenset[str] = frozenset(n for n in dir(GpuNamespace) if not n.startswith("_"))
"""Attributes of ``gpu`` that a custom kernel may not take as its name."""
