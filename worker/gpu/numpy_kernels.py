"""The numpy operations that run as kernels, each giving numpy's answer or raising for numpy to give it.

Each function takes a numpy call's operands (``plain`` views of device arrays, numpy and Python scalars)
and options, and either returns numpy's answer computed on the GPU, or raises: :class:`Silently` where
numpy's own answer is the right one without a word (empty arrays, numpy's errors, scalars, options
the kernels don't take, results a kernel didn't give exactly), :class:`~.convert.NotExact` where
numpy computes it and the user should hear why once (float32 can't hold these values), and
``launch.Unsupported`` where a kernel can't describe the shapes. The rules, for every operation:

* the result has numpy's dtype (worked out by numpy itself, on empty stand-ins of the operands);
* every operand is exact in float32 (``convert.py``), float64 aside: a GPU cell computes float64
  in float32 and gives float64 results, and the cell's notice names those arrays;
* boolean results come only from exact operands, and integer results only from operations that
  are exact on integers, checked after the kernel (within ±2**24 and the dtype's range);
* a float result that isn't finite is numpy's (NaN, infinities and numpy's warnings for them).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from . import integer, launch
from .convert import NotExact, as_float32, exact_integers, from_float32, is_lossy_float
from .dispatch import Dispatcher
from .host_ops import HOST_OPS

try:  # numpy >= 2
    from numpy.lib.array_utils import normalize_axis_index, normalize_axis_tuple
except ImportError:  # numpy 1.x
    from numpy.core.multiarray import normalize_axis_index  # type: ignore[no-redef]
    from numpy.core.numeric import normalize_axis_tuple  # type: ignore[no-redef]

INTEGER_EXACT = frozenset({
    "add", "subtract", "multiply", "negative", "abs", "maximum", "minimum", "fmax", "fmin", "square",
    "sign", "floor", "ceil", "trunc", "rint", "fabs", "sum", "max", "min", "where", "clip", "cumsum", "cumprod"})
"""Kernels whose float32 result is the exact integer result whenever it lies within ±2**24."""

UFUNC_OPTIONS = frozenset({"out", "casting", "subok", "dtype", "where", "order"})
"""Keyword arguments the ufunc path understands (``where`` only as True, ``order`` only as K)."""


class Silently(Exception):
    """numpy computes this, without a notice (empty arrays, numpy's own errors, scalars)."""


def plain(value: Any) -> Any:
    """A device array as the plain ndarray viewing its memory; anything else as it is."""
    return value.view(np.ndarray) if isinstance(value, np.ndarray) and type(value) is not np.ndarray else value


def merged(dispatcher: Dispatcher, sources: Sequence[Any]) -> frozenset[str] | None:
    """Kernels enabled for a result: all if any source enables all, else the union."""
    sets = [getattr(s, "_enabled", None) for s in sources if dispatcher.is_array(s)]
    union: frozenset[str] = frozenset()
    for enabled in sets:
        if enabled is None:
            return None
        union |= enabled
    return union if sets else None


def _operands(inputs: Sequence[Any]) -> list[Any]:
    """The inputs as numpy sees them: plain arrays, numpy scalars, Python scalars (lists as arrays)."""
    values = []
    for value in inputs:
        value = plain(value)
        if isinstance(value, (list, tuple)):
            value = np.asarray(value)
        if not isinstance(value, (np.ndarray, np.generic, bool, int, float)):
            raise Silently
        values.append(value)
    return values


def _stand_in(value: Any) -> Any:
    """What numpy's dtype rules see of an operand at no cost: arrays as empty ones of their dtype
    (0-d arrays and scalars as they are, since numpy 1.x looks at their values)."""
    return np.empty((0,), value.dtype) if isinstance(value, np.ndarray) and value.ndim else value


def _kernel_operands(values: Sequence[Any]) -> tuple[list[np.ndarray | float], bool]:
    """The operands as a kernel takes them (float32 arrays, Python floats for scalars), and whether
    any is float64 (computed in float32); raises NotExact for values float32 can't hold."""
    operands: list[np.ndarray | float] = []
    lossy = False
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2 ** 24:
            raise NotExact("with Python integers beyond ±2**24")
        array = np.asarray(value)
        lossy = lossy or (isinstance(value, (np.ndarray, np.generic)) and is_lossy_float(array.dtype))
        values32 = as_float32(array)
        operands.append(values32 if values32.ndim else float(values32))
    return operands, lossy


def result_of(dispatcher: Dispatcher, kernel: str, values32: np.ndarray, dtype: np.dtype[Any], lossy: bool,
            operands: Sequence[Any]) -> np.ndarray:
    """float32 kernel values as numpy's ``dtype``. Raises Silently, for numpy to compute it, when integers
    weren't exact, or a float result isn't finite: numpy's answer then (NaN, infinities, and the warning
    numpy gives for them, such as "divide by zero") is numpy's own."""
    if dtype.kind in "iu" and not exact_integers(values32, dtype):
        raise Silently
    if dtype.kind == "f" and not _all_finite(values32):
        raise Silently
    if lossy:
        dispatcher.note_lossy(operands)
    return from_float32(values32, dtype)


def _all_finite(values32: np.ndarray) -> bool:
    """True if every value is finite; may say False for finite values whose squares overflow (numpy then computes
    the result: slower, never wrong). One BLAS pass with no temporary, about half ``np.isfinite(...).all()``'s time:
    a NaN or an infinity makes the sum of squares NaN or infinite."""
    flat = values32.reshape(-1)
    return bool(np.isfinite(np.dot(flat, flat)))


def worth_a_kernel(dispatcher: Dispatcher, work: int, *operands: Any) -> None:
    """Raise Silently when the operation is too small to pay for a kernel (numpy computes it): fewer
    values to compute or read than the dispatcher's ``min_values``."""
    sizes = [work, *(v.size for v in operands if isinstance(v, np.ndarray))]
    if max(sizes) < dispatcher.min_values:
        raise Silently


def _check_result_dtype(kernel: str, dtype: np.dtype[Any], lossy: bool) -> None:
    if dtype.kind == "b" and lossy:
        raise NotExact("with float64 values (comparing in float32 could change the answer)")
    if dtype.kind in "iu" and kernel not in INTEGER_EXACT:
        raise NotExact(f"with {dtype} results")
    if dtype.kind not in "biuf" or (dtype.kind == "f" and dtype.itemsize not in (4, 8)):
        raise NotExact(f"with {dtype} results")


def deliver(dispatcher: Dispatcher, result: np.ndarray, out: tuple[Any, ...] | None, casting: str,
             sources: Sequence[Any]) -> Any:
    """The result as numpy returns it: written into ``out`` (returned), else a device array (a
    numpy scalar when it has no dimensions)."""
    if out is not None:
        np.copyto(plain(out[0]), result, casting=casting)  # type: ignore[arg-type]
        return out[0]
    if result.ndim == 0:
        return result[()]
    return dispatcher.wrap(result, merged(dispatcher, sources))


def _check_out(out: tuple[Any, ...] | None, shape: tuple[int, ...], dtype: np.dtype[Any], casting: str) -> None:
    """numpy answers (or raises) for an ``out=`` that isn't one array of the result's shape it can take."""
    if out is None:
        return
    if len(out) != 1 or not isinstance(out[0], np.ndarray) or out[0].shape != shape \
            or not np.can_cast(dtype, out[0].dtype, casting) or not out[0].flags.writeable:  # type: ignore[arg-type]
        raise Silently


# -- the kernels -------------------------------------------------------------------------------
def elementwise(dispatcher: Dispatcher, ufunc: np.ufunc, kernel: str, inputs: Sequence[Any],
                 kwargs: dict[str, Any]) -> Any:
    if set(kwargs) - UFUNC_OPTIONS or kwargs.get("where", True) is not True or kwargs.get("order", "K") != "K":
        raise NotExact("with these arguments")
    if len(inputs) != ufunc.nin or ufunc.nout != 1 or kwargs.get("dtype") is not None:
        raise Silently  # (dtype= casts the operands first: numpy's)
    values = _operands(inputs)
    try:
        options = {k: kwargs[k] for k in ("dtype", "casting") if k in kwargs}
        dtype = np.asarray(ufunc(*(_stand_in(v) for v in values), **options)).dtype
        shape = tuple(np.broadcast_shapes(*(np.shape(v) for v in values)))
    except Exception:  # numpy's own error: numpy raises it
        raise Silently from None
    scalars = sum(1 for v in values if not (isinstance(v, np.ndarray) and v.ndim))
    if 0 in shape or not shape or (scalars > 1 and kernel != "clip"):
        raise Silently  # empty, scalar, or two scalars (one place in the uniform): nothing worth a kernel
    worth_a_kernel(dispatcher, math.prod(shape), *values)
    casting = kwargs.get("casting", "same_kind")
    integers = _as_int32(ufunc.__name__, values, dtype)
    if integers is not None:
        _check_out(kwargs.get("out"), shape, dtype, casting)
        name, int_operands, signed = integers
        int_values = dispatcher.integer(name, int_operands, shape, signed=signed)
        return deliver(dispatcher, int_values.astype(dtype), kwargs.get("out"), casting, inputs)
    if kernel not in launch.UNARY and kernel not in launch.BINARY and kernel != "clip":
        raise NotExact(f"with {', '.join(sorted({str(np.asarray(v).dtype) for v in values}))} values")
    operands, lossy = _kernel_operands(values)
    lossy = lossy or is_lossy_float(dtype)
    _check_result_dtype(kernel, dtype, lossy)
    _check_out(kwargs.get("out"), shape, dtype, casting)
    if kernel == "clip":
        values32 = _clip(dispatcher, operands, shape, lossy)
    else:
        values32 = dispatcher.elementwise(kernel, operands, shape)
    result = result_of(dispatcher, kernel, values32, dtype, lossy, values)
    return deliver(dispatcher, result, kwargs.get("out"), casting, inputs)


INT32 = (-(2 ** 31), 2 ** 31 - 1)
UINT32 = (0, 2 ** 32 - 1)
_BOUNDED: dict[str, Callable[..., tuple[int, int]]] = {  # exact results' range, from the operands' (lo, hi)
    "add": lambda a, b: (a[0] + b[0], a[1] + b[1]),
    "subtract": lambda a, b: (a[0] - b[1], a[1] - b[0]),
    "multiply": lambda a, b: _span([x * y for x in a for y in b]),
    "maximum": lambda a, b: (max(a[0], b[0]), max(a[1], b[1])),
    "minimum": lambda a, b: (min(a[0], b[0]), min(a[1], b[1])),
    "negative": lambda a: (-a[1], -a[0]),
    "absolute": lambda a: (0, max(abs(a[0]), abs(a[1]))),
    "square": lambda a: (0, max(a[0] * a[0], a[1] * a[1])),
    "invert": lambda a: (-a[1] - 1, -a[0] - 1),
    "floor_divide": lambda a, b: (-max(abs(a[0]), abs(a[1])) - 1, max(abs(a[0]), abs(a[1]))),
    "remainder": lambda a, b: (-max(abs(b[0]), abs(b[1])), max(abs(b[0]), abs(b[1]))),
}
"""Operations whose exact integer results lie in a range that the operands' ranges give."""
_WITHIN_OPERANDS = frozenset({"bitwise_and", "bitwise_or", "bitwise_xor", "sign", "logical_not", "equal",
                              "not_equal", "less", "less_equal", "greater", "greater_equal"})
"""Operations whose results fit 32 bits whenever the operands do."""


def _span(values: list[int]) -> tuple[int, int]:
    return min(values), max(values)


def _as_int32(name: str, values: Sequence[Any], dtype: np.dtype[Any],
              ) -> tuple[str, list[np.ndarray | int], bool] | None:
    """The native integer kernel, its operands (32-bit arrays, Python ints) and whether it is signed, when
    it gives numpy's answer; else None (the float32 path may). int32 and uint32 arrays wrap around as
    numpy's do; wider integers, and mixed ones, only when their values and every exact result fit int32
    (checked from their ranges); ``~`` of booleans is their logical not. Division and remainder by zero
    (numpy warns; a kernel can't), and shifts of wider integers (other rules past 31 bits), are numpy's."""
    if name not in integer.UNARY and name not in integer.BINARY or dtype.kind not in "biu":
        return None
    arrays = [v for v in values if isinstance(v, np.ndarray) and v.ndim]
    if not arrays or any(a.dtype.kind not in "biu" for a in arrays) or any(
            isinstance(v, (float, np.floating)) or (isinstance(v, np.ndarray) and v.dtype.kind not in "biu")
            for v in values):
        return None
    native = {a.dtype for a in arrays} | ({dtype} if dtype.kind != "b" else set())
    if native <= {np.dtype(np.int32)} or native <= {np.dtype(np.uint32)}:
        signed = np.dtype(np.int32) in native or not native
        ranges = None  # numpy's own 32-bit arithmetic: wrapping around is its answer
    else:
        signed, ranges = True, [value_range(v) for v in values]
        if any(low < INT32[0] or high > INT32[1] for low, high in ranges):
            return None
        bound = _BOUNDED.get(name)
        if bound is not None:
            low, high = bound(*ranges)
            if low < INT32[0] or high > INT32[1]:
                return None
        elif name not in _WITHIN_OPERANDS:
            return None  # shifts, division, remainder: their 64-bit rules, and numpy's warnings
    if name in ("floor_divide", "remainder") and any(not np.all(v) for v in values[1:]):
        return None  # numpy warns "divide by zero": its answer
    if name in ("left_shift", "right_shift") and ranges is not None:
        return None
    kernel = "logical_not" if name == "invert" and dtype.kind == "b" else name
    return kernel, [_int_operand(v, signed) for v in values], signed


def value_range(value: Any) -> tuple[int, int]:
    """The smallest and largest of integer values, as Python ints ((0, 0) when empty)."""
    array = np.asarray(value)
    return (int(array.min()), int(array.max())) if array.size else (0, 0)


def _int_operand(value: Any, signed: bool) -> np.ndarray | int:
    if isinstance(value, np.ndarray) and value.ndim:
        return value.astype(np.int32 if signed else np.uint32, copy=False)
    return int(value)


def _clip(dispatcher: Dispatcher, operands: Sequence[np.ndarray | float], shape: tuple[int, ...],
          lossy: bool) -> np.ndarray:
    """numpy's clip, for bounds that are single values: numpy runs another loop for bound arrays, and which
    one it picks for a shape depends on its buffering, so only here is its choice of zero in a tie
    (``clip(0.0, -0.0, 1.0)``) known. float64 is numpy's: clipping computes nothing a float32 copy
    would do faster, and it would lose digits."""
    if lossy or any(isinstance(bound, np.ndarray) and bound.size != 1 for bound in operands[1:]):
        raise Silently
    bounds = [bound if isinstance(bound, float) else float(bound.reshape(())) for bound in operands[1:]]
    return dispatcher.select("clip", [operands[0], *bounds], shape)


def where(dispatcher: Dispatcher, condition: Any, x: Any = None, y: Any = None) -> Any:
    """``np.where(condition, x, y)``, the select kernel: ``x`` where ``condition`` is true (nonzero, or
    NaN), else ``y``. Only for operands float32 holds exactly (float64 is numpy's: selecting computes
    nothing, and a float32 copy would lose digits); then the result, whatever its dtype, is exact."""
    if x is None or y is None:
        raise Silently  # one argument: np.nonzero
    values = _operands([condition, x, y])
    try:
        dtype = np.where(*(_stand_in(v) for v in values)).dtype
        shape = tuple(np.broadcast_shapes(*(np.shape(v) for v in values)))
    except Exception:
        raise Silently from None
    if 0 in shape or not shape:
        raise Silently
    worth_a_kernel(dispatcher, math.prod(shape), *values)
    (cond32,), _ = _kernel_operands(values[:1])
    choices, lossy = _kernel_operands(values[1:])
    if lossy:
        raise Silently
    _check_result_dtype("where", dtype, lossy)
    values32 = dispatcher.select("where", [cond32, *choices], shape)
    return deliver(dispatcher, result_of(dispatcher, "where", values32, dtype, lossy, values), None, "same_kind",
                    [condition, x, y])


def reduce(dispatcher: Dispatcher, ufunc: np.ufunc, kernel: str, x: Any, kwargs: dict[str, Any]) -> Any:
    if set(kwargs) - {"axis", "dtype", "out", "keepdims", "where"} or kwargs.get("where", True) is not True:
        raise NotExact("with these arguments")
    x = plain(x)
    if not isinstance(x, np.ndarray) or x.size == 0 or x.ndim == 0:
        raise Silently  # numpy's rules for empty reductions (0, or an error) are the answer
    worth_a_kernel(dispatcher, x.size)
    axis, keepdims = kwargs.get("axis", 0), bool(kwargs.get("keepdims", False))
    if kwargs.get("dtype") not in (None, x.dtype) or axis == ():
        raise Silently  # another dtype casts the values first; no axis reduces nothing: numpy's
    try:
        stand_in = np.ones((1,) * x.ndim, x.dtype)
        dtype = np.asarray(ufunc.reduce(stand_in, axis=axis, dtype=kwargs.get("dtype"), keepdims=keepdims)).dtype
        axes = tuple(range(x.ndim)) if axis is None else normalize_axis_tuple(axis, x.ndim)
    except Exception:
        raise Silently from None
    (x32,), lossy = _kernel_operands([x])
    lossy = lossy or is_lossy_float(dtype)
    _check_result_dtype(kernel, dtype, lossy)
    shape = tuple(1 if d in axes else s for d, s in enumerate(x.shape)) if keepdims else \
        tuple(s for d, s in enumerate(x.shape) if d not in axes)
    _check_out(kwargs.get("out"), shape, dtype, "same_kind")
    x32 = np.asarray(x32)
    if kernel in ("any", "all") and x.dtype != np.bool_:  # truth values first: NaN counts as true, as in numpy
        x32 = dispatcher.elementwise("not_equal", [x32, 0.0], x.shape)
    values32 = dispatcher.reduce(kernel, x32, axes, keepdims)
    result = result_of(dispatcher, kernel, values32, dtype, lossy, [x])
    return deliver(dispatcher, result, kwargs.get("out"), "same_kind", [x])


def accumulate(dispatcher: Dispatcher, ufunc: np.ufunc, kernel: str, x: Any, kwargs: dict[str, Any]) -> Any:
    """``np.add.accumulate`` and ``np.multiply.accumulate`` (what ``np.cumsum``, ``np.cumprod`` and the
    methods run) along one axis: the scan kernel. A dtype= other than x's own is numpy's, but for
    integers widened to a wider integer (``x.cumsum()`` of int32 asks for int64), which changes no value."""
    if set(kwargs) - {"axis", "dtype", "out"}:
        raise NotExact("with these arguments")
    x = plain(x)
    if not isinstance(x, np.ndarray) or x.size == 0 or x.ndim == 0:
        raise Silently
    worth_a_kernel(dispatcher, x.size)
    wanted = kwargs.get("dtype")
    if wanted is not None and np.dtype(wanted) != x.dtype and not (
            x.dtype.kind in "biu" and np.dtype(wanted).kind in "iu" and np.can_cast(x.dtype, wanted, "safe")):
        raise Silently
    try:
        dtype = ufunc.accumulate(np.ones(1, x.dtype), dtype=wanted).dtype
        axis = normalize_axis_index(kwargs.get("axis", 0), x.ndim)
    except Exception:
        raise Silently from None
    (x32,), lossy = _kernel_operands([x])
    lossy = lossy or is_lossy_float(dtype)
    _check_result_dtype(kernel, dtype, lossy)
    _check_out(kwargs.get("out"), x.shape, dtype, "same_kind")
    values32 = dispatcher.along(kernel, np.asarray(x32), axis)
    result = result_of(dispatcher, kernel, values32, dtype, lossy, [x])
    return deliver(dispatcher, result, kwargs.get("out"), "same_kind", [x])


def arg_extreme(dispatcher: Dispatcher, kernel: str, x: Any, axis: Any = None, out: Any = None, *,
                keepdims: bool = False) -> Any:
    """``x.argmax()``/``x.argmin()`` (``kernel``), and ``np.argmax``/``np.argmin``, which call them: the
    first index of the extreme, a NaN counting as one, as numpy's. float64 is numpy's: two values
    float32 rounds alike would tie, and the first index could change."""
    x = plain(x)
    if out is not None or not isinstance(x, np.ndarray) or x.size == 0 or x.ndim == 0:
        raise Silently
    worth_a_kernel(dispatcher, x.size)
    try:
        index = None if axis is None else normalize_axis_index(axis, x.ndim)
    except Exception:
        raise Silently from None
    (x32,), lossy = _kernel_operands([x])
    if lossy:
        raise Silently
    values = np.asarray(x32)
    indices = dispatcher.along(kernel, values.reshape(-1) if index is None else values, 0 if index is None else index)
    if keepdims:
        indices = indices.reshape((1,) * x.ndim) if index is None else np.expand_dims(indices, index)
    return deliver(dispatcher, indices, None, "same_kind", [x])


def matmul(dispatcher: Dispatcher, inputs: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    if set(kwargs) - {"out"} or len(inputs) != 2:
        raise NotExact("with these arguments")
    a, b = (plain(v) for v in inputs)
    if not all(isinstance(v, np.ndarray) and v.ndim for v in (a, b)):
        raise Silently  # numpy's error for scalars
    dtype = np.result_type(a.dtype, b.dtype)
    if dtype.kind != "f" or dtype.itemsize not in (4, 8):
        raise NotExact(f"with {dtype} arrays")
    a2_shape = (1,) + a.shape if a.ndim == 1 else a.shape
    b2_shape = b.shape + (1,) if b.ndim == 1 else b.shape
    try:
        batch = tuple(np.broadcast_shapes(a2_shape[:-2], b2_shape[:-2]))
    except ValueError:
        raise Silently from None
    if a2_shape[-1] != b2_shape[-2]:
        raise Silently
    shape = batch + a2_shape[-2:-1] * (a.ndim > 1) + b2_shape[-1:] * (b.ndim > 1)
    if 0 in shape or a2_shape[-1] == 0:
        raise Silently
    worth_a_kernel(dispatcher, math.prod(shape) * a2_shape[-1], a, b)
    (a32, b32), lossy = _kernel_operands([a, b])
    _check_out(kwargs.get("out"), shape, dtype, "same_kind")
    values32 = dispatcher.matmul(np.asarray(a32), np.asarray(b32))
    result = result_of(dispatcher, "matmul", values32, dtype, lossy, [a, b])
    return deliver(dispatcher, result, kwargs.get("out"), "same_kind", inputs)


def einsum(dispatcher: Dispatcher, subscripts: Any, *operands: Any, out: Any = None, optimize: Any = False,
           **options: Any) -> Any:
    """``np.einsum`` of two operands that is a (batched) matrix product, as the matmul kernel: explicit
    output (``"bij,bjk->bik"``, ``"ij,kj->ik"``, ``"i,i->"``), each index once per operand, every index of
    an operand either in the output or in the other operand. The rest is numpy's."""
    if out is not None or options or not isinstance(subscripts, str) or len(operands) != 2 \
            or "->" not in subscripts or "." in subscripts:
        raise Silently
    inputs, output = subscripts.replace(" ", "").split("->")
    a_sub, _, b_sub = inputs.partition(",")
    a, b = (plain(v) for v in operands)
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.ndim == len(a_sub) and b.ndim == len(b_sub)):
        raise Silently
    if any(len(set(sub)) != len(sub) for sub in (a_sub, b_sub, output)) or not set(output) <= set(a_sub + b_sub):
        raise Silently
    batch = [c for c in output if c in a_sub and c in b_sub]
    summed = [c for c in a_sub if c in b_sub and c not in output]
    rows, columns = [c for c in a_sub if c not in b_sub], [c for c in b_sub if c not in a_sub]
    if any(c not in output for c in rows + columns):
        raise Silently  # an index summed within one operand: numpy's
    sizes = {c: n for sub, x in ((a_sub, a), (b_sub, b)) for c, n in zip(sub, x.shape)}
    if any(dict(zip(a_sub, a.shape)).get(c, n) != n for c, n in zip(b_sub, b.shape)):
        raise Silently  # numpy's error for mismatched sizes

    def laid_out(x: np.ndarray, sub: str, order: list[str], shape: tuple[int, int, int]) -> np.ndarray:
        return np.ascontiguousarray(np.transpose(x, [sub.index(c) for c in order])).reshape(shape)

    count = {group: math.prod(sizes[c] for c in letters) for group, letters in
             (("batch", batch), ("rows", rows), ("summed", summed), ("columns", columns))}
    a3 = laid_out(a, a_sub, batch + rows + summed, (count["batch"], count["rows"], count["summed"]))
    b3 = laid_out(b, b_sub, batch + summed + columns, (count["batch"], count["summed"], count["columns"]))
    product = matmul(dispatcher, (a3, b3), {})
    values = plain(np.asarray(product)).reshape([sizes[c] for c in batch + rows + columns])
    result = np.array(np.transpose(values, [(batch + rows + columns).index(c) for c in output]), order="C")
    return result[()] if result.ndim == 0 else dispatcher.wrap(result, merged(dispatcher, operands))


def dot(dispatcher: Dispatcher, a: Any, b: Any, out: Any = None) -> Any:
    if out is not None or not all(isinstance(v, np.ndarray) and 1 <= v.ndim <= 2 for v in (a, b)):
        raise Silently
    return matmul(dispatcher, (a, b), {})  # numpy's dot and matmul agree on 1-D and 2-D operands


# -- kernels numpy has no function for: gpu.sigmoid, gpu.softmax, gpu.transpose ----------------
def float_kernel(dispatcher: Dispatcher, kernel: str, x: Any, *args: Any) -> Any:
    """Kernel ``sigmoid`` or ``softmax`` (``args``: its axis): float results, in ``x``'s float dtype
    (float32 for other dtypes)."""
    x = plain(np.asarray(x))
    dtype = np.result_type(x.dtype, np.float32)
    try:
        if not dispatcher.active or x.size == 0 or x.ndim == 0:
            raise Silently
        (operand,), lossy = _kernel_operands([x])
        x32 = np.asarray(operand)
        if kernel == "softmax":
            values32 = dispatcher.softmax(x32, normalize_axis_index(args[0] if args else -1, x.ndim))
        else:
            values32 = dispatcher.elementwise(kernel, [x32], x.shape)
        return dispatcher.wrap(result_of(dispatcher, kernel, values32, dtype, lossy, [x]))
    except (NotExact, Silently, launch.Unsupported) as exc:
        dispatcher.with_numpy(f"gpu.{kernel}", str(exc) or None)
        return dispatcher.wrap(np.asarray(HOST_OPS[kernel](x, *args), dtype))


def transpose_kernel(dispatcher: Dispatcher, x: Any, axes: tuple[int, ...] | None) -> Any:
    """``x`` with its axes permuted as a new contiguous array: the transpose kernel for float32 data."""
    x = plain(np.asarray(x))
    order = tuple(reversed(range(x.ndim))) if axes is None else normalize_axis_tuple(axes, x.ndim)
    if len(order) != x.ndim:
        raise ValueError("axes don't match array")
    if dispatcher.active and x.dtype == np.float32 and x.size and order != tuple(range(x.ndim)):
        try:
            return dispatcher.wrap(dispatcher.transpose(x, order))
        except launch.Unsupported:
            pass
    return dispatcher.wrap(np.ascontiguousarray(np.transpose(x, order)))
