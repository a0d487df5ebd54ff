"""Launching the built-in elementwise, reduction, softmax and transpose kernels.

Functions here take a :class:`DeviceContext`, buffers and shapes, and return new buffers; they
fill the uniforms declared in ``uniforms`` and know nothing about numpy's API (see ``dispatch``).
All arrays are contiguous float32; broadcasting is expressed with zero strides.
"""

from __future__ import annotations

import math
from typing import Any, Sequence, Union

from .context import Binding, DeviceContext
from .memory import Allocation, round_up
from .uniforms import ELEMENTWISE, REDUCE, SOFTMAX, TRANSPOSE

MAX_DIMS = ELEMENTWISE.field("shape").count
"""Dimensions a kernel's uniform can describe (after merging dimensions that need no index): 8."""

UNARY = {"copy": 0, "negative": 1, "abs": 2, "exp": 3, "log": 4, "sqrt": 5, "tanh": 6, "sigmoid": 7, "relu": 8,
         "sin": 9, "cos": 10, "tan": 11, "arcsin": 12, "arccos": 13, "arctan": 14, "sinh": 15, "cosh": 16,
         "arcsinh": 17, "arccosh": 18, "arctanh": 19, "floor": 20, "ceil": 21, "trunc": 22, "rint": 23,
         "sign": 24, "square": 25, "reciprocal": 26, "log2": 27, "log10": 28, "log1p": 29, "expm1": 30,
         "exp2": 31, "fabs": 32, "logical_not": 33, "isnan": 34, "isinf": 35, "isfinite": 36, "signbit": 37,
         "absolute": 2}
"""Unary kernels of ``elementwise.wgsl`` by name -> its OP code: numpy's ufunc ``__name__`` where there is one
(``abs`` is also ``absolute``, np.abs's ``__name__``)."""
BINARY = {"add": 0, "subtract": 1, "multiply": 2, "divide": 3, "power": 4, "maximum": 5, "minimum": 6,
          "greater": 7, "greater_equal": 8, "less": 9, "less_equal": 10, "equal": 11, "not_equal": 12,
          "arctan2": 13, "hypot": 14, "fmax": 15, "fmin": 16, "copysign": 17, "logaddexp": 18,
          "floor_divide": 19, "remainder": 20, "fmod": 21}
"""Binary kernels of ``elementwise.wgsl`` by name -> its OP code."""
DENSE, SCALAR, ALONG = 1, 4, 16
"""``elementwise.wgsl`` flags of operand a, shifted left by 1 for operand b (A_DENSE = 1, B_DENSE = 2, ...)."""
COMPARISONS = frozenset({"greater", "greater_equal", "less", "less_equal", "equal", "not_equal",
                         "logical_not", "isnan", "isinf", "isfinite", "signbit"})
"""Kernels whose result is boolean, as numpy's is: they write 1.0 for true and 0.0 for false."""
REDUCTIONS = {"sum": 0, "mean": 0, "max": 1, "min": 2, "any": 1, "all": 2}
"""Reduction -> ``reduce.wgsl``'s OP: any and all are max and min of 0/1 values."""

ELEMENTWISE_GROUP = 256
THREAD_GROUP = 64
SHORT_AXIS = 256
"""Axes up to this long are reduced by one invocation per output rather than one workgroup."""
CHUNK = 4096
"""Long axes with few outputs are reduced in chunks of about this many values, then combined."""
MAX_CHUNKS = 4096
"""At most this many chunks (a longer axis gets longer chunks), so the second pass is one short span."""

Shape = tuple[int, ...]
Operand = Union[tuple[Allocation, Shape], float]
"""An array operand (its buffer and shape) or a Python scalar carried in the uniform."""


class Unsupported(Exception):
    """The kernel cannot describe this case (too many dimensions); compute it with numpy."""


def size_of(shape: Sequence[int]) -> int:
    """Number of elements of ``shape``."""
    return math.prod(shape)


