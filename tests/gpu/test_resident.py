"""Arrays kept on the GPU between cells: found by content, least recently used first out,
never written in place, forgotten with a lost device."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import pytest
import wgpu
from gpu_checks import DOUBLING_WGSL, make_runtime

from remote_magic.errors import GpuError
from remote_magic.worker.gpu import GpuRuntime
from remote_magic.worker.gpu.memory import Allocation
from remote_magic.worker.gpu.resident import ResidentBuffers, content_key
from remote_magic.worker.gpu.runtime import MAX_DEFAULT_GPU_MEMORY

pytestmark = pytest.mark.gpu

KIB_ARRAY = 1024
"""float32 values in a 4 KiB array: one size class, so budgets below count whole arrays."""


@pytest.fixture
def fresh() -> Iterator[GpuRuntime]:
    rt = make_runtime()
    yield rt
    rt.close()


def _cell(rt: GpuRuntime, **values: np.ndarray) -> dict[str, Any]:
    """What the executor does with a GPU cell's inputs: each arrives as a new numpy array."""
    return rt.to_device({name: value.copy() for name, value in values.items()})


class _Pool:
    def release(self, buffer: object) -> None:
        pass


def _allocation(nbytes: int) -> Allocation:
    return Allocation(object(), nbytes, _Pool())  # type: ignore[arg-type]


def test_the_key_is_the_float32_content() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert content_key(a) == content_key(a.copy()) == content_key(a.reshape(12))  # the same bytes
    assert content_key(a.T) == content_key(np.ascontiguousarray(a.T))
    changed = a.copy()
    changed[1, 1] = np.nextafter(changed[1, 1], np.float32(100))  # one ulp
    assert content_key(changed) != content_key(a)
    assert content_key(a)[1] == a.nbytes


def test_least_recently_used_goes_first_past_the_budget() -> None:
    cache = ResidentBuffers(3 * 4 * KIB_ARRAY)
    keys = [(bytes([i]) * 16, 4 * KIB_ARRAY) for i in range(4)]
    allocs = [_allocation(4 * KIB_ARRAY) for _ in keys]
    for key, alloc in zip(keys[:3], allocs):
        cache.keep(key, alloc)
    assert cache.get(keys[0]) is allocs[0]  # now the most recently used
    cache.keep(keys[3], allocs[3])
    assert keys[1] not in cache and [k in cache for k in (keys[0], keys[2], keys[3])] == [True, True, True]
    assert cache.used_bytes == 3 * 4 * KIB_ARRAY and len(cache) == 3
    cache.keep((b"x" * 16, 16 * KIB_ARRAY), _allocation(16 * KIB_ARRAY))  # larger than the whole budget
    assert len(cache) == 3, "a buffer larger than the budget is not kept"
    cache.clear()
    assert len(cache) == 0 and cache.used_bytes == 0


def test_an_unchanged_input_is_not_uploaded_again(fresh: GpuRuntime, rng: np.random.Generator) -> None:
    a = rng.standard_normal((64, 48)).astype(np.float32)
    b = rng.standard_normal((48, 32)).astype(np.float32)
    fresh.take_stats()
    first = fresh.to_host({"C": (lambda c: c["A"] @ c["B"])(_cell(fresh, A=a, B=b))})["C"]
    stats = fresh.take_stats()
    assert stats["uploads"] == 2 and stats["bytes_uploaded"] == a.nbytes + b.nbytes and stats["resident_hits"] == 0
    again = fresh.to_host({"C": (lambda c: c["A"] @ c["B"])(_cell(fresh, A=a, B=b))})["C"]
    stats = fresh.take_stats()
    assert stats["uploads"] == 0 and stats["bytes_uploaded"] == 0
    assert stats["resident_hits"] == 2 and stats["bytes_resident"] == a.nbytes + b.nbytes
    assert stats["readbacks"] == 1
    np.testing.assert_array_equal(again, first)
    changed = a.copy()
    changed[0, 0] += 1
    fresh.to_host({"C": (lambda c: c["A"] @ c["B"])(_cell(fresh, A=changed, B=b))})
    stats = fresh.take_stats()
    assert stats["bytes_uploaded"] == a.nbytes and stats["resident_hits"] == 1, "only the changed input goes up"


def test_a_result_read_back_serves_the_next_cell_that_sends_it(fresh: GpuRuntime, rng: np.random.Generator) -> None:
    a = rng.standard_normal((40, 40)).astype(np.float32)
    cell = _cell(fresh, A=a)
    returned = fresh.to_host({"C": cell["A"] @ cell["A"]})["C"]  # back to the notebook, as before
    assert isinstance(returned, np.ndarray)
    fresh.take_stats()
    total = float(_cell(fresh, C=returned)["C"].sum())
    stats = fresh.take_stats()
    assert stats["bytes_uploaded"] == 0 and stats["resident_hits"] == 1
    assert total == pytest.approx(float(returned.astype(np.float64).sum()), rel=1e-5, abs=1e-3)


