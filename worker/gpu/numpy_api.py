"""numpy's protocols for DeviceArray: which ufuncs and functions have kernels, and the rest.

``np.exp(x)``, ``np.maximum(x, 0)``, ``np.matmul(a, b)``, ``np.add.reduce(x)``, ``np.sum(x, axis=1)``,
``np.transpose(x)``... run as kernels; anything else (or these with options the kernels do
not take, such as ``out=`` or ``dtype=``) is computed with numpy on host copies, with a one-time
notice naming the function.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .dispatch import Dispatcher

UFUNC_KERNELS = {
    "add": "add", "subtract": "subtract", "multiply": "multiply", "divide": "divide", "true_divide": "divide",
    "power": "power", "maximum": "maximum", "minimum": "minimum", "negative": "negative", "absolute": "abs",
    "exp": "exp", "log": "log", "sqrt": "sqrt", "tanh": "tanh", "greater": "greater",
    "greater_equal": "greater_equal", "less": "less", "less_equal": "less_equal", "equal": "equal",
    "not_equal": "not_equal", "matmul": "matmul",
}
"""numpy ufunc name -> kernel name."""

REDUCE_KERNELS = {"add": "sum", "maximum": "max", "minimum": "min"}
"""``np.<ufunc>.reduce`` with a kernel."""


def array_ufunc(dispatcher: Dispatcher, ufunc: np.ufunc, method: str, inputs: tuple[Any, ...],
                kwargs: dict[str, Any]) -> Any:
    """``DeviceArray.__array_ufunc__``: a kernel when there is one, else numpy with a notice."""
    out = kwargs.get("out")
    if out is not None and any(dispatcher.is_array(o) for o in (out if isinstance(out, tuple) else (out,))):
        raise TypeError("DeviceArrays are immutable, so out= cannot be one; assign the result instead")
    name = ufunc.__name__
    if method == "__call__" and not kwargs and name in UFUNC_KERNELS and len(inputs) == ufunc.nin:
        kernel = UFUNC_KERNELS[name]
        if kernel == "matmul":
            return dispatcher.matmul(*inputs)
        return dispatcher.elementwise(kernel, *inputs)
    if method == "reduce" and name in REDUCE_KERNELS and len(inputs) == 1 and set(kwargs) <= {"axis", "keepdims"}:
        return dispatcher.reduce(REDUCE_KERNELS[name], inputs[0], kwargs.get("axis", 0), kwargs.get("keepdims", False))
    label = f"np.{name}" if method == "__call__" else f"np.{name}.{method}"
    return dispatcher.fallback(label, getattr(ufunc, method), inputs, kwargs)


def _reduction(kernel: str) -> Callable[..., Any]:
    def handler(dispatcher: Dispatcher, a: Any, axis: Any = None, *rest: Any, keepdims: bool = False,
                **options: Any) -> Any:
        if rest or options:
            raise _Unhandled
        return dispatcher.reduce(kernel, a, axis, keepdims)
    return handler


def _transpose(dispatcher: Dispatcher, a: Any, axes: Any = None) -> Any:
    return dispatcher.transpose(a, None if axes is None else tuple(axes))


def _dot(dispatcher: Dispatcher, a: Any, b: Any) -> Any:
    if all((dispatcher.is_array(v) or isinstance(v, np.ndarray)) and 1 <= v.ndim <= 2 and v.dtype.kind in "fiub"
           for v in (a, b)):
        return dispatcher.matmul(a, b)  # numpy's dot and matmul agree on 1-D and 2-D operands
    raise _Unhandled


def _reshape(dispatcher: Dispatcher, a: Any, shape: Any = None, order: str = "C", **options: Any) -> Any:
    shape = options.pop("newshape", shape)
    if order != "C" or options or not dispatcher.is_array(a) or shape is None:
        raise _Unhandled
    return a.reshape(shape)


def _shape(dispatcher: Dispatcher, a: Any) -> Any:
    return a.shape


def _ndim(dispatcher: Dispatcher, a: Any) -> Any:
    return a.ndim


def _size(dispatcher: Dispatcher, a: Any, axis: int | None = None) -> Any:
    return a.size if axis is None else a.shape[axis]


class _Unhandled(Exception):
    """A handled function was called with options its kernel does not take."""


FUNCTIONS: dict[Any, Callable[..., Any]] = {
    np.sum: _reduction("sum"), np.mean: _reduction("mean"),
    np.max: _reduction("max"), np.min: _reduction("min"),
    np.transpose: _transpose, np.dot: _dot, np.reshape: _reshape,
    np.shape: _shape, np.ndim: _ndim, np.size: _size,
}
for _alias, _kernel in (("amax", "max"), ("amin", "min")):
    if hasattr(np, _alias):
        FUNCTIONS.setdefault(getattr(np, _alias), _reduction(_kernel))


def array_function(dispatcher: Dispatcher, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``DeviceArray.__array_function__``: a kernel when there is one, else numpy with a notice."""
    handler = FUNCTIONS.get(func)
    if handler is not None:
        try:
            return handler(dispatcher, *args, **kwargs)
        except _Unhandled:
            pass
    return dispatcher.fallback(_qualified(func), func, args, kwargs)


def _qualified(func: Any) -> str:
    """``np.linalg.norm`` for numpy.linalg.norm, ``np.cumsum`` for numpy.cumsum (private modules dropped)."""
    name = getattr(func, "__name__", "function")
    module = getattr(func, "__module__", None) or "numpy"
    if module.startswith("numpy") and "._" not in module and not module.startswith("numpy._"):
        return "np" + module[len("numpy"):] + "." + name
    return f"np.{name}" if module.startswith("numpy") else f"{module}.{name}"
