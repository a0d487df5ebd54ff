"""argmax/argmin and cumsum/cumprod kernels against numpy, along each axis, on both backends.

argmax and argmin must give numpy's indices exactly: the first of equal extremes, the first NaN
(a NaN is the extreme), -0.0 equal to 0.0, subnormals above zero. Inputs have few distinct values,
so ties are everywhere. cumsum must be within a couple of float32 ulps of the running magnitude
(the sum of |terms| so far) of numpy's float64 result, also on long axes whose large terms cancel;
cumprod within an ulp a factor of it (and within two ulps of the result for factors near 1 on long
axes, which float32 products combined in a tree are not). NaN and infinities propagate as numpy's do.

Shapes cover one invocation per line (short axes, many lines), one workgroup per line, and long
axes with few lines (two passes for arg reductions, three for scans), with inner strides or not.
"""

from __future__ import annotations

import math
from typing import Iterator

import numpy as np
import pytest
from gpu_checks import FLOAT32_EPS, assert_within_ulps_of_terms, same_specials

from remote_magic.worker.gpu import GpuRuntime
from remote_magic.worker.gpu.arg_reduce import arg_reduce
from remote_magic.worker.gpu.scan import scan

pytestmark = pytest.mark.gpu

SPECIAL_BITS = np.array([0x00000000, 0x80000000, 0x7FC00000, 0xFFC00000, 0x7FC00001, 0x7F800000, 0xFF800000,
                         0x00000001, 0x80000001, 0x007FFFFF], dtype=np.uint32)
"""0.0, -0.0, NaN, -NaN, a NaN with a payload, +inf, -inf, the smallest subnormals (both signs), the largest."""

SHAPES = [((1001,), 0), ((1,), 0), ((6, 1, 5), 1), ((13, 301, 7), 0), ((13, 301, 7), 1), ((13, 301, 7), 2),
          ((20_000, 9), 1), ((9, 20_000), 0), ((8192, 70), 1), ((300_001,), 0), ((2, 150_001), 1),
          ((100_003, 3), 0), ((3, 9_000, 2), 1), ((40, 3000), 1), ((5, 40_000), 1)]
"""(shape, axis): 1-D, length 1, each axis of 3-D, many short lines (inner 1 and not), long axes with few
lines (inner 1 and not; scans of their chunks' totals by invocations and by a workgroup), just past two
chunks, one workgroup a line (vec4 loads, with a tail or not)."""


