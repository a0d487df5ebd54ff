"""numpy's unique on the GPU: sort the values, mark where runs of equal values start, number the runs
with a cumsum, and compact (``shaders/unique.wgsl``, with ``sort.wgsl`` and ``scan.wgsl``).

Like ``launch.py``'s, :func:`unique` takes a :class:`DeviceContext` and a buffer and knows nothing of
numpy's API.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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


@dataclass
class Runs:
    """What :func:`unique` found, as host arrays: the distinct values (uint32 bits), where each run of them
    starts among the sorted values, and (when asked) where each first comes in the input and each input
    value's run (int64)."""

    values: np.ndarray
    starts: np.ndarray
    firsts: np.ndarray | None = None
    inverse: np.ndarray | None = None


def unique(ctx: DeviceContext, alloc: Allocation, n: int, *, keys: str = "float32", firsts: bool = False,
           inverse: bool = False, name: str = "unique") -> Runs:
    """The distinct values among the ``n`` 32-bit ``keys`` values (float32, int32 or uint32) in ``alloc``, in
    ascending order, as ``np.unique`` gives them (-0.0 equal to 0.0, one NaN for all NaNs), and where each
    run starts in the sorted values (so run r has ``starts[r + 1] - starts[r]`` values); with ``firsts``,
    numpy's ``return_index``, and with ``inverse``, its ``return_inverse`` (flat). ``n`` is 1 to
    :data:`MAX_VALUES`. Dispatches count as ``name``.
    """
    if not 0 < n <= MAX_VALUES:
        raise ValueError(f"unique takes 1 to {MAX_VALUES:,} values, not {n:,}")
    ordered, order = sort.sort(ctx, alloc, 1, n, indices=firsts or inverse, keys=keys, name=name)
    params = SORT.pack(rows=1, len=n, shift=0, total=n, k=0, j=0, steps=0, flags=0)
    key = {"KEY": sort.KEYS[keys]}
    groups = math.ceil(n / WG)
    marks = ctx.empty(4 * n)
    ctx.dispatch(name, ctx.pipelines.get("unique", "starts", key), {0: ordered, 3: marks}, params, 2, groups)
    ranks = scan.scan(ctx, "cumsum", marks, 1, n, 1, counted_as=name)
    values, starts, found = ctx.empty(4 * n), ctx.empty(4 * n), ctx.empty(4)
    bindings = {0: ordered, 3: values, 4: starts, 5: ranks, 6: found}
    ctx.dispatch(name, ctx.pipelines.get("unique", "compact", key), bindings, params, 2, groups)
    places: dict[str, Allocation] = {}
    for entry in ("firsts", "inverse"):
        if order is not None and (firsts if entry == "firsts" else inverse):
            places[entry] = ctx.empty(4 * n)
            entry_bindings = {0: ordered, 5: ranks, 7: order, 8: places[entry]} if entry == "firsts" else \
                {5: ranks, 7: order, 8: places[entry]}
            ctx.dispatch(name, ctx.pipelines.get("unique", entry, key if entry == "firsts" else None),
                         entry_bindings, params, 2, groups)
    count = int(ctx.download(found, 1).view(np.uint32)[0])  # submits the work; the rest is read once done
    runs = Runs(ctx.download(values, count).view(np.uint32), ctx.download_indices(starts, count))
    if "firsts" in places:
        runs.firsts = ctx.download_indices(places["firsts"], count)
    if "inverse" in places:
        runs.inverse = ctx.download_indices(places["inverse"], n)
    return runs
