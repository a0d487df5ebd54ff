"""numpy's counting and order functions as kernels: bincount, ``np.add.at``, sort, partition, median and
quantiles, unique; each gives numpy's answer or raises for numpy to give it (``numpy_kernels``' rules).

* ``np.bincount`` adds 1 (or a float32 weight) into a slot per value with atomics (``counting.wgsl``).
  Counts are exact. Weighted sums are float32 sums in whatever order the GPU adds them, where numpy
  sums in float64: a float64 result holding float32 precision, said once like any float64 result
  computed in float32. Weights of other dtypes are numpy's.
* ``np.add.at(a, indices, values)`` (an array of indices, or a tuple of them for the leading dimensions)
  adds into a copy of ``a``'s values with atomics, then writes them into ``a``: 32-bit and smaller
  integers wrap around as numpy's; int64 only where every sum fits int32 (checked from the ranges);
  float32 within the rounding of another order. float64 is numpy's.
* ``np.partition``, ``np.argpartition`` and their methods sort along the axis (``sort.wgsl``): a sorted
  row is a partition for every ``kth``. numpy guarantees only the element at ``kth`` and the split (none
  before it larger, none after it smaller); the order within each side is its implementation's, so it
  may differ from numpy's.
* ``np.median``, ``np.percentile`` and ``np.quantile`` (any method) sort along the axis on the GPU;
  numpy's own code then reads the sorted values (the middle one or two for the median; its selection
  finds every value in place for the others), so NaN gives NaN and the interpolation is numpy's.
* ``np.unique`` (with its counts, indices and inverse) sorts, marks where runs of equal values start
  and compacts them (``unique.wgsl``).

* ``np.sort``, ``x.sort()`` and stable ``np.argsort`` along the last axis or flattened: the same sort.

Values are ordered natively: float32 bit for bit, booleans and integers as int32 or uint32 when every
value fits (:func:`sort_operand`). float64 is numpy's: a float32 copy would make ties.
"""

from __future__ import annotations

import operator
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np

from remote_magic.errors import GpuLimitError

from .convert import NotExact, is_lossy_float
from .dispatch import Dispatcher
from .numpy_kernels import INT32, UINT32, Silently, deliver, merged, plain, result_of, value_range, worth_a_kernel
from .unique import MAX_VALUES

try:  # numpy >= 2
    from numpy.lib.array_utils import normalize_axis_index, normalize_axis_tuple
except ImportError:  # numpy 1.x
    from numpy.core.multiarray import normalize_axis_index  # type: ignore[no-redef]
    from numpy.core.numeric import normalize_axis_tuple  # type: ignore[no-redef]

NATIVE = {"i": np.dtype(np.int32), "u": np.dtype(np.uint32)}
"""How integers of at most 32 bits add on the GPU (wrapping around as their own width does)."""


@contextmanager
def within_bindings() -> Iterator[None]:
    """A kernel's :class:`GpuLimitError` (more than one binding holds) as NotExact: numpy computes it."""
    try:
        yield
    except GpuLimitError:
        raise NotExact("with arrays larger than this GPU binds at once") from None


def _array(value: Any) -> np.ndarray:
    """A numpy call's array operand as the plain array numpy sees (lists too); Silently for anything else."""
    value = plain(value)
    if isinstance(value, (list, tuple)):
        value = np.asarray(value)
    if not isinstance(value, np.ndarray):
        raise Silently
    return value


# -- counting ----------------------------------------------------------------------------------
def bincount(dispatcher: Dispatcher, x: Any, weights: Any = None, minlength: Any = 0) -> Any:
    """``np.bincount(x, weights, minlength)`` of non-negative integers, without weights or with float32 ones."""
    values = _array(x)
    if values.ndim != 1 or values.size == 0 or values.dtype.kind not in "biu" \
            or not np.can_cast(values.dtype, np.intp, "safe"):
        raise Silently  # numpy's answer, or its error
    try:
        least = operator.index(minlength)
    except TypeError:
        raise Silently from None
    worth_a_kernel(dispatcher, values.size)
    low, high = value_range(values)
    if low < 0 or least < 0:
        raise Silently  # numpy's ValueError
    slots = max(high + 1, least)
    if 4 * slots > dispatcher.ctx.max_binding:
        raise NotExact(f"with {slots:,} bins, more than this GPU binds at once")
    index = values.astype(np.int32)
    if weights is None:
        with within_bindings():
            counts = dispatcher.scatter_add("bincount", None, slots, index, 1, adds="integers")
        return deliver(dispatcher, counts.astype(np.intp), None, "same_kind", [x])
    w = _array(weights)
    if w.shape != values.shape:
        raise Silently
    if w.dtype != np.float32:
        raise NotExact(f"with {w.dtype} weights")
    with within_bindings():
        sums = dispatcher.scatter_add("bincount", None, slots, index, w, adds="float32").view(np.float32)
    return deliver(dispatcher, result_of(dispatcher, "bincount", sums, np.dtype(np.float64), True, [w]), None,
                   "same_kind", [x, weights])


