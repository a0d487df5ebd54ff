"""The runtime: modes, capabilities, adapter choice, limits, folding, device loss, counters."""

from __future__ import annotations

import json
from typing import Any, Iterator

import numpy as np
import pytest
from gpu_checks import DOUBLING_WGSL, ELEMENTWISE_TOL, MATMUL_TOL, make_runtime, rel_err

from remote_magic.errors import GpuError, GpuLimitError
from remote_magic.worker.gpu import DeviceArray, GpuRuntime
from remote_magic.worker.gpu.host_ops import softmax as softmax_reference

pytestmark = pytest.mark.gpu


def test_capabilities_report_the_adapter_and_its_real_limits(runtime: GpuRuntime) -> None:
    caps = runtime.capabilities()
    assert caps["mode"] == "on" and caps["active"] is True
    assert caps["adapter_type"] in {"discrete", "integrated", "virtual", "software", "unknown"}
    limits = caps["limits"]
    for name in ("max_storage_buffer_binding_size", "max_buffer_size", "max_compute_workgroup_size_x",
                 "max_compute_invocations_per_workgroup", "max_compute_workgroups_per_dimension"):
        assert isinstance(limits[name], int) and limits[name] > 0, name
    assert runtime.device is not None
    if caps.get("browser_tab"):  # the tab asked its adapter for all its limits; the device says what it got
        assert caps["adapter"] and caps["backend"] == "WebGPU"
        adapter_limits = runtime.device.handle.limits
    else:
        assert caps["adapter"] and caps["backend"] in {"Vulkan", "Metal", "D3D12"}
        adapter_limits = runtime.device.adapter.limits
    assert limits["max_storage_buffer_binding_size"] == adapter_limits["max-storage-buffer-binding-size"]
    assert runtime.device.limits["max_buffer_size"] == adapter_limits["max-buffer-size"]
    assert json.loads(json.dumps(caps)) == caps
    assert json.loads(json.dumps(runtime.totals())) == runtime.totals()


def test_public_names() -> None:
    import remote_magic.worker.gpu
    assert sorted(remote_magic.worker.gpu.__all__) == ["DeviceArray", "GpuNamespace", "GpuRuntime", "KERNEL_NAMES"]
    assert set(remote_magic.worker.gpu.KERNEL_NAMES) >= {"matmul", "softmax", "transpose", "sum", "relu", "not_equal"}


def test_off_mode_never_opens_a_device() -> None:
    rt = GpuRuntime.create(mode="off")
    assert rt.capabilities() == {"mode": "off", "active": False}
    assert rt.device is None
    values = {"A": np.ones(3)}
    assert np.shares_memory(rt.to_device(values)["A"], values["A"])
    np.testing.assert_array_equal(rt.gpu.matmul(np.eye(2), np.ones((2, 2))), np.ones((2, 2)))
    with pytest.raises(GpuError, match="--gpu off"):
        rt.register_kernel("k", "")
    rt.close()


def test_auto_mode_on_a_software_adapter_computes_with_numpy_and_says_so(wgpu_runtime: GpuRuntime,
                                                                        capfd: Any) -> None:
    if wgpu_runtime.capabilities()["adapter_type"] != "software":
        pytest.skip("the adapter is a hardware GPU: auto mode uses it")
    rt = GpuRuntime.create(mode="auto")
    try:
        caps = rt.capabilities()
        assert caps["active"] is False and caps["adapter_type"] == "software" and "numpy" in caps["reason"]
        a = np.arange(6, dtype=np.float64).reshape(2, 3)
        cell = rt.to_device({"A": a})
        out = rt.gpu.matmul(cell["A"], cell["A"].T)
        assert out.dtype == np.float64
        np.testing.assert_array_equal(out.view(np.ndarray), a @ a.T)
        rt.to_device({"B": a})["B"] + 1
        err = capfd.readouterr().err
        assert err.count("remote-magic: ") == 1 and "software" in err and "numpy" in err
        assert "--gpu on to use it anyway" in err, err
        stats = rt.take_stats()
        assert stats["kernels"] == {} and stats["numpy"] == {"np.matmul": 1, "np.add": 1}
    finally:
        rt.close()


def test_adapter_choice_by_substring_and_backend(wgpu_runtime: GpuRuntime) -> None:
    caps = wgpu_runtime.capabilities()
    word = caps["adapter"].split()[0]
    rt = make_runtime(adapter=word.upper(), backend=caps["backend"].lower())
    assert rt.capabilities()["adapter"] == caps["adapter"]
    rt.close()
    with pytest.raises(GpuError, match="no GPU adapter matching 'no-such-adapter'.*adapters found"):
        GpuRuntime.create(mode="on", adapter="no-such-adapter")
    with pytest.raises(GpuError, match="unknown GPU backend"):
        GpuRuntime.create(mode="on", backend="glide")
    rt = GpuRuntime.create(mode="auto", adapter="no-such-adapter")
    assert rt.capabilities()["active"] is False and "no GPU adapter matching" in rt.capabilities()["reason"]
    rt.close()


@pytest.fixture
def fresh() -> Iterator[GpuRuntime]:
    rt = make_runtime(max_binding_bytes=64 * 1024)
    yield rt
    rt.close()


