"""Reductions, softmax and transpose against numpy: axes, long axes, specials, empties."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import pytest
from gpu_checks import ELEMENTWISE_TOL, rel_err, same_specials

from remote_magic.worker.gpu import DeviceArray
from remote_magic.worker.gpu.host_ops import softmax as softmax_reference

pytestmark = pytest.mark.gpu

REDUCTIONS: dict[str, Callable[..., Any]] = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}
AXES = [None, 0, 1, 2, -1, (0, 2), (0, 1), (1, 2), (0, 1, 2)]


@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("name", REDUCTIONS)
def test_reduction_along_axes(gpu: Any, rng: np.random.Generator, name: str, axis: Any) -> None:
    x = rng.standard_normal((13, 301, 7)).astype(np.float32)
    out = getattr(gpu, name)(x, axis=axis)
    expected = REDUCTIONS[name](x.astype(np.float64), axis=axis)
    assert isinstance(out, DeviceArray if np.ndim(expected) else np.float32) and out.shape == np.shape(expected)
    assert out.dtype == np.float32 and rel_err(np.asarray(out), expected) < ELEMENTWISE_TOL


@pytest.mark.parametrize("name", REDUCTIONS)
def test_reduction_keepdims(gpu: Any, rng: np.random.Generator, name: str) -> None:
    x = rng.standard_normal((5, 6, 7)).astype(np.float32)
    out = getattr(gpu, name)(x, axis=(0, 2), keepdims=True)
    expected = REDUCTIONS[name](x.astype(np.float64), axis=(0, 2), keepdims=True)
    assert out.shape == (1, 6, 1)
    assert rel_err(np.asarray(out), expected) < ELEMENTWISE_TOL


# and in one pass: vec4 loads with a tail of 1, rows that do not start on a vec4
@pytest.mark.parametrize("shape,axis", [((3, 50_000), 1), ((100_003,), None), ((20_000, 2), 0),
                                        ((1_001,), None), ((5, 1_003), 1)], ids=str)
@pytest.mark.parametrize("name", REDUCTIONS)
def test_long_axes_reduce_in_two_passes(gpu: Any, rng: np.random.Generator, name: str,
                                        shape: tuple[int, ...], axis: Any) -> None:
    x = rng.standard_normal(shape).astype(np.float32)
    out = getattr(gpu, name)(x, axis=axis)
    assert rel_err(np.asarray(out), REDUCTIONS[name](x.astype(np.float64), axis=axis)) < ELEMENTWISE_TOL


@pytest.mark.parametrize("length", [3, 200, 2_000, 100_000], ids=str)  # threads, groups, two passes
def test_sums_keep_small_terms_that_a_float32_total_would_lose(gpu: Any, rng: np.random.Generator,
                                                               length: int) -> None:
    x = rng.standard_normal(length).astype(np.float32)
    x[:3] = [1e8, 1.0, -1e8]  # a float32 running total drops the 1.0 entirely
    exact = math.fsum(x.astype(np.float64))
    assert abs(np.asarray(gpu.sum(x)) - exact) < 1e-4  # the float-float pair's bound here is about 1e-5
    rows = rng.standard_normal((4, length)).astype(np.float32)
    exact_rows = rows.astype(np.float64).sum(axis=1)
    error = np.abs(np.asarray(gpu.sum(rows, axis=1)) - exact_rows)
    assert np.all(error <= abs(np.spacing(exact_rows.astype(np.float32))))


@pytest.mark.parametrize("shape", [(1, 1), (1, 500), (500, 1), (1,), ()], ids=str)
def test_reductions_of_thin_shapes(gpu: Any, rng: np.random.Generator, shape: tuple[int, ...]) -> None:
    x = rng.standard_normal(shape).astype(np.float32)
    for name, reference in REDUCTIONS.items():
        assert rel_err(np.asarray(getattr(gpu, name)(x)), reference(x.astype(np.float64))) < ELEMENTWISE_TOL, name
        for axis in range(x.ndim):
            out = np.asarray(getattr(gpu, name)(x, axis=axis))
            assert rel_err(out, reference(x.astype(np.float64), axis=axis)) < ELEMENTWISE_TOL, (name, axis)


@pytest.mark.parametrize("name", REDUCTIONS)
def test_reductions_propagate_nan_and_inf(gpu: Any, rng: np.random.Generator, name: str) -> None:
    x = rng.standard_normal((6, 400)).astype(np.float32)
    x[1, 17] = np.nan
    x[2, 3] = np.inf
    x[3, 5] = -np.inf
    x[4, 0], x[4, 1] = np.inf, -np.inf
    with np.errstate(invalid="ignore"):
        expected = REDUCTIONS[name](x, axis=1)
        out = np.asarray(getattr(gpu, name)(x, axis=1))  # numpy's answer (and numpy's warning for inf - inf)
    same_specials(out, expected)
    finite = np.isfinite(expected)
    assert rel_err(out[finite], expected[finite]) < ELEMENTWISE_TOL
    assert np.isnan(float(getattr(gpu, name)(x)))


def test_empty_reductions_follow_numpy(gpu: Any) -> None:
    x = np.zeros((0, 4), np.float32)
    np.testing.assert_array_equal(np.asarray(gpu.sum(x, axis=0)), np.zeros(4))
    assert gpu.sum(x, axis=1).shape == (0,)
    assert float(gpu.sum(x)) == 0.0
    with pytest.warns(RuntimeWarning):
        assert np.isnan(np.asarray(gpu.mean(x, axis=0))).all()
    with pytest.raises(ValueError):
        gpu.max(x, axis=0)


@pytest.mark.parametrize("shape,axis", [((17, 10), -1), ((17, 1000), 1), ((300, 7), 0), ((4, 70, 5), 1),
                                        ((2, 3, 4), 0), ((1, 1), -1), ((9,), 0)], ids=str)
def test_softmax_matches_numpy(gpu: Any, rng: np.random.Generator, shape: tuple[int, ...], axis: int) -> None:
    x = (rng.standard_normal(shape) * 10).astype(np.float32)
    out = gpu.softmax(x, axis=axis)
    expected = softmax_reference(x.astype(np.float64), axis=axis)
    assert rel_err(np.asarray(out), expected) < ELEMENTWISE_TOL
    np.testing.assert_allclose(np.asarray(out).sum(axis=axis), 1.0, rtol=1e-5)


def test_softmax_is_stable_and_propagates_nan(gpu: Any) -> None:
    x = np.array([[1000.0, 1000.0, -1000.0], [1.0, np.nan, 2.0], [-np.inf, 0.0, 0.0]] * 30, np.float32)
    with np.errstate(invalid="ignore"):
        expected = softmax_reference(x, axis=1)
    out = np.asarray(gpu.softmax(x, axis=1))
    same_specials(out, expected)
    assert rel_err(out[np.isfinite(expected)], expected[np.isfinite(expected)]) < ELEMENTWISE_TOL
    wide = np.repeat(x, 40, axis=1)  # the one-workgroup-per-row path
    with np.errstate(invalid="ignore"):
        same_specials(np.asarray(gpu.softmax(wide, axis=1)), softmax_reference(wide, axis=1))


@pytest.mark.parametrize("shape,axes", [((37, 53), None), ((1, 300), None), ((300, 1), None),
                                        ((3, 33, 17), (0, 2, 1)), ((2, 3, 4, 5), (3, 1, 0, 2)),
                                        ((2, 3, 4), (1, 0, 2)), ((5,), None), ((0, 3), None)], ids=str)
def test_transpose_matches_numpy(gpu: Any, rng: np.random.Generator, shape: tuple[int, ...], axes: Any) -> None:
    x = rng.standard_normal(shape).astype(np.float32)
    out = gpu.transpose(x, axes)
    np.testing.assert_array_equal(np.asarray(out), np.transpose(x, axes))
    np.testing.assert_array_equal(np.asarray(gpu.array(x).T), x.T)


def test_transpose_rejects_bad_axes(gpu: Any) -> None:
    with pytest.raises((ValueError, np.exceptions.AxisError if hasattr(np, "exceptions") else ValueError)):
        gpu.transpose(np.ones((2, 3), np.float32), (0, 0))
