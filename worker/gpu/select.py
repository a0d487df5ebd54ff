"""Launching ``select.wgsl``: numpy's ``where(cond, a, b)`` and ``clip(x, lo, hi)`` on float32.

Like :func:`launch.elementwise`, these take buffers and shapes (or Python scalars, carried in the
uniform) broadcast to ``out_shape``, and return a new buffer; they know nothing of numpy's API.
Values are copied and compared by their bits, so the results are numpy's exactly: NaN payloads,
signed zeros and subnormals included.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from .context import Binding, DeviceContext
from .launch import ELEMENTWISE_GROUP, Operand, Shape, broadcast_layout, size_of
from .memory import Allocation
from .uniforms import SELECT

MAX_DIMS = SELECT.field("shape").count
"""Dimensions the uniform can describe (after merging dimensions that need no index): 8."""
DENSE, SCALAR, CONSTANT_BOUNDS = 1, 8, 64
"""``select.wgsl`` flags: ``DENSE << k`` and ``SCALAR << k`` for operand k, and clip's bounds being one value each."""


def where(ctx: DeviceContext, cond: Operand, a: Operand, b: Operand, out_shape: Shape) -> Allocation:
    """numpy's ``where(cond, a, b)``: ``a`` where ``cond`` is nonzero (NaN included), else ``b``."""
    return _launch(ctx, "where", "select_where", (cond, a, b), out_shape, 0)


def clip(ctx: DeviceContext, x: Operand, lo: Operand, hi: Operand, out_shape: Shape) -> Allocation:
    """numpy's ``clip(x, lo, hi)``: ``minimum(maximum(x, lo), hi)``, NaN in any operand giving NaN.

    numpy runs one loop when lo and hi are single values (scalars or size-1 arrays) and another
    otherwise; they differ only in which NaN or zero wins a tie (say clip(0.0, -0.0, 1.0)), and
    this follows the same one.
    """
    constant = all(isinstance(bound, float) or size_of(bound[1]) == 1 for bound in (lo, hi))
    return _launch(ctx, "clip", "clip", (x, lo, hi), out_shape, CONSTANT_BOUNDS if constant else 0)


def float32_bits(value: float) -> int:
    """The bits of ``value`` rounded to float32, as numpy casts it (beyond float32's range: ±inf)."""
    with np.errstate(over="ignore"):
        return int(np.float32(value).view(np.uint32))


def _launch(ctx: DeviceContext, name: str, entry: str, operands: Sequence[Operand], out_shape: Shape,
            flags: int) -> Allocation:
    n = size_of(out_shape)
    out, shape, strides = broadcast_layout(ctx, name, operands, out_shape, MAX_DIMS)
    if n == 0:
        return out
    arrays = [op[0] for op in operands if not isinstance(op, float)]
    bits = [0, 0, 0]
    for k, op in enumerate(operands):
        if isinstance(op, float):
            flags |= SCALAR << k
            bits[k] = float32_bits(op)
        elif size_of(op[1]) == n:
            flags |= DENSE << k
    params = SELECT.pack(n=n, ndim=len(shape), flags=flags, a_bits=bits[0], b_bits=bits[1], c_bits=bits[2],
                         shape=shape, a_strides=strides[0], b_strides=strides[1], c_strides=strides[2])
    stand_in = arrays[0] if arrays else ctx.empty(4)  # bound, never read, for a scalar's binding
    bindings: dict[int, Binding] = {k: stand_in if isinstance(op, float) else op[0] for k, op in enumerate(operands)}
    bindings[3] = out
    ctx.dispatch(name, ctx.pipelines.get("select", entry), bindings, params, 4, math.ceil(n / ELEMENTWISE_GROUP))
    return out
