"""Elementwise kernels against numpy: every operation, broadcasting, scalars, specials, empties.

Results are compared through ``np.asarray(result)`` with float32 inputs, whatever array type the
kernels return. Operations numpy computes exactly (rounding, sign, floor_divide, remainder, fmod...)
must match it bit for bit, signed zeros included; the transcendental ones must be within
:data:`ULPS` float32 ulps of the exact (float64) value.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest
from gpu_checks import ELEMENTWISE_TOL, assert_within_ulps_of_terms, rel_err, same_specials

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


def uniform(lo: float, hi: float) -> Domain:
    """Values spread evenly over [lo, hi]."""
    return lambda rng, shape: rng.uniform(lo, hi, shape).astype(np.float32)


def magnitudes(lo: int, hi: int, *, signed: bool = True, offset: float = 0.0) -> Domain:
    """offset + ±10**e with e spread evenly over [lo, hi]: every scale, the tiny ones included."""
    def draw(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        values = 10.0 ** rng.uniform(lo, hi, shape)
        if signed:
            values *= rng.choice([-1.0, 1.0], shape)
        return (offset + values).astype(np.float32)
    return draw


def rounding_cases(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Quarters (ties of rint among them), values of every scale, and integers beyond 2**23."""
    quarters = rng.integers(-80, 80, shape) / 4
    spread = magnitudes(-3, 9)(rng, shape)
    return np.where(rng.random(shape) < 0.5, quarters, spread).astype(np.float32)


