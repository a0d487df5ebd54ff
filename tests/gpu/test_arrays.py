"""DeviceArray semantics: numpy protocols, staying on the GPU, notices, dtype rules, cell values."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest
from gpu_checks import ELEMENTWISE_TOL, MATMUL_TOL, rel_err

from remote_magic.errors import GpuError
from remote_magic.worker.gpu import DeviceArray, GpuRuntime

pytestmark = pytest.mark.gpu


def test_attributes(gpu: Any) -> None:
    x = gpu.array(np.zeros((3, 4, 5), np.float32))
    assert (x.shape, x.ndim, x.size, x.nbytes, x.dtype, len(x)) == ((3, 4, 5), 3, 60, 240, np.float32, 3)
    assert x.T.shape == (5, 4, 3)
    assert x.reshape(12, -1).shape == (12, 5)
    with pytest.raises(ValueError):
        x.reshape(7, -1)


def test_numpy_functions_run_as_kernels(gpu: Any, runtime: GpuRuntime, rng: np.random.Generator) -> None:
    a = rng.standard_normal((40, 30)).astype(np.float32)
    x = gpu.array(a)
    a64 = a.astype(np.float64)
    results = {
        "np.exp": (np.exp(x), np.exp(a64)),
        "np.maximum": (np.maximum(x, 0), np.maximum(a64, 0)),
        "np.sum": (np.sum(x, axis=1), a64.sum(axis=1)),
        "np.mean": (np.mean(x), a64.mean()),
        "np.max": (np.max(x, axis=0, keepdims=True), a64.max(axis=0, keepdims=True)),
        "np.transpose": (np.transpose(x), a64.T),
        "np.add.reduce": (np.add.reduce(x), a64.sum(axis=0)),
        "np.abs": (np.abs(x), np.abs(a64)),
        "np.tanh": (np.tanh(x), np.tanh(a64)),
        "x.min": (x.min(axis=1), a64.min(axis=1)),
    }
    for label, (out, expected) in results.items():
        assert isinstance(out, DeviceArray), label
        assert rel_err(out.numpy(), expected) < ELEMENTWISE_TOL, label
    assert runtime.take_stats()["numpy"] == {}, "everything above has a kernel"
    assert np.shape(x) == (40, 30) and np.ndim(x) == 2 and np.size(x) == 1200


def test_a_chain_of_operations_reads_back_once(gpu: Any, runtime: GpuRuntime, rng: np.random.Generator) -> None:
    a = rng.standard_normal((64, 48)).astype(np.float32)
    b = rng.standard_normal((48, 32)).astype(np.float32)
    cell = runtime.to_device({"A": a, "B": b, "label": "not an array"})
    assert isinstance(cell["A"], DeviceArray) and cell["label"] == "not an array"
    h = np.maximum(cell["A"] @ cell["B"], 0).sum(axis=1)
    c = gpu.softmax(h * 0.1)
    out = runtime.to_host({"C": c, "pair": (c, 1)})
    stats = runtime.take_stats()
    assert stats["bytes_uploaded"] == a.nbytes + b.nbytes
    assert stats["bytes_downloaded"] == 64 * 4, "only the result comes back, once"
    assert stats["kernels"] == {"matmul": 1, "maximum": 1, "sum": 1, "multiply": 1, "softmax": 1}
    assert stats["gpu_time_s"] > 0
    expected = np.maximum(a.astype(np.float64) @ b, 0).sum(axis=1) * 0.1
    expected = np.exp(expected - expected.max()) / np.exp(expected - expected.max()).sum()
    assert isinstance(out["C"], np.ndarray) and out["C"].flags.writeable
    assert rel_err(out["C"], expected) < MATMUL_TOL
    assert isinstance(out["pair"][0], np.ndarray) and out["pair"][1] == 1


def test_unused_inputs_are_never_uploaded(runtime: GpuRuntime) -> None:
    runtime.take_stats()
    cell = runtime.to_device({"big": np.ones((100, 100), np.float32), "small": np.ones(4, np.float32)})
    runtime.to_host({"r": cell["small"] + 1})
    stats = runtime.take_stats()
    # The small one went up (or was there already, from another test: resident.py); the big one never did.
    assert stats["bytes_uploaded"] + stats["bytes_resident"] == 16 and stats["bytes_downloaded"] == 16


def test_enabled_kernels_only_run_on_the_gpu(runtime: GpuRuntime, rng: np.random.Generator, capfd: Any) -> None:
    a = rng.standard_normal((20, 10)).astype(np.float32)
    b = rng.standard_normal((10, 5)).astype(np.float32)
    runtime.take_stats()
    cell = runtime.to_device({"A": a, "B": b}, ["matmul"])
    c = cell["A"] @ cell["B"]
    h = np.maximum(c, 0).sum(axis=1)  # not enabled: numpy, silently
    assert isinstance(c, DeviceArray) and isinstance(h, np.ndarray)
    assert rel_err(h, np.maximum(a.astype(np.float64) @ b, 0).sum(axis=1)) < MATMUL_TOL
    stats = runtime.take_stats()
    assert stats["kernels"] == {"matmul": 1} and stats["numpy"] == {"maximum": 1}
    assert "remote-magic" not in capfd.readouterr().err
    with pytest.raises(GpuError, match="unknown kernel 'matmull'"):
        runtime.to_device({"A": a}, ["matmull"])


def test_fallback_for_an_operation_without_a_kernel_is_announced_once(
        gpu: Any, runtime: GpuRuntime, rng: np.random.Generator, capfd: Any) -> None:
    a = rng.standard_normal((8, 9)).astype(np.float32)
    x = gpu.array(a)
    first = np.cumsum(x, axis=1)
    second = np.cumsum(x, axis=0)
    np.testing.assert_allclose(first, np.cumsum(a, axis=1), rtol=1e-6)
    np.testing.assert_allclose(second, np.cumsum(a, axis=0), rtol=1e-6)
    err = capfd.readouterr().err
    assert err.count("remote-magic: np.cumsum has no GPU kernel") == 1, err
    np.testing.assert_array_equal(x[2:4, ::2], a[2:4, ::2])
    assert "indexing" in capfd.readouterr().err
    assert runtime.take_stats()["numpy"]["np.cumsum"] == 2


def test_float64_is_computed_in_float32_with_a_notice(runtime: GpuRuntime, rng: np.random.Generator,
                                                      capfd: Any) -> None:
    a = rng.standard_normal((30, 20))
    b = rng.standard_normal((20, 10))
    cell = runtime.to_device({"A": a, "B": b})
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "remote-magic: A, B are float64" in err and "float32" in err
    c = cell["A"] @ cell["B"]
    assert c.dtype == np.float32
    out = runtime.to_host({"C": c})["C"]
    assert out.dtype == np.float32 and rel_err(out, a @ b) < MATMUL_TOL


def test_integers_are_converted_only_when_exact(runtime: GpuRuntime, gpu: Any) -> None:
    small = np.arange(-5, 5, dtype=np.int64)
    cell = runtime.to_device({"n": small})
    np.testing.assert_array_equal(runtime.to_host({"n": cell["n"] * 2})["n"], small * 2.0)
    limit = np.array([2 ** 24, -(2 ** 24)], np.int64)
    np.testing.assert_array_equal(gpu.array(limit).numpy(), limit.astype(np.float32))
    with pytest.raises(GpuError, match=r"big is an int64 array with values beyond ±2\*\*24") as info:
        runtime.to_device({"big": np.array([1, 2 ** 24 + 1], np.int64)})
    assert "astype(np.float32)" in str(info.value)
    with pytest.raises(GpuError, match="2\\*\\*24"):
        gpu.array(np.array([2 ** 31], np.uint32)) + 1


def test_comparisons_make_boolean_arrays(gpu: Any, rng: np.random.Generator) -> None:
    a = rng.standard_normal(50).astype(np.float32)
    x = gpu.array(a)
    mask = x > 0
    assert mask.dtype == np.bool_ and mask.numpy().dtype == np.bool_
    np.testing.assert_array_equal((mask * x).numpy(), (a > 0) * a)  # bool * float: float32, on the GPU
    np.testing.assert_array_equal(mask & (x < 1), (a > 0) & (a < 1))  # logic has no kernel: numpy
    assert float(mask.sum()) == (a > 0).sum()


def test_host_conversions(gpu: Any, rng: np.random.Generator) -> None:
    a = rng.standard_normal((3, 2)).astype(np.float32)
    x = gpu.array(a)
    np.testing.assert_array_equal(np.asarray(x), a)
    total = x.sum()
    assert total.shape == () and abs(float(total) - float(a.sum())) < 1e-5
    assert f"{total:.2f}" == f"{float(total):.2f}"
    assert bool(gpu.array(np.float32(1.0)) > 0)
    assert repr(x).startswith("DeviceArray([[") and repr(x).endswith("dtype=float32)") and str(x) == str(a)
    restored = pickle.loads(pickle.dumps(x + 1))
    assert type(restored) is np.ndarray and np.array_equal(restored, a + 1)
    with pytest.raises(TypeError, match="immutable"):
        np.add(x, 1, out=x)
    with pytest.raises(TypeError):
        x[0] = 1


def test_values_stay_immutable_when_the_host_copy_is_shared(gpu: Any) -> None:
    a = np.ones(4, np.float32)
    x = gpu.array(a)
    a[1] = 5  # the caller's array stays writeable, and changing it does not change x
    np.testing.assert_array_equal((x + 0).numpy(), np.ones(4))
    host = x.numpy()
    host[0] = 7
    np.testing.assert_array_equal(x.numpy(), np.ones(4))
    with pytest.raises(ValueError):
        np.asarray(x)[0] = 7
