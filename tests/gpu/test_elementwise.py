"""Elementwise kernels against numpy: every operation, broadcasting, scalars, specials, empties."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest
from gpu_checks import ELEMENTWISE_TOL, rel_err, same_specials

from remote_magic.worker.gpu import DeviceArray
from remote_magic.worker.gpu.host_ops import sigmoid

pytestmark = pytest.mark.gpu

Domain = Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]


def normal(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def positive(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.uniform(0.1, 10.0, shape).astype(np.float32)


def moderate(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.uniform(-5.0, 5.0, shape).astype(np.float32)


UNARY: dict[str, tuple[Callable[..., Any], Domain]] = {
    "negative": (np.negative, normal),
    "abs": (np.abs, normal),
    "exp": (np.exp, moderate),
    "log": (np.log, positive),
    "sqrt": (np.sqrt, positive),
    "tanh": (np.tanh, moderate),
    "sigmoid": (sigmoid, moderate),
    "relu": (lambda x: np.maximum(x, 0), normal),
}

BINARY: dict[str, tuple[Callable[..., Any], Domain, Domain]] = {
    "add": (np.add, normal, normal),
    "subtract": (np.subtract, normal, normal),
    "multiply": (np.multiply, normal, normal),
    "divide": (np.divide, normal, positive),
    "power": (np.power, positive, moderate),
    "maximum": (np.maximum, normal, normal),
    "minimum": (np.minimum, normal, normal),
}

COMPARISONS = {
    "greater": np.greater, "greater_equal": np.greater_equal, "less": np.less,
    "less_equal": np.less_equal, "equal": np.equal, "not_equal": np.not_equal,
}

SHAPES = [(1000,), (1001,), (37, 53), (1, 300), (300, 1), (2, 3, 5, 7)]
PAIRS = [((37, 53), (37, 53)), ((37, 53), (53,)), ((37, 1), (1, 53)), ((4, 1, 6), (5, 1)),
         ((1,), (7, 9)), ((), (3, 4)), ((2, 1, 3, 1, 5), (4, 1, 6, 1)),
         # four outputs per invocation: dense with a partial last vec4, and broadcasts whose last dimension is a
         # multiple of 4 (a row, a column, both operands broadcast, a column in the middle)
         ((1001,), (1001,)), ((6, 8), (8,)), ((6, 8), (6, 1)), ((3, 1, 8), (5, 8)), ((2, 3, 4), (3, 1))]
SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 2.5, -2.5, 100.0, -100.0], np.float32)
LAYOUTS = ["outer", "outer by 4", "dense"]
"""How the specials test pairs values: an outer product (11 x 11, one output per invocation), one of 12 x 12
(four per invocation, a column broadcast), or dense arrays of every pair (four per invocation, vec4 loads)."""


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", UNARY)
def test_unary_matches_numpy(gpu: Any, rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> None:
    reference, domain = UNARY[name]
    x = domain(rng, shape)
    out = getattr(gpu, name)(x)
    assert isinstance(out, DeviceArray) and out.dtype == np.float32 and out.shape == shape
    assert rel_err(out.numpy(), reference(x.astype(np.float64))) < ELEMENTWISE_TOL


@pytest.mark.parametrize("shapes", PAIRS, ids=str)
@pytest.mark.parametrize("name", BINARY)
def test_binary_broadcasts_like_numpy(gpu: Any, rng: np.random.Generator, name: str,
                                      shapes: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    reference, left, right = BINARY[name]
    a, b = left(rng, shapes[0]), right(rng, shapes[1])
    out = getattr(gpu, name)(a, b)
    expected = reference(a.astype(np.float64), b.astype(np.float64))
    assert out.shape == expected.shape
    assert rel_err(out.numpy(), expected) < ELEMENTWISE_TOL


def test_power_of_negative_bases_with_integral_exponents(gpu: Any, rng: np.random.Generator) -> None:
    base = -rng.uniform(0.5, 3.0, (40, 1)).astype(np.float32)
    exponent = np.arange(-4, 5, dtype=np.float32)
    out = gpu.power(base, exponent).numpy()
    assert rel_err(out, np.power(base.astype(np.float64), exponent)) < ELEMENTWISE_TOL
    assert np.isnan(gpu.power(base, np.float32(0.5)).numpy()).all()


@pytest.mark.parametrize("name", COMPARISONS)
def test_comparisons_give_exact_booleans(gpu: Any, rng: np.random.Generator, name: str) -> None:
    a = rng.integers(0, 3, (31, 17)).astype(np.float32)  # small integers, so ties happen
    b = rng.integers(0, 3, (17,)).astype(np.float32)
    out = getattr(gpu, name)(a, b)
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out.numpy(), COMPARISONS[name](a, b))


def test_operators_with_python_scalars_on_either_side(gpu: Any, rng: np.random.Generator) -> None:
    a = positive(rng, (19, 23))
    x = gpu.array(a)
    a64 = a.astype(np.float64)
    cases = {
        "x + 2": (x + 2, a64 + 2), "2 - x": (2 - x, 2 - a64), "x * 0.5": (x * 0.5, a64 * 0.5),
        "3 / x": (3 / x, 3 / a64), "x / 3": (x / 3, a64 / 3), "x ** 2": (x ** 2, a64 ** 2),
        "2 ** x": (2 ** x, 2 ** a64), "-x": (-x, -a64), "abs(-x)": (abs(-x), a64),
    }
    for label, (out, expected) in cases.items():
        assert isinstance(out, DeviceArray), label
        assert rel_err(out.numpy(), expected) < ELEMENTWISE_TOL, label
    np.testing.assert_array_equal((x > 5).numpy(), a > 5)
    np.testing.assert_array_equal((5 >= x).numpy(), 5 >= a)


@pytest.mark.parametrize("name", UNARY)
def test_unary_nan_and_inf_propagate_like_numpy(gpu: Any, name: str) -> None:
    reference = UNARY[name][0]
    with np.errstate(all="ignore"):
        expected = reference(SPECIALS)
    out = getattr(gpu, name)(SPECIALS).numpy()
    same_specials(out, expected)
    finite = np.isfinite(expected)
    assert rel_err(out[finite], expected[finite]) < ELEMENTWISE_TOL


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", list(BINARY) + list(COMPARISONS))
def test_binary_nan_and_inf_propagate_like_numpy(gpu: Any, name: str, layout: str) -> None:
    reference = BINARY[name][0] if name in BINARY else COMPARISONS[name]
    values = SPECIALS if layout == "outer" else np.append(SPECIALS, np.float32(0.5))
    a, b = values[:, None], values[None, :]
    if layout == "dense":
        a, b = (np.ascontiguousarray(v).ravel() for v in np.broadcast_arrays(a, b))
    with np.errstate(all="ignore"):
        expected = reference(a, b)
    out = getattr(gpu, name)(a, b).numpy()
    same_specials(out, expected)
    finite = np.isfinite(expected) & (np.abs(expected) > 1e-30)  # float32 denormals may flush to zero
    assert rel_err(out[finite], expected[finite]) < ELEMENTWISE_TOL


@pytest.mark.parametrize("shapes", [((0,), (0,)), ((3, 0), (3, 0)), ((0, 4), (4,)), ((5, 0), (1,))], ids=str)
def test_zero_size_operands(gpu: Any, shapes: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    a, b = np.zeros(shapes[0], np.float32), np.ones(shapes[1], np.float32)
    out = gpu.add(a, b)
    assert out.shape == np.add(a, b).shape
    assert out.numpy().size == 0
    assert gpu.exp(a).numpy().shape == shapes[0]


def test_incompatible_shapes_raise_like_numpy(gpu: Any) -> None:
    with pytest.raises(ValueError):
        gpu.add(np.ones((3, 4), np.float32), np.ones((5,), np.float32))
