"""numpy's protocols for DeviceArray: which numpy operations go to a kernel, and numpy for the rest.

A DeviceArray is an ndarray whose values are always on the host, so anything numpy does with it
is numpy's own answer. Ufuncs (operators, ``np.exp``, ``x.sum()``: ndarray methods reach them too)
and the functions in :data:`FUNCTIONS` (``np.dot``) go to ``numpy_kernels``, which computes them on
the GPU where that gives numpy's answer. Everything else runs numpy on the same values: silently
when the cell didn't enable the kernel, the runtime computes with numpy, or numpy's answer is the
right one without a word (empty arrays, scalars); with a one-time notice naming the operation and
why when there is no kernel for it or these values. A numpy function without a kernel runs numpy's
own implementation, whose ufuncs come back here and may use kernels; only the outermost operation
is counted and noticed.
"""

from __future__ import annotations

import linecache
from types import FrameType
from typing import Any, Callable, Sequence

import numpy as np

from . import integer, launch, numpy_counting, numpy_indexing, numpy_kernels
from .convert import NotExact
from .dispatch import Dispatcher
from .numpy_kernels import Silently, merged, plain

ELEMENTWISE_KERNELS: dict[str, str] = {
    **{name: name for name in (*launch.UNARY, *launch.BINARY) if isinstance(getattr(np, name, None), np.ufunc)},
    "absolute": "abs", "true_divide": "divide", "clip": "clip",
    **{name: name for name in (*integer.UNARY, *integer.BINARY) if name not in ("absolute",)},
}
"""numpy ufunc ``__name__`` -> elementwise kernel."""
REDUCE_KERNELS = {"add": "sum", "maximum": "max", "minimum": "min", "logical_or": "any", "logical_and": "all"}
ACCUMULATE_KERNELS = {"add": "cumsum", "multiply": "cumprod"}
"""``np.<ufunc>.accumulate`` (what ``np.cumsum`` and ``np.cumprod`` run) -> scan kernel."""
"""``np.<ufunc>.reduce`` -> reduction kernel (``x.any()`` and ``x.all()`` reach the logical ones)."""
METHOD_NAMES = {("add", "reduce"): "sum", ("maximum", "reduce"): "max", ("minimum", "reduce"): "min",
                ("multiply", "reduce"): "prod", ("logical_or", "reduce"): "any", ("logical_and", "reduce"): "all",
                ("add", "accumulate"): "cumsum", ("multiply", "accumulate"): "cumprod"}
"""A ufunc method as the numpy function it does, for counters and notices."""
NO_KERNEL = "has no GPU kernel"
"""What an operation computed with numpy says, unless its kernel said why not (``with float16 values``)."""
QUIET_FUNCTIONS = frozenset({
    "shape", "ndim", "size", "result_type", "can_cast", "may_share_memory", "shares_memory", "reshape", "ravel",
    "transpose", "squeeze", "expand_dims", "swapaxes", "moveaxis", "broadcast_to", "broadcast_arrays",
    "atleast_1d", "atleast_2d", "atleast_3d", "copy", "empty_like", "zeros_like", "ones_like", "full_like",
    "astype", "copyto", "iscomplexobj", "isrealobj", "array_repr", "array_str", "array2string",
    "save", "savez", "savez_compressed", "savetxt", "flip", "fliplr", "flipud", "rot90", "roll"})
"""numpy functions that only move or describe values: nothing for a kernel to do, nothing to say."""


