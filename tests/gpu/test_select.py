"""The where and clip kernels (select.wgsl) against numpy, bit for bit, at the launch level.

Each operand is an uploaded array broadcast to the output (a row, a column, a size-1 array, empty)
or a Python scalar in the uniform. Results must equal numpy's float32 answer bit for bit (NaN
payloads and -0.0 included), and numpy's float64 answer as values. Inputs carry every special
value in every position: NaN of either sign and with payloads, ±inf, ±0.0, subnormals.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import numpy as np
import pytest

from remote_magic.worker.gpu import GpuRuntime
from remote_magic.worker.gpu.context import DeviceContext
from remote_magic.worker.gpu.launch import Operand, Unsupported
from remote_magic.worker.gpu.memory import Allocation
from remote_magic.worker.gpu.select import clip, where

pytestmark = pytest.mark.gpu

SPECIAL_BITS = np.array([0x00000000, 0x80000000, 0x3F800000, 0xBF800000, 0x3F000000, 0x7FC00000, 0xFFC00000,
                         0x7FC00001, 0xFFC12345, 0x7F800000, 0xFF800000, 0x00000001, 0x80000001, 0x007FFFFF,
                         0x7F7FFFFF], dtype=np.uint32)
"""0.0, -0.0, ±1, 0.5, NaN, -NaN, NaNs with payloads, ±inf, the smallest subnormals, the largest one, float32's max."""
SPECIALS = SPECIAL_BITS.view(np.float32)

Value = Union[np.ndarray, float]
"""An operand on the host: an array (uploaded, then broadcast) or a Python scalar (in the uniform)."""
Kernel = Callable[[DeviceContext, Operand, Operand, Operand, tuple[int, ...]], Allocation]
Reference = Callable[[Value, Value, Value, type], np.ndarray]


