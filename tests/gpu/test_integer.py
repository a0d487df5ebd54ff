"""The 32-bit integer kernels (integer.wgsl) against numpy's int32 and uint32 loops, exactly, at the launch level.

Operands are uploaded as their bits (viewed as float32, which moves bytes unchanged) and results read back
the same way. Every pair of edge values (INT_MIN, INT_MAX, 0, -1, values whose products overflow...) meets
every other, as a column against a row; shifts run every count from -2 to 40; random full-range values
run dense (four outputs per invocation), broadcast and beside a Python int.
"""

from __future__ import annotations

from typing import Optional, Union

import numpy as np
import pytest

from remote_magic.worker.gpu import GpuRuntime
from remote_magic.worker.gpu.integer import BINARY, COMPARISONS, UNARY, IntOperand, integer
from remote_magic.worker.gpu.launch import Unsupported

pytestmark = pytest.mark.gpu

Value = Union[np.ndarray, int]
"""An operand on the host: an array (uploaded, then broadcast) or a Python int (in the uniform)."""

I32 = np.iinfo(np.int32)
EDGES = {
    np.int32: np.array([I32.min, I32.min + 1, -65536, -46341, -7, -3, -2, -1, 0, 1, 2, 3, 7, 31, 32, 46341,
                        65536, I32.max - 1, I32.max], np.int32),
    np.uint32: np.array([0, 1, 2, 3, 7, 31, 32, 46341, 65535, 65536, 2**31 - 1, 2**31, 2**31 + 1, 2**32 - 7,
                         2**32 - 2, 2**32 - 1], np.uint32),
}
"""Each type's extremes and their neighbours, small values of both signs, and squares past the range."""
DTYPES = [np.int32, np.uint32]


def run(runtime: GpuRuntime, name: str, operands: tuple[Value, ...], out_shape: tuple[int, ...],
        dtype: type) -> np.ndarray:
    """The kernel on these operands, read back as an ``out_shape`` array of ``dtype``."""
    ctx = runtime.dispatcher.ctx
    ops: list[IntOperand] = [v if isinstance(v, int) else (ctx.upload(np.ascontiguousarray(v).view(np.float32)),
                                                           v.shape) for v in operands]
    out = integer(ctx, name, ops, out_shape, signed=dtype == np.int32)
    result: np.ndarray = ctx.download(out, int(np.prod(out_shape))).view(dtype).reshape(out_shape)
    return result


def reference(name: str, operands: tuple[Value, ...], dtype: type) -> np.ndarray:
    """numpy's answer: arrays of ``dtype``, Python ints as they are (numpy's rules for them), warnings off."""
    with np.errstate(all="ignore"):
        expected = np.asarray(getattr(np, name)(*operands))
    assert expected.dtype == (np.bool_ if name in COMPARISONS else dtype), expected.dtype
    return expected


def check(runtime: GpuRuntime, name: str, operands: tuple[Value, ...], dtype: type) -> np.ndarray:
    """The kernel's answer equals numpy's exactly (a bool as 0 or 1)."""
    expected = reference(name, operands, dtype)
    out = run(runtime, name, operands, expected.shape, dtype)
    np.testing.assert_array_equal(out, expected.astype(dtype), err_msg=f"{name} on {np.dtype(dtype)}")
    return out


