"""Matmul against numpy: odd shapes, vectors, batches with broadcasting, empties, specials, splits; every tiling,
with and without vec4 loads, the subgroup kernel where the device has the feature, and the rule that picks one."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace
from typing import Any, Iterator, cast

import numpy as np
import pytest
from gpu_checks import MATMUL_TOL, make_runtime, rel_err, same_specials
from hypothesis import given, settings, strategies as st

from remote_magic.worker.gpu import DeviceArray, GpuRuntime
from remote_magic.worker.gpu.context import DeviceContext
from remote_magic.worker.gpu.matmul import (
    GPU_FILL_WORKGROUPS,
    TILE_32,
    TILE_64,
    TILE_128,
    TILE_SUBGROUPS,
    TILED,
    Tiling,
    choose_tiling,
    matmul,
    naive_tiling,
)

pytestmark = pytest.mark.gpu


def operands(rng: np.random.Generator, a_shape: tuple[int, ...],
             b_shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    return (rng.standard_normal(a_shape).astype(np.float32), rng.standard_normal(b_shape).astype(np.float32))


def check(gpu: Any, a: np.ndarray, b: np.ndarray) -> Any:
    out = gpu.matmul(a, b)
    expected = np.matmul(a.astype(np.float64), b.astype(np.float64))
    assert isinstance(out, (DeviceArray, np.float32)) and out.shape == expected.shape and out.dtype == np.float32
    assert rel_err(np.asarray(out), expected) < MATMUL_TOL
    return out


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (64, 64, 64), (63, 65, 67), (130, 17, 1), (1, 300, 200),
                                   (200, 300, 1), (129, 257, 65), (8, 1, 8), (3, 1000, 5)], ids=str)
def test_matrix_shapes_not_multiples_of_the_tile(gpu: Any, rng: np.random.Generator, m: int, k: int, n: int) -> None:
    check(gpu, *operands(rng, (m, k), (k, n)))


@pytest.mark.parametrize("a_shape,b_shape", [((50,), (50, 7)), ((7, 50), (50,)), ((50,), (50,)),
                                             ((3, 4, 50), (50,)), ((50,), (3, 50, 4))], ids=str)
def test_vectors_are_promoted_like_numpy(gpu: Any, rng: np.random.Generator,
                                         a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> None:
    a, b = operands(rng, a_shape, b_shape)
    # (50,) @ (50,) has one output: one-signed terms keep its tolerance about the kernel, not cancellation
    check(gpu, np.abs(a), np.abs(b))


@pytest.mark.parametrize("a_shape,b_shape", [((3, 40, 30), (30, 20)), ((40, 30), (3, 30, 20)),
                                             ((2, 1, 40, 30), (1, 4, 30, 20)), ((5, 33, 17), (5, 17, 9)),
                                             ((2, 3, 1, 9, 10), (3, 4, 10, 11))], ids=str)
def test_batched_with_broadcast_leading_dims(gpu: Any, rng: np.random.Generator,
                                             a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> None:
    check(gpu, *operands(rng, a_shape, b_shape))


@pytest.mark.parametrize("a_shape,b_shape", [((0, 5), (5, 3)), ((4, 5), (5, 0)), ((4, 0), (0, 3)),
                                             ((2, 0, 3, 4), (4, 5))], ids=str)
def test_zero_size(gpu: Any, a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> None:
    a, b = np.ones(a_shape, np.float32), np.ones(b_shape, np.float32)
    out = np.asarray(gpu.matmul(a, b))
    np.testing.assert_array_equal(out, np.matmul(a, b))  # includes the all-zero result when k == 0


def test_nan_and_inf_propagate(gpu: Any, rng: np.random.Generator) -> None:
    a, b = operands(rng, (70, 40), (40, 33))
    b[np.abs(b) < 1e-3] = 1.0  # no exact zeros: inf * 0 would be NaN on either side
    a[3, 5] = np.nan
    a[7, 2] = np.inf
    b[9, 30] = -np.inf
    with np.errstate(invalid="ignore"):
        expected = a @ b
        out = np.asarray(gpu.matmul(a, b))  # numpy's answer: a result with NaN or inf is computed by numpy
    same_specials(out, expected)
    finite = np.isfinite(expected)
    assert rel_err(out[finite], expected[finite]) < MATMUL_TOL


def test_operator_and_numpy_function_with_mixed_operands(gpu: Any, rng: np.random.Generator) -> None:
    a, b = operands(rng, (31, 29), (29, 23))
    x = gpu.array(a)
    for out in (x @ b, a @ gpu.array(b), x.T.T @ b, np.matmul(x, b), np.dot(x, b)):
        assert isinstance(out, DeviceArray)
        assert rel_err(np.asarray(out), a.astype(np.float64) @ b) < MATMUL_TOL


def test_shape_errors_are_numpys(gpu: Any) -> None:
    with pytest.raises(ValueError, match="mismatch in its core dimension"):
        gpu.matmul(np.ones((3, 4), np.float32), np.ones((5, 6), np.float32))
    with pytest.raises(ValueError, match="not have enough dimensions"):
        gpu.matmul(np.float32(2.0), np.ones((2, 2), np.float32))
    with pytest.raises(ValueError):
        gpu.matmul(np.ones((2, 3, 4), np.float32), np.ones((5, 4, 6), np.float32))


@pytest.fixture(scope="module")
def narrow_runtime() -> Iterator[GpuRuntime]:
    """A runtime with the 8x8-invocation (64x64 tile) matmul workgroup."""
    rt = make_runtime(matmul_threads=8)
    yield rt
    rt.close()


def test_more_workgroups_than_one_dimension_allows(narrow_runtime: GpuRuntime, rng: np.random.Generator) -> None:
    a, b = operands(rng, (70_000, 1, 2), (70_000, 2, 1))  # one workgroup per batch entry: folded into y
    assert narrow_runtime.dispatcher.ctx.max_groups < 70_000
    check(narrow_runtime.gpu, a, b)


@pytest.mark.parametrize("a_shape,b_shape", [((130, 70), (70, 257)), ((3, 65, 31), (31, 140)), ((1, 5), (5, 2))],
                         ids=str)
def test_narrow_tiles(narrow_runtime: GpuRuntime, rng: np.random.Generator,
                      a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> None:
    check(narrow_runtime.gpu, *operands(rng, a_shape, b_shape))


@pytest.fixture(scope="module")
def small_binding() -> Iterator[GpuRuntime]:
    """A runtime whose bindings hold at most 64 KiB, so modest products must be split."""
    rt = make_runtime(max_binding_bytes=64 * 1024)
    yield rt
    rt.close()


@pytest.mark.parametrize("a_shape,b_shape", [((200, 130), (130, 150)), ((20, 40, 50), (20, 50, 30)),
                                             ((20, 40, 50), (50, 30)), ((3, 20_000), (20_000, 2)),
                                             ((2, 3, 90, 100), (3, 100, 80))], ids=str)
def test_matmul_past_the_binding_limit_is_split(small_binding: GpuRuntime, rng: np.random.Generator,
                                                a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> None:
    small_binding.take_stats()
    a, b = operands(rng, a_shape, b_shape)
    assert max(a.nbytes, b.nbytes, 4 * np.matmul(a, b).size) > 64 * 1024
    check(small_binding.gpu, a, b)
    assert small_binding.take_stats()["kernels"]["matmul"] > 1


def kernel_product(runtime: GpuRuntime, a: np.ndarray, b: np.ndarray, **options: Any) -> np.ndarray:
    """``a @ b`` (at least 2-D each) straight through the matmul launcher, with its ``options``."""
    ctx = runtime.dispatcher.ctx
    out, shape = matmul(ctx, ctx.upload(a), a.shape, ctx.upload(b), b.shape, **options)
    return ctx.download(out, math.prod(shape)).reshape(shape)


TILINGS = [TILE_128, TILE_64, TILE_32, naive_tiling(16, 16), naive_tiling(1, 256), naive_tiling(256, 1)]


@pytest.mark.parametrize("vectorize", [True, False], ids=["vec4", "scalar"])
@pytest.mark.parametrize("tiling", TILINGS, ids=lambda t: f"{t.name}-{t.wx}x{t.wy}")
@pytest.mark.parametrize("a_shape,b_shape", [((70, 36), (36, 68)), ((65, 33), (33, 67)), ((3, 1), (1, 5)),
                                             ((2, 1, 20, 44), (1, 3, 44, 12))], ids=str)
def test_every_tiling_matches_numpy(runtime: GpuRuntime, rng: np.random.Generator, tiling: Tiling, vectorize: bool,
                                    a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> None:
    a, b = operands(rng, a_shape, b_shape)  # aligned to 4 (vec4 loads when asked), odd, K of 1, batched
    out = kernel_product(runtime, a, b, tiling=tiling, vectorize=vectorize)
    assert rel_err(out, np.matmul(a.astype(np.float64), b)) < MATMUL_TOL


def test_a_tiled_kernel_folds_workgroups_past_one_dimension(narrow_runtime: GpuRuntime,
                                                             rng: np.random.Generator) -> None:
    a, b = operands(rng, (70_000, 1, 4), (70_000, 4, 1))
    out = kernel_product(narrow_runtime, a, b, tiling=TILE_32)
    assert rel_err(out, np.matmul(a.astype(np.float64), b)) < MATMUL_TOL


@pytest.fixture(scope="module")
def subgroup_runtime(wgpu_runtime: GpuRuntime) -> GpuRuntime:
    """The wgpu runtime, if its device has the "subgroups" feature (a browser tab's never has)."""
    if not wgpu_runtime.dispatcher.ctx.device.subgroups:  # skipped even under REMOTE_MAGIC_REQUIRE_GPU=1
        pytest.skip("the wgpu adapter lacks the subgroups feature: no subgroup matmul to test")
    return wgpu_runtime


@pytest.mark.parametrize("lanes", [TILE_SUBGROUPS.wx, 4, 16], ids=lambda n: f"{n}-lanes")
@pytest.mark.parametrize("vectorize", [True, False], ids=["vec4", "scalar"])
@pytest.mark.parametrize("a_shape,b_shape", [((70, 36), (36, 68)), ((65, 33), (33, 67)), ((3, 1), (1, 5)),
                                             ((2, 1, 20, 44), (1, 3, 44, 12)), ((129, 257), (257, 65)),
                                             ((1, 300), (300, 200)), ((200, 300), (300, 1))], ids=str)
def test_the_subgroup_kernel_matches_numpy(subgroup_runtime: GpuRuntime, rng: np.random.Generator, lanes: int,
                                           vectorize: bool, a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> None:
    # Workgroups of other sizes than the shipped one: smaller than a subgroup (a partial one, still shared)
    # and, on most adapters, larger (several subgroups: the kernel's path without sharing)
    tiling = dataclasses.replace(TILE_SUBGROUPS, wx=lanes)
    a, b = operands(rng, a_shape, b_shape)
    out = kernel_product(subgroup_runtime, a, b, tiling=tiling, vectorize=vectorize)
    assert rel_err(out, np.matmul(a.astype(np.float64), b)) < MATMUL_TOL


@pytest.mark.parametrize("a_shape,b_shape", [((200, 132), (132, 152)), ((20, 40, 50), (20, 50, 30)),
                                             ((3, 20_000), (20_000, 2))], ids=str)
def test_the_subgroup_kernel_past_the_binding_limit(small_binding: GpuRuntime, rng: np.random.Generator,
                                                    a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> None:
    if not small_binding.dispatcher.ctx.device.subgroups:
        pytest.skip("the wgpu adapter lacks the subgroups feature: no subgroup matmul to test")
    small_binding.take_stats()
    a, b = operands(rng, a_shape, b_shape)
    out = kernel_product(small_binding, a, b, tiling=TILE_SUBGROUPS)
    assert rel_err(out, np.matmul(a.astype(np.float64), b)) < MATMUL_TOL
    assert small_binding.take_stats()["kernels"]["matmul"] > 1


def test_a_tab_device_has_no_subgroup_kernel(tab_runtime: GpuRuntime, rng: np.random.Generator) -> None:
    ctx = tab_runtime.dispatcher.ctx
    assert not ctx.device.subgroups
    a, b = operands(rng, (20, 30), (30, 40))
    with pytest.raises(ValueError, match="subgroups feature"):
        matmul(ctx, ctx.upload(a), a.shape, ctx.upload(b), b.shape, tiling=TILE_SUBGROUPS)


def fake_context(adapter_type: str = "discrete-gpu", subgroups: bool = False, max_groups: int = 65_535,
                 **limits: int) -> DeviceContext:
    """Just what :func:`choose_tiling` reads of a context: the adapter's type, subgroups feature and limits."""
    device = SimpleNamespace(info=SimpleNamespace(adapter_type=adapter_type), subgroups=subgroups, limits=limits)
    return cast(DeviceContext, SimpleNamespace(device=device, max_groups=max_groups))


@pytest.mark.parametrize("dims,batch,expected", [
    ((4096, 4096, 4096), 1, TILE_128),      # 1,024 tiles of 128x128: the most reuse still fills the GPU
    ((2048, 2048, 64), 1, TILE_128),        # 256 tiles: just enough
    ((1024, 1024, 1024), 1, TILE_64),       # 64 tiles of 128x128 would leave most compute units idle
    ((1024, 1024, 1024), 4, TILE_128),      # ... unless the batch makes up for it
    ((384, 384, 384), 1, TILE_32),          # 144 workgroups: over half the target
    ((256, 256, 256), 1, "naive"),          # 64 tiles of 32x32 can't keep a GPU busy, nor K's parts as deep as 256
    ((128, 768, 3072), 1, "32x32, K in 4"),  # a GPT-2 block's MLP down: 96 tiles, each of 4 parts of K
    ((128, 768, 768), 1, "32x32, K in 2"),   # its attention's projection: 192 workgroups, over half the target
    ((64, 64, 8192), 1, "32x32, K in 32"),   # 4 tiles: the most parts there are, 128 workgroups
    ((32, 32, 8192), 1, "naive"),            # 1 tile: 32 parts make too few workgroups to fill the GPU
    ((128, 768, 3000), 1, "naive"),          # K in no parts of a multiple of 16 (the tiles' K step)
    ((4096, 40, 64), 1, TILE_32),           # 40 columns: no 128-wide tile, and 64x64 makes only 64
    ((1, 1024, 1024), 1, "naive"),          # a vector-matrix product
    ((4096, 8, 4096), 1, "naive"),          # eight columns
], ids=str)
def test_choice_on_a_gpu(dims: tuple[int, int, int], batch: int, expected: Tiling | str) -> None:
    chosen = choose_tiling(fake_context(), dims, batch)
    assert chosen == expected or chosen.name == expected


def test_choice_within_limits_and_threads() -> None:
    big = (8192, 8192, 8192)
    assert choose_tiling(fake_context(), big, 1) == TILE_128
    assert choose_tiling(fake_context(), big, 1, threads=8) == TILE_64
    assert choose_tiling(fake_context(max_compute_workgroup_storage_size=8192), big, 1) == TILE_64
    assert choose_tiling(fake_context(max_compute_invocations_per_workgroup=64), big, 1) == TILE_64
    assert choose_tiling(fake_context(max_compute_workgroup_storage_size=2048), big, 1).name == "naive"


def test_choice_on_a_software_adapter_fills_the_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("remote_magic.worker.gpu.matmul.os.cpu_count", lambda: 2)
    cpu = fake_context("software")
    assert choose_tiling(cpu, (256, 256, 256), 1) == TILE_128  # 4 workgroups for 2 threads
    assert choose_tiling(cpu, (128, 128, 128), 1) == TILE_64
    assert choose_tiling(cpu, (1024, 1024, 1024), 1) == TILE_128
    assert GPU_FILL_WORKGROUPS > 4 * 2


def test_subgroups_chosen_only_where_they_measured_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("remote_magic.worker.gpu.matmul.os.cpu_count", lambda: 2)
    cpu = fake_context("software", subgroups=True)
    assert choose_tiling(cpu, (256, 256, 256), 1) == TILE_SUBGROUPS  # lavapipe: 1.2-1.6x the tiles up to 512
    assert choose_tiling(cpu, (512, 512, 512), 1) == TILE_SUBGROUPS
    assert choose_tiling(cpu, (32, 1024, 1024), 1) == TILE_SUBGROUPS
    assert choose_tiling(cpu, (1024, 1024, 1024), 1) == TILE_128  # even at 1024, slower past it
    assert choose_tiling(cpu, (1, 1024, 1024), 1).name == "naive"  # skinny: as without subgroups
    assert choose_tiling(fake_context(subgroups=True), (384, 384, 384), 1) == TILE_32  # never measured on a GPU
    few = fake_context("software", subgroups=True, max_groups=7)  # 49 workgroups a dispatch: 9 tiles, 190 not
    assert choose_tiling(few, (300, 300, 20), 1) == TILE_128


def test_split_k_fills_the_cpus_of_a_software_adapter_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("remote_magic.worker.gpu.matmul.os.cpu_count", lambda: 2)
    cpu = fake_context("software")
    assert choose_tiling(cpu, (32, 32, 4096), 1).name == "32x32, K in 4"  # 1 tile: naive ran it 5.3-5.5x slower
    assert choose_tiling(cpu, (32, 32, 256), 1).name == "naive"  # a K too short to split
    with_subgroups = fake_context("software", subgroups=True)  # which it measured faster than split-K there
    assert choose_tiling(with_subgroups, (32, 32, 4096), 1) == TILE_SUBGROUPS


@pytest.mark.parametrize("vectorize", [True, False], ids=["vec4", "scalar"])
@pytest.mark.parametrize("tiling", [TILE_32.split_k(2), TILE_64.split_k(4), TILE_128.split_k(3)], ids=lambda t: t.name)
@pytest.mark.parametrize("a_shape,b_shape", [((70, 96), (96, 68)), ((65, 48), (48, 67)),
                                             ((2, 1, 20, 96), (1, 3, 96, 12)), ((40, 48), (48,))], ids=str)
def test_split_k_matches_numpy(runtime: GpuRuntime, rng: np.random.Generator, tiling: Tiling, vectorize: bool,
                               a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> None:
    a, b = operands(rng, a_shape, b_shape)  # aligned and odd, batched and broadcast; K in equal parts
    if b.ndim == 1:
        b = b[:, None]
    ctx = runtime.dispatcher.ctx
    ctx.stats.kernels.clear()
    out = kernel_product(runtime, a, b, tiling=tiling, vectorize=vectorize)
    assert rel_err(out, np.matmul(a.astype(np.float64), b)) < MATMUL_TOL
    assert ctx.stats.kernels["matmul"] == 2  # the parts' products, then their sum


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(m=st.integers(1, 70), n=st.integers(1, 70), depth=st.integers(1, 40), parts=st.sampled_from([2, 3, 4, 8, 32]),
       tiling=st.sampled_from(TILED), vectorize=st.booleans(), nan_at=st.none() | st.integers(0, 10_000))
def test_split_k_property(runtime: GpuRuntime, m: int, n: int, depth: int, parts: int, tiling: Tiling,
                          vectorize: bool, nan_at: int | None) -> None:
    """Any shape, K in any number of equal parts, against numpy in float64, a NaN (or none) anywhere in A."""
    rng = np.random.default_rng(m * 10_000 + n * 100 + depth)
    a, b = operands(rng, (m, depth * parts), (depth * parts, n))
    if nan_at is not None:
        a.flat[nan_at % a.size] = np.nan
    out = kernel_product(runtime, a, b, tiling=tiling.split_k(parts), vectorize=vectorize)
    expected = np.matmul(a.astype(np.float64), b)
    same_specials(out, expected)
    finite = np.isfinite(expected)
    assert rel_err(out[finite], expected[finite]) < MATMUL_TOL


def test_split_k_past_the_binding_limit_adds_each_blocks_parts_onto_c(small_binding: GpuRuntime,
                                                                     rng: np.random.Generator,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    pipelines = small_binding.dispatcher.ctx.pipelines
    entries: list[str] = []
    original = pipelines.get
    monkeypatch.setattr(pipelines, "get", lambda shader, entry, constants=None: (
        entries.append(entry), original(shader, entry, constants))[1])
    a, b = operands(rng, (24, 4096), (4096, 20))  # 384 KiB and 320 KiB: blocks of K, each split in two
    out = kernel_product(small_binding, a, b, tiling=TILE_32.split_k(2))
    assert rel_err(out, np.matmul(a.astype(np.float64), b)) < MATMUL_TOL
    assert entries.count("sum_splits") == entries.count("tiled4") > 1, entries


@pytest.mark.parametrize("m,n", [(1, 1000), (1000, 1), (3, 7), (16, 16), (200, 300)], ids=str)
def test_naive_workgroups_follow_the_shape_of_c(m: int, n: int) -> None:
    tiling = naive_tiling(m, n)
    assert tiling.wx * tiling.wy <= 256
    assert tiling.wx <= max(1 << (n - 1).bit_length(), 1) and tiling.wy <= max(1 << (m - 1).bit_length(), 1)
    assert tiling.wx * tiling.wy == 256 or (tiling.wx >= n and tiling.wy >= m)


def test_split_blocks_keep_vec4_loads(small_binding: GpuRuntime, rng: np.random.Generator,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    pipelines = small_binding.dispatcher.ctx.pipelines
    asked: list[dict[str, float]] = []
    original = pipelines.get

    def spy(shader: str, entry: str, constants: dict[str, float] | None = None) -> Any:
        asked.append(dict(constants or {}))
        return original(shader, entry, constants)

    monkeypatch.setattr(pipelines, "get", spy)
    a, b = operands(rng, (200, 132), (132, 152))  # K and N multiples of 4; over 64 KiB each, so split over K too
    check(small_binding.gpu, a, b)
    assert len(asked) > 1 and all(c.get("VEC4") == 1 for c in asked)
