"""Launching ``arg_reduce.wgsl``: numpy's argmax and argmin along one axis, as u32 indices.

Like ``launch.reduce``, functions here take a :class:`DeviceContext`, a buffer and the (outer, length,
inner) view of a contiguous float32 array, and return a new buffer; they know nothing of numpy's API.
"""

from __future__ import annotations

import math

from .context import Binding, DeviceContext
from .memory import Allocation
from .uniforms import ARG_REDUCE

ARG_REDUCTIONS = {"argmax": 0, "argmin": 1}
"""Name -> ``arg_reduce.wgsl``'s OP (also the name the stats count the dispatches under)."""

THREAD_GROUP = 64
SHORT_AXIS = 256
"""Axes up to this long are reduced by one invocation per output rather than one workgroup."""
CHUNK = 4096
"""Long axes with few outputs are reduced in chunks of about this many values, then combined."""
MAX_CHUNKS = 4096
"""At most this many chunks (a longer axis gets longer chunks), so the second pass is one short span."""
FEW_OUTPUTS = 1024
"""Below this many outputs, an axis longer than two chunks is reduced in two passes."""


def arg_reduce(ctx: DeviceContext, name: str, alloc: Allocation, outer: int, length: int, inner: int) -> Allocation:
    """The index of the extreme of each (outer, :, inner) line of an (outer, length, inner) array.

    ``name`` is ``"argmax"`` or ``"argmin"``, with numpy's answers: the first index of the maximum
    (minimum), a NaN counting as the extreme (the first NaN's index), -0.0 equal to 0.0. ``length``
    must be at least 1 (numpy refuses an empty argmax; that is the caller's).

    The result holds ``outer * inner`` indices in (outer, inner) order as **uint32**, not float32:
    read them with ``ctx.download_indices``, or ``ctx.download(out, n).view(np.uint32)``.
    """
    if length < 1:
        raise ValueError(f"{name} of an empty axis")
    op = ARG_REDUCTIONS[name]
    outputs = outer * inner
    if outputs == 0:
        return ctx.empty(0)
    ctx.check_binding(name, alloc.nbytes)
    if length <= 2 * CHUNK or outputs >= FEW_OUTPUTS:
        return _pass(ctx, name, op, alloc, outer, length, inner, length)
    chunk = math.ceil(length / min(math.ceil(length / CHUNK), MAX_CHUNKS))
    chunks = math.ceil(length / chunk)
    partial = _pass(ctx, name, op, alloc, outer, length, inner, chunk, idx_out=outer * chunks * inner)
    return _pass(ctx, name, op, partial, outer, chunks, inner, chunks, idx_in=outer * chunks * inner)


def _pass(ctx: DeviceContext, name: str, op: int, source: Allocation, outer: int, length: int, inner: int,
          chunk: int, *, idx_in: int = 0, idx_out: int = 0) -> Allocation:
    """One dispatch over spans of ``chunk`` values: partial (key, index) pairs if ``idx_out`` places the
    indices after the keys, else the final indices; ``idx_in`` places the input's indices (0: floats)."""
    chunks = math.ceil(length / chunk)
    count = outer * chunks * inner
    out = ctx.empty(4 * (count + idx_out))
    params = ARG_REDUCE.pack(outer=outer, len=length, inner=inner, chunks=chunks, chunk=chunk, count=count,
                             idx_in=idx_in, idx_out=idx_out)
    bindings: dict[int, Binding] = {0: source, 1: out}
    if chunk <= SHORT_AXIS:
        entry, groups = "threads", math.ceil(count / THREAD_GROUP)
    else:
        entry, groups = "groups", count
    ctx.dispatch(name, ctx.pipelines.get("arg_reduce", entry, {"OP": op}), bindings, params, 2, groups)
    return out