def test_a_small_budget_keeps_the_most_recently_used(rng: np.random.Generator) -> None:
    rt = make_runtime(gpu_memory=2 * 4 * KIB_ARRAY)
    try:
        x, y, z = (rng.standard_normal(KIB_ARRAY).astype(np.float32) for _ in range(3))
        for value in (x, y, z):  # z evicts x
            _cell(rt, V=value)["V"].sum()
        rt.take_stats()
        _cell(rt, V=z)["V"].sum()
        _cell(rt, V=y)["V"].sum()
        assert rt.take_stats()["resident_hits"] == 2
        _cell(rt, V=x)["V"].sum()
        stats = rt.take_stats()
        assert stats["resident_hits"] == 0 and stats["bytes_uploaded"] == x.nbytes
    finally:
        rt.close()


def test_no_budget_keeps_nothing(rng: np.random.Generator) -> None:
    rt = make_runtime(gpu_memory=0)
    try:
        a = rng.standard_normal(100).astype(np.float32)
        _cell(rt, A=a)["A"].sum()
        rt.take_stats()
        _cell(rt, A=a)["A"].sum()
        stats = rt.take_stats()
        assert stats["resident_hits"] == 0 and stats["bytes_uploaded"] == a.nbytes
    finally:
        rt.close()


def test_a_changed_array_is_never_read_from_a_stale_buffer(fresh: GpuRuntime, rng: np.random.Generator) -> None:
    fresh.register_kernel("twice", DOUBLING_WGSL)
    a = rng.standard_normal(2000).astype(np.float32)
    x = _cell(fresh, A=a)["A"]
    np.testing.assert_array_equal(x * 1, a)  # its values are on the GPU now
    x[0] = 100  # numpy writes the memory: no kernel knows
    np.testing.assert_array_equal((x * 1)[:2], [100, a[1]])
    x += 1  # a kernel, written into x's memory (the notebook's array)
    np.testing.assert_array_equal(np.negative(x)[:2], [-101, -(a[1] + 1)])
    np.testing.assert_array_equal(np.asarray(fresh.gpu.twice(x))[:1], [202])


def test_a_lost_device_forgets_the_kept_buffers(fresh: GpuRuntime, rng: np.random.Generator) -> None:
    a = rng.standard_normal(500).astype(np.float32)
    _cell(fresh, A=a)["A"].sum()
    old = fresh.dispatcher.ctx
    assert len(old.resident) == 1  # the input (the sum stays on the GPU, not read back)
    lost = fresh.device
    assert lost is not None
    lost.handle.destroy()  # what a driver reset looks like to wgpu
    with pytest.raises(GpuError, match="lost"):
        _cell(fresh, A=a)["A"].sum()
    fresh.take_stats()
    float(_cell(fresh, A=a)["A"].sum())  # a new device
    assert len(old.resident) == 0 and fresh.dispatcher.ctx is not old
    stats = fresh.take_stats()
    assert stats["bytes_uploaded"] == a.nbytes and stats["resident_hits"] == 0


def test_the_default_budget_and_capabilities(fresh: GpuRuntime) -> None:
    caps = fresh.capabilities()
    largest = caps["limits"]["max_buffer_size"]
    assert caps["gpu_memory"] == fresh.gpu_memory == min(largest // 2, MAX_DEFAULT_GPU_MEMORY) > 0
    with pytest.raises(GpuError, match="gpu_memory"):
        GpuRuntime.create(mode="on", gpu_memory=-1)


def test_on_a_shared_memory_adapter_results_are_read_where_they_were_written(fresh: GpuRuntime) -> None:
    """lavapipe shares the host's memory: results are mapped in place, with no staging copy, and the digest
    taken while copying them out is the content key, so the next operation finds them on the device."""
    ctx = fresh.dispatcher.ctx
    assert ctx.device.info.adapter_type in ("software", "integrated") and ctx.device.mappable_storage
    made: list[int] = []
    create_buffer = ctx.handle.create_buffer

    def counted(**kwargs: Any) -> Any:
        made.append(kwargs["usage"])
        return create_buffer(**kwargs)

    ctx.handle.create_buffer = counted  # wgpu's own call, observed: which kinds of buffer the readback makes
    try:
        x = _cell(fresh, x=np.linspace(-3, 3, 64 * KIB_ARRAY, dtype=np.float32))["x"]
        y = np.tanh(x * 2.0)
        stats = fresh.take_stats()
        assert (stats["readbacks"], stats["uploads"]) == (2, 1)
        expected = np.tanh(np.linspace(-3, 3, 64 * KIB_ARRAY) * 2.0)
        np.testing.assert_allclose(np.asarray(y), expected, rtol=2e-6, atol=1e-7)
        assert fresh.dispatcher.ctx.resident.get(content_key(y)) is not None  # kept under the digest of its copy
        z = y + 1.0  # y's buffer found by that digest: nothing uploaded
        assert fresh.take_stats()["uploads"] == 0 and z[0] == np.float32(y[0] + 1.0)
    finally:
        del ctx.handle.create_buffer
    staging = [usage for usage in made if usage & wgpu.BufferUsage.MAP_READ and not usage & wgpu.BufferUsage.STORAGE]
    assert made and not staging
