"""Launching ``gather.wgsl``: rows of an array picked by their numbers (numpy's ``x[rows]`` on the first axis).

Like :func:`launch.elementwise`, :func:`take_rows` takes buffers and returns a new one; it knows nothing of
numpy's API. Values move as their 32 bits, so the result is numpy's exactly for float32, int32 and uint32.
"""

from __future__ import annotations

import math

from .context import DeviceContext
from .launch import ELEMENTWISE_GROUP
from .memory import Allocation
from .uniforms import GATHER

MAX_VALUES = (1 << 32) - 1
"""Values an array, and a result, may hold: the kernel numbers them with 32 bits."""


def take_rows(ctx: DeviceContext, x: Allocation, rows: Allocation, count: int, width: int) -> Allocation:
    """``count`` rows of ``width`` 32-bit values each from ``x``, the row numbers in ``rows`` (``count`` uint32
    values, each a row of ``x``: the caller checks them): a new buffer of ``count * width`` values."""
    n = count * width
    if n > MAX_VALUES or x.nbytes // 4 > MAX_VALUES:
        raise ValueError(f"take_rows numbers values with 32 bits: {n:,} results from {x.nbytes // 4:,} values")
    for what, alloc in (("the array", x), ("the row numbers", rows)):
        ctx.check_binding(f"indexing ({what})", alloc.nbytes)
    ctx.check_binding("indexing (its result)", 4 * n)
    out = ctx.empty(4 * n)
    if n:
        ctx.dispatch("take", ctx.pipelines.get("gather", "take_rows"), {0: x, 1: rows, 2: out},
                     GATHER.pack(n=n, width=width), 3, math.ceil(n / ELEMENTWISE_GROUP))
    return out