def contiguous_strides(shape: Sequence[int]) -> Shape:
    """Element strides of a C-contiguous array of ``shape``."""
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= extent
    return tuple(reversed(strides))


def broadcast_strides(shape: Shape, out_shape: Shape) -> Shape:
    """Strides reading a contiguous ``shape`` array as if broadcast to ``out_shape`` (0 = repeat)."""
    own = contiguous_strides(shape)
    pad = len(out_shape) - len(shape)
    return tuple(0 if d < pad or shape[d - pad] == 1 else own[d - pad] for d in range(len(out_shape)))


def collapse(shape: Shape, strides: Sequence[Shape]) -> tuple[Shape, list[Shape]]:
    """Drop size-1 dimensions and merge neighbours that every operand walks contiguously."""
    dims = [d for d in range(len(shape)) if shape[d] != 1]
    out_shape: list[int] = []
    out_strides: list[list[int]] = [[] for _ in strides]
    for d in dims:
        mergeable = out_shape and all(s[d] * shape[d] == o[-1] for s, o in zip(strides, out_strides))
        if mergeable:
            out_shape[-1] *= shape[d]
            for s, o in zip(strides, out_strides):
                o[-1] = s[d]
        else:
            out_shape.append(shape[d])
            for s, o in zip(strides, out_strides):
                o.append(s[d])
    return tuple(out_shape), [tuple(o) for o in out_strides]


def check_dims(shape: Sequence[int]) -> None:
    """Refuse a shape with more dimensions than a uniform describes, as :class:`Unsupported`."""
    if len(shape) > MAX_DIMS:
        raise Unsupported(f"more than {MAX_DIMS} dimensions")


def broadcast_layout(ctx: DeviceContext, name: str, operands: Sequence[Any], out_shape: Shape,
                     max_dims: int = MAX_DIMS) -> tuple[Allocation, Shape, list[Shape]]:
    """What every elementwise launch starts with: the output buffer, and the operands' strides broadcast
    to ``out_shape`` with the dimensions that need no index merged (a scalar, anything but an
    ``(Allocation, shape)`` pair, gets zero strides). Checks every binding's size; raises
    :class:`Unsupported` past ``max_dims`` merged dimensions. An empty output needs no launch."""
    out = ctx.empty(4 * size_of(out_shape))
    if out.nbytes == 0:
        return out, (), []
    ctx.check_binding(name, out.nbytes)
    for op in operands:
        if isinstance(op, tuple):
            ctx.check_binding(name, op[0].nbytes)
    strides = [broadcast_strides(op[1], out_shape) if isinstance(op, tuple) else (0,) * len(out_shape)
               for op in operands]
    shape, merged = collapse(out_shape, strides)
    if len(shape) > max_dims:
        raise Unsupported(f"more than {max_dims} dimensions")
    return out, shape, merged


def vec4_bindings(out: Allocation, buffers: Sequence[Allocation], n: int, vec4: bool,
                  ) -> tuple[dict[int, Binding], int]:
    """The bindings and workgroup count of ``elementwise.wgsl``'s layout (and ``integer.wgsl``'s): inputs at
    0 and 1, the output at 2, or with ``vec4`` the same at 4, 5 and 6 rounded up to whole vec4s."""
    if vec4:
        bindings: dict[int, Binding] = {4 + i: (buffer, 0, round_up(buffer.nbytes, 16))
                                        for i, buffer in enumerate(buffers)}
        bindings[6] = (out, 0, round_up(out.nbytes, 16))
        return bindings, math.ceil(n / (4 * ELEMENTWISE_GROUP))
    bindings = {i: buffer for i, buffer in enumerate(buffers)}
    bindings[2] = out
    return bindings, math.ceil(n / ELEMENTWISE_GROUP)


