"""The dispatcher: decides where each operation runs and runs it.

For every operation on DeviceArrays it checks, in order: is the runtime computing on the GPU at
all (``active``); is this kernel enabled for the arrays involved (a cell may enable only some
kernels: the others run with numpy, silently); can the kernel handle these inputs (booleans,
unusual dtypes, too many dimensions fall back to numpy with a one-time notice naming the
operation). Then it converts operands to float32 (float64 with a notice, integers only when
exact), launches the kernel and wraps the result in a new DeviceArray.

The dispatcher sits below the array class, which calls it for every operation: it knows device
arrays through the :class:`DeviceArrayLike` protocol and makes them with the class it is given
(``arrays.DeviceArray``, passed in by the runtime).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Protocol, Sequence, TypeGuard

import numpy as np

from remote_magic.errors import GpuError

from . import launch
from .context import DeviceContext
from .convert import FLOAT64_NOTICE, convertible, is_lossy_float, to_float32
from .host_ops import HOST_OPS
from .matmul import matmul as matmul_kernel
from .memory import Allocation
from .notices import Notices
from .stats import Stats

log = logging.getLogger(__name__)

try:  # numpy >= 2
    from numpy.lib.array_utils import normalize_axis_index, normalize_axis_tuple
except ImportError:  # numpy 1.x
    from numpy.core.multiarray import normalize_axis_index  # type: ignore[no-redef]
    from numpy.core.numeric import normalize_axis_tuple  # type: ignore[no-redef]


class DeviceArrayLike(Protocol):
    """What the dispatcher needs of a device array; ``arrays.DeviceArray`` is the class it is given."""

    def __init__(self, dispatcher: Dispatcher, shape: tuple[int, ...], *, alloc: Allocation | None = None,
                 ctx: DeviceContext | None = None, host: np.ndarray | None = None, dtype: Any = np.float32,
                 enabled: frozenset[str] | None = None) -> None: ...

    @property
    def _enabled(self) -> frozenset[str] | None:
        """The kernels its operations may use (None: all)."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> np.dtype[Any]: ...

    @property
    def ndim(self) -> int: ...

    @property
    def size(self) -> int: ...

    def buffer(self, ctx: DeviceContext) -> Allocation:
        """Its GPU buffer on ``ctx``, uploaded first if needed."""

    def host(self) -> np.ndarray:
        """Its values on the host (read back if needed)."""

    def reshape(self, *shape: Any) -> DeviceArrayLike: ...