def view(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    """(outer, length, inner) of a contiguous array reduced or scanned along ``axis``."""
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


def gpu_arg(runtime: GpuRuntime, name: str, x: np.ndarray, axis: int) -> np.ndarray:
    ctx = runtime.dispatcher.ctx
    outer, length, inner = view(x.shape, axis)
    out = ctx.download_indices(arg_reduce(ctx, name, ctx.upload(x), outer, length, inner), outer * inner)
    assert out.dtype == np.int64
    return out.reshape(x.shape[:axis] + x.shape[axis + 1:])


def gpu_scan(runtime: GpuRuntime, name: str, x: np.ndarray, axis: int) -> np.ndarray:
    ctx = runtime.dispatcher.ctx
    outer, length, inner = view(x.shape, axis)
    out = ctx.download(scan(ctx, name, ctx.upload(x), outer, length, inner), x.size)
    assert out.dtype == np.float32
    return out.reshape(x.shape)


def check_arg(runtime: GpuRuntime, x: np.ndarray, axis: int) -> None:
    for name in ("argmax", "argmin"):
        np.testing.assert_array_equal(gpu_arg(runtime, name, x, axis), getattr(np, name)(x, axis=axis), name)


def check_cumsum(runtime: GpuRuntime, x: np.ndarray, axis: int, ulps: float = 2) -> np.ndarray:
    out = gpu_scan(runtime, "cumsum", x, axis)
    x64 = x.astype(np.float64)
    expected = np.cumsum(x64, axis=axis)
    same_specials(out, expected)
    finite = np.isfinite(expected)
    terms = np.cumsum(np.abs(x64), axis=axis)
    assert_within_ulps_of_terms(out[finite], expected[finite], terms[finite], ulps)
    return out


def check_cumprod(runtime: GpuRuntime, x: np.ndarray, axis: int, ulps_per_factor: float = 1) -> np.ndarray:
    out = gpu_scan(runtime, "cumprod", x, axis)
    expected = np.cumprod(x.astype(np.float64), axis=axis)
    same_specials(out, expected)
    factors = np.arange(1, x.shape[axis] + 1, dtype=np.float64).reshape((-1,) + (1,) * (x.ndim - axis - 1))
    finite = np.isfinite(expected)
    terms = np.broadcast_to(factors, x.shape) * np.abs(expected)  # an ulp of the result a factor
    assert_within_ulps_of_terms(out[finite], expected[finite], terms[finite], ulps_per_factor)
    return out


def ties(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Few distinct values, so most lines have several equal extremes; some zeros of either sign."""
    x = rng.integers(-3, 4, size=shape).astype(np.float32)
    x[rng.random(shape) < 0.1] = -0.0
    return x


def specials(rng: np.random.Generator, shape: tuple[int, ...], rate: float) -> np.ndarray:
    """Ties, and a ``rate`` of them special values (NaN of either sign, infinities, subnormals, zeros)."""
    x = ties(rng, shape)
    special = rng.random(shape) < rate
    x[special] = SPECIAL_BITS[rng.integers(0, len(SPECIAL_BITS), size=int(special.sum()))].view(np.float32)
    return x


@pytest.mark.parametrize("shape,axis", SHAPES, ids=str)
def test_arg_reductions_match_numpy(runtime: GpuRuntime, rng: np.random.Generator, shape: tuple[int, ...],
                                    axis: int) -> None:
    check_arg(runtime, ties(rng, shape), axis)
    length = shape[axis]
    check_arg(runtime, specials(rng, shape, rate=min(0.1, 3 / length)), axis)  # a few a line: NaN often absent


@pytest.mark.parametrize("shape,axis", SHAPES, ids=str)
def test_scans_match_numpy(runtime: GpuRuntime, rng: np.random.Generator, shape: tuple[int, ...],
                           axis: int) -> None:
    check_cumsum(runtime, rng.standard_normal(shape).astype(np.float32), axis)
    check_cumprod(runtime, (1 + 0.001 * rng.standard_normal(shape)).astype(np.float32), axis)


@pytest.mark.parametrize("length", [7, 1000, 100_000], ids=str)  # invocations, one workgroup, two passes
def test_arg_reductions_of_special_lines(runtime: GpuRuntime, length: int) -> None:
    nan, inf = np.float32(np.nan), np.float32(np.inf)
    lines = np.zeros((14, length), np.float32)
    lines[0, [1, 4]] = -0.0  # zeros of both signs are equal: the first wins
    lines[1] = -0.0
    lines[1, length - 1] = 0.0
    lines[2] = 5.0  # all equal
    lines[3, [2, length - 1]] = nan  # the first NaN wins, for argmin too
    lines[4] = nan
    lines[5] = -inf
    lines[6] = inf
    lines[7, [0, length - 2]] = inf, -inf
    lines[8, length - 1] = np.float32(1e-45)  # a subnormal is not zero
    lines[9, [0, length - 1]] = -nan, nan  # any NaN: the sign does not matter
    lines[10, length // 2:] = nan  # a NaN in a later chunk than equal infinities
    lines[10, [0, 3]] = inf, -inf
    lines[11] = np.arange(length)  # the extreme at either end
    lines[12] = -np.arange(length)
    lines[13, [length // 3, 2 * length // 3]] = 2.0, 2.0  # equal maxima in different chunks
    check_arg(runtime, lines, 1)


def test_scans_propagate_specials(runtime: GpuRuntime, rng: np.random.Generator) -> None:
    for length in (5, 1000, 50_000):  # invocations, one workgroup, three passes
        x = rng.standard_normal((8, length)).astype(np.float32)
        x[1, length // 2] = np.nan  # everything after is NaN
        x[2, 1] = np.inf
        x[3, [0, length - 1]] = np.inf, -np.inf  # inf then NaN at the end
        x[4, [1, 3]] = -np.inf, np.inf
        x[5:7] = -0.0
        x[6, length // 2] = 0.0  # -0.0 + 0.0 is 0.0
        x[7, length - 2] = -np.inf
        out = check_cumsum(runtime, x, 1)
        np.testing.assert_array_equal(np.signbit(out[5:7]), np.signbit(np.cumsum(x[5:7], axis=1)))  # as numpy's
        prod = (1 + 0.001 * rng.standard_normal((7, length))).astype(np.float32)
        prod[1, length // 2] = np.nan
        prod[2, [1, 4]] = np.inf, 0.0  # inf * 0: NaN from there
        prod[3, 0] = -np.inf
        prod[4, [length - 1, 2]] = 0.0, -1.0
        prod[5] = -0.0
        prod[6, ::2], prod[6, 1::2] = 1e35, 1e-35  # too large to split into halves: plain float32 products
        out = check_cumprod(runtime, prod, 1)
        np.testing.assert_array_equal(np.signbit(out[4:6]), np.signbit(np.cumprod(prod[4:6], axis=1)))


@pytest.mark.parametrize("length", [40, 3000, 1_000_000], ids=str)
def test_cumsum_keeps_small_terms_of_cancelling_large_ones(runtime: GpuRuntime, rng: np.random.Generator,
                                                           length: int) -> None:
    x = rng.standard_normal(length).astype(np.float32)
    x[:3] = [1e8, 1.0, -1e8]  # a float32 running total loses the 1.0 for good
    x[length // 2] = 3e7
    x[length // 2 + 1] = -3e7
    out = gpu_scan(runtime, "cumsum", x, 0).astype(np.float64)
    exact = np.cumsum(x.astype(np.float64))
    # Past the cancellation the values are small again, and so must their errors be: float-float
    # carries leave about 2^-44 of the 2e8 that passed (1e-5), where a float32 total loses the 1.0.
    error = np.abs(out - exact)[3:]
    assert np.all(error <= 2 * FLOAT32_EPS * np.abs(exact[3:]) + 2.0**-44 * 2e8)


@pytest.mark.parametrize("length", [40, 3000, 300_000], ids=str)
def test_cumprod_of_factors_near_one_is_unbiased(runtime: GpuRuntime, rng: np.random.Generator, length: int) -> None:
    # float32 products of factors near 1, combined in a tree, round down more often than up (about 10
    # ulps every 4096 factors); float-float carries keep every prefix within about an ulp.
    x = (1 + 0.001 * rng.standard_normal(length)).astype(np.float32)
    out = gpu_scan(runtime, "cumprod", x, 0)
    exact = np.cumprod(x.astype(np.float64))
    assert_within_ulps_of_terms(out, exact, np.abs(exact), ulps=2)


def test_dispatches_are_counted_by_name(runtime: GpuRuntime, rng: np.random.Generator) -> None:
    ctx = runtime.dispatcher.ctx
    runtime.take_stats()
    x = ctx.upload(rng.standard_normal(300_000).astype(np.float32))
    arg_reduce(ctx, "argmax", x, 1, 300_000, 1)  # two passes
    arg_reduce(ctx, "argmin", x, 300, 1000, 1)
    scan(ctx, "cumsum", x, 1, 300_000, 1)  # three passes
    scan(ctx, "cumprod", x, 3000, 100, 1)
    ctx.submit()
    assert runtime.take_stats()["kernels"] == {"argmax": 2, "argmin": 1, "cumsum": 3, "cumprod": 1}


@pytest.fixture
def few_groups(runtime: GpuRuntime) -> Iterator[GpuRuntime]:
    """The runtime as if its GPU allowed 16 workgroups a dimension: kernels fold theirs over y."""
    ctx = runtime.dispatcher.ctx
    saved, ctx.max_groups = ctx.max_groups, 16
    try:
        yield runtime
    finally:
        ctx.max_groups = saved


@pytest.mark.parametrize("shape,axis", [((3000, 5), 1), ((100, 400), 1), ((5, 60_000), 1)], ids=str)
def test_workgroups_folded_over_y(few_groups: GpuRuntime, rng: np.random.Generator, shape: tuple[int, ...],
                                  axis: int) -> None:
    check_arg(few_groups, ties(rng, shape), axis)
    check_cumsum(few_groups, rng.standard_normal(shape).astype(np.float32), axis)


def test_empty_results(runtime: GpuRuntime) -> None:
    ctx = runtime.dispatcher.ctx
    x = ctx.upload(np.ones(4, np.float32))
    assert arg_reduce(ctx, "argmax", x, 0, 4, 1).nbytes == 0
    assert scan(ctx, "cumsum", x, 4, 0, 1).nbytes == 0
    with pytest.raises(ValueError, match="empty"):
        arg_reduce(ctx, "argmin", x, 4, 0, 1)