def elementwise(ctx: DeviceContext, name: str, operands: Sequence[Operand], out_shape: Shape) -> Allocation:
    """``name`` (a key of UNARY or BINARY) applied to one or two operands, broadcast to ``out_shape``."""
    n = size_of(out_shape)
    out, shape, strides = broadcast_layout(ctx, name, operands, out_shape)
    if n == 0:
        return out
    arrays = [op for op in operands if not isinstance(op, float)]
    flags, scalar = 0, 0.0
    for i, op in enumerate(operands):
        if isinstance(op, float):
            flags |= SCALAR << i
            scalar = op
        elif size_of(op[1]) == n:
            flags |= DENSE << i
        elif shape and strides[i][-1] == 1:
            flags |= ALONG << i  # runs along the last dimension
    while len(strides) < 2:
        strides.append((0,) * len(shape))
    params = ELEMENTWISE.pack(n=n, ndim=len(shape), flags=flags, scalar=scalar, shape=shape,
                              a_strides=strides[0], b_strides=strides[1], one=1.0)
    unary = len(operands) == 1
    buffers = [op[0] if not isinstance(op, float) else arrays[0][0] for op in operands]
    entry = _elementwise_entry(unary, flags, shape, [out, *buffers])
    pipeline = ctx.pipelines.get("elementwise", entry, {"OP": (UNARY if unary else BINARY)[name]})
    bindings, groups = vec4_bindings(out, buffers, n, entry.endswith("4"))
    ctx.dispatch(name, pipeline, bindings, params, 3, groups)
    return out


def _elementwise_entry(unary: bool, flags: int, shape: Shape, allocs: Sequence[Allocation]) -> str:
    """The entry point of ``elementwise.wgsl`` for these operands: four outputs per invocation where it can."""
    if any(alloc.buffer.size < round_up(alloc.nbytes, 16) for alloc in allocs):
        return "unary" if unary else "binary"  # not padded to whole vec4s (the pool's buffers are)
    indexed = [i for i in range(1 if unary else 2) if not flags & ((DENSE | SCALAR) << i)]
    if not indexed:
        return "unary4" if unary else "binary4"
    return "broadcast4" if not unary and shape and shape[-1] % 4 == 0 else ("unary" if unary else "binary")


def _reduce_pass(ctx: DeviceContext, name: str, op: int, source: Allocation, outer: int, length: int,
                 inner: int, chunk: int, scale: float, *, lo_in: int = 0, lo_out: int = 0) -> Allocation:
    """One dispatch of ``reduce.wgsl`` over spans of ``chunk`` values; ``lo_in``/``lo_out`` place the lo
    halves of a chunked sum."""
    chunks = math.ceil(length / chunk)
    count = outer * chunks * inner
    out = ctx.empty(4 * (count + lo_out))
    params = REDUCE.pack(outer=outer, len=length, inner=inner, chunks=chunks, chunk=chunk, count=count, scale=scale,
                         lo_in=lo_in, lo_out=lo_out, one=1.0)
    bindings: dict[int, Binding] = {0: source, 1: out}
    if chunk <= SHORT_AXIS:
        entry, groups = "threads", math.ceil(count / THREAD_GROUP)
    elif inner == 1 and not lo_in and (outer == 1 or length % 4 == 0) and (chunks == 1 or chunk % 4 == 0):
        entry, groups = "contiguous", count  # every span starts on a vec4
        bindings[3] = (source, 0, source.nbytes - source.nbytes % 16)
    else:
        entry, groups = "groups", count
    pipeline = ctx.pipelines.get("reduce", entry, {"OP": op})
    ctx.dispatch(name, pipeline, bindings, params, 2, groups)
    return out


