"""Launching the matmul kernels: a tiling picked by shape and adapter, and products larger than one binding.

``shaders/matmul.wgsl`` has three entry points: ``naive`` (one invocation per element of C) and
``tiled4``/``tiled8`` (tiles of C through workgroup memory, 4x4 or 8x8 outputs per invocation).
:func:`choose_tiling` picks one per launch:

1. Only tiles at most twice C's rows and columns are considered: a larger tile would be mostly
   padding. A skinny C (fewer than 16 rows or columns, a vector-matrix product) has none and
   runs ``naive``.
2. Of those, the largest (128x128, 64x64, 32x32) that still makes at least ``target``
   workgroups, so that every compute unit has work: :func:`fill_target` is 2x the CPU count on a
   software adapter (lavapipe runs one workgroup per thread) and :data:`GPU_FILL_WORKGROUPS` on a
   GPU, as WebGPU does not tell how many compute units an adapter has.
3. When none does, the smallest if it makes at least half of ``target``.
4. Below that, C is too small to keep the device busy with tiles (each workgroup waits on its
   loads with no other to switch to). With a long K, the smallest tile splits K (split-K): each
   of 2 to 32 parts of K, at least :data:`MIN_SPLIT_DEPTH` deep, is a product of its own into
   partial sums (as many workgroups again each), and a second kernel adds them into C; the
   fewest parts that make ``target`` workgroups, or the most there are if they make half of it
   (the subgroup kernel below replaces it where it replaces tiles: 1.3-1.6x split-K's 32 x 32 tiles
   at 32x4096 @ 4096x32 on lavapipe, where split-K ran 5.3-5.5x the naive kernel).
   A GPT-2 block's 128 x 768 products (K of 768 to 3072) are such products on a GPU.
5. Else ``naive``, with the most workgroups, runs it.

K enters only rule 4: with K as small as 4 the tiles still ran several times faster than
``naive`` on lavapipe. Tilings past the adapter's limits (invocations and size per workgroup,
workgroup memory) are never chosen; ``threads`` caps the tiled kernels' workgroup side (8: tiles
up to 64x64).
Tiles are loaded as ``vec4<f32>`` when K, N and every offset and leading dimension are multiples
of 4, one element at a time otherwise.

On a device with WebGPU's "subgroups" feature (``GpuDevice.subgroups``; never a browser tab's),
``shaders/matmul_subgroups.wgsl`` adds ``subgroups8`` (:data:`TILE_SUBGROUPS`): 8x8 outputs per
invocation as ``tiled8``, A's loads shared through the subgroup instead of workgroup memory, no
barriers. :func:`choose_tiling` takes it only where it measured faster: on a software adapter, in
place of a tile, for a C of at most :data:`SUBGROUP_MAX_OUTPUTS` elements: on lavapipe it ran
1.2-1.7x the tiles up to 512x512 in every run, 1.0-1.1x at 1024x1024 and 0.7-1.3x at 4096x4096 with
K = 64 (too close to call), 0.3-0.6x at 2048x2048 (``benchmarks/results.md``). On an NVIDIA H200 it ran
0.14-0.55x the tiles at every shape measured, so a GPU never gets it.

A and B are read through leading dimensions and element offsets, so a product whose operands
exceed ``max_storage_buffer_binding_size`` is computed by binding slices of the buffers: first
whole matrices in batches, else row, column and K blocks of one matrix, accumulating partial sums
over K blocks into C. Every binding stays within the limit.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, replace
from itertools import product as cartesian
from typing import Sequence

import numpy as np

from .context import Binding, DeviceContext
from .launch import MAX_DIMS, Shape, Unsupported, broadcast_strides, collapse, contiguous_strides, size_of
from .memory import Allocation, round_up
from .uniforms import MATMUL

log = logging.getLogger(__name__)

BK = 16
"""K step of the tiled kernels through workgroup memory (``BK`` in matmul.wgsl)."""
GPU_FILL_WORKGROUPS = 256
"""Workgroups that fill a GPU: about 2x the compute units of a large one (an H100 has 132)."""
NAIVE_INVOCATIONS = 256
"""Invocations per workgroup of the naive kernel (16x16 for a square C, 256x1 for one row)."""
SPLITS = (2, 4, 8, 16, 32)
"""Parts split-K may split K into (rule 4 of the module docstring)."""
MIN_SPLIT_DEPTH = 256
"""The least K a part of a split K has: shallower, the partial sums cost more than they save."""
SUM_SPLITS_INVOCATIONS = 256
"""Invocations per workgroup of ``sum_splits``, split-K's second pass (its ``@workgroup_size``)."""


