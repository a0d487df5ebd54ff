"""DeviceArray semantics: numpy protocols, staying on the GPU, notices, dtype rules, cell values."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest
from gpu_checks import ELEMENTWISE_TOL, MATMUL_TOL, make_runtime, rel_err

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
        "np.add.reduce": (np.add.reduce(x), a64.sum(axis=0)),
        "np.abs": (np.abs(x), np.abs(a64)),
        "np.tanh": (np.tanh(x), np.tanh(a64)),
        "x.min": (x.min(axis=1), a64.min(axis=1)),
    }
    for label, (out, expected) in results.items():
        assert isinstance(out, (DeviceArray, np.float32)) and out.dtype == np.float32, label
        assert rel_err(np.asarray(out), expected) < ELEMENTWISE_TOL, label
    stats = runtime.take_stats()
    assert stats["numpy"] == {}, "everything above has a kernel"
    assert set(stats["kernels"]) == {"exp", "maximum", "sum", "max", "abs", "tanh", "min"}
    assert np.shape(x) == (40, 30) and np.ndim(x) == 2 and np.size(x) == 1200
    assert np.transpose(x).base is x, "a transpose is numpy's view, as locally"


def test_a_chain_of_operations_uploads_each_input_once(gpu: Any, runtime: GpuRuntime, rng: np.random.Generator) -> None:
    a = rng.standard_normal((64, 48)).astype(np.float32)
    b = rng.standard_normal((48, 32)).astype(np.float32)
    cell = runtime.to_device({"A": a, "B": b, "label": "not an array"})
    assert isinstance(cell["A"], DeviceArray) and cell["label"] == "not an array"
    h = np.maximum(cell["A"] @ cell["B"], 0).sum(axis=1)
    c = gpu.softmax(h * 0.1)
    out = runtime.to_host({"C": c, "pair": (c, 1)})
    stats = runtime.take_stats()
    # A result of 4 KiB or more is found on the GPU by its digest; smaller ones (h, 64 values) go up again.
    assert stats["bytes_uploaded"] == a.nbytes + b.nbytes + 2 * h.nbytes and stats["resident_hits"] == 2
    assert stats["kernels"] == {"matmul": 1, "maximum": 1, "sum": 1, "multiply": 1, "softmax": 1}
    assert stats["gpu_time_s"] > 0
    expected = np.maximum(a.astype(np.float64) @ b, 0).sum(axis=1) * 0.1
    expected = np.exp(expected - expected.max()) / np.exp(expected - expected.max()).sum()
    assert type(out["C"]) is np.ndarray and out["C"].flags.writeable and out["C"].dtype == np.float32
    assert rel_err(out["C"], expected) < MATMUL_TOL
    pair = pickle.loads(pickle.dumps(out["pair"]))  # inside a container it stays, and pickles as numpy's
    assert type(pair[0]) is np.ndarray and pair[1] == 1


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
    assert stats["kernels"] == {"matmul": 1} and stats["numpy"] == {"np.maximum": 1, "np.sum": 1}
    assert "remote-magic" not in capfd.readouterr().err
    with pytest.raises(GpuError, match="unknown kernel 'matmull'"):
        runtime.to_device({"A": a}, ["matmull"])


def test_an_operation_without_a_kernel_is_numpy_and_said_once(
        gpu: Any, runtime: GpuRuntime, rng: np.random.Generator, capfd: Any) -> None:
    a = rng.standard_normal((8, 9)).astype(np.float32)
    x = gpu.array(a)
    runtime.take_stats()
    first = np.prod(x, axis=1)
    second = np.prod(x, axis=0)
    repeated = x.repeat(2, axis=1)
    assert runtime.take_stats()["numpy"] == {"np.prod": 2, "ndarray.repeat": 1}
    np.testing.assert_array_equal(first.view(np.ndarray), np.prod(a, axis=1))
    np.testing.assert_array_equal(second.view(np.ndarray), np.prod(a, axis=0))
    assert isinstance(first, DeviceArray), "its result's later operations may use kernels"
    err = capfd.readouterr().err
    assert err.count("remote-magic: np.prod has no GPU kernel") == 1, err
    np.testing.assert_array_equal(x[2:4, ::2].view(np.ndarray), a[2:4, ::2])
    np.testing.assert_array_equal(repeated.view(np.ndarray), a.repeat(2, axis=1))
    assert "indexing" not in capfd.readouterr().err, "a view is numpy's own: nothing to say"


def test_float64_is_computed_in_float32_and_stays_float64(runtime: GpuRuntime, rng: np.random.Generator,
                                                           capfd: Any) -> None:
    a = rng.standard_normal((30, 20))
    b = rng.standard_normal((20, 10))
    cell = runtime.to_device({"A": a, "B": b, "unused": a.copy()})
    assert capfd.readouterr().err == "", "nothing said before a kernel computes in float32"
    c = cell["A"] @ cell["B"]
    assert c.dtype == np.float64 and rel_err(c, a @ b) < MATMUL_TOL
    runtime.end_cell({})
    err = capfd.readouterr().err
    assert err.count("\n") == 1, err
    assert "remote-magic: A, B: the GPU computed float64 results from them in float32" in err, err
    out = runtime.to_host({"C": c})["C"]
    assert type(out) is np.ndarray and out.dtype == np.float64


def test_integers_keep_their_dtype_and_exact_values(runtime: GpuRuntime, gpu: Any, capfd: Any) -> None:
    small = np.arange(-5, 5, dtype=np.int64)
    cell = runtime.to_device({"n": small, "big": np.array([1, 2 ** 24 + 1], np.int64),
                              "huge": np.array([1, 2 ** 40], np.int64)})
    runtime.take_stats()
    doubled = cell["n"] * 2
    assert doubled.dtype == np.int64 and np.array_equal(doubled.view(np.ndarray), small * 2)
    assert runtime.take_stats()["kernels"] == {"multiply": 1}
    big = cell["big"] + 1  # beyond float32's exact integers, within int32: the 32-bit integer kernel
    assert big.dtype == np.int64 and big.tolist() == [2, 2 ** 24 + 2]
    assert runtime.take_stats()["kernels"] == {"add": 1}
    huge = cell["huge"] + 1  # beyond int32 too: numpy, with its exact answer
    assert huge.dtype == np.int64 and huge.tolist() == [2, 2 ** 40 + 1]
    assert "np.add with int64 values beyond ±2**24" in capfd.readouterr().err
    on_int32 = gpu.array(np.array([2 ** 31 - 1], np.int32)) + 1  # numpy's int32 wraps around: so does the kernel
    assert on_int32.dtype == np.int32 and on_int32.tolist() == [-(2 ** 31)]
    wraps = gpu.array(np.array([250], np.uint8)) + np.uint8(10)  # numpy wraps around: so does the answer
    assert wraps.dtype == np.uint8 and wraps.tolist() == [4]
    assert (cell["n"] / 3).dtype == np.float64 and (-cell["n"]).tolist() == (-small).tolist()
    runtime.end_cell({})
    assert "remote-magic: n: the GPU computed float64 results from it in float32" in capfd.readouterr().err


def test_comparisons_make_boolean_arrays(gpu: Any, rng: np.random.Generator) -> None:
    a = rng.standard_normal(50).astype(np.float32)
    x = gpu.array(a)
    mask = x > 0
    assert mask.dtype == np.bool_ and np.asarray(mask).dtype == np.bool_
    np.testing.assert_array_equal(np.asarray((mask * x)), (a > 0) * a)  # bool * float: float32, on the GPU
    np.testing.assert_array_equal(mask & (x < 1), (a > 0) & (a < 1))  # logic has no kernel: numpy
    assert mask.sum() == (a > 0).sum() and mask.sum().dtype == np.int64


def test_a_device_array_is_an_ndarray(gpu: Any, rng: np.random.Generator) -> None:
    a = rng.standard_normal((3, 2)).astype(np.float32)
    x = gpu.array(a)
    assert isinstance(x, np.ndarray) and repr(x) == repr(a) and str(x) == str(a)
    total = x.sum()
    assert type(total) is np.float32 and abs(float(total) - float(a.sum())) < 1e-5
    assert f"{total:.2f}" == f"{float(total):.2f}"
    restored = pickle.loads(pickle.dumps(x + 1))
    assert type(restored) is np.ndarray and np.array_equal(restored, a + 1)
    np.add(x, 1, out=x)
    x[0] = 7
    expected = a + 1
    expected[0] = 7
    np.testing.assert_array_equal(x, expected)
    np.testing.assert_array_equal(x * 2, expected * 2), "the GPU sees the assigned values, not a stale copy"


def test_an_input_is_viewed_in_place(runtime: GpuRuntime) -> None:
    a = np.ones(4, np.float32)
    cell = runtime.to_device({"a": a, "alias": a})
    x = cell["a"]
    assert cell["alias"] is x, "names that share an array still do"
    x[1] = 5
    x += 1
    np.testing.assert_array_equal(a, [2, 6, 2, 2])
    np.testing.assert_array_equal(x * 1, [2, 6, 2, 2])
    namespace = {"a": x, "y": x[1:]}
    runtime.end_cell(namespace)
    assert namespace["a"] is a and np.shares_memory(namespace["y"], a)


def test_an_array_too_small_to_pay_for_a_kernel_computes_with_numpy_without_a_word(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Under --gpu auto small arrays compute with numpy: counted so, but no notice claims the operation has
    no GPU kernel (argmax, sort, median and the ufuncs all have one)."""
    rt = make_runtime()
    try:
        rt.dispatcher.min_values = 1000  # what --gpu auto uses on a hardware adapter
        x = rt.to_device({"x": np.array([3.0, 1.0, 2.0], np.float32)})["x"]
        assert (int(x.argmax()), np.sort(x).tolist(), float(np.median(x)), float((x * 2).sum())) == (
            0, [1.0, 2.0, 3.0], 2.0, 12.0)
        assert not rt.take_stats()["kernels"]
        assert "GPU kernel" not in capsys.readouterr().err
    finally:
        rt.close()