class Dispatcher:
    """Runs operations on the current device, or with numpy when that is the right answer.

    ``array_type`` is the device-array class it makes results of (``arrays.DeviceArray``).
    """

    def __init__(self, open_context: Callable[[], DeviceContext] | None, stats: Stats, notices: Notices,
                 *, array_type: type[DeviceArrayLike], active: bool, matmul_threads: int = 16) -> None:
        self._array_type = array_type
        self._open_context = open_context
        self._ctx: DeviceContext | None = None
        self.stats = stats
        self.notices = notices
        self.active = active
        self.matmul_threads = matmul_threads
        self.inactive_notice: str | None = None
        """Said once when an operation computes with numpy because the dispatcher is inactive."""

    # -- the device ------------------------------------------------------------------------
    @property
    def ctx(self) -> DeviceContext:
        """The live device context, made anew (with a new device) after a loss."""
        if self._ctx is None or self._ctx.lost:
            if self._open_context is None:
                raise GpuError("no GPU device is available on this worker")
            if self._ctx is not None:
                log.warning("GPU device was lost; creating a new one")
                self._ctx.close()  # frees its pool; later releases of its buffers are ignored
                self._ctx = None
            self._ctx = self._open_context()
        return self._ctx

    @property
    def current_context(self) -> DeviceContext | None:
        """The context in use, without creating one."""
        return self._ctx

    def close(self) -> None:
        """Release the device context."""
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None

    # -- values ----------------------------------------------------------------------------
    def is_array(self, value: Any) -> TypeGuard[DeviceArrayLike]:
        """True if ``value`` is a device array (of the class this dispatcher makes)."""
        return isinstance(value, self._array_type)

    def asarray(self, value: Any, what: str = "the array", enabled: frozenset[str] | None = None,
                *, force: bool = False, notice: bool = True, copy: bool = False) -> Any:
        """``value`` as a DeviceArray (float32, or bool for boolean data); numpy when inactive.

        float64 data is converted with a notice; integers only when exact in float32. ``force``
        makes a DeviceArray even when the dispatcher computes with numpy (for custom kernels);
        ``copy`` detaches it from ``value``'s memory (for arrays handed back to user code).
        """
        if self.is_array(value):
            return value
        array = np.asarray(value)
        if not self.active and not force:
            return array
        if notice and is_lossy_float(array.dtype):
            self.notices.once("float64", FLOAT64_NOTICE)
        host = to_float32(array, what)
        if copy and np.may_share_memory(host, array):
            host = host.copy()
        dtype = np.bool_ if array.dtype.kind == "b" else np.float32
        return self._array_type(self, host.shape, host=host.astype(bool) if dtype is np.bool_ else host,
                                dtype=dtype, enabled=enabled)

    def wrap(self, alloc: Any, shape: tuple[int, ...], ctx: DeviceContext, sources: Sequence[Any],
             dtype: Any = np.float32) -> DeviceArrayLike:
        """A new DeviceArray for a kernel's result, inheriting which kernels its sources enable."""
        return self._array_type(self, shape, alloc=alloc, ctx=ctx, dtype=dtype, enabled=self._merged(sources))

    def download(self, array: DeviceArrayLike) -> np.ndarray:
        """Read ``array`` back from its device."""
        ctx = self.ctx
        values = ctx.download(array.buffer(ctx), array.size).reshape(array.shape)
        return values.astype(bool) if array.dtype == np.bool_ else values

    def _operand(self, value: Any) -> DeviceArrayLike | float | None:
        """An operand for a kernel: a DeviceArray, a float for the uniform, or None if unsupported."""
        if self.is_array(value):
            return value
        if isinstance(value, (bool, int, float)) and not isinstance(value, np.generic):
            with np.errstate(over="ignore"):  # beyond float32's range is ±inf, as numpy casts it
                return float(np.float32(float(value)))
        if isinstance(value, (list, tuple)):
            value = np.asarray(value)
        if not convertible(value):
            return None
        if np.ndim(value) == 0:
            if is_lossy_float(value.dtype):
                self.notices.once("float64", FLOAT64_NOTICE)
            return float(to_float32(value, "a scalar"))
        array: DeviceArrayLike = self.asarray(value, "an operand")
        return array

    def _array_operand(self, value: Any) -> DeviceArrayLike | None:
        """A single array argument (0-d included) as a DeviceArray, or None if unsupported."""
        if self.is_array(value):
            return value
        if isinstance(value, (bool, int, float, list, tuple)) and not isinstance(value, np.generic):
            value = np.asarray(value)
        if not convertible(value):
            return None
        array: DeviceArrayLike = self.asarray(value, "the argument")
        return array

    def _merged(self, sources: Sequence[Any]) -> frozenset[str] | None:
        """Kernels enabled for a result: all if any source enables all, else the union."""
        sets = [a._enabled for a in sources if self.is_array(a)]
        merged: frozenset[str] = frozenset()
        for enabled in sets:
            if enabled is None:
                return None
            merged |= enabled
        return merged if sets else None

    def _to_host(self, value: Any) -> Any:
        """Device arrays (also inside lists, tuples and dicts) replaced by their host values."""
        if self.is_array(value):
            return value.host()
        if isinstance(value, (list, tuple)):
            return type(value)(self._to_host(v) for v in value) if not hasattr(value, "_fields") else value
        if isinstance(value, dict):
            return {k: self._to_host(v) for k, v in value.items()}
        return value

    # -- where an operation runs -------------------------------------------------------------
    def notice_inactive(self) -> None:
        """Say (once) why operations compute with numpy, if the runtime gave a reason."""
        if self.inactive_notice:
            self.notices.once("inactive", self.inactive_notice)

    def _on_host(self, name: str, args: Sequence[Any], explicit: bool) -> bool:
        """True when ``name`` must run with numpy without a kernel notice (inactive, or not enabled)."""
        if not self.active:
            self.notice_inactive()
            return True
        if explicit:
            return False
        arrays = [a for a in args if self.is_array(a)]
        enabled = self._merged(arrays)
        return enabled is not None and name not in enabled

    def host_op(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Run the numpy version of kernel ``name`` on host copies of the arguments, silently."""
        if self.active:
            self.stats.numpy[name] += 1
        return HOST_OPS[name](*self._to_host(args), **kwargs)

    def fallback(self, name: str, func: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any],
                 *, notice: bool = True) -> Any:
        """Compute ``func`` with numpy on host copies, with a one-time notice naming ``name``."""
        if notice and self.active:
            self.notices.once(f"fallback:{name}", f"{name} has no GPU kernel for these inputs; "
                              "computed with numpy on the worker (shown once)")
        self.stats.numpy[name] += 1
        return func(*self._to_host(args), **self._to_host(kwargs))

    # -- operations ------------------------------------------------------------------------
    def elementwise(self, name: str, *args: Any, explicit: bool = False) -> Any:
        """Unary or binary elementwise kernel ``name`` (numpy broadcasting)."""
        if self._on_host(name, args, explicit):
            return self.host_op(name, *args)
        operands = [self._operand(a) for a in args]
        arrays = [op for op in operands if self.is_array(op)]
        if any(op is None for op in operands) or not arrays or all(a.dtype == np.bool_ for a in arrays):
            return self.fallback(_label(name), HOST_OPS[name], args, {})
        out_shape = tuple(np.broadcast_shapes(*(a.shape for a in arrays)))
        ctx = self.ctx
        launch_ops: list[launch.Operand] = [op if isinstance(op, float) else (op.buffer(ctx), op.shape)
                                             for op in operands if op is not None]
        try:
            alloc = launch.elementwise(ctx, name, launch_ops, out_shape)
        except launch.Unsupported:
            return self.fallback(_label(name), HOST_OPS[name], args, {})
        dtype = np.bool_ if name in launch.COMPARISONS else np.float32
        return self.wrap(alloc, out_shape, ctx, arrays, dtype)

    def reduce(self, name: str, x: Any, axis: Any = None, keepdims: bool = False, *, explicit: bool = False) -> Any:
        """Reduction ``name`` (sum, mean, max, min) over ``axis`` (None: all axes)."""
        if self._on_host(name, (x,), explicit):
            return self.host_op(name, x, axis=axis, keepdims=keepdims)
        x = _first(self._array_operand(x), x)
        if not self.is_array(x) or x.dtype == np.bool_:
            return self.fallback(f"np.{name}", HOST_OPS[name], (x,), {"axis": axis, "keepdims": keepdims})
        axes = tuple(range(x.ndim)) if axis is None else normalize_axis_tuple(axis, x.ndim)
        if x.size == 0:  # numpy's rules for empty reductions (0, NaN or an error) are the answer
            result = HOST_OPS[name](x.host(), axis=axis, keepdims=keepdims)
            return self.asarray(np.asarray(result, np.float32), enabled=x._enabled)
        ctx = self.ctx
        alloc, shape = x.buffer(ctx), list(x.shape)
        for first, last in reversed(_runs(sorted(axes))):
            outer = int(np.prod(shape[:first], dtype=np.int64))
            length = int(np.prod(shape[first:last + 1], dtype=np.int64))
            inner = int(np.prod(shape[last + 1:], dtype=np.int64))
            alloc = launch.reduce(ctx, name, alloc, outer, length, inner)
            shape[first:last + 1] = [1] * (last + 1 - first) if keepdims else []
        return self.wrap(alloc, tuple(shape), ctx, [x])

    def softmax(self, x: Any, axis: int = -1, *, explicit: bool = False) -> Any:
        """Numerically stable softmax along ``axis``."""
        if self._on_host("softmax", (x,), explicit):
            return self.host_op("softmax", x, axis=axis)
        x = _first(self._array_operand(x), x)
        if not self.is_array(x) or x.dtype == np.bool_ or x.ndim == 0:
            return self.fallback("softmax", HOST_OPS["softmax"], (x,), {"axis": axis})
        axis = normalize_axis_index(axis, x.ndim)
        ctx = self.ctx
        outer = int(np.prod(x.shape[:axis], dtype=np.int64))
        inner = int(np.prod(x.shape[axis + 1:], dtype=np.int64))
        alloc = launch.softmax(ctx, x.buffer(ctx), outer, x.shape[axis], inner)
        return self.wrap(alloc, x.shape, ctx, [x])

    def transpose(self, x: Any, axes: Sequence[int] | None = None, *, explicit: bool = False) -> Any:
        """``x`` with axes permuted (reversed by default), as a new contiguous array."""
        if self._on_host("transpose", (x,), explicit):
            return self.host_op("transpose", x, axes)
        x = _first(self._array_operand(x), x)
        if not self.is_array(x):
            return self.fallback("np.transpose", np.transpose, (x,), {"axes": axes})
        order = tuple(reversed(range(x.ndim))) if axes is None else normalize_axis_tuple(tuple(axes), x.ndim)
        if len(order) != x.ndim:
            raise ValueError("axes don't match array")
        if order == tuple(range(x.ndim)):
            return x
        ctx = self.ctx
        alloc = launch.transpose(ctx, x.buffer(ctx), x.shape, order)
        return self.wrap(alloc, tuple(x.shape[a] for a in order), ctx, [x], x.dtype)

    def matmul(self, a: Any, b: Any, *, explicit: bool = False) -> Any:
        """numpy's matmul: batched, with leading dimensions broadcast and 1-D operands promoted."""
        if self._on_host("matmul", (a, b), explicit):
            return self.host_op("matmul", a, b)
        ops = [self._operand(v) for v in (a, b)]
        for i, op in enumerate(ops):
            if isinstance(op, float) or (self.is_array(op) and op.ndim == 0):
                raise ValueError(f"matmul: Input operand {i} does not have enough dimensions "
                                 "(has 0, gufunc core with signature (n?,k),(k,m?)->(n?,m?) requires 1)")
        x, y = ops
        if not self.is_array(x) or not self.is_array(y) or (
                x.dtype == np.bool_ and y.dtype == np.bool_):
            return self.fallback("np.matmul", np.matmul, (a, b), {})
        x2 = x.reshape(1, x.shape[0]) if x.ndim == 1 else x
        y2 = y.reshape(y.shape[0], 1) if y.ndim == 1 else y
        if x2.shape[-1] != y2.shape[-2]:
            raise ValueError(f"matmul: Input operand 1 has a mismatch in its core dimension 0, with gufunc "
                             f"signature (n?,k),(k,m?)->(n?,m?) (size {y2.shape[-2]} is different from {x2.shape[-1]})")
        ctx = self.ctx
        try:
            alloc, shape = matmul_kernel(ctx, x2.buffer(ctx), x2.shape, y2.buffer(ctx), y2.shape,
                                         self.matmul_threads)
        except launch.Unsupported:
            return self.fallback("np.matmul", np.matmul, (a, b), {})
        if x.ndim == 1:
            shape = shape[:-2] + shape[-1:]
        if y.ndim == 1:
            shape = shape[:-1]
        return self.wrap(alloc, shape, ctx, [x, y])


def _first(converted: Any, original: Any) -> Any:
    """``converted`` unless it is None (no ``or``: a DeviceArray's truth value reads it back)."""
    return original if converted is None else converted


def _label(name: str) -> str:
    """How a notice names kernel ``name``: ``np.exp`` for numpy's functions, ``gpu.relu`` else."""
    return f"np.{name}" if hasattr(np, name) else f"gpu.{name}"


def _runs(axes: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted axes grouped into runs of neighbours: [0, 1, 3] -> [(0, 1), (3, 3)]."""
    runs: list[tuple[int, int]] = []
    for axis in axes:
        if runs and runs[-1][1] == axis - 1:
            runs[-1] = (runs[-1][0], axis)
        else:
            runs.append((axis, axis))
    return runs