def random_values(rng: np.random.Generator, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    """Half full-range values, a quarter small ones (divisions, ties and shifts are common), a quarter edges."""
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    kind = rng.integers(0, 4, size=shape)
    small = rng.integers(-9 if dtype == np.int32 else 0, 10, size=shape).astype(dtype)
    x = np.where(kind == 0, small, x)
    edges = EDGES[dtype]
    return np.asarray(np.where(kind == 1, edges[rng.integers(0, len(edges), size=shape)], x), dtype)


def random_scalar(rng: np.random.Generator, dtype: type, name: str) -> int:
    value = int(rng.choice(EDGES[dtype])) if rng.random() < 0.5 else int(rng.integers(0, 9))
    if name in ("left_shift", "right_shift") and rng.random() < 0.5:
        value = int(rng.integers(-2 if dtype == np.int32 else 0, 41))
    return value


@pytest.mark.parametrize("dtype", DTYPES, ids=["int32", "uint32"])
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_on_every_pair_of_edges_and_broadcasts(runtime: GpuRuntime, rng: np.random.Generator, name: str,
                                                      dtype: type) -> None:
    edges = EDGES[dtype]
    check(runtime, name, (edges.reshape(-1, 1), edges.reshape(1, -1)), dtype)  # a column against a row
    x = random_values(rng, dtype, (37, 29))
    check(runtime, name, (x, random_values(rng, dtype, (37, 29))), dtype)  # dense: four per invocation
    check(runtime, name, (x, random_values(rng, dtype, (29,))), dtype)  # a shorter row
    check(runtime, name, (random_values(rng, dtype, (3, 1, 5)), random_values(rng, dtype, (4, 1))), dtype)
    for value in (random_scalar(rng, dtype, name), int(edges[0]), int(edges[-1]), 0):
        check(runtime, name, (x, value), dtype)
        check(runtime, name, (value, x[:, :7]), dtype)
    check(runtime, name, (np.array(edges[1], dtype), x), dtype)  # a 0-d array


@pytest.mark.parametrize("dtype", DTYPES, ids=["int32", "uint32"])
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_on_edges_and_broadcasts(runtime: GpuRuntime, rng: np.random.Generator, name: str,
                                       dtype: type) -> None:
    check(runtime, name, (EDGES[dtype],), dtype)
    check(runtime, name, (random_values(rng, dtype, (33, 17)),), dtype)
    ctx = runtime.dispatcher.ctx
    x = random_values(rng, dtype, (5, 1))  # read broadcast, through its strides
    out = integer(ctx, name, [(ctx.upload(x.view(np.float32)), x.shape)], (5, 6), signed=dtype == np.int32)
    np.testing.assert_array_equal(ctx.download(out, 30).view(dtype).reshape(5, 6),
                                  np.broadcast_to(reference(name, (x,), dtype).astype(dtype), (5, 6)))
    for value in (int(EDGES[dtype][0]), int(EDGES[dtype][-1]), 0):  # a Python int alone
        expected = reference(name, (np.array(value, dtype),), dtype).astype(dtype)
        np.testing.assert_array_equal(run(runtime, name, (value,), (3,), dtype), np.broadcast_to(expected, (3,)))


@pytest.mark.parametrize("dtype", DTYPES, ids=["int32", "uint32"])
def test_shifts_by_every_count(runtime: GpuRuntime, dtype: type) -> None:
    """Counts -2 to 40 (for uint32, the bits of -2 and -1: counts past 2^31): 0 past 31, or -1 shifting a
    negative int32 right; as arrays and as Python ints."""
    counts = np.arange(-2, 41).astype(dtype)  # as uint32, -2 and -1 are 2**32 - 2 and 2**32 - 1
    x = EDGES[dtype]
    for name in ("left_shift", "right_shift"):
        check(runtime, name, (x.reshape(-1, 1), counts), dtype)
        for count in (-2, -1, 0, 1, 30, 31, 32, 33, 40) if dtype == np.int32 else (0, 1, 31, 32, 33, 40, 2**32 - 1):
            check(runtime, name, (x, count), dtype)
    assert run(runtime, "right_shift", (np.array([-5, 5]).astype(dtype), 32), (2,), dtype).tolist() == (
        [-1, 0] if dtype == np.int32 else [0, 0])  # -5 as uint32 is 2**32 - 5: no sign to fill with


def test_numpys_division_corner_cases(runtime: GpuRuntime) -> None:
    """Floor semantics, zero divisors giving 0, and INT_MIN // -1 wrapping to INT_MIN (remainder 0)."""
    x = np.array([7, -7, 7, -7, 6, -6, I32.min, I32.min, I32.min, I32.max, 5, 0, I32.min], np.int32)
    y = np.array([2, 2, -2, -2, -3, 3, -1, 1, 2, -1, 0, 0, I32.min], np.int32)
    q = run(runtime, "floor_divide", (x, y), x.shape, np.int32)
    r = run(runtime, "remainder", (x, y), x.shape, np.int32)
    assert q.tolist() == [3, -4, -4, 3, -2, -2, I32.min, I32.min, -(2**30), -I32.max, 0, 0, 1]
    assert r.tolist() == [1, 1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    u = np.array([7, 0, 2**32 - 1, 2**32 - 1], np.uint32)
    v = np.array([0, 0, 2, 2**32 - 1], np.uint32)
    assert run(runtime, "floor_divide", (u, v), u.shape, np.uint32).tolist() == [0, 0, 2**31 - 1, 1]
    assert run(runtime, "remainder", (u, v), u.shape, np.uint32).tolist() == [0, 0, 1, 0]


def test_wraparound_and_sign_edges(runtime: GpuRuntime) -> None:
    x = np.array([I32.max, I32.min, 46341, -1], np.int32)
    assert run(runtime, "add", (x, 1), x.shape, np.int32).tolist() == [I32.min, I32.min + 1, 46342, 0]
    assert run(runtime, "absolute", (x,), x.shape, np.int32).tolist() == [I32.max, I32.min, 46341, 1]
    assert run(runtime, "negative", (x,), x.shape, np.int32).tolist() == [-I32.max, I32.min, -46341, 1]
    assert run(runtime, "square", (x,), x.shape, np.int32).tolist() == [1, 0, -2147479015, 1]
    u = np.array([0, 1, 2**32 - 1], np.uint32)
    assert run(runtime, "negative", (u,), u.shape, np.uint32).tolist() == [0, 2**32 - 1, 1]
    assert run(runtime, "subtract", (0, u), u.shape, np.uint32).tolist() == [0, 2**32 - 1, 1]
    assert run(runtime, "sign", (u,), u.shape, np.uint32).tolist() == [0, 1, 1]


SHAPES: list[tuple[tuple[int, ...], Optional[tuple[int, ...]]]] = [
    ((0, 3), (1, 3)),  # empty
    ((3, 0), None),
    ((0,), (0,)),
    ((1,) * 10 + (3,), (3,)),  # more than 8 dimensions, only one that needs an index
    ((1, 1, 300), (2, 1, 1)),  # rows longer than a workgroup
    ((2, 1, 3, 1, 2), (1, 4, 1, 5, 1)),  # each broadcast along the other's dimensions
]


@pytest.mark.parametrize("shapes", SHAPES, ids=str)
def test_shapes(runtime: GpuRuntime, rng: np.random.Generator,
                shapes: tuple[tuple[int, ...], Optional[tuple[int, ...]]]) -> None:
    for dtype, name in ((np.int32, "floor_divide"), (np.uint32, "right_shift"), (np.int32, "less_equal")):
        a = random_values(rng, dtype, shapes[0])
        b: Value = 3 if shapes[1] is None else random_values(rng, dtype, shapes[1])
        check(runtime, name, (a, b), dtype)
        check(runtime, name, (b, a), dtype)


def test_large_arrays_fold_their_workgroups(runtime: GpuRuntime, rng: np.random.Generator,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the per-dimension workgroup limit (here 7) the kernels number their workgroups x + y * num_workgroups.x."""
    monkeypatch.setattr(runtime.dispatcher.ctx, "max_groups", 7)
    rows = 45  # 45 * 256 outputs: 45 workgroups, dispatched as 7 x 7 (four of them idle)
    check(runtime, "multiply", (random_values(rng, np.int32, (rows, 256)), random_values(rng, np.int32, (rows, 1))),
          np.int32)
    check(runtime, "remainder", (random_values(rng, np.uint32, (4 * rows * 256 + 3,)), 7), np.uint32)  # dense, by 4


def test_dispatches_are_counted_by_name(runtime: GpuRuntime) -> None:
    ctx = runtime.dispatcher.ctx
    runtime.take_stats()
    x = EDGES[np.int32]
    run(runtime, "add", (x, x), x.shape, np.int32)
    run(runtime, "add", (x.reshape(-1, 1), x), (len(x), len(x)), np.int32)
    run(runtime, "invert", (x,), x.shape, np.int32)
    run(runtime, "add", (x[:0], 1), (0,), np.int32)  # empty: no dispatch
    assert dict(ctx.stats.kernels) == {"add": 2, "invert": 1}


def test_refusals(runtime: GpuRuntime) -> None:
    ctx = runtime.dispatcher.ctx
    odd, even = (2, 1) * 4 + (2,), (1, 2) * 4 + (1,)
    x, y = ctx.upload(np.ones(odd, np.float32)), ctx.upload(np.ones(even, np.float32))
    with pytest.raises(Unsupported, match="more than 8 dimensions"):
        integer(ctx, "add", [(x, odd), (y, even)], (2,) * 9, signed=True)
    with pytest.raises(ValueError, match="at most one"):
        integer(ctx, "add", [1, 2], (3,), signed=True)
    with pytest.raises(ValueError, match="no 1-operand"):
        integer(ctx, "add", [(x, odd)], odd, signed=True)
    with pytest.raises(ValueError, match="neither int32 nor uint32"):
        integer(ctx, "add", [(x, odd), 2**32], odd, signed=False)