def test_kernels_that_cannot_split_refuse_past_the_binding_limit(fresh: GpuRuntime) -> None:
    big = np.ones(20_000, np.float32)  # 80,000 bytes > 64 KiB
    with pytest.raises(GpuLimitError, match=r"add needs 80.0 kB in one binding.*at most 65.5 kB"
                                            r".*max_storage_buffer_binding_size"):
        fresh.gpu.add(big, 1.0)
    with pytest.raises(GpuLimitError, match="softmax"):
        fresh.gpu.softmax(big)
    np.testing.assert_array_equal(np.asarray(fresh.gpu.add(big[:1000], 1.0)), 2.0)


def test_every_kernel_folds_workgroups_past_the_per_dimension_limit(rng: np.random.Generator) -> None:
    rt = make_runtime()
    rt.dispatcher.ctx.max_groups = 7  # as if the GPU allowed 7 workgroups per dimension (49 per dispatch)
    gpu = rt.gpu
    a = rng.standard_normal((40, 300)).astype(np.float32)  # 12 elementwise workgroups (four values per invocation)
    c = rng.standard_normal((20, 1000)).astype(np.float32)
    a64, c64 = a.astype(np.float64), c.astype(np.float64)
    m, n = rng.standard_normal((300, 20)).astype(np.float32), rng.standard_normal((20, 300)).astype(np.float32)
    assert rel_err(np.asarray(gpu.matmul(m, n)), m.astype(np.float64) @ n) < MATMUL_TOL  # 9 tiles
    assert rel_err(np.asarray(gpu.exp(a)), np.exp(a64)) < ELEMENTWISE_TOL
    assert rel_err(np.asarray(gpu.add(a, a[0])), a64 + a64[0]) < ELEMENTWISE_TOL
    assert rel_err(np.asarray(gpu.sum(a, axis=1)), a64.sum(axis=1)) < ELEMENTWISE_TOL  # a workgroup per output
    assert rel_err(np.asarray(gpu.max(c, axis=0)), c64.max(axis=0)) < ELEMENTWISE_TOL  # an invocation per output
    assert rel_err(np.asarray(gpu.softmax(a, axis=1)), softmax_reference(a64, axis=1)) < ELEMENTWISE_TOL
    assert rel_err(np.asarray(gpu.softmax(c, axis=0)), softmax_reference(c64, axis=0)) < ELEMENTWISE_TOL
    np.testing.assert_array_equal(np.asarray(gpu.transpose(a[:, :100])), a[:, :100].T)  # 21 tiles
    cube = a.reshape(10, 30, 40)
    np.testing.assert_array_equal(np.asarray(gpu.transpose(cube, (1, 0, 2))), cube.transpose(1, 0, 2))  # 47 groups
    with pytest.raises(GpuLimitError, match="max_compute_workgroups_per_dimension"):
        gpu.exp(np.ones(4 * 256 * 7 * 7 + 1, np.float32))  # four values per invocation
    rt.close()


def test_a_lost_device_is_reported_and_replaced(fresh: GpuRuntime, rng: np.random.Generator) -> None:
    fresh.register_kernel("double", DOUBLING_WGSL)
    a = rng.standard_normal((5, 7)).astype(np.float32)
    kept = fresh.gpu.array(a)
    computed = kept + 1  # its values are on the host too: nothing is lost with the device
    first = fresh.device
    assert first is not None
    first.handle.destroy()  # what a driver reset looks like to wgpu
    with pytest.raises(GpuError, match="GPU device was lost.*next GPU call creates a new device"):
        fresh.gpu.exp(kept)
    out = fresh.gpu.exp(kept)
    assert fresh.device is not first
    assert rel_err(np.asarray(out), np.exp(a.astype(np.float64))) < ELEMENTWISE_TOL
    np.testing.assert_allclose(np.asarray(fresh.gpu.double(kept)), 2 * a, rtol=1e-6)
    np.testing.assert_array_equal(computed * 1, a + 1)
    assert fresh.capabilities()["active"] is True


def test_stats_are_taken_and_totalled(fresh: GpuRuntime) -> None:
    fresh.take_stats()
    x = fresh.gpu.array(np.ones(10, np.float32))
    np.asarray((x + x))
    first = fresh.take_stats()
    assert first["kernels"] == {"add": 1} and first["bytes_uploaded"] == 40 and first["bytes_downloaded"] == 40
    assert first["uploads"] == 1 and first["readbacks"] == 1 and first["resident_hits"] == 1  # x's second use
    assert fresh.take_stats() == {"kernels": {}, "gpu_time_s": 0.0, "bytes_uploaded": 0, "bytes_downloaded": 0,
                                  "uploads": 0, "readbacks": 0, "resident_hits": 0, "bytes_resident": 0,
                                  "numpy": {}}
    np.asarray((x * x))
    totals = fresh.totals()
    assert totals["kernels"]["add"] >= 1 and totals["kernels"]["multiply"] == 1
    assert totals["bytes_downloaded"] >= 80


def test_create_rejects_bad_options() -> None:
    with pytest.raises(GpuError, match="unknown GPU mode"):
        GpuRuntime.create(mode="sometimes")
    with pytest.raises(GpuError, match="max_binding_bytes"):
        GpuRuntime.create(mode="on", max_binding_bytes=10)


def test_closed_runtime_refuses_work(rng: np.random.Generator) -> None:
    rt = make_runtime()
    x = rt.gpu.array(np.ones(3, np.float32))
    rt.close()
    with pytest.raises(GpuError):
        np.asarray((x + 1))
    rt.close()  # twice is fine
    assert isinstance(x, DeviceArray)