# -- entry points ----------------------------------------------------------------------------
def array_ufunc(dispatcher: Dispatcher | None, ufunc: np.ufunc, method: str, inputs: tuple[Any, ...],
                kwargs: dict[str, Any], *, caller: FrameType | None = None) -> Any:
    """``DeviceArray.__array_ufunc__``: a kernel when it gives numpy's answer, else numpy. ``caller``: the
    frame that called the ufunc (see :func:`_asks_for_an_array`)."""
    if dispatcher is None:
        return _numpy_ufunc(dispatcher, ufunc, method, inputs, kwargs)
    label = _label(ufunc, method)
    kernel = _kernel(ufunc, method)
    why: str | None = None
    if kernel is None:
        why = NO_KERNEL
    elif dispatcher.active and _enabled(dispatcher, kernel, inputs):
        try:
            if kernel == "matmul":
                return numpy_kernels.matmul(dispatcher, inputs, kwargs)
            if method == "reduce":
                return numpy_kernels.reduce(dispatcher, ufunc, kernel, inputs[0], kwargs)
            if method == "accumulate":
                return numpy_kernels.accumulate(dispatcher, ufunc, kernel, inputs[0], kwargs)
            if method == "at":
                return numpy_counting.add_at(dispatcher, inputs, kwargs)
            return numpy_kernels.elementwise(dispatcher, ufunc, kernel, inputs, kwargs)
        except (NotExact, launch.Unsupported, Silently) as exc:
            why = _why_numpy(exc)
    if not dispatcher.nested:
        dispatcher.with_numpy(label, why)
    result = _numpy_ufunc(dispatcher, ufunc, method, inputs, kwargs)
    if method == "__call__" and isinstance(result, np.generic) and _asks_for_an_array(caller):
        return dispatcher.wrap(np.asarray(result), merged(dispatcher, inputs))
    return result


def _label(ufunc: np.ufunc, method: str) -> str:
    """How counters and notices name a ufunc call: as the code that makes it is written (``np.sum`` for
    ``x.sum()``, ``np.add.reduce`` and ``np.sum(x)``; ``np.cumsum`` for ``np.add.accumulate``)."""
    if method == "__call__":
        return f"np.{ufunc.__name__}"
    return f"np.{METHOD_NAMES.get((ufunc.__name__, method), f'{ufunc.__name__}.{method}')}"


def _asks_for_an_array(caller: FrameType | None) -> bool:
    """Whether the ufunc call being made in ``caller`` passes ``out=...``, asking for an array even when the
    result has no dimensions: numpy drops that argument before ``__array_ufunc__`` sees it, so the call's
    line is read (numpy's own ``_var`` and ``percentile`` ask so, and fail on a scalar)."""
    if caller is None:
        return False
    return "out=..." in linecache.getline(caller.f_code.co_filename, caller.f_lineno)


def array_function(dispatcher: Dispatcher | None, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                   numpy_implementation: Callable[[], Any]) -> Any:
    """``DeviceArray.__array_function__``: a kernel for the functions that have one; numpy's own
    implementation for the rest (its ufuncs may still use kernels)."""
    name = getattr(func, "__name__", "function")
    if dispatcher is None or name in QUIET_FUNCTIONS:
        return numpy_implementation()
    kernel, handler = FUNCTIONS.get(func, ("", None))
    why = NO_KERNEL if handler is None else None  # a kernel the cell didn't enable: numpy, silently
    if handler is not None and dispatcher.active and _enabled(dispatcher, kernel, args):
        try:
            return handler(dispatcher, *args, **kwargs)
        except Exception as exc:  # numpy's implementation answers (and raises numpy's errors)
            why = _why_numpy(exc)
    return wrapped(dispatcher, counted(dispatcher, _qualified(func), numpy_implementation, why), args)


def with_kernel(dispatcher: Dispatcher | None, kernel: str, label: str, on_gpu: Callable[[Dispatcher], Any],
                with_numpy: Callable[[], Any], operand: Any) -> Any:
    """An operation numpy has no ufunc for but a kernel does (``x.argmax()``, ``x.sort()``): ``on_gpu`` gives
    numpy's answer with the kernel or raises; then ``with_numpy`` does, counted under ``label`` and said once."""
    why = None  # a kernel the cell didn't enable: numpy, silently
    if dispatcher is not None and dispatcher.active and _enabled(dispatcher, kernel, (operand,)):
        try:
            return on_gpu(dispatcher)
        except Exception as exc:
            why = _why_numpy(exc)
    return counted(dispatcher, label, with_numpy, why)


def _why_numpy(refusal: Exception) -> str | None:
    """What a kernel's refusal makes the notice say: its reason (``with float16 values``), nothing when numpy's
    answer needs no word (``Silently``: too small to pay, or numpy's own error to raise), else re-raised."""
    if isinstance(refusal, NotExact):
        return str(refusal)
    if isinstance(refusal, launch.Unsupported):
        return f"with {refusal}"
    if isinstance(refusal, (Silently, TypeError)):
        return None
    raise refusal


