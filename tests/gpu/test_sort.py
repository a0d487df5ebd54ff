"""The sort kernel against numpy: values bit for bit as np.sort(kind="stable"), indices as stable np.argsort.

Inputs mix in the values whose order is easy to get wrong: -0.0 and 0.0 (equal: they keep their
order), NaN of either sign and with a payload (all last, in their order), infinities, subnormals and
many repeats (stability). Shapes cover one workgroup for whole rows, padding, several rows per
workgroup, and rows long enough for the global passes.
"""

from __future__ import annotations

import numpy as np
import pytest

from remote_magic.worker.gpu import GpuRuntime
from remote_magic.worker.gpu.sort import BLOCK, sort

pytestmark = pytest.mark.gpu

SPECIAL_BITS = np.array([0x00000000, 0x80000000, 0x7FC00000, 0xFFC00000, 0x7FC00001, 0x7F800001, 0x7F800000,
                         0xFF800000, 0x00000001, 0x80000001, 0x007FFFFF], dtype=np.uint32)
"""0.0, -0.0, NaN, -NaN, NaNs with payloads, +inf, -inf, the smallest subnormals (both signs), the largest."""


def mixed(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Few distinct values (so many ties), a tenth of them special."""
    x = rng.integers(-20, 20, size=shape).astype(np.float32) / 4
    special = rng.random(shape) < 0.1
    x[special] = SPECIAL_BITS[rng.integers(0, len(SPECIAL_BITS), size=int(special.sum()))].view(np.float32)
    return x


def gpu_sort(runtime: GpuRuntime, x: np.ndarray, indices: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """Rows of ``x`` (2-D) sorted by the kernel, and their indices when asked."""
    ctx = runtime.dispatcher.ctx
    rows, length = x.shape
    values, order = sort(ctx, ctx.upload(x), rows, length, indices=indices)
    assert (order is not None) == indices
    out = ctx.download(values, x.size).reshape(x.shape)
    return out, None if order is None else ctx.download_indices(order, x.size).reshape(x.shape)


def check(runtime: GpuRuntime, x: np.ndarray) -> None:
    out, order = gpu_sort(runtime, x)
    expected_order = np.argsort(x, axis=-1, kind="stable")
    assert order is not None and order.dtype == np.int64
    np.testing.assert_array_equal(order, expected_order)
    expected = np.sort(x, axis=-1, kind="stable")
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out.view(np.uint32), expected.view(np.uint32))  # -0.0, NaN payloads too
    np.testing.assert_array_equal(out, np.sort(x, axis=-1))  # numpy's default sort: the same values


@pytest.mark.parametrize("shape", [(1, 1), (1, 2), (3, 1), (2, 3), (5, 13), (4, 1000), (1000, 7), (7, BLOCK),
                                   (2, BLOCK + 1), (3, 5000), (1, 200_000)], ids=str)
def test_sort_matches_numpy(runtime: GpuRuntime, rng: np.random.Generator, shape: tuple[int, int]) -> None:
    check(runtime, mixed(rng, shape))


@pytest.mark.parametrize("length", [6, 3000], ids=str)
def test_all_equal_sorted_and_reversed_rows(runtime: GpuRuntime, rng: np.random.Generator, length: int) -> None:
    ascending = np.sort(rng.standard_normal(length).astype(np.float32))
    zeros = np.where(rng.random(length) < 0.5, np.float32(0.0), np.float32(-0.0))
    for x in (np.full(length, 1.5, np.float32), zeros, np.full(length, np.nan, np.float32), ascending,
              ascending[::-1].copy(), np.float32(-np.inf) * np.ones(length, np.float32)):
        check(runtime, np.stack([x, x[::-1]]))


def test_random_values_and_many_rows(runtime: GpuRuntime, rng: np.random.Generator) -> None:
    check(runtime, rng.standard_normal((300, 100)).astype(np.float32))
    check(runtime, rng.standard_normal((1, 70_000)).astype(np.float32))


def test_values_alone_and_empty_arrays(runtime: GpuRuntime, rng: np.random.Generator) -> None:
    x = mixed(rng, (3, 300))
    out, order = gpu_sort(runtime, x, indices=False)
    assert order is None
    np.testing.assert_array_equal(out.view(np.uint32), np.sort(x, axis=-1, kind="stable").view(np.uint32))
    for shape in [(0, 5), (4, 0)]:
        out, order = gpu_sort(runtime, np.zeros(shape, np.float32))
        assert out.shape == shape and order is not None and order.shape == shape


def test_dispatches_count_as_sort(runtime: GpuRuntime, rng: np.random.Generator) -> None:
    runtime.take_stats()
    check(runtime, mixed(rng, (500, 30)))
    assert runtime.take_stats()["kernels"] == {"sort": 1}  # rows that fit a workgroup: one dispatch
    check(runtime, mixed(rng, (1, 4 * BLOCK)))
    # a block sort; stage 4096: stride 2048 and a block merge; stage 8192: strides 4096, 2048 and a merge
    assert runtime.take_stats()["kernels"] == {"sort": 6}


def test_workgroups_fold_past_one_dimension(runtime: GpuRuntime, rng: np.random.Generator,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime.dispatcher.ctx, "max_groups", 6)
    check(runtime, mixed(rng, (2, 3 * BLOCK)))  # 8 block workgroups as 4x2, 32 step workgroups as 6x6
    check(runtime, mixed(rng, (40, 100)))
