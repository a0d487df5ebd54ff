"""Launching ``integer.wgsl``: elementwise int32 and uint32 operations with numpy's semantics exactly.

Like :func:`launch.elementwise`, :func:`integer` takes buffers and shapes (or a Python int, carried
in the uniform as its 32 bits) broadcast to ``out_shape``, and returns a new buffer; it knows
nothing of numpy's API. Buffers hold 32-bit integers (int32 or uint32, as ``signed`` says), and
results are 32-bit integers of the same kind, comparisons and ``logical_not`` giving 0 or 1 (numpy's
bool, as a uint32). Overflow wraps around as two's complement, as numpy's C loops do; division and
remainder by zero give 0 (numpy warns, which is the caller's), and shift counts outside 0..31 give
numpy's 0 or -1.
"""

from __future__ import annotations

from typing import Sequence, Union

from .context import DeviceContext
from .launch import Shape, broadcast_layout, size_of, vec4_bindings
from .memory import Allocation, round_up
from .uniforms import INTEGER

MAX_DIMS = INTEGER.field("shape").count
"""Dimensions the uniform can describe (after merging dimensions that need no index): 8."""

UNARY = {"negative": 0, "absolute": 1, "invert": 2, "square": 3, "sign": 4, "logical_not": 5}
"""Unary kernels of ``integer.wgsl`` by numpy's ufunc ``__name__`` -> its OP code."""
BINARY = {"add": 0, "subtract": 1, "multiply": 2, "bitwise_and": 3, "bitwise_or": 4, "bitwise_xor": 5,
          "left_shift": 6, "right_shift": 7, "maximum": 8, "minimum": 9, "floor_divide": 10, "remainder": 11,
          "equal": 12, "not_equal": 13, "less": 14, "less_equal": 15, "greater": 16, "greater_equal": 17}
"""Binary kernels of ``integer.wgsl`` by numpy's ufunc ``__name__`` -> its OP code."""
COMPARISONS = frozenset({"equal", "not_equal", "less", "less_equal", "greater", "greater_equal", "logical_not"})
"""Kernels whose result is numpy's bool: they write 1 for true and 0 for false."""
SIGN_BLIND = frozenset({"add", "subtract", "multiply", "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift",
                        "equal", "not_equal", "negative", "invert", "square", "logical_not"})
"""Kernels whose bits do not depend on signedness: one pipeline serves int32 and uint32."""
DENSE, SCALAR = 1, 4
"""``integer.wgsl`` flags of operand a, shifted left by 1 for operand b (A_DENSE = 1, B_DENSE = 2, ...)."""

IntOperand = Union[tuple[Allocation, Shape], int]
"""An array operand (its buffer of 32-bit integers and its shape) or a Python int carried in the uniform."""


def int32_bits(value: int) -> int:
    """The 32 bits of ``value`` as int32 or uint32 holds it (-1 and 2**32 - 1 are the same bits).

    Raises ``ValueError`` for a value neither type holds: numpy's casting rules are the caller's.
    """
    if not -(1 << 31) <= value < (1 << 32):
        raise ValueError(f"{value} fits neither int32 nor uint32")
    return value & 0xFFFFFFFF


def integer(ctx: DeviceContext, name: str, operands: Sequence[IntOperand], out_shape: Shape, *,
            signed: bool) -> Allocation:
    """``name`` (a key of UNARY or BINARY) applied to one or two operands broadcast to ``out_shape``,
    on int32 (``signed``) or uint32 values, as numpy computes it: a new buffer of ``size_of(out_shape)``
    32-bit results (0 or 1 for comparisons and logical_not).

    At most one operand may be a Python int; it is given as a value (-1, or 2**32 - 1: the same bits),
    which numpy's rules must already have accepted for the arrays' type (the caller's part).
    Raises :class:`Unsupported` for more dimensions than the uniform describes once merged.
    """
    table = UNARY if len(operands) == 1 else BINARY
    if len(operands) not in (1, 2) or name not in table:
        raise ValueError(f"no {len(operands)}-operand integer kernel {name!r}")
    arrays = [op for op in operands if not isinstance(op, int)]
    if len(operands) - len(arrays) > 1:
        raise ValueError(f"{name}: at most one operand may be a Python int (the uniform carries one)")
    n = size_of(out_shape)
    out, shape, strides = broadcast_layout(ctx, name, operands, out_shape, MAX_DIMS)
    if n == 0:
        return out
    flags, scalar = 0, 0
    for k, op in enumerate(operands):
        if isinstance(op, int):
            flags |= SCALAR << k
            scalar = int32_bits(op)
        elif size_of(op[1]) == n:
            flags |= DENSE << k
    while len(strides) < 2:
        strides.append((0,) * len(shape))
    params = INTEGER.pack(n=n, ndim=len(shape), flags=flags, scalar=scalar, shape=shape,
                          a_strides=strides[0], b_strides=strides[1])
    unary = len(operands) == 1
    stand_in = arrays[0][0] if arrays else ctx.empty(4)  # bound for a scalar's binding, never read
    buffers = [stand_in if isinstance(op, int) else op[0] for op in operands]
    constants = {"OP": table[name], "SIGNED": 1 if signed or name in SIGN_BLIND else 0}
    vec4 = all(flags & ((DENSE | SCALAR) << k) for k in range(len(operands))) and all(
        alloc.buffer.size >= round_up(alloc.nbytes, 16) for alloc in (out, *buffers))  # padded, as the pool's are
    entry = ("unary" if unary else "binary") + ("4" if vec4 else "")
    bindings, groups = vec4_bindings(out, buffers, n, vec4)
    ctx.dispatch(name, ctx.pipelines.get("integer", entry, constants), bindings, params, 3, groups)
    return out