def counted(dispatcher: Dispatcher | None, label: str, call: Callable[[], Any],
            why: str | None = NO_KERNEL) -> Any:
    """numpy's code for an operation without a kernel of its own (``np.cumsum``, ``x.argmax()``), or whose
    kernel refused these values (``why``): its ufuncs may use kernels; when none ran, it counts as computed
    with numpy, said once."""
    if dispatcher is None or dispatcher.nested:
        return call()
    kernels_before = sum(dispatcher.stats.kernels.values())
    with dispatcher.inside():
        result = call()
    if sum(dispatcher.stats.kernels.values()) == kernels_before:
        dispatcher.with_numpy(label, why)
    return result


# -- values ------------------------------------------------------------------------------------
def wrapped(dispatcher: Dispatcher, result: Any, sources: Sequence[Any]) -> Any:
    """numpy's ``result`` with its new plain arrays (also in a tuple or list) as device arrays, so
    later operations on them may use kernels; the operands' own objects are returned as they are."""
    if type(result) is np.ndarray and not any(result is s for s in sources):
        return dispatcher.wrap(result, merged(dispatcher, sources))
    if isinstance(result, (tuple, list)) and not hasattr(result, "_fields"):
        return type(result)(wrapped(dispatcher, r, sources) for r in result)
    return result


def _numpy_ufunc(dispatcher: Dispatcher | None, ufunc: np.ufunc, method: str, inputs: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> Any:
    """numpy's ufunc on the plain views; ``out=`` arrays are returned as the objects passed."""
    out = kwargs.get("out")
    if out is not None:
        kwargs = {**kwargs, "out": tuple(plain(o) for o in out)}
    result = getattr(ufunc, method)(*(plain(a) for a in inputs), **kwargs)
    if out is not None and method != "at":
        return out[0] if len(out) == 1 else out
    return wrapped(dispatcher, result, inputs) if dispatcher is not None else result


def _kernel(ufunc: np.ufunc, method: str) -> str | None:
    if method == "__call__":
        return "matmul" if ufunc is np.matmul else ELEMENTWISE_KERNELS.get(ufunc.__name__)
    if method == "reduce":
        return REDUCE_KERNELS.get(ufunc.__name__)
    if method == "accumulate":
        return ACCUMULATE_KERNELS.get(ufunc.__name__)
    if method == "at":
        return "add_at" if ufunc is np.add else None
    return None


def _enabled(dispatcher: Dispatcher, kernel: str, inputs: Sequence[Any]) -> bool:
    enabled = merged(dispatcher, inputs)
    return enabled is None or kernel in enabled


FUNCTIONS: dict[Any, tuple[str, Callable[..., Any]]] = {
    np.dot: ("matmul", numpy_kernels.dot), np.where: ("where", numpy_kernels.where),
    np.sort: ("sort", numpy_counting.sort), np.argsort: ("sort", numpy_counting.argsort),
    np.einsum: ("matmul", numpy_kernels.einsum), np.bincount: ("bincount", numpy_counting.bincount),
    np.partition: ("partition", numpy_counting.partition), np.argpartition: ("partition", numpy_counting.argpartition),
    np.median: ("median", numpy_counting.median), np.percentile: ("percentile", numpy_counting.percentile),
    np.quantile: ("quantile", numpy_counting.quantile), np.unique: ("unique", numpy_counting.unique),
    np.take: (numpy_indexing.KERNEL, numpy_indexing.take)}
"""numpy functions (not ufuncs) with a kernel of their own: its name, and what runs it."""


def _qualified(func: Any) -> str:
    """``np.linalg.norm`` for numpy.linalg.norm, ``np.cumsum`` for numpy.cumsum (private modules dropped)."""
    name = getattr(func, "__name__", "function")
    module = getattr(func, "__module__", None) or "numpy"
    if module.startswith("numpy") and "._" not in module and not module.startswith("numpy._"):
        return "np" + module[len("numpy"):] + "." + name
    return f"np.{name}" if module.startswith("numpy") else f"{module}.{name}"
