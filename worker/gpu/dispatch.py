"""The dispatcher: runs kernels on host arrays' values, and keeps account of where work ran.

It owns the device context (made anew after a loss), the counters and the notices. Its kernel
methods take numpy values (float32 arrays, or Python floats carried in a uniform), upload them
through the context (an array whose values are already on the device, kept from an earlier
operation or cell, is found by its digest and not uploaded again), run the kernel, and read the
float32 result back. Which operations reach it, and in which dtype their results come back, is
``numpy_api``'s decision.

The dispatcher sits below the array class: it makes device arrays with the class the runtime
passes in (``arrays.DeviceArray``).
"""

from __future__ import annotations

import logging
import math
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from remote_magic.errors import GpuError

from . import arg_reduce, counting, gather, integer, launch, scan, select, sort, unique
from .context import DeviceContext
from .matmul import matmul as matmul_kernel
from .memory import Allocation
from .notices import Notices
from .stats import Stats

log = logging.getLogger(__name__)

Operand = np.ndarray | float
"""A kernel operand: a float32 array, or a Python float carried in the uniform."""


class Dispatcher:
    """Runs kernels on the current device and counts what ran where.

    ``array_type`` is the ndarray subclass results are viewed as (``arrays.DeviceArray``).
    """

    def __init__(self, open_context: Callable[[], DeviceContext] | None, stats: Stats, notices: Notices,
                 *, array_type: type[np.ndarray], active: bool, matmul_threads: int = 16, min_values: int = 1) -> None:
        self._array_type = array_type
        self._open_context = open_context
        self._ctx: DeviceContext | None = None
        self.stats = stats
        self.notices = notices
        self.active = active
        self.matmul_threads = matmul_threads
        self.min_values = min_values
        """Operations computing or reading fewer values than this run with numpy: a kernel costs more."""
        self.inactive_notice: str | None = None
        """Said once when a GPU cell computes with numpy because the dispatcher is inactive."""
        self.cell_inputs: dict[str, np.ndarray] = {}
        """The running GPU cell's input arrays by name, to name them in the float64 notice."""
        self.lossy: dict[str, None] = {}
        """Names of the arrays the running cell computed float64 results from in float32 (in order)."""
        self._depth = 0
        self.made = 0
        """Device arrays made since the runtime last turned them back into plain ones."""

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

    # -- arrays ------------------------------------------------------------------------------
    def is_array(self, value: Any) -> bool:
        """True if ``value`` is a device array (of the class this dispatcher makes)."""
        return isinstance(value, self._array_type)

    def wrap(self, values: np.ndarray, enabled: frozenset[str] | None = None) -> Any:
        """``values`` viewed as a device array whose operations this dispatcher runs (no copy)."""
        array = values.view(self._array_type)
        self.made += 1
        array._dispatcher = self  # type: ignore[attr-defined]
        array._enabled = enabled  # type: ignore[attr-defined]
        return array

    def note_lossy(self, operands: Sequence[Any]) -> None:
        """Remember the arrays a float64 result was computed from in float32, by the cell's input names
        (or as arrays the cell made), for the cell's notice."""
        for operand in operands:
            if isinstance(operand, np.ndarray):
                names = [name for name, value in self.cell_inputs.items() if np.may_share_memory(value, operand)]
                for name in names or ["arrays the cell made"]:
                    self.lossy[name] = None

    # -- where an operation ran ------------------------------------------------------------
    @property
    def nested(self) -> bool:
        """True inside an operation being counted as a whole (numpy's implementation of a function)."""
        return self._depth > 0

    @contextmanager
    def inside(self) -> Iterator[None]:
        """Within: the operations numpy's implementation makes are not counted or noticed on their
        own (their kernels still run and count)."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1

    def with_numpy(self, label: str, why: str | None) -> None:
        """Count ``label`` as computed with numpy; ``why`` (when there is a reason worth saying) is
        said once per label and reason."""
        self.stats.numpy[label] += 1
        if not self.active:
            if self.inactive_notice:
                self.notices.once("inactive", self.inactive_notice)
        elif why:
            self.notices.once(f"numpy:{label}:{why}", f"{label} {why}; computed with numpy on the worker (shown once)")

    # -- kernels on host values --------------------------------------------------------------
    def _upload(self, ctx: DeviceContext, values: np.ndarray) -> Allocation:
        return ctx.upload(np.ascontiguousarray(values, dtype=np.float32))

    def _operands(self, ctx: DeviceContext, operands: Sequence[Operand]) -> list[launch.Operand]:
        """Arrays uploaded (or found on the device) beside their shapes; scalars as they are, for the uniform."""
        return [op if isinstance(op, float) else (self._upload(ctx, op), op.shape) for op in operands]

    def _download(self, ctx: DeviceContext, alloc: Allocation, shape: tuple[int, ...]) -> np.ndarray:
        count = math.prod(shape)
        if count == 0:
            return np.empty(shape, np.float32)
        return ctx.download(alloc, count).reshape(shape)

    def elementwise(self, name: str, operands: Sequence[Operand], out_shape: tuple[int, ...]) -> np.ndarray:
        """Kernel ``name`` on one or two operands broadcast to ``out_shape``; float32 values.

        Raises ``launch.Unsupported`` when the kernel can't describe the shapes.
        """
        ctx = self.ctx
        ops = self._operands(ctx, operands)
        alloc = launch.elementwise(ctx, name, ops, out_shape)
        return self._download(ctx, alloc, out_shape)

    def integer(self, name: str, operands: Sequence[np.ndarray | int], out_shape: tuple[int, ...], *,
                signed: bool) -> np.ndarray:
        """Integer kernel ``name`` on int32 (``signed``) or uint32 arrays, or Python ints, broadcast to
        ``out_shape``: int32 or uint32 results (0/1 for comparisons), wrapping around as numpy's do."""
        ctx = self.ctx
        ops: list[integer.IntOperand] = [
            op if isinstance(op, int) else (ctx.upload(np.ascontiguousarray(op).view(np.float32)), op.shape)
            for op in operands]
        alloc = integer.integer(ctx, name, ops, out_shape, signed=signed)
        return self._download(ctx, alloc, out_shape).view(np.int32 if signed else np.uint32)

    def select(self, name: str, operands: Sequence[Operand], out_shape: tuple[int, ...]) -> np.ndarray:
        """``where(cond, a, b)`` or ``clip(x, lo, hi)`` (``name``) on three operands broadcast to ``out_shape``."""
        ctx = self.ctx
        ops = self._operands(ctx, operands)
        first, second, third = ops
        launch_select = select.where if name == "where" else select.clip
        alloc = launch_select(ctx, first, second, third, out_shape)
        return self._download(ctx, alloc, out_shape)

    def along(self, name: str, x: np.ndarray, axis: int) -> np.ndarray:
        """``argmax``/``argmin`` (int64 indices, without the axis) or ``cumsum``/``cumprod`` (float32, x's
        shape) of a non-empty float32 array along ``axis``."""
        ctx = self.ctx
        outer, length, inner = math.prod(x.shape[:axis]), x.shape[axis], math.prod(x.shape[axis + 1:])
        if name in ("cumsum", "cumprod"):
            return self._download(ctx, scan.scan(ctx, name, self._upload(ctx, x), outer, length, inner), x.shape)
        alloc = arg_reduce.arg_reduce(ctx, name, self._upload(ctx, x), outer, length, inner)
        return ctx.download_indices(alloc, outer * inner).reshape(x.shape[:axis] + x.shape[axis + 1:])

    def _upload_bits(self, ctx: DeviceContext, values: np.ndarray) -> Allocation:
        """32-bit values (float32, int32 or uint32) uploaded as they are, bit for bit."""
        return ctx.upload(np.ascontiguousarray(values).view(np.float32))

    def sort(self, x: np.ndarray, *, indices: bool, name: str = "sort") -> tuple[np.ndarray, np.ndarray | None]:
        """A non-empty float32, int32 or uint32 array sorted along its last axis as numpy's stable sort (in
        its dtype), and with ``indices`` the int64 indices that sort it. Dispatches count as ``name``."""
        ctx = self.ctx
        rows, length = math.prod(x.shape[:-1]), x.shape[-1]
        values, order = sort.sort(ctx, self._upload_bits(ctx, x), rows, length, indices=indices,
                                  keys=x.dtype.name, name=name)
        sorted_indices = ctx.download_indices(order, x.size).reshape(x.shape) if order is not None else None
        return self._download(ctx, values, x.shape).view(x.dtype), sorted_indices

    def take_rows(self, x: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Rows of a float32, int32 or uint32 array ``x`` (along its first axis) picked by ``rows``, row numbers
        already checked and made non-negative: numpy's ``x[rows]``, in ``x``'s dtype."""
        ctx = self.ctx
        alloc = gather.take_rows(ctx, self._upload_bits(ctx, x), self._upload_bits(ctx, rows.astype(np.uint32)),
                                 rows.size, math.prod(x.shape[1:]))
        return self._download(ctx, alloc, rows.shape + x.shape[1:]).view(x.dtype)

    def unique(self, x: np.ndarray, *, firsts: bool = False, inverse: bool = False) -> unique.Runs:
        """``unique.unique`` of a float32, int32 or uint32 array (1 to ``unique.MAX_VALUES`` values, flattened):
        its distinct values in its dtype, where their runs start, and if asked where each first comes and
        each value's run."""
        ctx = self.ctx
        runs = unique.unique(ctx, self._upload_bits(ctx, x), x.size, keys=x.dtype.name, firsts=firsts,
                             inverse=inverse)
        runs.values = runs.values.view(x.dtype)
        return runs

    def scatter_add(self, name: str, start: np.ndarray | None, slots: int, index: np.ndarray,
                    values: np.ndarray | int, *, adds: str) -> np.ndarray:
        """``counting.scatter_add`` on host values: ``start`` (32-bit values; None: zeros) with ``values``
        (32-bit, of ``index``'s length times a row of ``slots // rows`` slots, or one value's bits) added at
        the int32 ``index``; the new values as uint32 bits."""
        ctx = self.ctx
        width = 1 if start is None or start.ndim < 2 else math.prod(start.shape[1:])
        alloc = counting.scatter_add(
            ctx, name, None if start is None else self._upload_bits(ctx, start), slots,
            self._upload_bits(ctx, index), index.size,
            values if isinstance(values, int) else self._upload_bits(ctx, values), width=width, adds=adds)
        return self._download(ctx, alloc, (slots,)).view(np.uint32)

    def reduce(self, name: str, x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
        """Reduction ``name`` (sum, max, min) of a non-empty float32 array over ``axes``."""
        ctx = self.ctx
        alloc, shape = self._upload(ctx, x), list(x.shape)
        for first, last in reversed(_runs(sorted(axes))):
            outer = math.prod(shape[:first])
            length = math.prod(shape[first:last + 1])
            inner = math.prod(shape[last + 1:])
            alloc = launch.reduce(ctx, name, alloc, outer, length, inner)
            shape[first:last + 1] = [1] * (last + 1 - first) if keepdims else []
        return self._download(ctx, alloc, tuple(shape))

    def softmax(self, x: np.ndarray, axis: int) -> np.ndarray:
        """Numerically stable softmax of a float32 array along ``axis`` (normalized)."""
        ctx = self.ctx
        outer, inner = math.prod(x.shape[:axis]), math.prod(x.shape[axis + 1:])
        alloc = launch.softmax(ctx, self._upload(ctx, x), outer, x.shape[axis], inner)
        return self._download(ctx, alloc, x.shape)

    def transpose(self, x: np.ndarray, order: tuple[int, ...]) -> np.ndarray:
        """A float32 array's axes permuted by ``order``, as a contiguous array."""
        ctx = self.ctx
        alloc = launch.transpose(ctx, self._upload(ctx, x), x.shape, order)
        return self._download(ctx, alloc, tuple(x.shape[a] for a in order))

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """numpy's matmul of float32 arrays: batched, broadcast, 1-D operands promoted.

        The caller checks the shapes (numpy's errors); raises ``launch.Unsupported`` when the
        kernel can't run them.
        """
        a2 = a.reshape(1, -1) if a.ndim == 1 else a
        b2 = b.reshape(-1, 1) if b.ndim == 1 else b
        ctx = self.ctx
        alloc, shape = matmul_kernel(ctx, self._upload(ctx, a2), a2.shape, self._upload(ctx, b2), b2.shape,
                                     self.matmul_threads)
        values = self._download(ctx, alloc, shape)
        if a.ndim == 1:
            values = values.reshape(shape[:-2] + shape[-1:])
        if b.ndim == 1:
            values = values.reshape(values.shape[:-1])
        return values


def _runs(axes: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted axes grouped into runs of neighbours: [0, 1, 3] -> [(0, 1), (3, 3)]."""
    runs: list[tuple[int, int]] = []
    for axis in axes:
        if runs and runs[-1][1] == axis - 1:
            runs[-1] = (runs[-1][0], axis)
        else:
            runs.append((axis, axis))
    return runs
