"""Launching ``counting.wgsl``: scatter-adds into 32-bit slots, for numpy's bincount and ``np.add.at``.

Like ``launch.py``'s, :func:`scatter_add` takes a :class:`DeviceContext` and buffers and returns a new
buffer; it knows nothing of numpy's API. Slots hold 32-bit integers (int32 and uint32 alike: they add
and wrap around as the same bits) or float32 values; indices are int32, and negative ones count from
the end, as numpy's do. The caller checks that every index is within the slots.
"""

from __future__ import annotations

import math

from .context import Binding, DeviceContext
from .memory import Allocation
from .uniforms import COUNTING

WG = 256
"""Invocations of a workgroup (``counting.wgsl``'s WG)."""
ADDS = {"integers": 0, "float32": 1}
"""How values add -> ``counting.wgsl``'s OP."""


def scatter_add(ctx: DeviceContext, name: str, start: Allocation | None, slots: int, index: Allocation,
                count: int, values: Allocation | int, *, width: int = 1, adds: str = "integers") -> Allocation:
    """A new buffer of ``slots`` 32-bit slots: ``start``'s values (zeros when None), plus, for each
    i < ``count`` and j < ``width``, value (i, j) added into slot ``index[i] * width + j``.

    ``values`` is a buffer of ``count * width`` values, or one value's 32 bits (an int) for every
    (i, j). ``adds`` is ``"integers"`` (wrapping around) or ``"float32"``, in whatever order the
    invocations reach a slot. An index below zero counts from the end of ``slots // width`` rows.
    The dispatches count as ``name``.
    """
    rows = slots // width if width else 0
    for nbytes in (4 * slots, index.nbytes, values.nbytes if isinstance(values, Allocation) else 0):
        ctx.check_binding(name, nbytes)
    scalar = not isinstance(values, Allocation)
    params = COUNTING.pack(n=slots, m=count, width=width, rows=rows, scalar=int(scalar),
                           value=values if isinstance(values, int) else 0)
    if start is None:
        out = ctx.zeros(4 * slots)
    else:
        out = ctx.empty(4 * slots)
        ctx.dispatch(name, ctx.pipelines.get("counting", "copy"), {0: start, 3: out}, params, 4,
                     math.ceil(slots / WG))
    if count * width == 0 or slots == 0:
        return out
    bindings: dict[int, Binding] = {1: index, 2: index if isinstance(values, int) else values, 3: out}
    ctx.dispatch(name, ctx.pipelines.get("counting", "scatter", {"OP": ADDS[adds]}), bindings, params, 4,
                 math.ceil(count * width / WG))
    return out