def mixed(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Zeros of both signs, small integers (so clip has ties) and specials, about a third each."""
    x = np.array(rng.integers(-8, 8, size=shape) / 2, np.float32)  # an array, 0-d too
    kind = rng.integers(0, 3, size=shape)
    x[kind == 0] = np.where(rng.random(int((kind == 0).sum())) < 0.5, np.float32(0.0), np.float32(-0.0))
    x[kind == 1] = SPECIALS[rng.integers(0, len(SPECIALS), size=int((kind == 1).sum()))]
    return x


def run(runtime: GpuRuntime, kernel: Kernel, operands: tuple[Value, Value, Value],
        out_shape: tuple[int, ...]) -> np.ndarray:
    """The kernel on these operands, read back as an ``out_shape`` float32 array."""
    ctx = runtime.dispatcher.ctx
    ops: list[Operand] = [v if isinstance(v, float) else (ctx.upload(v), v.shape) for v in operands]
    out = kernel(ctx, ops[0], ops[1], ops[2], out_shape)
    result: np.ndarray = ctx.download(out, int(np.prod(out_shape))).reshape(out_shape)
    return result


def numpy_where(cond: Value, a: Value, b: Value, dtype: type) -> np.ndarray:
    return np.asarray(np.where(np.asarray(cond, dtype), np.asarray(a, dtype), np.asarray(b, dtype)))


def numpy_clip(x: Value, lo: Value, hi: Value, dtype: type) -> np.ndarray:
    """numpy's clip; Python scalars stay Python scalars, as a caller's would be."""
    bounds: list[Any] = [v if isinstance(v, float) else np.asarray(v, dtype) for v in (lo, hi)]
    with np.errstate(over="ignore"):
        return np.asarray(np.clip(np.asarray(x, dtype), *bounds))


def check(runtime: GpuRuntime, name: str, operands: tuple[Value, Value, Value]) -> np.ndarray:
    """The kernel's answer equals numpy's in float32 bit for bit, and numpy's in float64 as values."""
    kernel: Kernel = where if name == "where" else clip
    reference: Reference = numpy_where if name == "where" else numpy_clip
    exact = reference(*operands, np.float32)
    out = run(runtime, kernel, operands, exact.shape)
    assert out.shape == exact.shape and out.dtype == np.float32
    np.testing.assert_array_equal(out.view(np.uint32), exact.view(np.uint32))
    with np.errstate(over="ignore"):  # scalars as the kernel sees them: rounded to float32
        c, a, b = (float(np.float32(v)) if isinstance(v, float) else v for v in operands)
    np.testing.assert_array_equal(out.astype(np.float64), reference(c, a, b, np.float64))
    return out


SHAPES = [
    ((5, 7), (5, 7), (5, 7)),          # all dense
    ((5, 1), (1, 7), (7,)),            # a column, a row, a shorter row
    ((3, 1, 4), (1, 5, 1), (3, 5, 1)),  # every operand broadcast somewhere
    ((), (4, 6), (1,)),                # a 0-d and a size-1 array
    (None, (3, 1, 4), (2, 1, 1, 1)),   # a scalar beside broadcasts
    ((2, 3, 4, 5), None, (4, 1)),
    ((6, 1), None, None),              # two scalars
    ((1, 1, 300), (2, 1, 1, 1), (1, 300)),  # rows longer than a workgroup
    ((1,) * 10 + (3,), (3,), (1,) * 12),  # more than 8 dimensions, but only one that needs an index
    ((0, 3), (1, 3), None),            # empty
    ((3, 0), (3, 1), (1, 0)),
    (None, (0,), None),
]


def operand(rng: np.random.Generator, shape: Optional[tuple[int, ...]]) -> Value:
    """A random array of ``shape``, or (None) a special scalar drawn at random."""
    if shape is None:
        return float(SPECIALS[rng.integers(0, len(SPECIALS))]) if rng.random() < 0.5 else float(rng.integers(-3, 3))
    return mixed(rng, shape)


@pytest.mark.parametrize("name", ["where", "clip"])
@pytest.mark.parametrize("shapes", SHAPES, ids=str)
def test_broadcasting_of_every_operand(runtime: GpuRuntime, rng: np.random.Generator, name: str,
                                       shapes: tuple[Optional[tuple[int, ...]], ...]) -> None:
    ops = (operand(rng, shapes[0]), operand(rng, shapes[1]), operand(rng, shapes[2]))
    check(runtime, name, ops)


def test_where_specials_in_every_position(runtime: GpuRuntime) -> None:
    k = len(SPECIALS)
    out = check(runtime, "where", (SPECIALS.reshape(k, 1, 1), SPECIALS.reshape(1, k, 1), SPECIALS.reshape(1, 1, k)))
    chosen = out[:, 0, 1].view(np.uint32)  # cond is each special; a = -0.0, b = 0.0
    assert chosen.tolist() == [0x80000000] * 2 + [0] * (k - 2)  # only ±0.0 is false: NaN and subnormals are true


def test_where_of_zeros_and_ones_as_comparisons_give(runtime: GpuRuntime, rng: np.random.Generator) -> None:
    a, b = mixed(rng, (50, 40)), mixed(rng, (40,))
    cond = (rng.random((50, 1)) < 0.5).astype(np.float32)
    check(runtime, "where", (cond, a, b))
    check(runtime, "where", (1.0, a, b))
    check(runtime, "where", (0.0, a, b))
    check(runtime, "where", (-0.0, 2.5, b))
    check(runtime, "where", (float("nan"), a, -0.0))


def test_clip_specials_in_every_position(runtime: GpuRuntime) -> None:
    """Every triple of specials as arrays (numpy's general loop: a tie takes the bound), lo > hi among them."""
    k = len(SPECIALS)
    check(runtime, "clip", (SPECIALS.reshape(k, 1, 1), SPECIALS.reshape(1, k, 1), SPECIALS.reshape(1, 1, k)))


@pytest.mark.parametrize("bounds", ["scalars", "size-1 arrays"])
def test_clip_with_constant_bounds(runtime: GpuRuntime, bounds: str) -> None:
    """Single-value bounds take numpy's other loop: a NaN bound wins over a NaN x, and a tie keeps x."""
    x = np.concatenate([SPECIALS, np.array([-2, 2, 0.25, -0.25], np.float32)])
    pairs = [(0.0, 1.0), (-0.0, 1.0), (-1.0, 0.0), (-1.0, -0.0), (0.0, -0.0), (-0.0, 0.0), (3.0, 1.0),
             (0.5, -0.5), (float("nan"), 1.0), (0.0, float("nan")), (float("-inf"), float("inf")),
             (float("inf"), float("-inf")), (1e-45, 2e-45), (-1e40, 1e40)]  # 1e40 is inf in float32
    payload = float(SPECIALS[8])  # -NaN with a payload, kept through float64
    pairs += [(payload, 1.0), (0.0, payload)]
    for lo, hi in pairs:
        if bounds == "scalars":
            check(runtime, "clip", (x, lo, hi))
        else:
            with np.errstate(over="ignore"):
                lo_a, hi_a = np.array([lo], np.float32), np.array([[hi]], np.float32)
            check(runtime, "clip", (x.reshape(-1, 1), lo_a, hi_a))
    assert run(runtime, clip, (np.array([-0.0, 0.0], np.float32), 0.0, -0.0), (2,)).view(np.uint32).tolist() == [
        0x80000000, 0]  # ties keep x


def test_clip_lo_above_hi_gives_hi(runtime: GpuRuntime, rng: np.random.Generator) -> None:
    x = rng.standard_normal((64, 33)).astype(np.float32)
    lo = rng.uniform(5, 10, (64, 1)).astype(np.float32)
    hi = rng.uniform(-4, 4, (33,)).astype(np.float32)
    out = check(runtime, "clip", (x, lo, hi))
    np.testing.assert_array_equal(out, np.broadcast_to(hi, out.shape))


@pytest.mark.parametrize("name", ["where", "clip"])
def test_large_arrays_fold_their_workgroups(runtime: GpuRuntime, rng: np.random.Generator, name: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the per-dimension workgroup limit (here 7, as in test_runtime) the kernels number their
    workgroups x + y * num_workgroups.x: every output is written, once, right."""
    monkeypatch.setattr(runtime.dispatcher.ctx, "max_groups", 7)
    rows = 45  # 45 * 256 + 3 outputs: 46 workgroups, dispatched as 7 x 7 (three of them idle)
    check(runtime, name, (mixed(rng, (rows, 256)), mixed(rng, (rows, 1)), mixed(rng, (1, 256))))
    check(runtime, name, (mixed(rng, (rows * 256 + 3,)), 0.5, mixed(rng, (1,))))


def test_over_65535_workgroups(wgpu_runtime: GpuRuntime) -> None:
    """A real dispatch of more workgroups than one dimension holds (lavapipe's limit: 65,535)."""
    assert wgpu_runtime.dispatcher.ctx.max_groups <= 65_535
    n = 65_536 * 256 + 3  # 65,537 workgroups of 256
    x = (np.arange(n, dtype=np.int32) % 7 - 3).astype(np.float32)
    out = run(wgpu_runtime, where, (x, x, -0.5), (n,))
    np.testing.assert_array_equal(out, np.where(x != 0, x, np.float32(-0.5)))


def test_dispatches_are_counted_by_name(runtime: GpuRuntime, rng: np.random.Generator) -> None:
    ctx = runtime.dispatcher.ctx
    runtime.take_stats()
    x = mixed(rng, (10, 3))
    run(runtime, where, (x, 1.0, x), x.shape)
    run(runtime, clip, (x, 0.0, x[0]), x.shape)
    assert run(runtime, clip, (1.0, 0.0, 2.0), (4,)).tolist() == [1.0] * 4  # no array at all
    run(runtime, where, (x[:0], 1.0, 2.0), (0, 3))  # empty: no dispatch
    assert ctx.stats.kernels["where"] == 1
    assert ctx.stats.kernels["clip"] == 2


def test_more_dimensions_than_the_uniform_describes(runtime: GpuRuntime) -> None:
    """Nine dimensions that cannot merge (each operand broadcast along every other one) are refused."""
    ctx = runtime.dispatcher.ctx
    odd, even = (2, 1) * 4 + (2,), (1, 2) * 4 + (1,)
    x, y = ctx.upload(np.ones(odd, np.float32)), ctx.upload(np.ones(even, np.float32))
    with pytest.raises(Unsupported, match="more than 8 dimensions"):
        where(ctx, (x, odd), (y, even), 0.0, (2,) * 9)
    with pytest.raises(Unsupported):
        clip(ctx, 1.0, (x, odd), (y, even), (2,) * 9)
