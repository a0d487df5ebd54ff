"""DeviceArray: a float32 array that lives in GPU memory between operations.

Operators and numpy functions on a DeviceArray run as GPU kernels and return DeviceArrays, so
a chain of operations moves no data; values come back to the host only when asked for
(``numpy()``, ``np.asarray``, printing, or at the end of a GPU cell). Operations without a kernel
fall back to numpy with a one-time notice. Comparisons give boolean DeviceArrays (stored as
0.0/1.0). DeviceArrays are immutable: there is no item assignment or in-place operator (``x +=
1`` rebinds ``x`` to a new array).

An array made from host data keeps that data (read-only) and uploads it on first use; an array
computed on the GPU caches its values on the host after the first readback.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from remote_magic.errors import GpuError

from .context import DeviceContext
from .dispatch import Dispatcher
from .memory import Allocation
from .numpy_api import array_function, array_ufunc


class DeviceArray:
    """A float32 (or boolean) array in GPU memory; see the module docstring."""

    __array_priority__ = 1000  # win over ndarray in mixed binary operators
    __slots__ = ("_dispatcher", "_shape", "_dtype", "_alloc", "_ctx", "_host", "_enabled")
    __hash__ = None  # type: ignore[assignment]  # == is elementwise, as in numpy

    def __init__(self, dispatcher: Dispatcher, shape: tuple[int, ...], *, alloc: Allocation | None = None,
                 ctx: DeviceContext | None = None, host: np.ndarray | None = None,
                 dtype: Any = np.float32, enabled: frozenset[str] | None = None) -> None:
        self._dispatcher = dispatcher
        self._shape = tuple(int(s) for s in shape)
        self._dtype = np.dtype(dtype)
        self._alloc = alloc
        self._ctx = ctx
        self._host = host
        self._enabled = enabled
        if host is not None:  # a read-only view: the caller's array keeps its own flags
            self._host = host.view()
            self._host.flags.writeable = False

    # -- what it is ----------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        """The array's dimensions."""
        return self._shape

    @property
    def dtype(self) -> np.dtype[Any]:
        """float32, or bool for the result of a comparison."""
        dtype: np.dtype[Any] = self._dtype
        return dtype

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self._shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        return int(np.prod(self._shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        """Bytes the values take on the GPU (4 per element)."""
        return 4 * self.size

    @property
    def T(self) -> Any:
        """The array with its axes reversed (a transpose kernel)."""
        return self.transpose()

    # -- data movement -------------------------------------------------------------------
    def buffer(self, ctx: DeviceContext) -> Allocation:
        """This array's GPU buffer on ``ctx``, uploading the host copy first if needed."""
        if self._alloc is not None and self._ctx is ctx:
            return self._alloc
        if self._host is None:
            raise GpuError("this array lived only on a GPU device that has since been lost; "
                           "run the cell again to recompute it")
        self._alloc = ctx.upload(self._host)
        self._ctx = ctx
        return self._alloc

    def host(self) -> np.ndarray:
        """The values on the host (read-only, cached after the first readback)."""
        if self._host is None:
            self._host = self._dispatcher.download(self)
            self._host.flags.writeable = False
        return self._host

    def numpy(self) -> np.ndarray:
        """A writeable numpy copy of the values (reads back from the GPU if needed)."""
        return np.array(self.host(), copy=True)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        data = self.host()
        if dtype is not None and np.dtype(dtype) != data.dtype:
            return data.astype(dtype)
        return np.array(data, copy=True) if copy else data

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        return array_ufunc(self._dispatcher, ufunc, method, inputs, kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        return array_function(self._dispatcher, func, args, kwargs)

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickle as the numpy array it holds (read back), so results leave as plain arrays."""
        return self.numpy().__reduce_ex__(protocol)

    # -- methods -------------------------------------------------------------------------
    def sum(self, axis: Any = None, keepdims: bool = False) -> Any:
        """Sum over ``axis`` (an int, a tuple, or None for all): a DeviceArray, or numpy's result
        when the cell did not enable this kernel."""
        return self._dispatcher.reduce("sum", self, axis, keepdims)

    def mean(self, axis: Any = None, keepdims: bool = False) -> Any:
        """Mean over ``axis``."""
        return self._dispatcher.reduce("mean", self, axis, keepdims)

    def max(self, axis: Any = None, keepdims: bool = False) -> Any:
        """Maximum over ``axis`` (NaN if any value is NaN)."""
        return self._dispatcher.reduce("max", self, axis, keepdims)

    def min(self, axis: Any = None, keepdims: bool = False) -> Any:
        """Minimum over ``axis`` (NaN if any value is NaN)."""
        return self._dispatcher.reduce("min", self, axis, keepdims)

    def transpose(self, *axes: Any) -> Any:
        """The array with axes permuted (reversed when none are given), as numpy's."""
        one_sequence = len(axes) == 1 and (axes[0] is None or isinstance(axes[0], (tuple, list)))
        order = tuple(axes[0] or ()) if one_sequence else axes
        return self._dispatcher.transpose(self, order or None)

    def reshape(self, *shape: Any) -> "DeviceArray":
        """The same values with a new shape (no copy; one dimension may be -1)."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        new_shape = _infer_shape(tuple(int(s) for s in shape), self.size)
        host = self._host.reshape(new_shape) if self._host is not None else None
        return DeviceArray(self._dispatcher, new_shape, alloc=self._alloc, ctx=self._ctx, host=host, dtype=self._dtype,
                           enabled=self._enabled)

    def astype(self, dtype: Any) -> Any:
        """float32 stays a DeviceArray; any other dtype reads the values back as numpy."""
        if np.dtype(dtype) == self._dtype:
            return self
        return self._dispatcher.fallback("astype", lambda x: np.asarray(x).astype(dtype), (self,), {}, notice=False)

    def copy(self) -> "DeviceArray":
        """The same values (arrays are immutable, so this is the array itself)."""
        return self

    # -- operators: all through numpy's ufuncs, which come back to __array_ufunc__ --------
    def __add__(self, other: Any) -> Any: return np.add(self, other)
    def __radd__(self, other: Any) -> Any: return np.add(other, self)
    def __sub__(self, other: Any) -> Any: return np.subtract(self, other)
    def __rsub__(self, other: Any) -> Any: return np.subtract(other, self)
    def __mul__(self, other: Any) -> Any: return np.multiply(self, other)
    def __rmul__(self, other: Any) -> Any: return np.multiply(other, self)
    def __truediv__(self, other: Any) -> Any: return np.divide(self, other)
    def __rtruediv__(self, other: Any) -> Any: return np.divide(other, self)
    def __floordiv__(self, other: Any) -> Any: return np.floor_divide(self, other)
    def __rfloordiv__(self, other: Any) -> Any: return np.floor_divide(other, self)
    def __mod__(self, other: Any) -> Any: return np.remainder(self, other)
    def __rmod__(self, other: Any) -> Any: return np.remainder(other, self)
    def __pow__(self, other: Any) -> Any: return np.power(self, other)
    def __rpow__(self, other: Any) -> Any: return np.power(other, self)
    def __matmul__(self, other: Any) -> Any: return np.matmul(self, other)
    def __rmatmul__(self, other: Any) -> Any: return np.matmul(other, self)
    def __and__(self, other: Any) -> Any: return np.bitwise_and(self, other)
    def __rand__(self, other: Any) -> Any: return np.bitwise_and(other, self)
    def __or__(self, other: Any) -> Any: return np.bitwise_or(self, other)
    def __ror__(self, other: Any) -> Any: return np.bitwise_or(other, self)
    def __xor__(self, other: Any) -> Any: return np.bitwise_xor(self, other)
    def __rxor__(self, other: Any) -> Any: return np.bitwise_xor(other, self)
    def __invert__(self) -> Any: return np.invert(self)
    def __neg__(self) -> Any: return np.negative(self)
    def __pos__(self) -> "DeviceArray": return self
    def __abs__(self) -> Any: return np.absolute(self)
    def __lt__(self, other: Any) -> Any: return np.less(self, other)
    def __le__(self, other: Any) -> Any: return np.less_equal(self, other)
    def __gt__(self, other: Any) -> Any: return np.greater(self, other)
    def __ge__(self, other: Any) -> Any: return np.greater_equal(self, other)
    def __eq__(self, other: Any) -> Any: return np.equal(self, other)
    def __ne__(self, other: Any) -> Any: return np.not_equal(self, other)

    # -- host conveniences (each reads back) ---------------------------------------------
    def __getitem__(self, index: Any) -> Any:
        return self._dispatcher.fallback("indexing (x[...])", lambda x: x[index], (self,), {})

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of unsized object")
        return self._shape[0]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.host())

    def __bool__(self) -> bool:
        return bool(self.host())

    def __float__(self) -> float:
        return float(self.host())

    def __int__(self) -> int:
        return int(self.host())

    def __format__(self, spec: str) -> str:
        return format(self.host()[()] if not self._shape else self.host(), spec)

    def __repr__(self) -> str:
        text = np.array2string(self.host(), separator=", ", prefix="DeviceArray(")
        return f"DeviceArray({text}, dtype={self._dtype})"

    def __str__(self) -> str:
        return str(self.host())


def _infer_shape(shape: tuple[int, ...], size: int) -> tuple[int, ...]:
    """``shape`` with one -1 resolved so that it holds ``size`` elements, as numpy does."""
    unknown = [i for i, s in enumerate(shape) if s == -1]
    known = int(np.prod([s for s in shape if s != -1], dtype=np.int64))
    if len(unknown) > 1:
        raise ValueError("can only specify one unknown dimension")
    if unknown and known and size % known == 0:
        shape = shape[:unknown[0]] + (size // known,) + shape[unknown[0] + 1:]
    if int(np.prod(shape, dtype=np.int64)) != size or any(s < 0 for s in shape):
        raise ValueError(f"cannot reshape array of size {size} into shape {shape}")
    return shape