@dataclass(frozen=True)
class Tiling:
    """How one dispatch covers C: the entry point, the workgroup's shape, outputs per invocation.

    Each invocation computes a ``block`` x ``block`` block of C, so a workgroup covers a
    ``tile_m`` x ``tile_n`` tile.
    """

    name: str
    entry: str
    wx: int
    wy: int
    block: int
    shader: str = "matmul"
    """The shader file: ``matmul_subgroups`` for the kernel that needs the "subgroups" feature."""
    split: int = 1
    """Parts K is split into (split-K, rule 4 of the module docstring): 1, K whole."""

    @property
    def tile_m(self) -> int:
        """Rows of C per workgroup."""
        return self.wy * self.block

    @property
    def tile_n(self) -> int:
        """Columns of C per workgroup."""
        return self.wx * self.block

    @property
    def workgroup_bytes(self) -> int:
        """Workgroup memory the kernel declares (the A and B tiles; none for naive and subgroups8)."""
        return 0 if self.entry in ("naive", "subgroups8") else 4 * BK * (self.tile_m + self.tile_n)

    def workgroups(self, m: int, n: int, batch: int) -> int:
        """Workgroups for ``batch`` products with an m x n C (each part of K's, split)."""
        return math.ceil(m / self.tile_m) * math.ceil(n / self.tile_n) * batch * self.split

    def split_k(self, parts: int) -> Tiling:
        """This tiling with K split into ``parts`` (split-K)."""
        return replace(self, name=f"{self.name}, K in {parts}", split=parts)

    def constants(self, vec4: bool) -> dict[str, float]:
        """The override constants of this tiling's pipeline."""
        if self.entry == "naive":
            return {"WX": self.wx, "WY": self.wy}
        if self.entry == "subgroups8":
            return {"WX": self.wx, "VEC4": int(vec4)}
        return {"WX": self.wx, "WY": self.wy, "TM": self.block, "VEC4": int(vec4)}


TILE_128 = Tiling("128x128", "tiled8", 16, 16, 8)
"""16x16 invocations of 8x8 outputs: the most reuse, for large products (the one tiling before issue 21)."""
TILE_64 = Tiling("64x64", "tiled8", 8, 8, 8)
"""8x8 invocations of 8x8 outputs."""
TILE_32 = Tiling("32x32", "tiled4", 8, 8, 4)
"""8x8 invocations of 4x4 outputs: four times the workgroups of 64x64 on a mid-sized product."""
TILED = (TILE_128, TILE_64, TILE_32)
"""The tiled kernels, largest tile first."""
SUBGROUP_LANES = 8
"""Invocations per workgroup of the subgroup kernel: lavapipe's subgroup (256-bit vectors of f32), and no
more than a GPU's (32 or 64 on most), so that the workgroup is one subgroup, which the kernel needs to share
loads (with smaller subgroups it runs correctly without sharing)."""
SUBGROUP_MAX_OUTPUTS = 512 * 512
"""Largest C (elements) for which a software adapter runs the subgroup kernel instead of a tile."""
TILE_SUBGROUPS = Tiling("subgroups", "subgroups8", SUBGROUP_LANES, 1, 8, shader="matmul_subgroups")
"""8x8 outputs per invocation, A's loads shared through the subgroup: 8 x 64 tiles, no workgroup memory.
Only on devices with the "subgroups" feature (``GpuDevice.subgroups``)."""


