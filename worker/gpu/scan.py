"""Launching ``scan.wgsl``: numpy's cumsum and cumprod along one axis, inclusive, same shape out.

Like ``launch.reduce``, functions here take a :class:`DeviceContext`, a buffer and the (outer, length,
inner) view of a contiguous float32 array, and return a new buffer; they know nothing of numpy's API.
"""

from __future__ import annotations

import math

from .context import Binding, DeviceContext
from .memory import Allocation
from .uniforms import SCAN

SCANS = {"cumsum": 0, "cumprod": 1}
"""Name -> ``scan.wgsl``'s OP (also the name the stats count the dispatches under)."""

THREAD_GROUP = 64
SHORT_AXIS = 64
"""Axes up to this long are scanned by one invocation per line, value after value."""
MANY_LINES = 8192
"""With this many lines, axes up to 4 * SHORT_AXIS long are scanned by an invocation a line too: enough
invocations to fill a GPU, and none idle (a workgroup's block of 1024 would be mostly padding)."""
BLOCK = 1024
"""Values a workgroup of ``rows`` scans at once (``scan.wgsl``'s BLOCK)."""
CHUNK = 4 * BLOCK
"""Long axes with few lines are scanned in spans of about this many values (a multiple of BLOCK)."""
MAX_CHUNKS = 4096
"""At most this many spans a line (a longer axis gets longer spans), so their totals scan quickly."""
FEW_LINES = 1024
"""Below this many lines, an axis longer than two chunks is scanned in three passes."""


def scan(ctx: DeviceContext, name: str, alloc: Allocation, outer: int, length: int, inner: int, *,
         counted_as: str | None = None) -> Allocation:
    """The inclusive ``name`` (``"cumsum"`` or ``"cumprod"``) along the middle axis of an (outer, length,
    inner) array: a new buffer of the same shape. The dispatches count as ``counted_as`` (default ``name``).

    Sums and products are carried in float-float, so each prefix is its exact value rounded to float32,
    give or take about 2^-44 of the sum of its terms' magnitudes (sums) or of itself (products; a few
    ulps where the products leave [2^-100, 2^112]), however long the axis. A NaN makes every later
    prefix NaN, as numpy's. Values are combined in a tree, not left to right: a product (or sum) whose
    float32 partial results over- or underflow in one order but not the other can differ from numpy's
    (inf or 0 where numpy's stays finite, or the reverse).
    """
    op = SCANS[name]
    name = counted_as or name
    lines = outer * inner
    n = lines * length
    if n == 0:
        return ctx.empty(0)
    ctx.check_binding(name, alloc.nbytes)
    if length <= 2 * CHUNK or lines >= FEW_LINES:
        short = length <= SHORT_AXIS or (lines >= MANY_LINES and length <= 4 * SHORT_AXIS)
        return _pass(ctx, name, op, "threads" if short else "rows", alloc, outer, length, inner, length)
    chunk = BLOCK * math.ceil(length / min(math.ceil(length / CHUNK), MAX_CHUNKS) / BLOCK)
    chunks = math.ceil(length / chunk)
    count = outer * chunks * inner
    # The spans' totals (float-float pairs: lo values after the his), scanned along the line, are the
    # carries each span starts from.
    totals = _pass(ctx, name, op, "totals", alloc, outer, length, inner, chunk, lo_out=count)
    entry = "threads" if chunks <= SHORT_AXIS else "rows"
    carries = _pass(ctx, name, op, entry, totals, outer, chunks, inner, chunks, lo_in=count, lo_out=count)
    return _pass(ctx, name, op, "rows", alloc, outer, length, inner, chunk, carries=carries, carry_lo=count)


def _pass(ctx: DeviceContext, name: str, op: int, entry: str, source: Allocation, outer: int, length: int,
          inner: int, chunk: int, *, lo_in: int = 0, lo_out: int = 0, carries: Allocation | None = None,
          carry_lo: int = 0) -> Allocation:
    """One dispatch of ``entry`` over spans of ``chunk`` values: ``totals`` writes one (pair) a span, the
    scans a value a value; ``lo_in``/``lo_out`` place lo halves of pairs; ``carries`` start the spans."""
    chunks = math.ceil(length / chunk)
    count = outer * chunks * inner
    values = count if entry == "totals" else outer * length * inner
    out = ctx.empty(4 * (values + lo_out))
    # Four values a load where every span starts on a vec4 (a span is the whole line, or a multiple of BLOCK).
    quads = inner == 1 and not lo_in and (outer == 1 or length % 4 == 0) and source.buffer.size >= 16
    params = SCAN.pack(outer=outer, len=length, inner=inner, chunks=chunks, chunk=chunk, count=count, lo_in=lo_in,
                       lo_out=lo_out, carried=int(carries is not None), carry_lo=carry_lo, one=1.0, quads=int(quads))
    bindings: dict[int, Binding] = {0: source, 1: out}
    if entry == "rows":
        bindings[3] = carries if carries is not None else source  # unread without carries
    if entry != "threads":
        bindings[4] = (source, 0, max(16, source.nbytes - source.nbytes % 16)) if quads else source  # whole vec4s
    groups = math.ceil(count / THREAD_GROUP) if entry == "threads" else count
    ctx.dispatch(name, ctx.pipelines.get("scan", entry, {"OP": op}), bindings, params, 2, groups)
    return out
