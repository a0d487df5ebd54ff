"""numpy's unique on the GPU: sort the values, mark where runs of equal values start, number the runs
with a cumsum, and compact (``shaders/unique.wgsl``, with ``sort.wgsl`` and ``scan.wgsl``).

Like ``launch.py``'s, :func:`unique` takes a :class:`DeviceContext` and a buffer and knows nothing of
numpy's API.
"""

from __future__ import annotations

import math

import numpy as np

from . import scan, sort
from .context import DeviceContext
from .convert import EXACT_INTEGER
from .memory import Allocation
from .uniforms import SORT

WG = 256
"""Invocations of a workgroup (``sort.wgsl``'s WG, which ``unique.wgsl`` uses)."""
MAX_VALUES = EXACT_INTEGER
"""Most values :func:`unique` takes: runs are numbered by a float32 cumsum, exact up to 2**24."""


def unique(ctx: DeviceContext, alloc: Allocation, n: int, *, keys: str = "float32",
           name: str = "unique") -> tuple[np.ndarray, np.ndarray]:
    """The distinct values among the ``n`` 32-bit ``keys`` values (float32, int32 or uint32) in ``alloc``, in
    ascending order, as ``np.unique`` gives them (-0.0 equal to 0.0, one NaN for all NaNs), and where each
    first comes in the sorted values (so run r has ``starts[r + 1] - starts[r]`` values): host arrays, the
    values as uint32 bits, the places as int64. ``n`` is 1 to :data:`MAX_VALUES`. Dispatches count as ``name``.
    """
    if not 0 < n <= MAX_VALUES:
        raise ValueError(f"unique takes 1 to {MAX_VALUES:,} values, not {n:,}")
    ordered, _ = sort.sort(ctx, alloc, 1, n, indices=False, keys=keys, name=name)
    params = SORT.pack(rows=1, len=n, shift=0, total=n, k=0, j=0, steps=0, flags=0)
    key = {"KEY": sort.KEYS[keys]}
    groups = math.ceil(n / WG)
    marks = ctx.empty(4 * n)
    ctx.dispatch(name, ctx.pipelines.get("unique", "starts", key), {0: ordered, 3: marks}, params, 2, groups)
    ranks = scan.scan(ctx, "cumsum", marks, 1, n, 1, counted_as=name)
    values, starts, found = ctx.empty(4 * n), ctx.empty(4 * n), ctx.empty(4)
    bindings = {0: ordered, 3: values, 4: starts, 5: ranks, 6: found}
    ctx.dispatch(name, ctx.pipelines.get("unique", "compact", key), bindings, params, 2, groups)
    count = int(ctx.download(found, 1).view(np.uint32)[0])  # submits the work; the rest is read once done
    return ctx.download(values, count).view(np.uint32), ctx.download_indices(starts, count)