def naive_tiling(m: int, n: int) -> Tiling:
    """One output per invocation, the workgroup shaped after C: 16x16, or a row or column of 256."""
    wy = min(1 << (m - 1).bit_length(), 16)
    wx = min(1 << (n - 1).bit_length(), NAIVE_INVOCATIONS // wy)
    wy = min(1 << (m - 1).bit_length(), NAIVE_INVOCATIONS // wx)
    return Tiling("naive", "naive", wx, wy, 1)


def fill_target(ctx: DeviceContext) -> int:
    """Workgroups that keep every compute unit of ``ctx``'s adapter busy (see the module docstring)."""
    if ctx.device.info.adapter_type == "software":
        return 2 * (os.cpu_count() or 1)
    return GPU_FILL_WORKGROUPS


def fits(ctx: DeviceContext, tiling: Tiling) -> bool:
    """True if ``tiling``'s workgroup is within the adapter's limits."""
    limits = ctx.device.limits
    return (tiling.wx * tiling.wy <= limits.get("max_compute_invocations_per_workgroup", 256)
            and tiling.wx <= limits.get("max_compute_workgroup_size_x", 256)
            and tiling.wy <= limits.get("max_compute_workgroup_size_y", 256)
            and tiling.workgroup_bytes <= limits.get("max_compute_workgroup_storage_size", 16384))


def choose_tiling(ctx: DeviceContext, dims: tuple[int, int, int], batch: int, threads: int = 16, *,
                  subgroups: bool = True) -> Tiling:
    """The tiling for ``batch`` products of an m x k and a k x n matrix (``dims`` = (m, n, k)).

    The rule is the module docstring's; ``threads`` caps the tiled kernels' workgroup side;
    ``subgroups=False`` chooses as on a device without the feature (for benchmarks).
    """
    m, n, k = dims
    allowed = [t for t in TILED if max(t.wx, t.wy) <= threads and fits(ctx, t)
               and t.tile_m <= 2 * m and t.tile_n <= 2 * n]
    target = fill_target(ctx)
    for tiling in allowed:
        if tiling.workgroups(m, n, batch) >= target:
            return _or_subgroups(ctx, tiling, m, n, batch) if subgroups else tiling
    if not allowed:
        return naive_tiling(m, n)
    smallest = allowed[-1]
    if smallest.workgroups(m, n, batch) * 2 >= target:
        return _or_subgroups(ctx, smallest, m, n, batch) if subgroups else smallest
    parts = [s for s in SPLITS if k % (BK * s) == 0 and k // s >= MIN_SPLIT_DEPTH]
    enough = [s for s in parts if smallest.workgroups(m, n, batch) * s >= target]
    if enough or (parts and smallest.workgroups(m, n, batch) * parts[-1] * 2 >= target):
        split = smallest.split_k(enough[0] if enough else parts[-1])
        return _or_subgroups(ctx, split, m, n, batch) if subgroups else split
    return naive_tiling(m, n)


def _or_subgroups(ctx: DeviceContext, tiled: Tiling, m: int, n: int, batch: int) -> Tiling:
    """The subgroup kernel where it measured faster than ``tiled`` (see the module docstring), else ``tiled``.

    Its 8 x 64 tiles make several times the workgroups of ``tiled``: not where they pass the dispatch's limit.
    """
    if (ctx.device.subgroups and ctx.device.info.adapter_type == "software" and m * n <= SUBGROUP_MAX_OUTPUTS
            and TILE_SUBGROUPS.workgroups(m, n, batch) <= ctx.max_groups ** 2):
        return TILE_SUBGROUPS
    return tiled


def matmul(ctx: DeviceContext, a: Allocation, a_shape: Shape, b: Allocation, b_shape: Shape,
           threads: int = 16, *, tiling: Tiling | None = None, vectorize: bool = True) -> tuple[Allocation, Shape]:
    """C = A @ B for contiguous arrays of at least two dimensions, batch dimensions broadcast.

    ``threads`` caps the tiled kernels' workgroup side (8: tiles up to 64x64; 16: up to
    128x128). ``tiling`` forces one tiling and ``vectorize=False`` the element-wise loads, for
    benchmarks and tests; by default :func:`choose_tiling` picks per launch. Returns C's buffer
    and shape. The caller checks that the inner dimensions match.
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
    launch = _Launcher(ctx, threads, tiling, vectorize)
    if max(a.nbytes, b.nbytes, out.nbytes) <= ctx.max_binding:
        launch(a, b, out, (m, n, k), (0, 0, 0), False, bshape, a_bs, b_bs, m * n)
        return out, out_shape
    log.debug("splitting a %s @ %s matmul over bindings of %d bytes", a_shape, b_shape, ctx.max_binding)
    _split(ctx, launch, a, b, out, (m, n, k), bshape, a_bs, b_bs)
    return out, out_shape


class _Launcher:
    """Picks the tiling, packs the uniform and dispatches one matmul over given bindings."""

    def __init__(self, ctx: DeviceContext, threads: int, tiling: Tiling | None, vectorize: bool) -> None:
        self.ctx = ctx
        self.threads = threads
        self.tiling = tiling
        self.vectorize = vectorize

    def __call__(self, a: Binding, b: Binding, c: Binding, dims: tuple[int, int, int],
                 offsets: tuple[int, int, int], accumulate: bool, bshape: Shape,
                 a_bs: Sequence[int], b_bs: Sequence[int], c_bstride: int,
                 lds: tuple[int, int, int] | None = None) -> None:
        m, n, k = dims
        lda, ldb, ldc = lds or (k, n, n)
        batch = size_of(bshape)
        a_off, b_off, c_off = offsets
        tiling = self.tiling or choose_tiling(self.ctx, dims, batch, self.threads)
        if (tiling.split == 1 or k % tiling.split or len(bshape) >= MAX_DIMS or ldc != n
                or (batch > 1 and c_bstride != m * n)  # (the partial sums are C's values, contiguous, a part at a time)
                or 4 * tiling.split * batch * m * n > self.ctx.max_binding):
            self._product(replace(tiling, split=1), a, b, c, dims, offsets, accumulate, bshape, a_bs, b_bs, c_bstride,
                          (lda, ldb, ldc))
            return
        parts, depth = tiling.split, k // tiling.split
        partials = self.ctx.empty(4 * parts * batch * m * n)
        self._product(tiling, a, b, partials, (m, n, depth), (a_off, b_off, 0), False, (parts, *bshape),
                      (depth, *a_bs), (depth * ldb, *b_bs), m * n, (lda, ldb, n))
        self.ctx.dispatch("matmul", self.ctx.pipelines.get("matmul", "sum_splits"), {0: _vec4_binding(partials), 2: c},
                          sum_splits_params(parts, batch * m * n, c_off, accumulate), 3,
                          math.ceil(batch * m * n / SUM_SPLITS_INVOCATIONS))

    def _product(self, tiling: Tiling, a: Binding, b: Binding, c: Binding, dims: tuple[int, int, int],
                 offsets: tuple[int, int, int], accumulate: bool, bshape: Shape,
                 a_bs: Sequence[int], b_bs: Sequence[int], c_bstride: int, lds: tuple[int, int, int]) -> None:
        m, n, k = dims
        lda, ldb, ldc = lds
        batch = size_of(bshape)
        a_off, b_off, c_off = offsets
        vec4 = (self.vectorize and tiling.entry != "naive"
                and all(v % 4 == 0 for v in (k, n, lda, ldb, a_off, b_off, *a_bs, *b_bs)))
        if tiling.shader == "matmul_subgroups" and not self.ctx.device.subgroups:
            raise ValueError(f"the {tiling.name} matmul needs the subgroups feature, which this device lacks")
        pipeline = self.ctx.pipelines.get(tiling.shader, tiling.entry, tiling.constants(vec4))
        tiles_n, tiles_m = math.ceil(n / tiling.tile_n), math.ceil(m / tiling.tile_m)
        params = MATMUL.pack(M=m, N=n, K=k, batch=batch, lda=lda, ldb=ldb, ldc=ldc, accumulate=int(accumulate),
                             a_off=a_off, b_off=b_off, c_off=c_off, batch_ndim=len(bshape), tiles_n=tiles_n,
                             tiles_m=tiles_m, c_bstride=c_bstride, batch_shape=bshape, a_bstride=a_bs, b_bstride=b_bs)
        self.ctx.dispatch("matmul", pipeline, {0: _vec4_binding(a), 1: _vec4_binding(b), 2: c}, params, 3,
                          tiles_n * tiles_m * batch)


def sum_splits_params(parts: int, count: int, c_off: int = 0, accumulate: bool = False) -> bytes:
    """The uniform of ``sum_splits`` (split-K's second pass): add ``parts`` partial products of ``count`` values each
    into C from element ``c_off`` (onto C's values, with ``accumulate``)."""
    return MATMUL.pack(M=0, N=0, K=parts, batch=1, lda=0, ldb=0, ldc=0, accumulate=int(accumulate), a_off=0, b_off=0,
                       c_off=c_off, batch_ndim=0, tiles_n=0, tiles_m=0, c_bstride=count, batch_shape=(), a_bstride=(),
                       b_bstride=())


def _vec4_binding(binding: Binding) -> Binding:
    """``binding`` with its size rounded up to whole vec4s, as matmul.wgsl reads A and B.

    Pooled buffers are at least 256 bytes in sizes that are multiples of 16, and bindings start
    at multiples of ``min_storage_buffer_offset_alignment`` (32 bytes or more), so the rounded
    binding stays inside its buffer; the values past the array are read but never used.
    """
    alloc, offset, size = (binding, 0, binding.nbytes) if isinstance(binding, Allocation) else binding
    return alloc, offset, round_up(max(size, 16), 16)


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
    # One matrix at a time, in blocks of rows (m), columns (n) and inner dimension (k); blocks of
    # columns and of k in multiples of 4 where the whole is, so the blocks keep vec4 loads.
    nc = _multiple_of_4(min(n, room), n)
    kc = _multiple_of_4(min(k, room, max(1, (room - nc) // n + 1)), k)
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


def _multiple_of_4(block: int, whole: int) -> int:
    """``block`` rounded down to a multiple of 4 when ``whole`` is one and ``block`` is at least 4."""
    return block - block % 4 if whole % 4 == 0 and block >= 4 else block


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
