"""Counting and order kernels against numpy: bincount, np.add.at, partition, median and quantiles, unique.

Properties (Hypothesis, numpy as the oracle, through test_numpy_oracle's machinery: the same operation on
plain arrays and on DeviceArrays, answers and operands' memory compared) over dtypes, shapes, views and
values with NaN, -0.0, infinities, duplicates and empty arrays. bincount and unique must be numpy's exactly;
median, percentile and quantile too (numpy's own interpolation reads the values the GPU sorted); float32
weights and float32 ``np.add.at`` within the rounding of another order of the sum. numpy's partition
guarantees only the element at each ``kth`` and the split around it, so that is what is checked of
``np.partition``, ``np.argpartition`` and ``x.partition``: the kth elements equal numpy's, none before them
larger, none after smaller, the same values. Where the kernel gives numpy's answer (float32, bool and
integers that fit 32 bits), a kernel must have run. Kernel tests at sizes the properties don't reach (several
sort passes, many repeats of one index) and at the binding limit follow.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable

import numpy as np
import pytest
from gpu_checks import make_runtime
from hypothesis import HealthCheck, given, note, settings, strategies as st
from hypothesis.extra import numpy as hnp
from test_numpy_oracle import (
    BACKENDS,
    F32,
    RECIPES,
    A,
    Arr,
    Backend,
    Case,
    arrs,
    backend_for,
    normal_floats,
    prepare,
    public_type,
    run_property,
    shapes,
)

from remote_magic.worker.gpu import GpuRuntime

pytestmark = pytest.mark.gpu

NATIVE = [np.dtype(name) for name in ("float32", "int32", "uint32", "int8", "uint8", "int16", "bool")]
"""dtypes the order kernels take natively (int64 too, where its values fit 32 bits)."""
ORDER_DTYPES = st.one_of(st.just(F32), st.sampled_from(NATIVE + [np.dtype(np.int64), np.dtype(np.float64)]))
VIEWS_1D = ["", "[::-1]", "[..., ::2]", "[1:]"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    """test_numpy_oracle's backends: the wgpu runtime and a browser tab's."""
    return backend_for(request)


def native(dtype: np.dtype[Any]) -> bool:
    return dtype in NATIVE


@st.composite
def integer_arrs(draw: Any, dtype: np.dtype[Any], n: int, low: int, high: int) -> Arr:
    """A 1-D :class:`Arr` of ``n`` integers in [low, high], sometimes a non-contiguous view."""
    recipe = draw(st.sampled_from(VIEWS_1D))
    base = draw(hnp.arrays(dtype, RECIPES[recipe][0]((n,)), elements=st.integers(low, high)))
    return Arr(base, recipe, draw(st.booleans()))


# -- bincount --------------------------------------------------------------------------------------------


@st.composite
def bincount_cases(draw: Any) -> Case:
    n = draw(st.integers(0, 40))
    dtype = draw(st.sampled_from([np.dtype(t) for t in (np.int64, np.int32, np.uint8, np.uint32, np.bool_)]))
    high = 1 if dtype == np.bool_ else min(draw(st.sampled_from([3, 60, 2000])), int(np.iinfo(dtype).max))
    low = -2 if dtype.kind == "i" and draw(st.integers(0, 9)) == 0 else 0  # numpy's ValueError
    x = draw(integer_arrs(dtype, n, low, high))
    minlength = draw(st.sampled_from([0, 0, 5, 100]))
    gpu = "yes" if n and low == 0 else None
    if not draw(st.booleans()):
        return Case(f"np.bincount(x0, minlength={minlength})", lambda x0: np.bincount(x0, minlength=minlength),
                    [x], gpu=gpu)
    wtype = draw(st.sampled_from([F32, F32, np.dtype(np.float64)]))
    w = draw(arrs(wtype, (n,), style="moderate", specials=draw(st.integers(0, 4)) == 0))

    def terms(x64: Any, w64: Any, r: Any) -> Any:
        return np.bincount(x64.astype(np.int64), A(w64), minlength=minlength) * (x64.size + 4)

    return Case(f"np.bincount(x0, weights=x1, minlength={minlength})",
                lambda x0, x1: np.bincount(x0, weights=x1, minlength=minlength), [x, w], terms, 1,
                gpu if wtype == F32 else None)


def test_bincount(backend: Backend) -> None:
    """Counts of int64/int32/uint8/uint32/bool values exactly, float32 weights within another order's
    rounding (float64 weights: numpy), minlength, views, empty arrays, negative values (numpy's error)."""
    run_property(backend, bincount_cases(), 40)


# -- np.add.at -------------------------------------------------------------------------------------------


def add_at(a: Any, indices: Any, values: Any) -> Any:
    return np.add.at(a, indices, values)


@st.composite
def add_at_cases(draw: Any) -> Case:
    dtype = draw(st.sampled_from([F32, F32, np.dtype(np.int32), np.dtype(np.uint32), np.dtype(np.int8),
                                  np.dtype(np.int64), np.dtype(np.float64)]))
    rows = draw(st.integers(1, 12))
    shape = (rows,) if draw(st.booleans()) else (rows, draw(st.integers(1, 3)))
    a = draw(arrs(dtype, shape, style="small" if dtype.kind != "f" else "moderate", specials=False))
    m = draw(st.integers(0, 30))
    out_of_range = draw(st.integers(0, 15)) == 0  # numpy's IndexError
    idx = draw(integer_arrs(np.dtype(np.int64), m, -rows, rows if out_of_range else rows - 1))
    operands: list[Any] = [a, idx]
    pairs = len(shape) == 2 and draw(st.booleans())  # (rows, columns) of a 2-D a: one element each
    if pairs:
        operands.append(draw(integer_arrs(np.dtype(np.int32), m, -shape[1], shape[1] - 1)))
        shape = (rows,)  # the values' shape: one a pair
    if draw(st.booleans()):
        value: Any = draw(st.integers(-5, 5) if dtype.kind != "f" else normal_floats(-10, 10))
        slack = m * abs(value)
        operands.append(value)
        code = f"np.add.at(x0, {'(x1, x2)' if pairs else 'x1'}, {value!r})"
    else:
        vshape = (m,) + shape[1:] if draw(st.integers(0, 3)) else shape[1:]  # broadcast along the indices
        vals = draw(arrs(dtype, vshape, style="small" if dtype.kind != "f" else "moderate",
                         specials=dtype.kind == "f" and draw(st.integers(0, 5)) == 0))
        finite = vals.base[np.isfinite(vals.base)] if dtype.kind == "f" else vals.base
        slack = m * float(np.sum(np.abs(finite.astype(np.float64))))
        operands.append(vals)
        code = f"np.add.at(x0, {'(x1, x2)' if pairs else 'x1'}, x{len(operands) - 1})"
    gpu = "yes" if m and not out_of_range and (dtype == F32 or dtype.itemsize <= 4) else None
    fn = (lambda a, i, j, v: add_at(a, (i, j), v)) if pairs else add_at
    return Case(code + "  # in place", fn, operands, gpu=gpu, base_slack=(slack + 1) * (m + 1))


def test_add_at(backend: Backend) -> None:
    """np.add.at with one array of indices (negative ones, repeats, out of range) or a (rows, columns) pair of
    them, a value or an array of values (broadcast along the indices), into rows of 1-D and 2-D arrays and
    views, in place: int32, uint32 and int8 wrapping as numpy's, float32 within another order's rounding,
    int64 where its sums fit 32 bits, float64 as numpy's."""
    run_property(backend, add_at_cases(), 40)


def test_add_at_with_many_repeats_of_few_indices(runtime: GpuRuntime, rng: np.random.Generator) -> None:
    """Invocations contending for a slot: every add lands (integers exactly, floats to their order's rounding)."""
    n = 100_000
    index = rng.integers(0, 4, n)
    cell = runtime.to_device({"counts": np.zeros(4, np.int32), "sums": np.zeros(4, np.float32),
                              "index": index, "ones": np.ones(n, np.float32)})
    runtime.take_stats()
    np.add.at(cell["counts"], cell["index"], 1)
    np.add.at(cell["sums"], cell["index"], cell["ones"])
    assert runtime.take_stats()["kernels"] == {"add_at": 4}  # a copy and a scatter each
    expected = np.bincount(index, minlength=4)
    np.testing.assert_array_equal(np.asarray(cell["counts"]), expected)
    np.testing.assert_array_equal(np.asarray(cell["sums"]), expected.astype(np.float32))  # whole numbers: exact


# -- partition -------------------------------------------------------------------------------------------


def _le(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a <= b in numpy's sort order (NaN last)."""
    with np.errstate(invalid="ignore"):
        return (a <= b) | np.isnan(b) if a.dtype.kind == "f" else a <= b


def check_partitioned(got: np.ndarray, want: np.ndarray, kths: list[int]) -> None:
    """``got`` (the partitioned axis last) is a partition at every kth: numpy's element there, none larger
    before it, none smaller after it, and the same values as numpy's."""
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    for k in kths:
        kth, kth_want = got[..., k:k + 1], want[..., k:k + 1]
        np.testing.assert_array_equal(kth, kth_want, err_msg=f"element {k}")
        assert _le(got[..., :k], kth).all(), f"a value before element {k} is larger than it"
        assert _le(kth, got[..., k + 1:]).all(), f"a value after element {k} is smaller than it"
    np.testing.assert_array_equal(np.sort(got, axis=-1), np.sort(want, axis=-1))


@st.composite
def partition_cases(draw: Any) -> tuple[Arr, Any, Any, str]:
    dtype = draw(ORDER_DTYPES)
    shape = draw(shapes(min_dims=1, max_dims=3, max_side=6))
    x = draw(arrs(dtype, shape, style=draw(st.sampled_from(["small", "moderate"]))))
    axis = draw(st.sampled_from([-1, 0, None]))
    length = math.prod(shape) if axis is None else shape[axis]
    k = st.integers(-length, length - 1) if length else st.integers(-1, 1)
    kth = draw(st.one_of(k, st.lists(k, min_size=1, max_size=3)))
    how = draw(st.sampled_from(["np.partition", "np.argpartition", "x.partition", "x.argpartition"]))
    return x, kth, axis, "np.partition" if how == "x.partition" and axis is None else how


def run_partition(how: str, x: Any, kth: Any, axis: Any) -> Any:
    if how == "np.partition":
        return np.partition(x, kth, axis=axis)
    if how == "np.argpartition":
        return np.argpartition(x, kth, axis=axis)
    if how == "x.argpartition":
        return x.argpartition(kth, axis=axis)
    x.partition(kth, axis=axis)
    return x


def test_partition(backend: Backend) -> None:
    """np.partition, np.argpartition and their methods (x.partition in place), along the last axis, the first
    or of all values, one kth or several: numpy's element at each kth and the split, the same values, and
    numpy's errors (kth out of range). Natively ordered dtypes must run the kernel."""

    @settings(max_examples=backend.examples(40), deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck), print_blob=True)
    @given(case=partition_cases())
    def prop(case: tuple[Arr, Any, Any, str]) -> None:
        x, kth, axis, how = case
        note(f"{how}(x0, {kth!r}, axis={axis!r}); x0 = {x!r}")
        (ref_x,), (dev_x,), _, _ = prepare(backend, [x])
        backend.take_stats()
        want, want_exc = _run(lambda: run_partition(how, ref_x, kth, axis))
        got, got_exc = _run(lambda: run_partition(how, dev_x, kth, axis))
        stats = backend.take_stats()
        note(f"stats: {stats}")
        if want_exc is not None:
            assert isinstance(got_exc, public_type(want_exc)), (want_exc, got_exc)
            return
        assert got_exc is None, got_exc
        values = np.asarray(ref_x)
        if axis is None:
            values = values.reshape(-1)
        where = -1 if axis is None else axis
        if "arg" in how:
            got_i, want_i = np.asarray(got), np.asarray(want)
            assert got_i.dtype == want_i.dtype and got_i.shape == want_i.shape
            rows = np.moveaxis(got_i, where, -1)
            np.testing.assert_array_equal(np.sort(rows, axis=-1), np.broadcast_to(np.arange(rows.shape[-1]),
                                                                                   rows.shape))
            got, want = np.take_along_axis(values, got_i, where), np.take_along_axis(values, want_i, where)
        length = np.shape(want)[where]
        if not length:
            assert np.shape(got) == np.shape(want) and np.asarray(got).dtype == np.asarray(want).dtype
            return
        kths = sorted({int(k) % length for k in np.atleast_1d(kth)})
        check_partitioned(np.moveaxis(np.asarray(got), where, -1), np.moveaxis(np.asarray(want), where, -1), kths)
        if backend.on_gpu and x.size and (native(x.dtype) or x.dtype == np.int64):
            assert stats["kernels"], f"computed with numpy, no kernel ran ({stats['numpy']})"

    prop()


def _run(fn: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            result = fn()
            return (np.array(result, copy=True) if isinstance(result, np.ndarray) else result), None
        except Exception as exc:  # noqa: BLE001 - compared with numpy's
            return None, exc


@st.composite
def sort_cases(draw: Any) -> Case:
    dtype = draw(ORDER_DTYPES)
    shape = draw(shapes(min_dims=1, max_dims=3, max_side=6))
    x = draw(arrs(dtype, shape, style=draw(st.sampled_from(["small", "moderate", "wide"]))))
    axis = draw(st.sampled_from([-1, 0, 1, None]))
    gpu = "yes" if x.size and native(x.dtype) and (axis is None or axis < len(shape)) else None
    how = draw(st.sampled_from(["np.sort", "np.argsort", "x.sort"]))
    if how == "np.argsort":
        return Case(f"np.argsort(x0, axis={axis!r}, kind='stable')",
                    lambda x0: np.argsort(x0, axis=axis, kind="stable"), [x], gpu=gpu)
    if how == "x.sort" and axis is not None:
        def in_place(x0: Any) -> Any:
            x0.sort(axis=axis, kind="stable")
            return np.asarray(x0).copy()
        return Case(f"x0.sort(axis={axis!r}, kind='stable'); x0", in_place, [x], gpu=gpu)
    return Case(f"np.sort(x0, axis={axis!r}, kind='stable')", lambda x0: np.sort(x0, axis=axis, kind="stable"),
                [x], gpu=gpu)


def test_sort_along_any_axis(backend: Backend) -> None:
    """np.sort, stable np.argsort and x.sort along the last axis, another one or of all values: numpy's answers
    bit for bit (the stable order: -0.0 and 0.0 as they came, NaN last), int32 and uint32 beyond float32's
    integers natively."""
    run_property(backend, sort_cases(), 30)


# -- median, percentile, quantile ------------------------------------------------------------------------


@st.composite
def quantile_cases(draw: Any) -> Case:
    name = draw(st.sampled_from(["median", "percentile", "quantile"]))
    dtype = draw(ORDER_DTYPES)
    shape = draw(shapes(max_dims=3, max_side=6))
    x = draw(arrs(dtype, shape, style=draw(st.sampled_from(["small", "moderate", "wide"]))))
    ndim = len(shape)
    axis = draw(st.one_of(st.none(), st.integers(-ndim, max(ndim - 1, 0)), st.integers(ndim, ndim + 1),
                          st.lists(st.integers(-ndim, max(ndim - 1, 0)), min_size=1, max_size=3).map(tuple)))
    top = 100 if name == "percentile" else 1
    q: Any = draw(st.one_of(normal_floats(0, top), st.sampled_from([0, top, top / 2]),
                            st.lists(normal_floats(0, top), min_size=1, max_size=3)))
    if name != "median" and draw(st.integers(0, 9)) == 0:
        q = top * 1.5  # numpy's ValueError
    valid_axis = axis is None or (-ndim <= axis < ndim if isinstance(axis, int) else
                                  len({a % max(ndim, 1) for a in axis}) == len(axis) and ndim > 0)
    gpu = "yes" if x.size and valid_axis and native(x.dtype) and not (name != "median" and x.dtype == np.bool_) \
        and (name == "median" or q != top * 1.5) else None
    options: dict[str, Any] = {"axis": axis, "keepdims": draw(st.booleans())}
    if name != "median" and draw(st.booleans()):
        options["method"] = draw(st.sampled_from(["lower", "higher", "nearest", "midpoint", "inverted_cdf",
                                                  "median_unbiased", "weibull"]))
    code = ", ".join(f"{key}={value!r}" for key, value in options.items())
    if name == "median":
        return Case(f"np.median(x0, {code})", lambda x0: np.median(x0, **options), [x], gpu=gpu)
    fn = getattr(np, name)
    return Case(f"np.{name}(x0, {q!r}, {code})", lambda x0: fn(x0, q, **options), [x], gpu=gpu)


def test_median_and_quantiles(backend: Backend) -> None:
    """np.median, np.percentile and np.quantile (one q or several, numpy's methods, keepdims) of all values,
    along an axis or along several: numpy's answers exactly, NaN giving NaN, scalars as numpy's scalar types;
    numpy's errors (axis, q out of range, percentiles of booleans) and empty arrays (NaN and a warning) as
    numpy's."""
    run_property(backend, quantile_cases(), 50)


# -- unique ----------------------------------------------------------------------------------------------


@st.composite
def unique_cases(draw: Any) -> Case:
    dtype = draw(ORDER_DTYPES)
    shape = draw(shapes(max_dims=2, max_side=8))
    style = draw(st.sampled_from(["small", "small", "wide"]))
    x = draw(arrs(dtype, shape, style=style))
    flags = {name: draw(st.booleans()) for name in ("return_index", "return_inverse", "return_counts")}
    gpu = "yes" if x.size and native(x.dtype) else None
    code = ", ".join(f"{name}={value}" for name, value in flags.items())
    return Case(f"np.unique(x0, {code})", lambda x0: np.unique(x0, **flags), [x], gpu=gpu)


def test_unique(backend: Backend) -> None:
    """np.unique of all values, with where each first comes, each value's place among them and their counts
    or not: numpy's answers exactly (-0.0 equal to 0.0, all NaNs one value), many duplicates, views, empty
    arrays."""
    run_property(backend, unique_cases(), 40)


# -- kernels at sizes the properties don't reach -------------------------------------------------------


def test_large_arrays_take_several_passes(runtime: GpuRuntime, rng: np.random.Generator) -> None:
    """Sorts over several workgroups and a cumsum over several spans; counts over many slots."""
    n = 150_000
    x = rng.integers(-5000, 5000, n).astype(np.int32)
    f = rng.standard_normal((3, n // 3)).astype(np.float32)
    f[1, ::7] = np.nan
    w = rng.standard_normal(n).astype(np.float32)
    cell = runtime.to_device({"x": x, "f": f, "w": w, "big": np.array([0, 2 ** 31 - 1, -(2 ** 31)] * 5, np.int32)})
    runtime.take_stats()
    values, counts = np.unique(cell["x"], return_counts=True)
    expected_values, expected_counts = np.unique(x, return_counts=True)
    np.testing.assert_array_equal(np.asarray(values), expected_values)
    np.testing.assert_array_equal(np.asarray(counts), expected_counts)
    np.testing.assert_array_equal(np.asarray(np.bincount(cell["x"] + 5000)), np.bincount(x + 5000))
    sums, expected_sums = np.bincount(cell["x"] + 5000, cell["w"]), np.bincount(x + 5000, w)
    assert np.abs(np.asarray(sums) - expected_sums).max() < 1e-4
    np.testing.assert_array_equal(np.asarray(np.median(cell["f"], axis=1)), np.median(f, axis=1))
    assert np.median(cell["f"][0]) == np.median(f[0])
    np.testing.assert_array_equal(np.asarray(np.percentile(cell["f"], [5, 50, 95], axis=1)),
                                  np.percentile(f, [5, 50, 95], axis=1))
    assert np.unique(cell["big"]).tolist() == [-(2 ** 31), 0, 2 ** 31 - 1]  # beyond float32: int32 natively
    assert set(runtime.take_stats()["kernels"]) == {"unique", "bincount", "add", "median", "percentile"}


def test_what_numpy_orders_it_says_why(rng: np.random.Generator, capfd: Any) -> None:
    """An array larger than a binding holds, and float64 values: numpy's answers, each said once with its
    reason; nothing raises."""
    rt = make_runtime(max_binding_bytes=64 * 1024)
    try:
        x, f = rng.integers(0, 100, 40_000), rng.standard_normal(100)
        cell = rt.to_device({"x": x, "f": f})
        rt.take_stats()
        np.testing.assert_array_equal(np.asarray(np.unique(cell["x"])), np.unique(x))
        np.testing.assert_array_equal(np.asarray(np.bincount(cell["x"])), np.bincount(x))
        np.testing.assert_array_equal(np.asarray(np.unique(cell["f"])), np.unique(f))
        assert rt.take_stats()["numpy"] == {"np.unique": 2, "np.bincount": 1}
        err = capfd.readouterr().err
        assert "np.unique with arrays larger than this GPU binds at once; computed with numpy" in err, err
        assert "np.unique with float64 values; computed with numpy" in err, err
    finally:
        rt.close()


def test_kernel_lists_name_the_new_kernels(runtime: GpuRuntime, rng: np.random.Generator) -> None:
    """``kernels=[...]`` enables them by name; one not enabled is numpy's, silently."""
    x = rng.standard_normal(1000).astype(np.float32)
    cell = runtime.to_device({"x": x}, ["median"])
    runtime.take_stats()
    assert np.median(cell["x"]) == np.median(x)
    assert np.asarray(np.unique(cell["x"])).tolist() == np.unique(x).tolist()
    stats = runtime.take_stats()
    assert set(stats["kernels"]) == {"median"} and stats["numpy"] == {"np.unique": 1}
    runtime.end_cell({})