def near_minus_one_to_large(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """log1p's domain: tiny values of both signs, down to just above -1 and up to 10**6."""
    tiny = magnitudes(-8, 0)(rng, shape) * np.float32(0.999)
    return np.where(rng.random(shape) < 0.5, tiny, magnitudes(-1, 6, signed=False)(rng, shape)).astype(np.float32)


def expm1_args(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Tiny values of both signs, and the whole range up to overflow."""
    return np.where(rng.random(shape) < 0.5, magnitudes(-8, 0)(rng, shape), uniform(-20.0, 88.0)(rng, shape))


UNARY: dict[str, tuple[Callable[..., Any], Domain]] = {
    "negative": (np.negative, normal),
    "abs": (np.abs, normal),
    "absolute": (np.absolute, normal),
    "exp": (np.exp, moderate),
    "log": (np.log, positive),
    "sqrt": (np.sqrt, positive),
    "tanh": (np.tanh, moderate),
    "sigmoid": (sigmoid, moderate),
    "relu": (lambda x: np.maximum(x, 0), normal),
    # |x| <= 100, where notebooks' angles are (and where a GPU's builtin sin is fine too); the kernels' own
    # reduction is exact for every float, as test_trigonometry_far_out_and_next_to_multiples_of_pi checks.
    "sin": (np.sin, uniform(-100.0, 100.0)),
    "cos": (np.cos, uniform(-100.0, 100.0)),
    "tan": (np.tan, uniform(-100.0, 100.0)),
    "arcsin": (np.arcsin, uniform(-1.0, 1.0)),
    "arccos": (np.arccos, uniform(-1.0, 1.0)),
    "arctan": (np.arctan, magnitudes(-6, 6)),
    "sinh": (np.sinh, uniform(-89.0, 89.0)),
    "cosh": (np.cosh, uniform(-89.0, 89.0)),
    "arcsinh": (np.arcsinh, magnitudes(-8, 30)),
    "arccosh": (np.arccosh, magnitudes(-7, 30, signed=False, offset=1.0)),
    "arctanh": (np.arctanh, magnitudes(-8, 0)),
    "floor": (np.floor, rounding_cases),
    "ceil": (np.ceil, rounding_cases),
    "trunc": (np.trunc, rounding_cases),
    "rint": (np.rint, rounding_cases),
    "sign": (np.sign, rounding_cases),
    "square": (np.square, magnitudes(-15, 15)),
    "reciprocal": (np.reciprocal, magnitudes(-30, 30)),
    "log2": (np.log2, magnitudes(-37, 38, signed=False)),
    "log10": (np.log10, magnitudes(-37, 38, signed=False)),
    "log1p": (np.log1p, near_minus_one_to_large),
    "expm1": (np.expm1, expm1_args),
    "exp2": (np.exp2, uniform(-120.0, 127.0)),
    "fabs": (np.fabs, normal),
}
EXACT_UNARY = frozenset({"negative", "abs", "absolute", "relu", "floor", "ceil", "trunc", "rint", "sign", "square",
                         "fabs"})
"""Operations whose float32 result numpy gives exactly: the GPU must give the same bits."""
ACCURATE_UNARY = frozenset(UNARY) - EXACT_UNARY - {"log", "sqrt", "tanh", "sigmoid"}
"""The math-library operations, within :data:`ULPS` of the exact value (``log``, ``sqrt``, ``tanh`` and
``sigmoid`` use WGSL's builtins, whose accuracy is the implementation's)."""
ULPS = 4
"""Float32 ulps (of the exact result) allowed to the math-library kernels: they measure under 3.5 (tan;
numpy's own float32 tan is as far off)."""

PREDICATES: dict[str, Callable[..., Any]] = {
    "logical_not": np.logical_not, "isnan": np.isnan, "isinf": np.isinf, "isfinite": np.isfinite,
    "signbit": np.signbit,
}

BINARY: dict[str, tuple[Callable[..., Any], Domain, Domain]] = {
    "add": (np.add, normal, normal),
    "subtract": (np.subtract, normal, normal),
    "multiply": (np.multiply, normal, normal),
    "divide": (np.divide, normal, positive),
    "power": (np.power, positive, moderate),
    "maximum": (np.maximum, normal, normal),
    "minimum": (np.minimum, normal, normal),
    "arctan2": (np.arctan2, normal, normal),
    "hypot": (np.hypot, magnitudes(-18, 18), magnitudes(-18, 18)),
    "fmax": (np.fmax, normal, normal),
    "fmin": (np.fmin, normal, normal),
    "copysign": (np.copysign, normal, normal),
    "logaddexp": (np.logaddexp, uniform(-50.0, 50.0), uniform(-50.0, 50.0)),
    "floor_divide": (np.floor_divide, magnitudes(-3, 6), magnitudes(-3, 3)),
    "remainder": (np.remainder, magnitudes(-3, 6), magnitudes(-3, 3)),
    "fmod": (np.fmod, magnitudes(-3, 6), magnitudes(-3, 3)),
}
EXACT_BINARY = frozenset({"fmax", "fmin", "copysign", "floor_divide", "remainder", "fmod"})
"""Binary operations whose float32 result numpy gives exactly."""
SIGNED_ZERO_EXEMPT = frozenset({"fmax", "fmin"})
"""numpy's fmax/fmin of 0.0 and -0.0 give either, depending on the loop that runs: not compared."""

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
EDGES = np.array([0.5, -0.5, 1.5, -1.5, 0.999, -0.999, 1.001, 1e-7, -1e-7, 1e-30, -1e-30, 88.72, -88.72, 89.4, 89.5,
                  -89.5, -103.9, -104.0, 127.9, 128.0, -149.0, -151.0, 8388607.5, 16777216.0, 1e38, -1e38,
                  3.4028235e38, -3.4028235e38], np.float32)
"""Values at the edges of the kernels' domains and branches."""
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
    if name in EXACT_UNARY:
        assert_same_floats(np.asarray(out), reference(x))
    else:
        assert rel_err(np.asarray(out), reference(x.astype(np.float64))) < ELEMENTWISE_TOL


@pytest.mark.parametrize("name", sorted(ACCURATE_UNARY))
def test_unary_within_ulps_of_exact(gpu: Any, rng: np.random.Generator, name: str) -> None:
    reference, domain = UNARY[name]
    x = domain(rng, (20_000,))
    with np.errstate(all="ignore"):
        expected = reference(x.astype(np.float64))
    assert_within_ulps(np.asarray(getattr(gpu, name)(x)), expected, x)


@pytest.mark.parametrize("name", PREDICATES)
def test_predicates_answer_for_every_float(gpu: Any, rng: np.random.Generator, name: str) -> None:
    x = np.concatenate([SPECIALS, EDGES, -SPECIALS, normal(rng, (100,)), np.float32([1e-45, -1e-45])])
    out = np.asarray(getattr(gpu, name)(x))
    np.testing.assert_array_equal(out.astype(bool), PREDICATES[name](x))


@pytest.mark.parametrize("shapes", PAIRS, ids=str)
@pytest.mark.parametrize("name", BINARY)
def test_binary_broadcasts_like_numpy(gpu: Any, rng: np.random.Generator, name: str,
                                      shapes: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    reference, left, right = BINARY[name]
    a, b = left(rng, shapes[0]), right(rng, shapes[1])
    out = getattr(gpu, name)(a, b)
    if name in EXACT_BINARY:
        assert_same_floats(np.asarray(out), reference(a, b), signed_zeros=name not in SIGNED_ZERO_EXEMPT)
        return
    expected = reference(a.astype(np.float64), b.astype(np.float64))
    assert out.shape == expected.shape
    assert rel_err(np.asarray(out), expected) < ELEMENTWISE_TOL


@pytest.mark.parametrize("name", ["floor_divide", "remainder", "fmod"])
def test_floor_divide_remainder_and_fmod_are_exact(gpu: Any, rng: np.random.Generator, name: str) -> None:
    """Mixed signs and scales, small multiples (exact quotients, zero remainders) and quotients past 2**24."""
    n = 20_000
    a = np.concatenate([magnitudes(-20, 20)(rng, (n,)), rng.integers(-60, 60, n) / np.float32(4),
                        magnitudes(20, 38)(rng, (n,))]).astype(np.float32)
    b = np.concatenate([magnitudes(-20, 20)(rng, (n,)), rng.integers(-12, 12, n) / np.float32(4),
                        magnitudes(-3, 3)(rng, (n,))]).astype(np.float32)
    b[b == 0] = 0.75
    with np.errstate(all="ignore"):
        expected = getattr(np, name)(a, b)
    assert_same_floats(np.asarray(getattr(gpu, name)(a, b)), expected)


@pytest.mark.parametrize("name", ["arctan2", "hypot"])
def test_binary_within_ulps_of_exact(gpu: Any, rng: np.random.Generator, name: str) -> None:
    reference, left, right = BINARY[name]
    a, b = left(rng, (20_000,)), right(rng, (20_000,))
    assert_within_ulps(np.asarray(getattr(gpu, name)(a, b)), reference(a.astype(np.float64), b.astype(np.float64)),
                       a, b)


def test_logaddexp_within_ulps_of_its_terms(gpu: Any, rng: np.random.Generator) -> None:
    """log(e^a + e^b) = max + log1p(e^-|a - b|): near 0 it cancels, so ulps of the terms, as numpy's own."""
    a, b = uniform(-50.0, 50.0)(rng, (20_000,)), uniform(-50.0, 50.0)(rng, (20_000,))
    a[:100] = b[:100] + rng.uniform(-1e-3, 1e-3, 100).astype(np.float32)  # nearly equal
    expected = np.logaddexp(a.astype(np.float64), b.astype(np.float64))
    terms = np.maximum(np.abs(a), np.abs(b)).astype(np.float64) + 1.0
    assert_within_ulps_of_terms(np.asarray(gpu.logaddexp(a, b)), expected, terms, ulps=ULPS)


def test_power_of_negative_bases_with_integral_exponents(gpu: Any, rng: np.random.Generator) -> None:
    base = -rng.uniform(0.5, 3.0, (40, 1)).astype(np.float32)
    exponent = np.arange(-4, 5, dtype=np.float32)
    out = np.asarray(gpu.power(base, exponent))
    assert rel_err(out, np.power(base.astype(np.float64), exponent)) < ELEMENTWISE_TOL
    assert np.isnan(np.asarray(gpu.power(base, np.float32(0.5)))).all()


@pytest.mark.parametrize("name", COMPARISONS)
def test_comparisons_give_exact_booleans(gpu: Any, rng: np.random.Generator, name: str) -> None:
    a = rng.integers(0, 3, (31, 17)).astype(np.float32)  # small integers, so ties happen
    b = rng.integers(0, 3, (17,)).astype(np.float32)
    out = getattr(gpu, name)(a, b)
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(np.asarray(out), COMPARISONS[name](a, b))


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
        assert rel_err(np.asarray(out), expected) < ELEMENTWISE_TOL, label
    np.testing.assert_array_equal(np.asarray(x > 5), a > 5)
    np.testing.assert_array_equal(np.asarray(5 >= x), 5 >= a)


@pytest.mark.parametrize("name", UNARY)
def test_unary_nan_and_inf_propagate_like_numpy(gpu: Any, name: str) -> None:
    reference = UNARY[name][0]
    with np.errstate(all="ignore"):
        expected = reference(SPECIALS)
    out = np.asarray(getattr(gpu, name)(SPECIALS))
    same_specials(out, expected)
    finite = np.isfinite(expected)
    assert rel_err(out[finite], expected[finite]) < ELEMENTWISE_TOL


@pytest.mark.parametrize("name", sorted(EXACT_UNARY | ACCURATE_UNARY))
def test_unary_specials_edges_and_signed_zeros(gpu: Any, name: str) -> None:
    """NaN, infinities and signed zeros as numpy gives them, and the edges of domains and branches."""
    x = np.concatenate([SPECIALS, EDGES])
    reference = UNARY[name][0]
    with np.errstate(all="ignore"):
        expected = reference(x)
        exact = reference(x.astype(np.float64))
    out = np.asarray(getattr(gpu, name)(x))
    if name in EXACT_UNARY:
        assert_same_floats(out, expected)
        return
    same_specials(out, expected)
    zero = expected == 0
    np.testing.assert_array_equal(out[zero], expected[zero])
    np.testing.assert_array_equal(np.signbit(out[zero]), np.signbit(expected[zero]), err_msg="signs of zero")
    # finite, nonzero and normal in float32 (GPUs may flush subnormals to zero)
    checked = np.isfinite(expected) & (np.abs(exact) >= np.finfo(np.float32).tiny)
    assert_within_ulps(out[checked], exact[checked], x[checked])


@pytest.mark.parametrize("name", ["sin", "cos", "tan"])
def test_trigonometry_far_out_and_next_to_multiples_of_pi(gpu: Any, rng: np.random.Generator, name: str) -> None:
    """Every scale up to float32's largest, and the floats nearest k pi / 2, where sin or cos nearly vanish
    (a reduction in float32 arithmetic would lose most digits there; the kernels' is exact)."""
    k = np.concatenate([np.arange(1, 5000), rng.integers(5000, 2**40, 5000)]).astype(np.float64)
    x = np.concatenate([magnitudes(0, 38)(rng, (20_000,)), (k * np.pi / 2).astype(np.float32)])
    reference = getattr(np, name)
    assert_within_ulps(np.asarray(getattr(gpu, name)(x)), reference(x.astype(np.float64)), x)


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
    out = np.asarray(getattr(gpu, name)(a, b))
    if name in EXACT_BINARY:
        assert_same_floats(out, expected, signed_zeros=name not in SIGNED_ZERO_EXEMPT)
        return
    same_specials(out, expected)
    finite = np.isfinite(expected) & (np.abs(expected) > 1e-30)  # float32 denormals may flush to zero
    assert rel_err(out[finite], expected[finite]) < ELEMENTWISE_TOL
    if name in ("arctan2", "hypot", "logaddexp"):  # the signed zeros and infinities of C99 (and numpy)
        zero = expected == 0
        np.testing.assert_array_equal(np.signbit(out[zero]), np.signbit(expected[zero]), err_msg="signs of zero")


@pytest.mark.parametrize("shapes", [((0,), (0,)), ((3, 0), (3, 0)), ((0, 4), (4,)), ((5, 0), (1,))], ids=str)
def test_zero_size_operands(gpu: Any, shapes: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    a, b = np.zeros(shapes[0], np.float32), np.ones(shapes[1], np.float32)
    out = gpu.add(a, b)
    assert out.shape == np.add(a, b).shape
    assert np.asarray(out).size == 0
    assert np.asarray(gpu.exp(a)).shape == shapes[0]


def test_incompatible_shapes_raise_like_numpy(gpu: Any) -> None:
    with pytest.raises(ValueError):
        gpu.add(np.ones((3, 4), np.float32), np.ones((5,), np.float32))


def assert_same_floats(out: np.ndarray, expected: np.ndarray, *, signed_zeros: bool = True) -> None:
    """``out`` equal to numpy's float32 result: NaN where it has NaN, and (optionally) the signs of its zeros."""
    np.testing.assert_array_equal(out, expected.astype(np.float32))
    if signed_zeros:
        zero = expected == 0
        np.testing.assert_array_equal(np.signbit(out[zero]), np.signbit(expected[zero]), err_msg="signs of zero")


def assert_within_ulps(out: np.ndarray, exact: np.ndarray, *inputs: np.ndarray) -> None:
    """Each value within :data:`ULPS` float32 ulps of the exact (float64) result, NaN where it is NaN."""
    out64, exact64 = np.asarray(out, np.float64), np.asarray(exact, np.float64)
    np.testing.assert_array_equal(np.isnan(out64), np.isnan(exact64))
    finite = np.isfinite(exact64) & (np.abs(exact64) <= np.finfo(np.float32).max)
    ulp = np.spacing(np.abs(exact64[finite]).astype(np.float32)).astype(np.float64)
    error = np.abs(out64[finite] - exact64[finite]) / ulp
    if error.size and error.max() > ULPS:
        worst = int(np.argmax(error))
        at = [v[finite][worst] for v in inputs]
        raise AssertionError(f"{int((error > ULPS).sum())} of {error.size} values off by more than {ULPS} ulps; "
                             f"the worst, {error[worst]:.2f} ulps, at {at}: {out64[finite][worst]!r} "
                             f"for {exact64[finite][worst]!r}")
