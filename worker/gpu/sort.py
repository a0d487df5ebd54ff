"""Sorting the rows of a float32, int32 or uint32 array on the GPU: numpy's ``np.sort`` and stable ``np.argsort``.

:func:`sort` takes a buffer viewed as (rows, length) and returns new buffers: each row's values in
ascending order and, if asked, the indices that order it (``np.argsort(x, axis=-1, kind="stable")``).
The order is numpy's: for floats -inf first, then the finite values, +inf, and every NaN last; equal
values (-0.0 and 0.0 among them) keep their order in the row, so the values come back bit for bit as
``np.sort(x, kind="stable")`` gives them. ``shaders/sort.wgsl`` describes the bitonic network.
"""

from __future__ import annotations

import math

from .context import Binding, DeviceContext
from .memory import Allocation
from .uniforms import SORT

BLOCK = 2048
"""Slots ``sort.wgsl``'s ``block`` kernel sorts in workgroup memory (its BLOCK): rows padded to at
most this many take one dispatch."""
WG = 256
"""Invocations of a workgroup (its WG)."""
FROM_INPUT, TO_OUTPUT = 1, 2
"""``block``'s flags: read the slots from the input values; write the sorted rows."""
KEYS = {"float32": 0, "int32": 1, "uint32": 2}
"""The values' type -> ``sort.wgsl``'s KEY."""


def sort(ctx: DeviceContext, alloc: Allocation, rows: int, length: int, *, indices: bool,
         keys: str = "float32", name: str = "sort") -> tuple[Allocation, Allocation | None]:
    """Sort each row of the contiguous (rows, length) array of ``keys`` values (float32, int32 or
    uint32) in ``alloc``.

    Returns the sorted values, as ``np.sort(x, axis=-1, kind="stable")``, and with ``indices`` the
    indices, as ``np.argsort(x, axis=-1, kind="stable")``: u32 in a buffer of ``4 * rows * length``
    bytes (read them with ``ctx.download_indices``); else None. The dispatches count as ``name``.
    Rows padded to a power of two over BLOCK slots need a scratch buffer of 8 bytes a padded slot:
    :class:`GpuLimitError` if that is more than one binding may hold.
    """
    n = rows * length
    values = ctx.empty(4 * n)
    order = ctx.empty(4 * n) if indices else None
    if n == 0:
        return values, order
    shift = (length - 1).bit_length()
    padded = 1 << shift  # slots a row takes: a power of two
    total = rows * padded
    ctx.check_binding(name, alloc.nbytes)
    ctx.check_binding(name, 4 * n)
    key = {"KEY": KEYS[keys]}
    block_entry = ctx.pipelines.get("sort", "block", {"INDICES": 1 if indices else 0, **key})
    out_idx = order if order is not None else ctx.empty(4)  # bound, never written
    common = {"rows": rows, "len": length, "shift": shift, "total": total}
    block_groups = math.ceil(total / BLOCK)
    if padded <= BLOCK:  # one workgroup sorts whole rows
        params = SORT.pack(**common, k=2, j=0, steps=shift, flags=FROM_INPUT | TO_OUTPUT)
        bindings: dict[int, Binding] = {0: alloc, 1: ctx.empty(8), 3: values, 4: out_idx}
        ctx.dispatch(name, block_entry, bindings, params, 2, block_groups)
        return values, order
    ctx.check_binding(name, 8 * total)
    pairs = ctx.empty(8 * total)
    bindings = {0: alloc, 1: pairs, 3: values, 4: out_idx}
    params = SORT.pack(**common, k=2, j=0, steps=int(math.log2(BLOCK)), flags=FROM_INPUT)
    ctx.dispatch(name, block_entry, bindings, params, 2, block_groups)
    step3, step = ctx.pipelines.get("sort", "step3"), ctx.pipelines.get("sort", "step")  # (keys already made)
    k = 2 * BLOCK
    while k <= padded:
        j = k // 2
        while j >= BLOCK:  # the strides of stage k too long for a block: three a dispatch where they can be
            steps = 3 if j >= 4 * BLOCK else 1
            params = SORT.pack(**common, k=k, j=j, steps=steps, flags=0)
            ctx.dispatch(name, step3 if steps == 3 else step, {1: pairs}, params, 2,
                         math.ceil((total >> steps) / WG))
            j >>= steps
        params = SORT.pack(**common, k=k, j=0, steps=1, flags=TO_OUTPUT if k == padded else 0)
        ctx.dispatch(name, block_entry, bindings, params, 2, block_groups)
        k *= 2
    return values, order

