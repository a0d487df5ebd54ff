"""Indexing by an integer array (``x[rows]``, ``np.take``) against numpy, on the take kernel (gather.wgsl).

Properties (Hypothesis, numpy as the oracle, through test_numpy_oracle's machinery): the same indexing of
plain arrays and of DeviceArrays, answers and operands' memory compared exactly, over dtypes, shapes, views,
negative and repeated row numbers, empty index arrays, lists of ints, and row numbers out of range (numpy's
IndexError). Where the kernel gives numpy's answer (float32, int32 and uint32 values), it must have run.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import strategies as st
from test_numpy_oracle import BACKENDS, Backend, Case, arrs, backend_for, run_property, shapes

pytestmark = pytest.mark.gpu

TAKEN = [np.dtype(name) for name in ("float32", "int32", "uint32")]
"""dtypes the take kernel moves; the others are numpy's, exactly."""
OTHERS = [np.dtype(name) for name in ("float64", "int64", "bool", "int16")]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    """test_numpy_oracle's backends: the wgpu runtime and a browser tab's."""
    return backend_for(request)


@st.composite
def take_cases(draw: Any) -> Case:
    dtype = draw(st.one_of(st.sampled_from(TAKEN), st.sampled_from(OTHERS)))
    shape = draw(shapes(min_dims=1, max_dims=3, max_side=6))
    x = draw(arrs(dtype, shape))
    rows = x.shape[0]
    out_of_range = draw(st.integers(0, 9)) == 0
    low, high = (-rows - 3, rows + 3) if out_of_range else (-rows, rows - 1)
    index_shape = draw(shapes(min_dims=1, max_dims=2, max_side=5))
    if high < low or (rows == 0 and not out_of_range):
        index_shape = (0,)
    values = draw(st.lists(st.integers(low, max(low, high)), min_size=int(np.prod(index_shape)),
                           max_size=int(np.prod(index_shape))))
    index_dtype = draw(st.sampled_from([np.int64, np.int32, np.intp]))
    index = np.array(values, index_dtype).reshape(index_shape)
    form = draw(st.sampled_from(["x0[rows]", "x0[list]", "np.take(x0, rows, axis=0)", "np.take(x0, rows)"]))
    fns = {"x0[rows]": lambda x0: x0[index], "x0[list]": lambda x0: x0[index.reshape(-1).tolist()],
           "np.take(x0, rows, axis=0)": lambda x0: np.take(x0, index, axis=0),
           "np.take(x0, rows)": lambda x0: np.take(x0, index)}
    extent = x.size if form == "np.take(x0, rows)" else rows  # np.take without an axis: the flattened array
    in_range = bool(index.size) and -extent <= index.min() and index.max() < extent
    code = form.replace("rows", repr(index)).replace("list", repr(index.reshape(-1).tolist()))
    return Case(code, fns[form], [x], gpu="yes" if dtype in TAKEN and in_range and x.size else None)


def test_take(backend: Backend) -> None:
    """x[rows], x[[ints]] and np.take: numpy's answers exactly (NaN payloads, -0.0), numpy's IndexError for
    row numbers out of range, numpy's own answer for other dtypes."""
    run_property(backend, take_cases(), 60)


def test_a_large_gather_runs_on_the_gpu_and_matches_numpy(backend: Backend) -> None:
    """Rows of a 2 MB matrix picked by a permutation with repeats and negatives: one take dispatch, numpy's bits."""
    rng = np.random.default_rng(7)
    values = rng.standard_normal((4096, 128)).astype(np.float32)
    values[5, 3], values[9, 0] = np.float32(-0.0), np.float32(np.nan)
    rows = np.concatenate([rng.permutation(4096), rng.integers(-4096, 4096, 1000)])
    runtime = backend.runtime
    x = runtime.to_device({"x": values})["x"]
    runtime.take_stats()
    got = x[rows]
    stats = runtime.take_stats()
    assert stats["kernels"] == {"take": 1} and not stats["numpy"]
    assert got.dtype == np.float32 and got.shape == (5096, 128)
    np.testing.assert_array_equal(np.asarray(got).view(np.uint32), values[rows].view(np.uint32))
    assert isinstance(got, np.ndarray) and (got[:2] == values[rows[:2]]).all()  # still indexes as numpy's