def add_at(dispatcher: Dispatcher, inputs: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """``np.add.at(a, indices, values)`` with integer index arrays (one, or a tuple of them for a's leading
    dimensions): in place, as numpy's."""
    if kwargs or len(inputs) != 3:
        raise Silently
    a = plain(inputs[0])
    if not isinstance(a, np.ndarray) or a.ndim == 0 or a.size == 0 or not a.flags.writeable:
        raise Silently
    index, leading = _flat_index(a, plain(inputs[1]))
    if index.size == 0:
        raise Silently
    worth_a_kernel(dispatcher, index.size, a)
    rows = (index.size,) + a.shape[leading:]
    values = _added_values(a, plain(inputs[2]), rows)
    start, adds, native = _addends(a, values, index.size)
    if not isinstance(values, (int, float)):
        values = np.ascontiguousarray(np.broadcast_to(values, rows)).astype(native, copy=False)
    elif adds == "float32":
        values = int(np.float32(values).view(np.uint32))
    else:
        values = int(values) & 0xFFFFFFFF
    start = start.reshape((-1,) + a.shape[leading:])  # rows of the leading dimensions flattened
    with within_bindings():
        bits = dispatcher.scatter_add("add_at", start, a.size, index, values, adds=adds)
    result = bits.view(native).reshape(a.shape)
    if adds == "float32" and not np.isfinite(result).all():
        raise Silently  # NaN and infinities, and their warnings, are numpy's (``a`` is as it was)
    np.copyto(a, result, casting="unsafe")  # integers wrap around to a's width, as numpy's sums do


def _flat_index(a: np.ndarray, index: Any) -> tuple[np.ndarray, int]:
    """``np.add.at``'s indices as one int32 index into a's first k dimensions flattened, and k: one array (or
    list) of integers, or a tuple of such arrays of one length, one a leading dimension. Negative indices
    count from the end (of a one-array index, in the kernel). Raises for the rest, numpy's."""
    parts = index if isinstance(index, tuple) else (index,)
    arrays = [np.asarray(plain(part)) for part in parts]
    if not 0 < len(arrays) <= a.ndim or any(p.ndim != 1 or p.dtype.kind not in "iu" for p in arrays) \
            or len({p.size for p in arrays}) != 1:
        raise NotExact("with indices other than integer arrays, one a leading dimension")
    for part, extent in zip(arrays, a.shape):
        low, high = value_range(part)
        if low < -extent or high >= extent:
            raise Silently  # numpy's IndexError
    if len(arrays) == 1:
        return arrays[0].astype(np.int32), 1
    flat = np.zeros(arrays[0].size, np.int64)
    for part, extent in zip(arrays, a.shape):
        flat = flat * extent + np.where(part < 0, part + extent, part)
    return flat.astype(np.int32), len(arrays)


def _added_values(a: np.ndarray, values: Any, rows: tuple[int, ...]) -> np.ndarray | int | float:
    """``np.add.at``'s values as one Python number (added to every place) or an array of a's dtype that
    broadcasts to ``rows``; raises where numpy's loop would be another dtype's (or numpy raises)."""
    if isinstance(values, (list, tuple)):
        values = np.asarray(values)
    if isinstance(values, np.ndarray) and values.ndim:
        if values.dtype != a.dtype:
            raise NotExact(f"with {values.dtype} values into {a.dtype}")
        try:
            if np.broadcast_shapes(values.shape, rows) != rows:
                raise Silently
        except ValueError:
            raise Silently from None
        return values.reshape(()).item() if values.size == 1 and values.ndim <= len(rows) else values
    if isinstance(values, (bool, np.bool_)) or not isinstance(values, (int, float, np.generic, np.ndarray)):
        raise Silently
    if isinstance(values, (np.generic, np.ndarray)):
        if values.dtype != a.dtype:
            raise NotExact(f"with {values.dtype} values into {a.dtype}")
        return values.item()  # type: ignore[no-any-return]
    if np.result_type(a.dtype, values) != a.dtype:
        raise NotExact(f"with {type(values).__name__} values into {a.dtype}")
    if a.dtype.kind in "iu" and not np.iinfo(a.dtype).min <= values <= np.iinfo(a.dtype).max:
        raise Silently  # numpy's OverflowError
    return values


def _addends(a: np.ndarray, values: np.ndarray | int | float, count: int) -> tuple[np.ndarray, str, np.dtype[Any]]:
    """``a``'s values as the scatter-add starts from, how they add, and the dtype they add in: float32;
    integers of at most 32 bits (their sums wrap around as numpy's, once cast back); 64-bit integers only
    where ``a``'s values and every sum of ``count`` values fit int32."""
    if a.dtype == np.float32:
        return np.ascontiguousarray(a), "float32", a.dtype
    if a.dtype.kind not in "iu":
        raise NotExact(f"with {a.dtype} arrays")
    native = NATIVE[a.dtype.kind]
    if a.dtype.itemsize > 4:
        (a_low, a_high), (v_low, v_high) = value_range(a), value_range(values)
        if not (INT32[0] <= a_low + count * min(v_low, 0) and a_high + count * max(v_high, 0) <= INT32[1]):
            raise NotExact(f"with {a.dtype} sums beyond 32 bits")
        native = np.dtype(np.int32)
    return a.astype(native), "integers", native


# -- order -------------------------------------------------------------------------------------
def sort_operand(a: np.ndarray) -> np.ndarray:
    """``a``'s values as the sort kernel orders them: float32 as they are; booleans and integers natively,
    as int32 or uint32, where every value fits one (checked for 64-bit integers). Raises NotExact for the
    rest: float64 among them (a float32 copy would lose digits and make ties), which numpy orders."""
    kind, size = a.dtype.kind, a.dtype.itemsize
    if a.dtype == np.float32:
        return a
    if is_lossy_float(a.dtype):
        raise NotExact(f"with {a.dtype} values")
    if kind == "b" or (kind == "u" and size <= 4):
        return a.astype(np.uint32, copy=False)
    if kind == "i" and size <= 4:
        return a.astype(np.int32, copy=False)
    if kind in "iu":
        low, high = value_range(a)
        if INT32[0] <= low and high <= INT32[1]:
            return a.astype(np.int32)
        if UINT32[0] <= low and high <= UINT32[1]:
            return a.astype(np.uint32)
        raise NotExact(f"with {a.dtype} values beyond 32 bits")
    raise NotExact(f"with {a.dtype} values")


def sort(dispatcher: Dispatcher, a: Any, axis: Any = -1, kind: Any = None, order: Any = None, *,
         stable: Any = None, indices: bool = False) -> Any:
    """``np.sort`` (and with ``indices``, ``np.argsort``) along any axis or of the flattened array: the sort
    kernel, whose order is numpy's stable sort. So argsort runs it only when asked for a stable one
    (``kind="stable"``): numpy's default may order equal values otherwise. float64 is numpy's (a float32
    copy would lose digits and make ties)."""
    stable_asked = kind == "stable" or stable is True
    if order is not None or (indices and not stable_asked):
        raise Silently
    values = plain(a)
    if not stable_asked and isinstance(values, np.ndarray) and values.dtype.kind == "f" and (
            np.signbit(values) & (values == 0)).any():
        raise Silently  # numpy's default sort may put -0.0 after an equal 0.0; the stable one never does
    a, ordered, order_found, axes = _sorted_rows(dispatcher, "sort", a, axis, indices=indices)
    return deliver(dispatcher, _back(ordered if order_found is None else order_found, axes), None, "same_kind",
                   [a])


def argsort(dispatcher: Dispatcher, a: Any, axis: Any = -1, kind: Any = None, order: Any = None, *,
            stable: Any = None) -> Any:
    """``np.argsort(a, kind="stable")``: :func:`sort`'s indices."""
    return sort(dispatcher, a, axis, kind, order, stable=stable, indices=True)


def _sorted_rows(dispatcher: Dispatcher, kernel: str, a: Any, axis: Any, *, indices: bool = False,
                 several: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, tuple[int, ...] | None]:
    """``a`` (plain), its values sorted along ``axis`` moved to the last axis (all values for None; with
    ``several`` a tuple of axes too, flattened into one), with ``indices`` the int64 indices that sort them,
    and the sorted axes (None: all). Dispatches count as ``kernel``."""
    a = plain(a)
    if not isinstance(a, np.ndarray) or a.size == 0 or a.ndim == 0:
        raise Silently
    try:
        if axis is None:
            axes = None
        elif several and isinstance(axis, tuple):
            axes = tuple(normalize_axis_tuple(axis, a.ndim))
        else:
            axes = (normalize_axis_index(operator.index(axis), a.ndim),)
    except Exception:
        raise Silently from None
    if axes == ():
        raise Silently
    worth_a_kernel(dispatcher, a.size)
    if axes is None:
        rows: np.ndarray = a.reshape(-1)
    else:
        moved = np.moveaxis(a, axes, range(a.ndim - len(axes), a.ndim))
        rows = moved.reshape(moved.shape[:a.ndim - len(axes)] + (-1,))
    values = np.ascontiguousarray(sort_operand(rows))
    with within_bindings():
        ordered, order = dispatcher.sort(values, indices=indices, name=kernel)
    return a, ordered.astype(a.dtype, copy=False), order, axes


def _back(rows: np.ndarray, axes: tuple[int, ...] | None) -> np.ndarray:
    """:func:`_sorted_rows`' rows (or their indices) along one axis, with it back in its place (None: flat)."""
    return rows if axes is None else np.ascontiguousarray(np.moveaxis(rows, -1, axes[0]))


def _kth_within(kth: Any, length: int) -> None:
    """Silently unless ``kth`` is integers each within ``length``'s range (numpy's error otherwise)."""
    k = np.asarray(kth)
    if k.dtype.kind not in "iu" or k.ndim > 1 or k.size == 0:
        raise Silently
    low, high = value_range(k)
    if low < -length or high >= length:
        raise Silently


def partition(dispatcher: Dispatcher, a: Any, kth: Any, axis: Any = -1, kind: Any = "introselect",
              order: Any = None, *, indices: bool = False) -> Any:
    """``np.partition`` (with ``indices``, ``np.argpartition``): the rows sorted, which is a partition at every
    ``kth``, numpy's at ``kth`` itself (see the module docstring)."""
    if kind != "introselect" or order is not None:
        raise Silently
    a, ordered, order_found, axes = _sorted_rows(dispatcher, "partition", a, axis, indices=indices)
    _kth_within(kth, ordered.shape[-1])  # (numpy raises for the rest: rare enough to sort for nothing)
    return deliver(dispatcher, _back(ordered if order_found is None else order_found, axes), None, "same_kind",
                   [a])


def argpartition(dispatcher: Dispatcher, a: Any, kth: Any, axis: Any = -1, kind: Any = "introselect",
                 order: Any = None) -> Any:
    """``np.argpartition``: :func:`partition`'s indices."""
    return partition(dispatcher, a, kth, axis, kind, order, indices=True)


def median(dispatcher: Dispatcher, a: Any, axis: Any = None, out: Any = None, overwrite_input: bool = False,
           keepdims: bool = False) -> Any:
    """``np.median`` along one axis or of all values: numpy's median of the middle one or two sorted values
    (NaN where a row's last sorted value is NaN, as numpy checks)."""
    if out is not None:
        raise Silently
    a, ordered, _, axes = _sorted_rows(dispatcher, "median", a, axis, several=True)
    half = ordered.shape[-1] // 2
    middle = ordered[..., half - 1:half + 1] if ordered.shape[-1] % 2 == 0 else ordered[..., half:half + 1]
    if ordered.dtype.kind == "f":
        last = ordered[..., -1:]
        middle = np.where(np.isnan(last), last, middle)
    result = np.asarray(np.median(middle, axis=-1))
    return deliver(dispatcher, _kept(result, a.shape, axes) if keepdims else result, None, "same_kind", [a])


def _kept(result: np.ndarray, shape: tuple[int, ...], axes: tuple[int, ...] | None) -> np.ndarray:
    """A median's or quantiles' ``result`` (q's dimensions first, then the axes of ``shape`` not reduced) as
    numpy's with keepdims: the reduced ``axes`` (all, for None) kept with length 1."""
    reduced = range(len(shape)) if axes is None else axes
    q_dims = result.ndim - (len(shape) - len(reduced))
    return result.reshape(result.shape[:q_dims] + tuple(1 if d in reduced else n for d, n in enumerate(shape)))


def _quantile(dispatcher: Dispatcher, kernel: str, a: Any, q: Any, axis: Any, options: dict[str, Any]) -> Any:
    """``np.percentile`` or ``np.quantile`` (``kernel``), any method, along one axis or of all values: numpy's
    own function on the rows sorted on the GPU. ``out=``, weights and the old ``interpolation=`` are numpy's."""
    if any(options.get(name) is not None for name in ("out", "weights", "interpolation")) \
            or set(options) - {"out", "overwrite_input", "method", "keepdims", "weights", "interpolation"}:
        raise Silently
    function, method = getattr(np, kernel), options.get("method", "linear")
    q = plain(q)
    try:
        function(np.zeros(1, plain(a).dtype), q, method=method)  # numpy's errors for q and method, before a kernel
    except Exception:
        raise Silently from None
    a, ordered, _, axes = _sorted_rows(dispatcher, kernel, a, axis, several=True)
    result = np.asarray(function(ordered, q, axis=-1, method=method, overwrite_input=True))  # on sorted values
    return deliver(dispatcher, _kept(result, a.shape, axes) if options.get("keepdims") else result, None,
                   "same_kind", [a])


def percentile(dispatcher: Dispatcher, a: Any, q: Any, axis: Any = None, **options: Any) -> Any:
    """``np.percentile(a, q, axis, ...)``: see :func:`_quantile`."""
    return _quantile(dispatcher, "percentile", a, q, axis, options)


def quantile(dispatcher: Dispatcher, a: Any, q: Any, axis: Any = None, **options: Any) -> Any:
    """``np.quantile(a, q, axis, ...)``: see :func:`_quantile`."""
    return _quantile(dispatcher, "quantile", a, q, axis, options)


def unique(dispatcher: Dispatcher, ar: Any, return_index: bool = False, return_inverse: bool = False,
           return_counts: bool = False, axis: Any = None, *, equal_nan: bool = True, sorted: bool = True) -> Any:
    """``np.unique`` of all values, with where each first comes, each value's place among them and how many
    times each comes, as asked: sorted on the GPU, runs of equal values (-0.0 and 0.0; every NaN) found and
    compacted there."""
    if axis is not None or equal_nan is not True or sorted is not True:
        raise Silently
    x = plain(ar)
    if not isinstance(x, np.ndarray) or x.size == 0:
        raise Silently
    if x.size > MAX_VALUES:
        raise NotExact(f"with more than {MAX_VALUES:,} values")
    worth_a_kernel(dispatcher, x.size)
    values = np.ascontiguousarray(sort_operand(x.reshape(-1)))
    with within_bindings():
        runs = dispatcher.unique(values, firsts=bool(return_index), inverse=bool(return_inverse))
    results = [runs.values.astype(x.dtype, copy=False)]
    if runs.firsts is not None:
        results.append(runs.firsts)
    if runs.inverse is not None:  # numpy 2 gives it the input's shape, numpy 1 flat: as its own answer for one value
        inverse_ndim = np.unique(np.zeros((1,) * x.ndim, x.dtype), return_inverse=True)[1].ndim
        results.append(runs.inverse.reshape(x.shape if inverse_ndim == x.ndim else (-1,)))
    if return_counts:
        results.append(np.diff(runs.starts, append=x.size))
    arrays = [dispatcher.wrap(result, merged(dispatcher, [ar])) for result in results]  # arrays, 0-d too
    return arrays[0] if len(arrays) == 1 else tuple(arrays)
