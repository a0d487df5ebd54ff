"""The ``gpu`` object every offloaded cell sees: explicit kernels, arrays, custom kernels.

``gpu.matmul(a, b)``, ``gpu.softmax(x, axis=-1)``, ``gpu.exp(x)``... may use every kernel
(whatever kernels the cell enabled), with numpy's dtypes as their numpy counterparts have, and
return DeviceArrays; ``gpu.array(x)`` makes a device array of a copy of ``x`` and ``gpu.asnumpy(x)``
gives the plain numpy array. A kernel registered with ``%%offload_kernel NAME``
is ``gpu.NAME(*inputs, out_shape=..., params=..., workgroups=...)``. When the runtime computes
with numpy (``--gpu auto`` on a software adapter), the same calls compute with numpy.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol

import numpy as np

from . import custom
from .dispatch import Dispatcher
from .host_ops import BINARY, UNARY
from .numpy_kernels import float_kernel, plain, transpose_kernel

HOST_UFUNCS = {"abs": "absolute", "relu": "maximum"}
"""Kernel names that aren't numpy's ufunc names (``gpu.relu(x)`` is ``np.maximum(x, 0)``)."""


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

    def _all_kernels(self, value: Any) -> Any:
        """``value`` as a device array whose operations may use every kernel (a view, no copy)."""
        if isinstance(value, (list, tuple)):
            value = np.asarray(value)
        return self._dispatcher.wrap(plain(value)) if isinstance(value, np.ndarray) else value

    def array(self, x: Any) -> Any:
        """A copy of ``x`` as a device array (numpy's dtype): its operations may use every kernel."""
        return self._dispatcher.wrap(np.array(plain(x), copy=True))

    def asnumpy(self, x: Any) -> np.ndarray:
        """``x`` as a plain numpy array (no copy)."""
        return np.asarray(plain(x))

    def matmul(self, a: Any, b: Any) -> Any:
        """``a @ b`` with numpy's matmul semantics, on the GPU."""
        return np.matmul(self._all_kernels(a), self._all_kernels(b))

    def softmax(self, x: Any, axis: int = -1) -> Any:
        """Numerically stable softmax along ``axis`` (float results: float32, or float64 computed in float32)."""
        return float_kernel(self._dispatcher, "softmax", x, axis)

    def transpose(self, x: Any, axes: Any = None) -> Any:
        """``x`` with axes permuted (reversed by default), as a new contiguous array."""
        return transpose_kernel(self._dispatcher, x, None if axes is None else tuple(axes))

    def sum(self, x: Any, axis: Any = None, keepdims: bool = False) -> Any:
        """Sum over ``axis`` (None: all)."""
        return np.sum(self._all_kernels(x), axis=axis, keepdims=keepdims)

    def mean(self, x: Any, axis: Any = None, keepdims: bool = False) -> Any:
        """Mean over ``axis`` (None: all)."""
        return np.mean(self._all_kernels(x), axis=axis, keepdims=keepdims)

    def max(self, x: Any, axis: Any = None, keepdims: bool = False) -> Any:
        """Maximum over ``axis`` (None: all); NaN if any value is NaN."""
        return np.max(self._all_kernels(x), axis=axis, keepdims=keepdims)

    def min(self, x: Any, axis: Any = None, keepdims: bool = False) -> Any:
        """Minimum over ``axis`` (None: all); NaN if any value is NaN."""
        return np.min(self._all_kernels(x), axis=axis, keepdims=keepdims)

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


def _elementwise(name: str) -> Callable[..., Any]:
    ufunc = getattr(np, HOST_UFUNCS.get(name, name), None)

    def method(self: GpuNamespace, *args: Any) -> Any:
        if name == "relu":
            args = (*args, 0)
        if isinstance(ufunc, np.ufunc):
            return ufunc(*(self._all_kernels(a) for a in args))
        return float_kernel(self._dispatcher, name, *args)
    method.__name__ = name
    method.__doc__ = f"Elementwise {name} with numpy broadcasting, on the GPU."
    return method


for _name in (*UNARY, *BINARY):
    setattr(GpuNamespace, _name, _elementwise(_name))

BUILTIN_NAMES: frozenset[str] = frozenset(n for n in dir(GpuNamespace) if not n.startswith("_"))
"""Attributes of ``gpu`` that a custom kernel may not take as its name."""