def reduce(ctx: DeviceContext, name: str, alloc: Allocation, outer: int, length: int, inner: int) -> Allocation:
    """Reduce the middle axis of an (outer, length, inner) array with ``name`` (sum/mean/max/min).

    ``length`` must be at least 1 (empty reductions are the caller's, as numpy's rules differ).
    """
    ctx.check_binding(name, alloc.nbytes)
    op = REDUCTIONS[name]
    scale = 1.0 / length if name == "mean" else 1.0
    if length <= 2 * CHUNK or outer * inner >= 1024:
        return _reduce_pass(ctx, name, op, alloc, outer, length, inner, length, scale)
    chunk = 4 * math.ceil(length / min(math.ceil(length / CHUNK), MAX_CHUNKS) / 4)  # a multiple of 4
    chunks = math.ceil(length / chunk)
    # A sum's partial results are float-float pairs: their lo halves follow the his.
    lo = outer * chunks * inner if op == REDUCTIONS["sum"] else 0
    partial = _reduce_pass(ctx, name, op, alloc, outer, length, inner, chunk, 1.0, lo_out=lo)
    return _reduce_pass(ctx, name, op, partial, outer, chunks, inner, chunks, scale, lo_in=lo)


def softmax(ctx: DeviceContext, alloc: Allocation, outer: int, length: int, inner: int) -> Allocation:
    """Softmax along the middle axis of an (outer, length, inner) array."""
    n = outer * length * inner
    out = ctx.empty(4 * n)
    if n == 0:
        return out
    ctx.check_binding("softmax", alloc.nbytes)
    rows = outer * inner
    params = SOFTMAX.pack(outer=outer, len=length, inner=inner, rows=rows)
    if length <= THREAD_GROUP:
        entry, groups = "threads", math.ceil(rows / THREAD_GROUP)
    else:
        entry, groups = "groups", rows
    ctx.dispatch("softmax", ctx.pipelines.get("softmax", entry), {0: alloc, 1: out}, params, 2, groups)
    return out


def transpose(ctx: DeviceContext, alloc: Allocation, shape: Shape, axes: Sequence[int]) -> Allocation:
    """A contiguous copy of the array ``shape`` with its axes permuted to ``axes``."""
    n = size_of(shape)
    out = ctx.empty(4 * n)
    if n == 0:
        return out
    ctx.check_binding("transpose", alloc.nbytes)
    ndim = len(shape)
    out_shape = tuple(shape[a] for a in axes)
    strides = contiguous_strides(shape)
    squeezed, (permuted,) = collapse(out_shape, [tuple(strides[a] for a in axes)])
    if len(squeezed) >= 2 and _is_swap_of_last_two(squeezed, permuted):
        cols_out, rows_out = squeezed[-1], squeezed[-2]
        batch = size_of(squeezed[:-2])
        rows, cols = cols_out, rows_out  # the input's matrix is (rows, cols)
        tiles_r, tiles_c = math.ceil(rows / 16), math.ceil(cols / 16)
        params = TRANSPOSE.pack(n=n, ndim=ndim, rows=rows, cols=cols, batch=batch, tiles_r=tiles_r, tiles_c=tiles_c,
                                shape=(), strides=())
        ctx.dispatch("transpose", ctx.pipelines.get("transpose", "tiles"), {0: alloc, 1: out}, params, 2,
                     tiles_r * tiles_c * batch)
        return out
    check_dims(squeezed)
    params = TRANSPOSE.pack(n=n, ndim=len(squeezed), rows=0, cols=0, batch=0, tiles_r=0, tiles_c=0,
                            shape=squeezed, strides=permuted)
    ctx.dispatch("transpose", ctx.pipelines.get("transpose", "permute"), {0: alloc, 1: out}, params, 2,
                 math.ceil(n / ELEMENTWISE_GROUP))
    return out


def _is_swap_of_last_two(shape: Shape, strides: Shape) -> bool:
    """True if (shape, strides) reads a contiguous (batch, rows, cols) array as (batch, cols, rows)."""
    rows, cols = shape[-1], shape[-2]  # output (.., cols, rows) of an input (.., rows, cols)
    if strides[-1] != cols or strides[-2] != 1:
        return False
    expected = rows * cols
    for extent, stride in zip(reversed(shape[:-2]), reversed(strides[:-2])):
        if stride != expected:
            return False
        expected *= extent
    return True
