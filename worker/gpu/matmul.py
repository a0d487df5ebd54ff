"""Launching the tiled matmul kernel, including products larger than one binding.

``shaders/matmul.wgsl`` reads A, B and C through leading dimensions and element offsets, so a
product whose operands exceed ``max_storage_buffer_binding_size`` is computed by binding slices
of the buffers: first whole matrices in batches, else row, column and K blocks of one matrix,
accumulating partial sums over K blocks into C. Every binding stays within the limit.
"""

from __future__ import annotations

import logging
import math
from itertools import product as cartesian
from typing import Sequence

import numpy as np

from .context import Binding, DeviceContext
from .launch import MAX_DIMS, Shape, Unsupported, broadcast_strides, collapse, contiguous_strides, size_of
from .memory import Allocation
from .uniforms import MATMUL

log = logging.getLogger(__name__)

TILE_PER_THREAD = 8
"""Each invocation computes an 8x8 block of C."""


def matmul(ctx: DeviceContext, a: Allocation, a_shape: Shape, b: Allocation, b_shape: Shape,
           threads: int = 16) -> tuple[Allocation, Shape]:
    """C = A @ B for contiguous arrays of at least two dimensions, batch dimensions broadcast.

    ``threads`` is the workgroup's side (8: 64 invocations and 64x64 tiles; 16: 256 and
    128x128). Returns C's buffer and shape. The caller checks that the inner dimensions match.
    """
    m, k = a_shape[-2:]
    n = b_shape[-1]
    batch_shape = tuple(np.broadcast_shapes(a_shape[:-2], b_shape[:-2]))
    out_shape = batch_shape + (m, n)
    count = size_of(batch_shape)
    if count * m * n == 0:
        return ctx.empty(0), out_shape
    if k == 0:
        return ctx.zeros(4 * count * m * n), out_shape
    out = ctx.empty(4 * count * m * n)
    a_bs = tuple(s * m * k for s in broadcast_strides(a_shape[:-2], batch_shape))
    b_bs = tuple(s * k * n for s in broadcast_strides(b_shape[:-2], batch_shape))
    c_bs = tuple(s * m * n for s in broadcast_strides(batch_shape, batch_shape))
    bshape, (a_bs, b_bs, _) = collapse(batch_shape, [a_bs, b_bs, c_bs])
    if len(bshape) > MAX_DIMS:
        raise Unsupported(f"more than {MAX_DIMS} broadcast batch dimensions")
    launch = _Launcher(ctx, threads)
    if max(a.nbytes, b.nbytes, out.nbytes) <= ctx.max_binding:
        launch(a, b, out, (m, n, k), (0, 0, 0), False, bshape, a_bs, b_bs, m * n)
        return out, out_shape
    log.debug("splitting a %s @ %s matmul over bindings of %d bytes", a_shape, b_shape, ctx.max_binding)
    _split(ctx, launch, a, b, out, (m, n, k), bshape, a_bs, b_bs)
    return out, out_shape


class _Launcher:
    """Packs the uniform and dispatches one matmul over given bindings."""

    def __init__(self, ctx: DeviceContext, threads: int) -> None:
        self.ctx = ctx
        self.threads = threads
        self.pipeline = ctx.pipelines.get("matmul", "main", {"WX": threads, "WY": threads})

    def __call__(self, a: Binding, b: Binding, c: Binding, dims: tuple[int, int, int],
                 offsets: tuple[int, int, int], accumulate: bool, bshape: Shape,
                 a_bs: Sequence[int], b_bs: Sequence[int], c_bstride: int,
                 lds: tuple[int, int, int] | None = None) -> None:
        m, n, k = dims
        lda, ldb, ldc = lds or (k, n, n)
        tile = TILE_PER_THREAD * self.threads
        tiles_n, tiles_m = math.ceil(n / tile), math.ceil(m / tile)
        batch = size_of(bshape)
        a_off, b_off, c_off = offsets
        params = MATMUL.pack(M=m, N=n, K=k, batch=batch, lda=lda, ldb=ldb, ldc=ldc, accumulate=int(accumulate),
                             a_off=a_off, b_off=b_off, c_off=c_off, batch_ndim=len(bshape), tiles_n=tiles_n,
                             tiles_m=tiles_m, c_bstride=c_bstride, batch_shape=bshape, a_bstride=a_bs, b_bstride=b_bs)
        self.ctx.dispatch("matmul", self.pipeline, {0: a, 1: b, 2: c}, params, 3, tiles_n * tiles_m * batch)


def _slice(ctx: DeviceContext, alloc: Allocation, start: int, count: int) -> tuple[Binding, int]:
    """A binding covering elements [start, start + count), and the element offset inside it."""
    align = max(1, ctx.offset_alignment // 4)
    base = (start // align) * align
    offset = start - base
    return (alloc, 4 * base, 4 * (offset + count)), offset


def _split(ctx: DeviceContext, launch: _Launcher, a: Allocation, b: Allocation, c: Allocation,
           dims: tuple[int, int, int], bshape: Shape, a_bs: Shape, b_bs: Shape) -> None:
    m, n, k = dims
    room = ctx.max_binding // 4 - max(1, ctx.offset_alignment // 4)  # elements per binding, minus alignment
    if room < 1:
        raise Unsupported("binding limit too small to split a matmul")
    one_a, one_b, one_c = m * k, k * n, m * n
    if len(bshape) <= 1 and max(one_a, one_b, one_c) <= room:
        _split_batches(ctx, launch, a, b, c, dims, bshape[0] if bshape else 1,
                       a_bs[0] if bshape else 0, b_bs[0] if bshape else 0, room)
        return
    # One matrix at a time, in blocks of rows (m), columns (n) and inner dimension (k).
    nc = min(n, room)
    kc = min(k, room, max(1, (room - nc) // n + 1))
    mc = min(m, max(1, (room - kc) // k + 1), max(1, (room - nc) // n + 1))
    for index in cartesian(*(range(s) for s in bshape)):
        a_base = sum(i * s for i, s in zip(index, a_bs))
        b_base = sum(i * s for i, s in zip(index, b_bs))
        c_base = one_c * sum(i * s for i, s in zip(index, contiguous_strides(bshape)))
        for m0 in range(0, m, mc):
            rows = min(mc, m - m0)
            for n0 in range(0, n, nc):
                cols = min(nc, n - n0)
                c_bind, c_off = _slice(ctx, c, c_base + m0 * n + n0, (rows - 1) * n + cols)
                for k0 in range(0, k, kc):
                    depth = min(kc, k - k0)
                    a_bind, a_off = _slice(ctx, a, a_base + m0 * k + k0, (rows - 1) * k + depth)
                    b_bind, b_off = _slice(ctx, b, b_base + k0 * n + n0, (depth - 1) * n + cols)
                    launch(a_bind, b_bind, c_bind, (rows, cols, depth), (a_off, b_off, c_off), k0 > 0,
                           (), (), (), 0, (k, n, n))


def _split_batches(ctx: DeviceContext, launch: _Launcher, a: Allocation, b: Allocation, c: Allocation,
                   dims: tuple[int, int, int], count: int, a_stride: int, b_stride: int, room: int) -> None:
    """Whole matrices fit one binding: bind as many consecutive batch entries as fit."""
    m, n, k = dims
    one_a, one_b, one_c = m * k, k * n, m * n
    per = min(room // one_a if a_stride else count, room // one_b if b_stride else count, room // one_c)
    for b0 in range(0, count, per):
        entries = min(per, count - b0)
        a_bind, a_off = _slice(ctx, a, b0 * a_stride, (entries - 1) * a_stride + one_a)
        b_bind, b_off = _slice(ctx, b, b0 * b_stride, (entries - 1) * b_stride + one_b)
        c_bind, c_off = _slice(ctx, c, b0 * one_c, entries * one_c)
        launch(a_bind, b_bind, c_bind, dims, (a_off, b_off, c_off), False, (entries,), (a_stride,),
               (b_stride,), one_c)

