"""numpy as the oracle for DeviceArray: property tests (Hypothesis) that a GPU cell's arrays answer as numpy does.

Every property runs one numpy operation twice: on plain ndarrays (the reference) and on the same values
handed through ``runtime.to_device`` (the device side), then checks the device side's answer with
:func:`compare`: the same kind of result (numpy scalar type exactly, or an ndarray), the same dtype and
shape, integers and booleans equal, floats equal within the rounding of another evaluation order (a bound
in float32 ulps of the magnitude of the terms that made each value), NaN exactly where numpy has NaN and
equal infinities; the same exception type where numpy raises; and the operands' memory changed exactly as
numpy changed it (writes through a DeviceArray reach the input array). float64 results are checked to
float32 precision only where a kernel ran (``take_stats()["kernels"]``), exactly elsewhere. Where the
operation has a GPU kernel and the operands are float32 and non-empty, the stats must show a kernel ran.

With REMOTE_MAGIC_ORACLE_SELF_CHECK=1 each property also runs on a third backend, ``plain``, where
``to_device`` hands back the ndarrays untouched: that checks the oracle itself (it must pass whatever the
implementation does); REMOTE_MAGIC_ORACLE_EXAMPLES scales the number of examples (default 0.6).

Covered: elementwise unary and binary ufuncs (operators too, reflected ones, Python and numpy scalars,
mixed dtypes, broadcasting, specials, non-contiguous views); reductions and ndarray methods; matmul / dot;
indexing of every kind; item and slice assignment, in-place operators (with aliasing operands), and that
``np.asarray`` and later operations see the writes; a handful of numpy functions; ``to_device`` itself.
Examples are derandomized, so a failure replays; Hypothesis prints the minimal case as code.
"""

from __future__ import annotations

import math
import operator
import os
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings, strategies as st
from hypothesis.extra import numpy as hnp

from remote_magic.worker.gpu import DeviceArray, GpuRuntime, launch

pytestmark = pytest.mark.gpu

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
F32_EPS = float(np.finfo(np.float32).eps)
F32_TINY = float(np.finfo(np.float32).tiny)
F32_MAX = float(np.finfo(np.float32).max)
DTYPES = [np.dtype(name) for name in ("float32", "float64", "int32", "int64", "uint8", "bool")]
FINITE_SPECIALS = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 2.0, 3.0, -3.0, 10.0, 100.0]
NONFINITE = [math.nan, math.inf, -math.inf]


# -- which operations have kernels ---------------------------------------------------------------------


def _ufuncs(names: Any) -> set[np.ufunc]:
    """The numpy ufuncs among kernel names (``abs`` is np.absolute; ``relu``, ``copy``... are not ufuncs)."""
    found = set()
    for name in names:
        ufunc = getattr(np, str(name), None)
        if isinstance(ufunc, np.ufunc):
            found.add(ufunc)
    return found


UNARY_KERNELS = {np.negative, np.absolute, np.exp, np.log, np.sqrt, np.tanh} | _ufuncs(getattr(launch, "UNARY", {}))
BINARY_KERNELS = ({np.add, np.subtract, np.multiply, np.divide, np.power, np.maximum, np.minimum, np.greater,
                   np.greater_equal, np.less, np.less_equal, np.equal, np.not_equal}
                  | _ufuncs(getattr(launch, "BINARY", {})))
BINARY_KERNELS = {u for u in BINARY_KERNELS if u.nin == 2}
UNARY_KERNELS = {u for u in UNARY_KERNELS if u.nin == 1 and u.nout == 1}
REDUCTION_KERNELS = {"sum", "mean", "max", "min"}

_UNARY_EXTRA = [np.sin, np.cos, np.floor, np.ceil, np.rint, np.trunc, np.square, np.reciprocal, np.sign,
                np.isnan, np.isinf, np.isfinite, np.signbit, np.logical_not, np.positive, np.expm1, np.log1p,
                np.log2, np.exp2, np.arctan, np.invert]
_BINARY_EXTRA = [np.arctan2, np.hypot, np.mod, np.floor_divide, np.fmod, np.logical_and, np.logical_or,
                 np.logical_xor, np.bitwise_and, np.bitwise_or, np.bitwise_xor, np.copysign, np.fmax, np.fmin]
UNARY_UFUNCS = sorted(UNARY_KERNELS | set(_UNARY_EXTRA), key=lambda u: u.__name__)
BINARY_UFUNCS = sorted(BINARY_KERNELS | set(_BINARY_EXTRA), key=lambda u: u.__name__)

UNARY_OPERATORS: dict[np.ufunc, tuple[str, Callable[[Any], Any]]] = {
    np.negative: ("-{}", operator.neg), np.absolute: ("abs({})", abs), np.positive: ("+{}", operator.pos),
    np.invert: ("~{}", operator.invert)}
BINARY_OPERATORS: dict[np.ufunc, tuple[str, Callable[[Any, Any], Any]]] = {
    np.add: ("+", operator.add), np.subtract: ("-", operator.sub), np.multiply: ("*", operator.mul),
    np.divide: ("/", operator.truediv), np.power: ("**", operator.pow), np.floor_divide: ("//", operator.floordiv),
    np.mod: ("%", operator.mod), np.greater: (">", operator.gt), np.greater_equal: (">=", operator.ge),
    np.less: ("<", operator.lt), np.less_equal: ("<=", operator.le), np.equal: ("==", operator.eq),
    np.not_equal: ("!=", operator.ne), np.bitwise_and: ("&", operator.and_), np.bitwise_or: ("|", operator.or_),
    np.bitwise_xor: ("^", operator.xor)}


# -- backends: the device runtimes, and "plain" (no conversion) to check the oracle itself --------------


class Backend:
    """``to_device`` and ``take_stats`` of a runtime, or of nothing at all (``plain``)."""

    def __init__(self, name: str, runtime: GpuRuntime | None) -> None:
        self.name = name
        self.runtime = runtime

    @property
    def on_gpu(self) -> bool:
        return self.runtime is not None

    def to_device(self, values: dict[str, Any]) -> dict[str, Any]:
        if self.runtime is None:
            return dict(values)
        return self.runtime.to_device(values)

    def take_stats(self) -> dict[str, Any]:
        if self.runtime is None:
            return {"kernels": {}, "numpy": {}}
        return self.runtime.take_stats()

    def examples(self, n: int) -> int:
        """Examples for a property: ``n`` times REMOTE_MAGIC_ORACLE_EXAMPLES (default 0.6, for the suite's
        time; 1 or more for a deeper run), fewer through the browser tab, whose every readback is a round trip."""
        scaled = n * float(os.environ.get("REMOTE_MAGIC_ORACLE_EXAMPLES", "0.6"))
        return max(5, int(scaled * 3 / 5 if self.name == "tab" else scaled))


BACKENDS = ["wgpu", "tab"] + (["plain"] if os.environ.get("REMOTE_MAGIC_ORACLE_SELF_CHECK") == "1" else [])
"""``plain`` (the oracle checking itself against numpy) runs with REMOTE_MAGIC_ORACLE_SELF_CHECK=1: after a
change to this file."""


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    return backend_for(request)


def backend_for(request: pytest.FixtureRequest) -> Backend:
    """The :class:`Backend` of ``request.param`` (one of BACKENDS), its stats reset: what ``backend`` gives."""
    if request.param == "plain":
        return Backend("plain", None)
    runtime: GpuRuntime = request.getfixturevalue(f"{request.param}_runtime")
    runtime.take_stats()
    return Backend(request.param, runtime)


# -- operands --------------------------------------------------------------------------------------------

RECIPES: dict[str, tuple[Callable[[tuple[int, ...]], tuple[int, ...]], Callable[[Any], Any]]] = {
    "": (lambda s: s, lambda a: a),
    ".T": (lambda s: s[::-1], lambda a: a.T),
    "[::-1]": (lambda s: s, lambda a: a[::-1]),
    "[..., ::2]": (lambda s: s[:-1] + (2 * s[-1],), lambda a: a[..., ::2]),
    "[1:]": (lambda s: (s[0] + 1,) + s[1:], lambda a: a[1:]),
}
"""A view of the wanted shape: (the base's shape from the view's, the view of the base)."""


@dataclass
class Arr:
    """An array operand: ``base`` viewed through ``recipe``; converted before or after the view is taken
    (``after``: the DeviceArray of the whole base is viewed), or left a plain ndarray (``plain``)."""

    base: np.ndarray
    recipe: str = ""
    after: bool = False
    plain: bool = False

    def view(self, base: Any) -> Any:
        return RECIPES[self.recipe][1](base)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.view(self.base).shape  # type: ignore[no-any-return]

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.base.dtype

    def __repr__(self) -> str:
        with np.printoptions(floatmode="unique", threshold=sys.maxsize, linewidth=200):
            data = "np." + repr(self.base)
        if self.plain:
            return f"{data}{self.recipe}  # a plain ndarray"
        if self.after:
            return f"to_device({data}){self.recipe}"
        return f"to_device({data}{self.recipe})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))


def show(value: Any) -> str:
    if isinstance(value, np.generic):
        return f"np.{type(value).__name__}({value.item()!r})"
    return repr(value)


def A(value: Any) -> np.ndarray:
    """|value| in float64 (for the terms of a bound)."""
    return np.abs(np.asarray(value, dtype=np.float64))


Terms = Optional[Callable[..., Any]]


@dataclass
class Case:
    """One operation on operands x0, x1, ...: ``code`` says it (the report), ``fn`` runs it.

    ``terms(*operands_as_float64, ref)`` gives the magnitude each float value is made of (None: a
    selection or copy, exact), ``ulps`` the float32 ulps of it allowed. ``gpu``: "yes" where a kernel must
    run, "tiny" where every input has at most one element (asserted on its own, in
    test_one_element_on_the_gpu), None where nothing is asserted.
    ``base_slack``: None, the operands' memory must end exactly as numpy leaves it; a number, within
    8 ulps of |before| + |after| + that number (an in-place float operation on the GPU).
    """

    code: str
    fn: Callable[..., Any]
    operands: list[Any]
    terms: Terms = None
    ulps: float = 4
    gpu: str | None = None
    base_slack: float | None = None
    notes: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        lines = [self.code] + [f"    x{i} = {show(op)}" for i, op in enumerate(self.operands)] + self.notes
        return "\n".join(lines)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))


def gpu_flag(kernel: bool, inputs: list[Any], out_size: int | None = None) -> str | None:
    """"yes"/"tiny" where float32 operands of a kernel operation must report a kernel; None otherwise."""
    arrays = [op for op in inputs if isinstance(op, Arr)]
    if not kernel or not arrays:
        return None
    for op in inputs:
        if isinstance(op, Arr) and op.dtype != F32:
            return None
        if isinstance(op, np.generic) and not isinstance(op, np.float32):
            return None
        if not isinstance(op, (Arr, np.generic, bool, int, float)):
            return None
        if isinstance(op, int) and abs(op) > 2**24:  # numpy on purpose (a notice says so): not exact in float32
            return None
        if isinstance(op, float) and math.isfinite(op) and abs(op) > F32_MAX:  # overflows float32: numpy's
            return None
    if any(op.size == 0 for op in arrays) or out_size == 0:
        return None
    return "tiny" if all(op.size <= 1 for op in arrays) else "yes"


# -- strategies ------------------------------------------------------------------------------------------


def normal_floats(lo: float, hi: float, width: int = 64) -> st.SearchStrategy[float]:
    """Floats in [lo, hi] without subnormals (test_subnormal_float32_values has those)."""
    return st.floats(lo, hi, width=width, allow_subnormal=False)


def _float_bounds(lo: float, hi: float, width: int) -> tuple[float, float]:
    if width == 32:
        return float(np.nextafter(np.float32(lo), np.float32(np.inf))), float(np.float32(hi))
    return lo, hi


def magnitudes(width: int) -> st.SearchStrategy[float]:
    """Large and small magnitudes of either sign (float32: 1e-30..1e30; float64: 1e-6..1e6, so a float64
    value and most results of one operation on it stay within float32's normal range)."""
    lo, hi = _float_bounds(*((1e-30, 1e30) if width == 32 else (1e-6, 1e6)), width)
    return st.builds(lambda m, neg: -m if neg else m, normal_floats(lo, hi, width=width), st.booleans())


def elements(dtype: np.dtype[Any], style: str = "wide") -> st.SearchStrategy[Any]:
    """Values for ``dtype``: ``wide`` (specials, small, large and small magnitudes, full integer ranges),
    ``moderate`` (|x| <= 1e3; full integer ranges), ``small`` (integers -100..100, exact in any order)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return st.booleans()
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        bound = 100 if style == "small" else 10
        small = st.integers(max(int(info.min), -bound), min(int(info.max), bound))
        return small if style == "small" else st.one_of(small, st.integers(int(info.min), int(info.max)))
    width = dtype.itemsize * 8
    ints = st.integers(-100, 100).map(float)
    if style == "small":
        return ints
    parts = [st.sampled_from(FINITE_SPECIALS), normal_floats(-10, 10, width=width), ints]
    if style == "wide":
        parts.append(magnitudes(width))
    else:
        parts.append(normal_floats(-1e3, 1e3, width=width))
    return st.one_of(parts)


DTYPE = st.one_of(st.just(F32), st.sampled_from(DTYPES))
"""A dtype, float32 (the GPU's) about half the time."""


def shapes(min_dims: int = 0, max_dims: int = 4, max_side: int = 4) -> st.SearchStrategy[tuple[int, ...]]:
    """Shapes of 0-d to 4-d, half of them with no empty side."""
    return st.one_of(hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=1, max_side=max_side),
                     hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=0, max_side=max_side))


@st.composite
def arrs(draw: Any, dtype: Any, shape: tuple[int, ...], style: str = "wide", plain: bool | None = False,
         specials: bool | None = None, views: bool = True) -> Arr:
    """An :class:`Arr` of ``shape``: sometimes a non-contiguous view; NaN/inf in about half the float arrays."""
    dtype = np.dtype(dtype)
    recipes = [""] if (not shape or not views) else list(RECIPES)
    recipe = draw(st.sampled_from(recipes))
    values = elements(dtype, style)
    special = dtype.kind == "f" and style != "small" and (specials if specials is not None else draw(st.booleans()))
    if special:
        values = st.one_of(values, st.sampled_from(NONFINITE))
    base = draw(hnp.arrays(dtype, RECIPES[recipe][0](tuple(shape)), elements=values))
    if special and base.size:  # a few NaN/inf/-0.0 for sure, not only where Hypothesis happens to put them
        for _ in range(draw(st.integers(1, 3))):
            base.flat[draw(st.integers(0, base.size - 1))] = draw(st.sampled_from(NONFINITE + [-0.0]))
    after = draw(st.booleans())
    is_plain = draw(st.integers(0, 4)) == 0 if plain is None else plain
    return Arr(base, recipe, after, is_plain)


PY_SCALARS = st.one_of(st.integers(-300, 300), st.sampled_from(FINITE_SPECIALS + NONFINITE),
                       normal_floats(-1e3, 1e3), st.booleans(), st.sampled_from([2**31, 2**40, -2**63, 2**64, 1e300]))


@st.composite
def np_scalars(draw: Any, dtype: Any | None = None) -> np.generic:
    dtype = np.dtype(draw(DTYPE) if dtype is None else dtype)
    values = elements(dtype)
    if dtype.kind == "f":
        values = st.one_of(values, st.sampled_from(NONFINITE))
    return dtype.type(draw(values))  # type: ignore[no-any-return]


@st.composite
def elementwise_shapes(draw: Any) -> tuple[int, ...]:
    """shapes(), and one time in ten 9 or 10 dimensions (more than a kernel's uniform describes)."""
    if draw(st.integers(0, 9)) == 0:
        return draw(hnp.array_shapes(min_dims=9, max_dims=10, min_side=1, max_side=2))  # type: ignore[no-any-return]
    return draw(shapes())  # type: ignore[no-any-return]


@st.composite
def shape_pairs(draw: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Two shapes that broadcast together, or (one time in eight) two independent ones, or (one in ten)
    two of 9 or 10 dimensions."""
    if draw(st.integers(0, 7)) == 0:
        return draw(shapes(max_dims=3)), draw(shapes(max_dims=3))
    if draw(st.integers(0, 9)) == 0:
        pair = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=9, max_dims=10, max_side=2))
        return pair.input_shapes[0], pair.input_shapes[1]
    min_side = draw(st.sampled_from([1, 0]))
    pair = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, min_side=min_side,
                                                  max_side=4))
    return pair.input_shapes[0], pair.input_shapes[1]


# -- running a case on both sides, and comparing ---------------------------------------------------------


@dataclass
class Seen:
    """What a result was: its type, and (arrays) a plain copy of its values read right away."""

    kind: type
    value: Any


def snapshot(value: Any) -> Any:
    if type(value) in (tuple, list):
        return type(value)(snapshot(v) for v in value)
    if isinstance(value, np.ndarray):
        return Seen(type(value), np.array(value, copy=True, subok=False))
    return Seen(type(value), value)


def call(fn: Callable[..., Any], args: list[Any]) -> tuple[Any, BaseException | None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            try:
                return snapshot(fn(*args)), None
            except Exception as exc:  # noqa: BLE001 - compared with numpy's
                return None, exc


def public_type(exc: BaseException) -> type:
    """The exception type a caller can name: the first builtin or ``numpy.exceptions`` class of its MRO
    (numpy's private ``_UFuncNoLoopError`` is a TypeError to a caller)."""
    for cls in type(exc).__mro__:
        if cls.__module__ in ("builtins", "numpy.exceptions"):
            return cls
    return type(exc)


def prepare(backend: Backend, operands: list[Any]) -> tuple[list[Any], list[Any], list[np.ndarray], list[np.ndarray]]:
    """Reference arguments (views of copies), device arguments (views of other copies, converted), and both
    sides' bases, whose contents the operation may change."""
    ref_args: list[Any] = []
    dev_args: list[Any] = []
    ref_bases: list[np.ndarray] = []
    dev_bases: list[np.ndarray] = []
    convert: dict[str, Any] = {}
    for i, op in enumerate(operands):
        if isinstance(op, Arr):
            ref_base, dev_base = op.base.copy(), op.base.copy()
            ref_bases.append(ref_base)
            dev_bases.append(dev_base)
            ref_args.append(op.view(ref_base))
            if op.plain:
                dev_args.append(op.view(dev_base))
            else:
                convert[f"x{i}"] = dev_base if op.after else op.view(dev_base)
                dev_args.append(None)
        else:
            ref_args.append(op)
            dev_args.append(op)
    converted = backend.to_device(convert) if convert else {}
    for i, op in enumerate(operands):
        if isinstance(op, Arr) and not op.plain:
            value = converted[f"x{i}"]
            dev_args[i] = op.view(value) if op.after else value
    return ref_args, dev_args, ref_bases, dev_bases


def float64_args(args: list[Any]) -> list[Any]:
    out = []
    for arg in args:
        try:
            out.append(np.array(arg, dtype=np.float64))
        except (TypeError, ValueError):
            out.append(arg)
    return out


def check(backend: Backend, case: Case) -> None:
    """Run ``case`` on numpy and on the device side; assert the device side answers as numpy does."""
    ref_args, dev_args, ref_bases, dev_bases = prepare(backend, case.operands)
    before64 = float64_args(ref_args)
    originals = [b.copy() for b in ref_bases]
    backend.take_stats()
    ref, ref_exc = call(case.fn, ref_args)
    out, out_exc = call(case.fn, dev_args)
    stats = backend.take_stats()
    ran = bool(stats["kernels"])
    try:
        note(f"stats: kernels {stats['kernels']}, numpy {stats['numpy']}")
    except Exception:  # noqa: BLE001 - outside a Hypothesis test
        pass
    if ref_exc is not None:
        if out_exc is None:
            raise AssertionError(f"numpy raises {type(ref_exc).__name__}({ref_exc}); the device side returned "
                                 f"{out!r}")
        wanted = public_type(ref_exc)
        if not isinstance(out_exc, wanted):
            raise AssertionError(f"numpy raises {wanted.__name__} ({ref_exc}); the device side raised "
                                 f"{type(out_exc).__name__}({out_exc})") from out_exc
    elif out_exc is not None:
        raise AssertionError(f"numpy returns a {ref_kind(ref)}; the device side raised "
                             f"{type(out_exc).__name__}({out_exc})") from out_exc
    else:
        spec = None
        if case.terms is not None:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                spec = case.terms(*before64, unsnap(ref))
        compare(out, ref, spec, case.ulps, ran)
    for i, (ref_base, dev_base, original) in enumerate(zip(ref_bases, dev_bases, originals)):
        compare_memory(dev_base, ref_base, original, case.base_slack, ran, f"the memory of operand {i}")
    if case.gpu == "yes" and backend.on_gpu and ref_exc is None:  # one element: test_one_element_on_the_gpu
        assert ran, f"float32 operands: computed with numpy, no kernel ran ({stats['numpy']})"


def ref_kind(ref: Any) -> str:
    return type(ref).__name__ if not isinstance(ref, Seen) else ref.kind.__name__


def unsnap(value: Any) -> Any:
    """The reference result as values (for the terms of a bound)."""
    if type(value) in (tuple, list):
        return type(value)(unsnap(v) for v in value)
    return value.value if isinstance(value, Seen) else value


def compare(got: Any, want: Any, spec: Any, ulps: float, ran: bool, where: str = "result") -> None:
    """``got`` is numpy's ``want``: structure, type, dtype, shape, values (see the module docstring)."""
    if type(want) in (tuple, list):
        assert type(got) is type(want), f"{where}: numpy gives a {type(want).__name__}, got {ref_kind(got)}"
        assert len(got) == len(want), f"{where}: numpy gives {len(want)} items, got {len(got)}"
        specs = spec if type(spec) in (tuple, list) else [spec] * len(want)
        for i, (g, w, s) in enumerate(zip(got, want, specs)):
            compare(g, w, s, ulps, ran, f"{where}[{i}]")
        return
    assert isinstance(got, Seen), f"{where}: numpy gives {want.kind.__name__}, got a {type(got).__name__}"
    if issubclass(want.kind, np.ndarray):
        assert issubclass(got.kind, np.ndarray), f"{where}: numpy gives an ndarray, got {got.kind.__name__}"
    else:
        assert got.kind is want.kind, f"{where}: numpy gives {want.kind.__name__}, got {got.kind.__name__}"
    if isinstance(want.value, (np.ndarray, np.generic)):
        g, w = np.asarray(got.value), np.asarray(want.value)
        assert g.dtype == w.dtype, f"{where}: numpy's dtype is {w.dtype}, got {g.dtype}"
        assert g.shape == w.shape, f"{where}: numpy's shape is {w.shape}, got {g.shape}"
        compare_values(g, w, spec, ulps, ran, where)
    elif isinstance(want.value, float) and math.isnan(want.value):
        assert isinstance(got.value, float) and math.isnan(got.value), f"{where}: numpy gives nan, got {got.value!r}"
    else:
        assert got.value == want.value, f"{where}: numpy gives {want.value!r}, got {got.value!r}"


def _at(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0]) if mask.ndim else ()


def compare_values(g: np.ndarray, w: np.ndarray, terms: Any, ulps: float, ran: bool, where: str) -> None:
    if w.dtype.kind not in "fc":
        bad = g != w
        assert not np.any(bad), (f"{where}: {int(np.sum(bad))} of {w.size} values differ; first at {_at(bad)}: "
                                 f"{g[bad].flat[0]!r} != numpy's {w[bad].flat[0]!r}")
        return
    nan_g, nan_w = np.isnan(g), np.isnan(w)
    bad = nan_g & ~nan_w
    assert not bad.any(), f"{where}: NaN where numpy has {w[bad].flat[0]!r} (first at {_at(bad)})"
    bad = nan_w & ~nan_g
    assert not bad.any(), f"{where}: {g[bad].flat[0]!r} where numpy has NaN (first at {_at(bad)})"
    exact = terms is None and not (ran and w.dtype == F64)
    exact = exact or (w.dtype == F64 and not ran)
    if exact:
        bad = ~nan_w & (g != w)
        assert not bad.any(), (f"{where}: {int(bad.sum())} of {w.size} values differ (exact: no kernel ran, or a "
                               f"selection or copy); first at {_at(bad)}: {g[bad].flat[0]!r} != numpy's "
                               f"{w[bad].flat[0]!r}")
        return
    inf = np.isinf(w)
    bad = inf & (g != w)
    assert not bad.any(), f"{where}: {g[bad].flat[0]!r} where numpy has {w[bad].flat[0]!r} (first at {_at(bad)})"
    checked = np.isfinite(w)
    if w.dtype.itemsize > 4:  # float64 computed in float32: beyond its range is test_float64_beyond_float32's
        checked &= ~((np.abs(w) > F32_MAX) | ((w != 0) & (np.abs(w) < F32_TINY)))
    finfo = np.finfo(w.dtype)
    eps, tiny = max(float(finfo.eps), F32_EPS), max(float(finfo.tiny), F32_TINY)
    if terms is None:
        terms, ulps = np.abs(w.astype(np.float64)), 1
    t = np.broadcast_to(np.nan_to_num(np.asarray(terms, dtype=np.float64), nan=0.0, posinf=np.inf), w.shape)
    bound = ulps * eps * t + 2 * tiny
    with np.errstate(all="ignore"):
        diff = np.abs(g.astype(np.float64) - w.astype(np.float64))
    bad = checked & ~(diff <= bound)
    assert not bad.any(), (f"{where}: {int(bad.sum())} of {w.size} values off by more than {ulps:g} ulps of their "
                           f"terms; first at {_at(bad)}: {g[bad].flat[0]!r} != numpy's {w[bad].flat[0]!r} "
                           f"(bound {bound[bad].flat[0]:.3g})")


def compare_memory(dev: np.ndarray, ref: np.ndarray, original: np.ndarray, slack: float | None, ran: bool,
                   where: str) -> None:
    if slack is None or ref.dtype.kind != "f":
        same = (dev == ref) | (np.isnan(dev) & np.isnan(ref)) if ref.dtype.kind == "f" else dev == ref
        bad = ~same
        assert not bad.any(), (f"{where}: {int(bad.sum())} of {ref.size} values not as numpy leaves them; first at "
                               f"{_at(bad)}: {dev[bad].flat[0]!r} != numpy's {ref[bad].flat[0]!r}")
        return
    compare_values(dev, ref, A(ref) + A(original) + slack, 8, ran, where)


def run_property(backend: Backend, strategy: st.SearchStrategy[Case], examples: int) -> None:
    """Check ``examples`` cases of ``strategy`` (fewer on the tab backend); derandomized, so they replay."""

    @settings(max_examples=backend.examples(examples), deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck), print_blob=True)
    @given(case=strategy)
    def prop(case: Case) -> None:
        check(backend, case)

    prop()


# -- elementwise -----------------------------------------------------------------------------------------


def unary_terms(ufunc: np.ufunc) -> tuple[Terms, float]:
    name = ufunc.__name__
    if name in ("negative", "absolute", "positive", "floor", "ceil", "rint", "trunc", "sign", "square",
                "reciprocal", "sqrt"):
        return (lambda x, r: A(r)), 4
    if name in ("exp", "exp2"):
        return (lambda x, r: A(r) * (2 + A(x))), 8
    if name == "expm1":
        return (lambda x, r: A(r) * (2 + A(x)) + 1), 8
    if name in ("log", "log2", "log10", "log1p", "tanh"):
        return (lambda x, r: A(r) + 1), 8
    return (lambda x, r: 1 + A(r) + A(x)), 64  # sin, cos, arctan...: GPU transcendentals are looser


def binary_terms(ufunc: np.ufunc) -> tuple[Terms, float]:
    name = ufunc.__name__
    if name in ("add", "subtract"):
        return (lambda a, b, r: A(a) + A(b)), 4
    if name in ("multiply", "divide", "maximum", "minimum", "fmax", "fmin", "copysign"):
        return (lambda a, b, r: A(r)), 4
    if name == "power":
        return (lambda a, b, r: A(r) * (4 + A(b) + A(b) * np.abs(np.log2(A(a))))), 8
    return (lambda a, b, r: 1 + A(r) + A(a) + A(b)), 64


@st.composite
def unary_cases(draw: Any, ufunc: np.ufunc | None = None, keywords: str = "") -> Case:
    if ufunc is None:
        ufunc = draw(st.one_of(st.sampled_from(sorted(UNARY_KERNELS, key=lambda u: u.__name__)),
                               st.sampled_from(UNARY_UFUNCS)))
    x = draw(arrs(draw(DTYPE), draw(elementwise_shapes())))
    form = UNARY_OPERATORS.get(ufunc)
    terms, ulps = unary_terms(ufunc)
    gpu = gpu_flag(ufunc in UNARY_KERNELS, [x])
    keywords = keywords or ""
    if keywords.startswith("dtype="):
        dtype, casting = (np.float64, "same_kind") if keywords == "dtype=np.float64" else (np.int64, "unsafe")
        code, fn, gpu = f"np.{ufunc.__name__}(x0, {keywords})", (lambda a: ufunc(a, dtype=dtype, casting=casting)), None
    elif keywords:
        def with_out(a: Any) -> Any:
            out = np.full(np.shape(a), 7.0)
            result = ufunc(a, out=out, where=(np.arange(np.size(a)) % 3 == 0).reshape(np.shape(a)))
            return result is out, out

        base_terms = terms
        terms = lambda a, r: (None, base_terms(a, r[1]))  # type: ignore[misc]  # noqa: E731
        code, fn, gpu = (f"out = np.full(x0.shape, 7.0); r = np.{ufunc.__name__}(x0, out=out, where=np.arange("
                         "x0.size).reshape(x0.shape) % 3 == 0); (r is out, out)"), with_out, None
    elif form is not None and draw(st.booleans()):
        code, fn = form[0].format("x0"), form[1]
    else:
        code, fn = f"np.{ufunc.__name__}(x0)", ufunc
    return Case(code, fn, [x], terms, ulps, gpu)


LAYOUTS = ["array array", "array scalar", "scalar array", "array plain", "plain array", "array npscalar",
           "npscalar array"]


@st.composite
def binary_cases(draw: Any, ufunc: np.ufunc | None = None, keywords: str = "") -> Case:
    if ufunc is None:
        ufunc = draw(st.one_of(st.sampled_from(sorted(BINARY_KERNELS, key=lambda u: u.__name__)),
                               st.sampled_from(BINARY_UFUNCS)))
    layout = draw(st.sampled_from(LAYOUTS)).split()
    dtype0 = draw(DTYPE)
    dtype1 = draw(st.one_of(st.just(dtype0), DTYPE))
    shape0, shape1 = draw(shape_pairs())
    operands: list[Any] = []
    for side, dtype, shape in zip(layout, (dtype0, dtype1), (shape0, shape1)):
        if side in ("array", "plain"):
            operands.append(draw(arrs(dtype, shape, plain=side == "plain")))
        elif side == "scalar":
            operands.append(draw(PY_SCALARS))
        else:
            operands.append(draw(np_scalars(dtype)))
    form = BINARY_OPERATORS.get(ufunc)
    terms, ulps = binary_terms(ufunc)
    try:
        out_size = math.prod(np.broadcast_shapes(*(op.shape if isinstance(op, Arr) else () for op in operands)))
    except ValueError:
        out_size = 0
    gpu = gpu_flag(ufunc in BINARY_KERNELS, operands, out_size)
    keywords = keywords or ""
    if keywords.startswith("dtype="):
        dtype, casting = (np.float64, "same_kind") if keywords == "dtype=np.float64" else (np.int64, "unsafe")
        code, fn, gpu = f"np.{ufunc.__name__}(x0, x1, {keywords})", \
            (lambda a, b: ufunc(a, b, dtype=dtype, casting=casting)), None
    elif keywords:
        where = "where" in keywords

        def with_out(a: Any, b: Any) -> Any:
            shape = np.broadcast_shapes(np.shape(a), np.shape(b))
            out = np.full(shape, 7.0)
            mask = (np.arange(math.prod(shape)) % 3 == 0).reshape(shape)
            result = ufunc(a, b, out=out, where=mask) if where else ufunc(a, b, out=out)
            return result is out, out

        base_terms = terms
        terms = lambda a, b, r: (None, base_terms(a, b, r[1]))  # type: ignore[misc]  # noqa: E731
        mask_code = ", where=np.arange(size).reshape(shape) % 3 == 0" if where else ""
        code, fn, gpu = (f"out = np.full(shape, 7.0); r = np.{ufunc.__name__}(x0, x1, out=out{mask_code}); "
                         "(r is out, out)"), with_out, None
    elif form is not None and draw(st.booleans()):
        code, fn = f"x0 {form[0]} x1", form[1]
    else:
        code, fn = f"np.{ufunc.__name__}(x0, x1)", ufunc
    return Case(code, fn, operands, terms, ulps, gpu)


def test_unary_ufuncs(backend: Backend) -> None:
    """Unary ufuncs (kernels and others) and their operators on every dtype, shape and view, with specials."""
    run_property(backend, unary_cases(), 60)


@pytest.mark.parametrize("ufunc", sorted(UNARY_KERNELS, key=lambda u: u.__name__), ids=lambda u: u.__name__)
def test_unary_kernel(backend: Backend, ufunc: np.ufunc) -> None:
    """One unary ufunc that has a kernel, on its own (so its special cases come up)."""
    run_property(backend, unary_cases(ufunc), 20)


def test_binary_ufuncs(backend: Backend) -> None:
    """Binary ufuncs and operators (reflected too): broadcasting, mixed dtypes, Python and numpy scalars,
    plain ndarrays beside DeviceArrays, non-contiguous views, specials, shapes that don't broadcast."""
    run_property(backend, binary_cases(), 80)


KEYWORDS = ["dtype=np.float64", "dtype=np.int64, casting='unsafe'", "out=", "out= where="]


KEYWORD_UNARY = [np.negative, np.absolute, np.exp, np.sqrt]
KEYWORD_BINARY = [np.add, np.subtract, np.multiply, np.divide, np.power, np.maximum, np.minimum, np.greater]


@st.composite
def keyword_cases(draw: Any, keywords: str) -> Case:
    """A kernel ufunc with ``keywords`` on plain cases: non-empty float32 (mostly) arrays of fractional values."""
    unary = keywords != "out=" and draw(st.integers(0, 2)) == 0
    ufunc = draw(st.sampled_from(KEYWORD_UNARY if unary else KEYWORD_BINARY))
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=5))
    dtype = draw(st.sampled_from([F32, F32, F32, F64, np.dtype(np.int32)]))
    values = st.one_of(normal_floats(-20, 20, width=dtype.itemsize * 8), st.sampled_from([0.5, -0.5, 1.5, 2.5]))
    if dtype.kind != "f":
        values = st.integers(-20, 20)
    x = Arr(draw(hnp.arrays(dtype, shape, elements=values)))
    operands: list[Any] = [x]
    if not unary:
        other = draw(st.sampled_from(["array", "scalar"]))
        operands.append(Arr(draw(hnp.arrays(dtype, shape, elements=values))) if other == "array"
                        else draw(st.sampled_from([0.5, -1.5, 2.0, 3])))
    template = unary_cases if unary else binary_cases
    case: Case = draw(template(ufunc, keywords=keywords))
    case.operands = operands
    return case


@pytest.mark.parametrize("keywords", KEYWORDS)
def test_ufunc_keywords(backend: Backend, keywords: str) -> None:
    """Kernel ufuncs called with dtype= (float64; int64 with casting='unsafe': numpy casts the inputs first),
    out= a float64 ndarray, and where= with out=: the keywords are numpy's, not ignored by a kernel."""
    run_property(backend, keyword_cases(keywords), 40)


@pytest.mark.parametrize("ufunc", sorted(BINARY_KERNELS, key=lambda u: u.__name__), ids=lambda u: u.__name__)
def test_binary_kernel(backend: Backend, ufunc: np.ufunc) -> None:
    """One binary ufunc that has a kernel, on its own (so its special cases come up)."""
    run_property(backend, binary_cases(ufunc), 25)


# -- reductions and methods ------------------------------------------------------------------------------


def _reduced(shape: tuple[int, ...], axis: Any) -> int:
    """Number of values each output of a reduction over ``axis`` is made of."""
    if axis is None:
        return math.prod(shape)
    axes = axis if isinstance(axis, tuple) else (axis,)
    return math.prod(shape[a % len(shape)] for a in axes) if shape else 1


def _var_terms(x: np.ndarray, axis: Any, keepdims: bool, ddof: int) -> np.ndarray:
    n = _reduced(x.shape, axis)
    m = np.mean(x, axis=axis, keepdims=True) if x.size else 0.0
    spread = np.sum((A(x) + A(m)) ** 2, axis=axis, keepdims=keepdims)
    return 2 * spread / max(n - ddof, 1) * (n + 4)  # type: ignore[no-any-return]


REDUCERS: dict[str, list[tuple[str, Callable[..., Any]]]] = {
    "sum": [("x0.sum({})", lambda x, **kw: x.sum(**kw)), ("np.sum(x0, {})", lambda x, **kw: np.sum(x, **kw)),
            ("np.add.reduce(x0, {})", lambda x, **kw: np.add.reduce(x, **kw))],
    "mean": [("x0.mean({})", lambda x, **kw: x.mean(**kw)), ("np.mean(x0, {})", lambda x, **kw: np.mean(x, **kw))],
    "max": [("x0.max({})", lambda x, **kw: x.max(**kw)), ("np.max(x0, {})", lambda x, **kw: np.max(x, **kw)),
            ("np.amax(x0, {})", lambda x, **kw: np.amax(x, **kw)),
            ("np.maximum.reduce(x0, {})", lambda x, **kw: np.maximum.reduce(x, **kw))],
    "min": [("x0.min({})", lambda x, **kw: x.min(**kw)), ("np.min(x0, {})", lambda x, **kw: np.min(x, **kw)),
            ("np.minimum.reduce(x0, {})", lambda x, **kw: np.minimum.reduce(x, **kw))],
    "prod": [("x0.prod({})", lambda x, **kw: x.prod(**kw))],
    "std": [("x0.std({})", lambda x, **kw: x.std(**kw)), ("np.std(x0, {})", lambda x, **kw: np.std(x, **kw))],
    "var": [("x0.var({})", lambda x, **kw: x.var(**kw)), ("np.var(x0, {})", lambda x, **kw: np.var(x, **kw))],
    "argmax": [("x0.argmax({})", lambda x, **kw: x.argmax(**kw)),
               ("np.argmax(x0, {})", lambda x, **kw: np.argmax(x, **kw))],
    "argmin": [("x0.argmin({})", lambda x, **kw: x.argmin(**kw))],
    "any": [("x0.any({})", lambda x, **kw: x.any(**kw)), ("np.any(x0, {})", lambda x, **kw: np.any(x, **kw))],
    "all": [("x0.all({})", lambda x, **kw: x.all(**kw))],
    "cumsum": [("x0.cumsum({})", lambda x, **kw: x.cumsum(**kw)),
               ("np.cumsum(x0, {})", lambda x, **kw: np.cumsum(x, **kw))],
}


def reduction_terms(name: str, axis: Any, keepdims: bool, ddof: int) -> tuple[Terms, float]:
    if name == "sum":
        return (lambda x, r: np.sum(A(x), axis=axis, keepdims=keepdims) * (_reduced(x.shape, axis) + 4)), 1
    if name == "mean":
        return (lambda x, r: np.mean(A(x), axis=axis, keepdims=keepdims) * (_reduced(x.shape, axis) + 4)), 1
    if name == "prod":
        return (lambda x, r: A(r) * (_reduced(x.shape, axis) + 4)), 1
    if name == "var":
        return (lambda x, r: _var_terms(x, axis, keepdims, ddof)), 1
    if name == "std":  # |sqrt(a) - sqrt(b)| <= sqrt(|a - b|): the bound on var, square-rooted
        return (lambda x, r: np.sqrt(F32_EPS * _var_terms(x, axis, keepdims, ddof)) / F32_EPS), 1
    if name == "cumsum":
        def cumsum_terms(x: np.ndarray, r: Any) -> Any:
            n = x.size if axis is None else (x.shape[axis % x.ndim] if x.ndim else 1)
            return np.cumsum(A(x), axis=axis) * (n + 4)
        return cumsum_terms, 1
    return None, 1  # max/min (a selection), argmax, any, all


@st.composite
def axes(draw: Any, ndim: int, tuples: bool = True) -> Any:
    """None, an axis (negative sometimes), a tuple of distinct axes; now and then an invalid one (out of
    range, duplicated) or the empty tuple."""
    valid = st.integers(-ndim, ndim - 1) if ndim else st.just(0)
    choices = [st.none(), valid]
    if tuples and ndim:
        choices.append(st.lists(valid, min_size=1, max_size=ndim, unique_by=lambda a: a % ndim).map(tuple))
    odd = [st.integers(-ndim - 2, ndim + 1)]
    if tuples:
        odd += [st.just(()), st.lists(valid, min_size=2, max_size=3).map(tuple)]
    if draw(st.integers(0, 4)) == 0:
        return draw(st.one_of(odd))
    return draw(st.one_of(choices))


def _kwargs_code(kwargs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


@st.composite
def reduction_cases(draw: Any, name: str | None = None, longest: int = 600, extra: str | None = None) -> Case:
    """A reduction; ``extra`` forces one of its keywords (dtype, initial, where) on plain cases: non-empty
    float32 (mostly) arrays of fractional values."""
    if name is None:
        name = draw(st.one_of(st.sampled_from(sorted(REDUCTION_KERNELS)), st.sampled_from(sorted(REDUCERS))))
    template, reducer = draw(st.sampled_from(REDUCERS[name]))
    dtype = draw(DTYPE)
    if extra is not None:
        dtype = draw(st.sampled_from([F32, F32, F32, F64, np.dtype(np.int32)]))
        shape = draw(hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=5))
    elif name in REDUCTION_KERNELS and draw(st.integers(0, 4)) == 0:  # past a kernel's short-axis path (256)
        length = draw(st.integers(200, longest))
        shape = draw(st.sampled_from([(length,), (2, length), (length, 2)]))
    else:
        shape = draw(st.one_of(shapes(min_dims=1), shapes()))
    x = draw(arrs(dtype, shape, style="moderate", specials=extra is None and draw(st.integers(0, 2)) == 0))
    kwargs: dict[str, Any] = {}
    axis = draw(axes(len(shape), tuples=name not in ("argmax", "argmin", "cumsum")))
    kwargs["axis"] = axis
    keepdims = False
    if name != "cumsum" and draw(st.booleans()):
        keepdims = kwargs["keepdims"] = draw(st.booleans())
    ddof = 0
    if name in ("std", "var") and draw(st.booleans()):
        ddof = kwargs["ddof"] = draw(st.integers(0, 2))
    terms, ulps = reduction_terms(name, axis, keepdims, ddof)
    forced = extra is not None
    if extra is None:
        extra = draw(st.sampled_from(["", "", "", "dtype", "initial", "where"]))
    masked = False
    if extra == "dtype" and name in ("sum", "mean", "prod", "cumsum"):
        kwargs["dtype"] = draw(st.sampled_from([np.int64, np.float64, np.float32] if forced else
                                               [np.float64, np.float32, np.int64]))
    elif extra == "initial" and name in ("sum", "max", "min", "prod"):
        kwargs["initial"] = initial = draw(st.sampled_from([-5.0, 0.0, 5.0, -math.inf, math.inf]))
        if terms is not None and name == "sum":
            base_terms = terms
            terms = lambda x, r: base_terms(x, r) + abs(initial) * (_reduced(x.shape, axis) + 4)  # noqa: E731
    elif extra == "where" and name in ("sum", "mean", "max", "min", "prod", "any", "all", "std", "var"):
        masked = True
        if name in ("max", "min") and draw(st.booleans()):
            kwargs["initial"] = draw(st.sampled_from([-5.0, 5.0]))
        if name in ("mean", "std", "var"):  # fewer values than the axis: a bound from the largest |x|
            terms = lambda x, r: (np.max(A(x), initial=0.0) ** (2 if name == "var" else 1)  # noqa: E731
                                  * 4 * (x.size + 4) ** 2)
    gpu = None
    if name in REDUCTION_KERNELS and axis != () and not extra.strip():
        gpu = gpu_flag(True, [x])
        if gpu == "yes" and _reduced_or_zero(shape, axis) <= 1:
            gpu = "tiny"
    code = template.format(_kwargs_code(kwargs) + (", where=np.arange(x0.size).reshape(x0.shape) % 2 == 0"
                                                   if masked else ""))

    def reduce(x0: Any) -> Any:
        if masked:
            return reducer(x0, **kwargs, where=(np.arange(np.size(x0)) % 2 == 0).reshape(np.shape(x0)))
        return reducer(x0, **kwargs)

    return Case(code, reduce, [x], terms, ulps, gpu)


def _reduced_or_zero(shape: tuple[int, ...], axis: Any) -> int:
    try:
        return _reduced(shape, axis)
    except (IndexError, ZeroDivisionError):
        return 0


def test_reductions(backend: Backend) -> None:
    """sum/mean/max/min/prod/std/var/argmax/argmin/any/all/cumsum as methods and functions: axis None, int,
    negative, tuple, empty tuple, out of range, duplicated; keepdims; ddof; empty arrays and axes."""
    run_property(backend, reduction_cases(), 80)


REDUCTION_KEYWORDS = [("dtype", name) for name in ("sum", "mean", "prod", "cumsum")] + \
    [("initial", name) for name in ("sum", "max", "min", "prod")] + \
    [("where", name) for name in ("sum", "mean", "max", "min", "std")]


@pytest.mark.parametrize("extra, name", REDUCTION_KEYWORDS, ids=[f"{n}-{e}" for e, n in REDUCTION_KEYWORDS])
def test_reduction_keywords(backend: Backend, extra: str, name: str) -> None:
    """sum/mean/max/min/prod/cumsum/std with dtype= (int64: numpy casts each value first), initial=, where=."""
    run_property(backend, reduction_cases(name, extra=extra), 25)


@pytest.mark.parametrize("name", sorted(REDUCTION_KERNELS))
def test_reduction_kernel(backend: Backend, name: str) -> None:
    """One reduction that has a kernel, on its own: its forms, axes, keepdims, NaN and inf."""
    run_property(backend, reduction_cases(name, longest=300 if backend.name == "tab" else 600), 30)


@st.composite
def exact_sum_cases(draw: Any) -> Case:
    """float32 integers -100..100: every summation order gives the same, exact sum."""
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6))
    x = draw(arrs(F32, shape, style="small"))
    axis = draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)))
    name = draw(st.sampled_from(["sum", "max", "min"]))
    fn = {"sum": lambda x0: x0.sum(axis=axis), "max": lambda x0: x0.max(axis=axis),
          "min": lambda x0: x0.min(axis=axis)}[name]
    return Case(f"x0.{name}(axis={axis!r})  # exact", fn, [x], None, 0, gpu_flag(True, [x]))


def test_reductions_of_float32_integers_are_exact(backend: Backend) -> None:
    """Sums of small integers are exact in float32 whatever the order: a value left out or added twice shows."""
    run_property(backend, exact_sum_cases(), 40)


def _diagonal_case(draw: Any, shape: tuple[int, ...]) -> tuple[str, Callable[..., Any]]:
    offset = draw(st.integers(-2, 2))
    axis1, axis2 = draw(st.sampled_from([(0, 1), (1, 0), (-1, -2), (0, 2)]))
    return (f"x0.diagonal({offset}, {axis1}, {axis2})", lambda x: x.diagonal(offset, axis1, axis2))


@st.composite
def method_cases(draw: Any) -> Case:
    """ndarray methods that are not reductions: in-place sort, round, clip, astype, diagonal, reshape, view,
    copy, transposes, item/tolist, fill, and the Python protocols."""
    name = draw(st.sampled_from(["sort", "round", "clip", "astype", "diagonal", "reshape", "view", "copy",
                                 "flatten", "ravel", "T", "transpose", "swapaxes", "squeeze", "item", "tolist",
                                 "fill", "len", "bool", "float", "repr"]))
    dtype = draw(DTYPE)
    shape = draw(shapes())
    style = "wide"
    target = None
    if name == "astype":
        target = draw(st.sampled_from(DTYPES + [np.dtype(np.float16), np.dtype(np.int8)]))
        if target.kind in "iub":  # float -> int of NaN, inf or out of range is undefined in C: stay inside
            style = "small"
    x = draw(arrs(dtype, shape, style=style))
    if name == "astype" and target is not None and target.kind in "iu" and dtype.kind in "fi":
        x = Arr(np.abs(x.base), x.recipe, x.after, x.plain)
    terms: Terms = None
    ulps: float = 4
    ndim = len(shape)
    if name == "sort":
        axis = draw(st.integers(-ndim - 1, max(ndim, 0)))

        def sort(x0: Any) -> Any:
            result = x0.sort(axis=axis)
            return result, np.asarray(x0).copy(), x0 * 1

        code, fn = f"x0.sort(axis={axis}); (None, np.asarray(x0), x0 * 1)", sort
    elif name == "round":
        decimals = draw(st.integers(-2, 3))
        code, fn = f"x0.round({decimals})", (lambda x0: x0.round(decimals))
        terms = lambda x0, r: A(r)  # noqa: E731
    elif name == "clip":
        lo = draw(st.one_of(st.none(), st.integers(-5, 5), normal_floats(-5, 5)))
        hi = draw(st.one_of(st.none(), st.integers(-5, 5), normal_floats(-5, 5)))
        code, fn = f"x0.clip({lo!r}, {hi!r})", (lambda x0: x0.clip(lo, hi))
    elif name == "astype":
        code, fn = f"x0.astype(np.{target})", (lambda x0: x0.astype(target))
    elif name == "diagonal":
        code, fn = _diagonal_case(draw, shape)
    elif name == "reshape":
        size = math.prod(shape)
        new = draw(st.sampled_from([(-1,), (size,), (1, -1), (-1, 1), (size, 1, 1), (2, -1), (3, 5)]))
        order = draw(st.sampled_from(["C", "F"]))
        code, fn = f"x0.reshape({new!r}, order={order!r})", (lambda x0: x0.reshape(new, order=order))
    elif name == "view":
        target = draw(st.sampled_from([np.int32, np.float32, np.uint8, np.int64, np.float64, np.ndarray]))
        code, fn = f"x0.view(np.{target.__name__})", (lambda x0: x0.view(target))
    elif name == "copy":
        order = draw(st.sampled_from(["C", "F", "K"]))
        code, fn = f"x0.copy(order={order!r})", (lambda x0: x0.copy(order=order))
    elif name == "flatten":
        code, fn = "x0.flatten()", (lambda x0: x0.flatten())
    elif name == "ravel":
        code, fn = "x0.ravel()", (lambda x0: x0.ravel())
    elif name == "T":
        code, fn = "x0.T", (lambda x0: x0.T)
    elif name == "transpose":
        perm = tuple(draw(st.permutations(range(ndim))))
        code, fn = f"x0.transpose({perm!r})", (lambda x0: x0.transpose(perm))
    elif name == "swapaxes":
        a, b = draw(st.integers(-2, 2)), draw(st.integers(-2, 2))
        code, fn = f"x0.swapaxes({a}, {b})", (lambda x0: x0.swapaxes(a, b))
    elif name == "squeeze":
        code, fn = "x0.squeeze()", (lambda x0: x0.squeeze())
    elif name == "item":
        code, fn = "x0.item()", (lambda x0: x0.item())
    elif name == "tolist":
        code, fn = "x0.tolist()", (lambda x0: x0.tolist())
    elif name == "fill":
        value = draw(elements(dtype, "small"))

        def fill(x0: Any) -> Any:
            before = x0 * 1
            result = x0.fill(value)
            return result, before, np.asarray(x0).copy(), x0 * 1

        code, fn = f"x0 * 1; x0.fill({value!r}); (np.asarray(x0), x0 * 1)", fill
    elif name == "len":
        code, fn = "len(x0)", len
    elif name == "bool":
        code, fn = "bool(x0)", bool
    elif name == "float":
        code, fn = "float(x0)", float
    else:
        code, fn = "repr(x0)", repr
    return Case(code, fn, [x], terms, ulps)


def test_methods(backend: Backend) -> None:
    run_property(backend, method_cases(), 100)


@st.composite
def ufunc_method_cases(draw: Any) -> Case:
    """ufunc methods other than __call__ and reduce: outer, accumulate, at (in place, unbuffered), reduceat."""
    method = draw(st.sampled_from(["outer", "accumulate", "at", "reduceat"]))
    if method == "outer":
        ufunc = draw(st.sampled_from([np.add, np.subtract, np.multiply, np.maximum, np.greater, np.power]))
        a = draw(arrs(draw(DTYPE), draw(shapes(max_dims=2)), plain=None))
        b = draw(arrs(draw(DTYPE), draw(shapes(max_dims=2))))
        base_terms, ulps = binary_terms(ufunc)

        def outer_terms(a64: Any, b64: Any, r: Any) -> Any:
            return base_terms(a64.reshape(a64.shape + (1,) * b64.ndim), b64, r)

        return Case(f"np.{ufunc.__name__}.outer(x0, x1)", ufunc.outer, [a, b], outer_terms, ulps)
    shape = draw(shapes(min_dims=1, max_dims=3))
    dtype = draw(DTYPE)
    if method == "accumulate":
        ufunc = draw(st.sampled_from([np.add, np.multiply, np.maximum, np.minimum, np.subtract]))
        x = draw(arrs(dtype, shape, style="moderate"))
        axis = draw(st.integers(-len(shape) - 1, len(shape)))

        def accumulate_terms(x64: Any, r: Any) -> Any:
            n = x64.shape[axis] + 4
            if ufunc in (np.add, np.subtract):
                return np.add.accumulate(A(x64), axis=axis) * n
            return A(r) * n

        return Case(f"np.{ufunc.__name__}.accumulate(x0, axis={axis})",
                    lambda x0: ufunc.accumulate(x0, axis=axis), [x], accumulate_terms, 1)
    if method == "reduceat":
        ufunc = draw(st.sampled_from([np.add, np.maximum, np.minimum, np.multiply]))
        x = draw(arrs(dtype, shape, style="moderate"))
        indices = sorted(draw(st.lists(st.integers(0, max(shape[0] - 1, 0)), min_size=1, max_size=4)))
        if draw(st.integers(0, 5)) == 0:
            indices.append(shape[0] + 1)  # out of range: IndexError
        n = shape[0] + 4

        def reduceat_terms(x64: Any, r: Any) -> Any:
            if ufunc is np.add:
                return np.add.reduceat(A(x64), indices, axis=0) * n
            return A(r) * n

        return Case(f"np.{ufunc.__name__}.reduceat(x0, {indices!r}, axis=0)",
                    lambda x0: ufunc.reduceat(x0, indices, axis=0), [x], reduceat_terms, 1)
    ufunc = draw(st.sampled_from([np.add, np.maximum, np.multiply, np.subtract]))
    x = draw(arrs(dtype, shape, style="small"))
    index = np.array(draw(st.lists(st.integers(-shape[0], max(shape[0] - 1, 0)), min_size=1, max_size=5)))
    value = draw(st.one_of(st.integers(-3, 3), st.sampled_from([0.5, -2.0, True])))

    def at(x0: Any) -> Any:
        before = x0 * 1  # the GPU may hold a copy from here on
        result = ufunc.at(x0, index, value)
        return result, before, np.asarray(x0).copy(), x0 * 1

    slack = abs(float(value)) * index.size

    def at_terms(x64: Any, r: Any) -> Any:
        t = A(r[2]) + A(r[1]) + slack
        return None, A(r[1]), t, t

    return Case(f"x0 * 1; np.{ufunc.__name__}.at(x0, {fmt_index(index)}, {value!r}); (np.asarray(x0), x0 * 1)",
                at, [x], at_terms, 8, base_slack=slack)


def test_ufunc_methods(backend: Backend) -> None:
    """ufunc.outer, ufunc.accumulate, ufunc.at (duplicate indices, in place), ufunc.reduceat."""
    run_property(backend, ufunc_method_cases(), 80)


# -- matmul ----------------------------------------------------------------------------------------------

MATMUL_DTYPES = [F32, F32, F32, F32, F64, np.dtype(np.int32), np.dtype(np.bool_)]


@st.composite
def matmul_cases(draw: Any) -> Case:
    kind = draw(st.sampled_from(["2d@2d", "1d@1d", "2d@1d", "1d@2d", "batched", "mismatch"]))
    m, k, n = (draw(st.one_of(st.integers(0, 6), st.integers(7, 20))) for _ in range(3))
    if kind == "batched":
        m, k, n = min(m, 6), min(k, 6), min(n, 6)
    if kind == "2d@2d":
        sa, sb = (m, k), (k, n)
    elif kind == "1d@1d":
        sa, sb = (k,), (k,)
    elif kind == "2d@1d":
        sa, sb = (m, k), (k,)
    elif kind == "1d@2d":
        sa, sb = (k,), (k, n)
    elif kind == "batched":
        batch = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=2, min_side=1, max_side=3))
        sa, sb = batch.input_shapes[0] + (m, k), batch.input_shapes[1] + (k, n)
    else:
        sa, sb = (m, k), (k + 1, n)
    dtype_a = draw(st.sampled_from(MATMUL_DTYPES))
    dtype_b = draw(st.one_of(st.just(dtype_a), st.sampled_from(MATMUL_DTYPES)))
    specials = draw(st.integers(0, 4)) == 0
    a = draw(arrs(dtype_a, sa, style="moderate", specials=specials, plain=None))
    b = draw(arrs(dtype_b, sb, style="moderate", specials=specials, plain=None))
    forms = [("x0 @ x1", operator.matmul), ("np.matmul(x0, x1)", np.matmul)]
    if len(sa) <= 2 and len(sb) <= 2:
        forms += [("np.dot(x0, x1)", np.dot), ("x0.dot(x1)", lambda x0, x1: x0.dot(x1))]
    code, fn = draw(st.sampled_from(forms))

    def terms(a64: Any, b64: Any, r: Any) -> Any:
        return np.matmul(A(a64), A(b64)) * (a64.shape[-1] + 4)

    try:
        out_size = np.matmul(np.zeros(sa), np.zeros(sb)).size
    except ValueError:
        out_size = 0
    gpu = gpu_flag(True, [a, b], out_size) if not (a.plain and b.plain) and code != "x0.dot(x1)" else None
    return Case(code, fn, [a, b], terms, 1, gpu)


def test_matmul(backend: Backend) -> None:
    """@, np.matmul, np.dot, x.dot over 1-D/2-D/batched broadcast shapes, float32 and mixed dtypes,
    transposed and strided operands, empty dimensions, and mismatched inner dimensions (ValueError)."""
    run_property(backend, matmul_cases(), 80)


# -- indexing and assignment -----------------------------------------------------------------------------


def fmt_index(index: Any) -> str:
    if isinstance(index, tuple):
        return ", ".join(fmt_index(i) for i in index) if index else "()"
    if isinstance(index, slice):
        parts = ["" if v is None else str(v) for v in (index.start, index.stop, index.step)]
        return ":".join(parts[:2]) + (f":{parts[2]}" if parts[2] else "")
    if index is Ellipsis:
        return "..."
    if index is None:
        return "np.newaxis"
    if isinstance(index, np.ndarray):
        return f"np.array({index.tolist()!r})"
    return repr(index)


@st.composite
def indices(draw: Any, shape: tuple[int, ...]) -> tuple[str, Any]:
    """(kind, index) for an array of ``shape``; ``index`` may be a function of the array (a mask it makes)."""
    ndim = len(shape)
    kinds = ["basic", "basic", "mask", "device mask", "out of bounds"]
    if ndim >= 1 and all(s > 0 for s in shape):
        kinds += ["integer", "int arrays", "int list"]
    if ndim >= 2 and shape[1] > 0:
        kinds.append("mixed")
    if ndim >= 1:
        kinds.append("bad mask")
    kind = draw(st.sampled_from(kinds))
    if kind == "basic":
        return kind, draw(hnp.basic_indices(shape, min_dims=0, allow_newaxis=True, allow_ellipsis=True))
    if kind == "integer":
        return kind, draw(st.integers(-shape[0], shape[0] - 1))
    if kind == "int arrays":
        return kind, draw(hnp.integer_array_indices(shape, result_shape=hnp.array_shapes(min_dims=0, max_dims=2,
                                                                                         max_side=3)))
    if kind == "int list":
        return kind, draw(st.lists(st.integers(-shape[0], shape[0] - 1), max_size=4))
    if kind == "mixed":
        columns = np.array(draw(st.lists(st.integers(-shape[1], shape[1] - 1), min_size=1, max_size=3)))
        return kind, (draw(st.slices(shape[0])), columns)
    if kind == "mask":
        lead = draw(st.integers(0, ndim))
        return kind, draw(hnp.arrays(np.bool_, shape[:lead]))
    if kind == "device mask":
        return kind, None
    if kind == "bad mask":
        return kind, np.ones((shape[0] + 1,) + shape[1:], dtype=bool)
    if ndim == 0:
        return kind, 0
    over = draw(st.integers(0, 2))
    return kind, draw(st.sampled_from([shape[0] + over, -shape[0] - 1 - over]))


def _index_of(kind: str, index: Any, x: Any) -> Any:
    return (x > 0) if kind == "device mask" else index


def _index_code(kind: str, index: Any) -> str:
    return "x0 > 0" if kind == "device mask" else fmt_index(index)


@st.composite
def getitem_cases(draw: Any) -> Case:
    x = draw(arrs(draw(DTYPE), draw(shapes())))
    kind, index = draw(indices(x.shape))
    return Case(f"x0[{_index_code(kind, index)}]", lambda x0: x0[_index_of(kind, index, x0)], [x])


def test_indexing(backend: Backend) -> None:
    """Basic slices, np.newaxis, Ellipsis, integers (numpy scalars out of 1-D), integer arrays and lists,
    boolean masks (also one the DeviceArray makes, x[x > 0]), mixed slices and arrays, out of bounds
    (IndexError), masks of the wrong shape."""
    run_property(backend, getitem_cases(), 100)


@st.composite
def setitem_cases(draw: Any) -> Case:
    dtype = draw(DTYPE)
    x = draw(arrs(dtype, draw(shapes())))
    kind, index = draw(indices(x.shape))
    probe = np.zeros(x.shape, dtype=x.dtype)
    try:
        target_shape = probe[_index_of(kind, index, probe)].shape
    except (IndexError, ValueError):
        target_shape = ()
    value_kind = draw(st.sampled_from(["python", "npscalar", "array", "device array", "any shape"]))
    operands: list[Any] = [x]
    if value_kind == "python":
        value = draw(st.one_of(elements(dtype, "small"), st.sampled_from([1.5, -2.7, math.nan, math.inf, True])))
    elif value_kind == "npscalar":
        value = draw(np_scalars())
    else:
        if value_kind == "any shape":
            shape = draw(shapes(max_dims=3))
        else:
            shape = draw(hnp.broadcastable_shapes(target_shape, min_dims=0, max_dims=max(len(target_shape), 1),
                                                  min_side=0 if 0 in target_shape else 1))
        value_dtype = draw(st.one_of(st.just(dtype), DTYPE))
        operands.append(draw(arrs(value_dtype, shape, style="small", plain=value_kind == "array")))
        value = None
    code_value = "x1" if value is None else show(value)
    index_code = _index_code(kind, index)

    def setitem(x0: Any, x1: Any = None) -> Any:
        before = x0 * 1  # the GPU may hold a copy from here on
        x0[_index_of(kind, index, x0)] = value if x1 is None else x1
        return before, np.asarray(x0).copy(), x0 * 1, x0.sum()

    def terms(*args: Any) -> Any:
        ref = args[-1]
        after = np.asarray(ref[1], dtype=np.float64)
        return A(ref[0]), None, A(ref[2]), np.sum(A(after)) * (after.size + 4)

    code = f"x0 * 1; x0[{index_code}] = {code_value}; (np.asarray(x0), x0 * 1, x0.sum())"
    return Case(code, setitem, operands, terms, 4)


def test_item_and_slice_assignment(backend: Backend) -> None:
    """x[index] = value for every kind of index, Python/numpy scalar and (device or plain) array values of
    other dtypes (NaN into an int array: ValueError), shapes that don't broadcast; the input array sees the
    write, and np.asarray(x) and later operations see it (no stale GPU copy)."""
    run_property(backend, setitem_cases(), 100)


INPLACE: list[tuple[str, Callable[[Any, Any], Any]]] = [
    ("x0 += {}", operator.iadd), ("x0 -= {}", operator.isub), ("x0 *= {}", operator.imul),
    ("x0 /= {}", operator.itruediv), ("x0 **= {}", operator.ipow), ("x0 //= {}", operator.ifloordiv),
    ("x0 %= {}", operator.imod), ("x0 &= {}", operator.iand), ("x0 |= {}", operator.ior),
    ("x0 ^= {}", operator.ixor),
    ("x0 = np.add(x0, {}, out=x0)", lambda x, y: np.add(x, y, out=x)),
    ("x0 = np.multiply(x0, {}, out=x0)", lambda x, y: np.multiply(x, y, out=x)),
    ("x0 = np.maximum(x0, {}, out=x0)", lambda x, y: np.maximum(x, y, out=x)),
    ("x0 = np.subtract(x0, {}, out=x0)", lambda x, y: np.subtract(x, y, out=x)),
    ("x0 = np.exp(x0, out=x0)", lambda x, y: np.exp(x, out=x)),
]
ALIASES: dict[str, Callable[[Any], Any]] = {"x0": lambda x: x, "x0[::-1]": lambda x: x[::-1],
                                            "x0.T": lambda x: x.T, "x0[..., ::-1]": lambda x: x[..., ::-1]}


@st.composite
def inplace_cases(draw: Any) -> Case:
    code, op = draw(st.sampled_from(INPLACE))
    dtype = draw(DTYPE)
    shape = draw(shapes(max_dims=3))
    x = draw(arrs(dtype, shape, style="small"))
    other = draw(st.sampled_from(["python", "array", "plain array", "alias", "any shape"]))
    operands: list[Any] = [x]
    alias = None
    if other == "python":
        y: Any = draw(st.one_of(st.integers(-3, 3), st.sampled_from([0.5, 2.0, -1.5, True])))
        code, slack = code.format(show(y)), abs(float(y))
    elif other == "alias":
        name = draw(st.sampled_from(sorted(ALIASES)))
        alias, y = ALIASES[name], None
        code, slack = code.format(name), float(np.max(np.abs(x.base.astype(np.float64)), initial=0))
    else:
        if other == "any shape":
            y_shape = draw(shapes(max_dims=3))
        else:
            y_shape = draw(hnp.broadcastable_shapes(shape, min_dims=0, max_dims=len(shape),
                                                    min_side=0 if 0 in shape else 1))
        y_dtype = dtype if draw(st.integers(0, 3)) else draw(DTYPE)
        y_arr = draw(arrs(y_dtype, y_shape, style="small",
                          plain=other == "plain array"))
        operands.append(y_arr)
        y = None
        code, slack = code.format("x1"), float(np.max(np.abs(y_arr.base.astype(np.float64)), initial=0))

    def inplace(x0: Any, x1: Any = None) -> Any:
        original = x0
        before = x0 * 1  # the GPU may hold a copy from here on
        operand = alias(x0) if alias is not None else (y if x1 is None else x1)
        x0 = op(x0, operand)
        return x0 is original, before, np.asarray(original).copy(), original * 1

    def terms(*args: Any) -> Any:
        ref = args[-1]
        t = A(ref[2]) + A(ref[1]) + slack
        return None, A(ref[1]), t, t

    return Case(f"x0 * 1; {code}; (x0 is the same object, np.asarray(x0), x0 * 1)", inplace, operands, terms, 8,
                base_slack=slack)


def test_inplace_operators(backend: Backend) -> None:
    """x0 op= y and ufunc(..., out=x0): the same object back, its memory (and the input's) changed as numpy
    changes it, also where y is a view of x0 itself (overlap), and casting errors (int /= 2: TypeError)."""
    run_property(backend, inplace_cases(), 100)


def test_writes_through_other_views_are_seen(backend: Backend) -> None:
    """A write through np.asarray(x), x.view(np.ndarray) or a slice of x, after x was used on the GPU:
    the next operations on x see it (no stale GPU copy)."""
    for how in ("np.asarray", "view", "slice", "another input on the same memory"):
        a = np.arange(12, dtype=np.float32).reshape(3, 4)
        cell = backend.to_device({"x": a, "rows": a[1:]})
        x = cell["x"]
        assert float(x.sum()) == 66.0 and float(x.max()) == 11.0 and float(np.asarray(x + 1)[-1, -1]) == 12.0
        assert float(cell["rows"].sum()) == 60.0
        target = {"np.asarray": np.asarray(x), "view": x.view(np.ndarray), "slice": x[1:],
                  "another input on the same memory": cell["rows"]}[how]
        target[...] = 1.0
        total, top = (0 + 1 + 2 + 3 + 8.0, 3.0) if how in ("slice", "another input on the same memory") else (12.0, 1.0)
        assert float(x.sum()) == total, f"after a write through {how}: x.sum() is {float(x.sum())}, not {total}"
        assert float(x.max()) == top, f"after a write through {how}: x.max() is {float(x.max())}, not {top}"
        assert float(np.asarray(x + 1)[-1, -1]) == 2.0, f"after a write through {how}: x + 1 is stale"
        assert a[-1, -1] == 1.0, f"a write through {how} did not reach the input array"


# -- numpy functions -------------------------------------------------------------------------------------


@st.composite
def function_cases(draw: Any) -> Case:
    name = draw(st.sampled_from(["concatenate", "stack", "where", "where1", "einsum", "unique", "bincount",
                                 "sort", "argsort", "cumsum", "tile", "repeat", "clip", "percentile", "median"]))
    dtype = draw(DTYPE)
    if name in ("concatenate", "stack"):
        ndim = draw(st.integers(1, 3))
        count = draw(st.integers(1, 3))
        base = draw(hnp.array_shapes(min_dims=ndim, max_dims=ndim, min_side=0, max_side=3))
        axis = draw(st.one_of(st.integers(-ndim - 1, ndim), st.none()) if name == "concatenate"
                    else st.integers(-ndim - 2, ndim + 1))
        operands = []
        for _ in range(count):
            shape = list(base)
            if name == "concatenate" and axis is not None and -ndim <= axis < ndim:
                shape[axis] = draw(st.integers(0, 3))
            if draw(st.integers(0, 9)) == 0:  # a mismatch: ValueError
                shape[0] += 1
            operands.append(draw(arrs(draw(st.one_of(st.just(dtype), DTYPE)), tuple(shape), plain=None)))
        names = ", ".join(f"x{i}" for i in range(count))
        fn = (lambda *xs: np.concatenate(xs, axis=axis)) if name == "concatenate" else \
             (lambda *xs: np.stack(xs, axis=axis))
        return Case(f"np.{name}([{names}], axis={axis!r})", fn, operands)
    if name == "where":
        s0, s1 = draw(shape_pairs())
        cond = draw(arrs(dtype, s0))
        a = draw(arrs(dtype, s1, plain=None))
        b = draw(st.one_of(PY_SCALARS, arrs(draw(DTYPE), draw(st.sampled_from([s0, s1, ()])))))
        return Case("np.where(x0 > 0, x1, x2)", lambda c, x, y: np.where(c > 0, x, y), [cond, a, b])
    if name == "where1":
        x = draw(arrs(dtype, draw(shapes())))
        return Case("np.where(x0)", np.where, [x])
    if name == "einsum":
        i, j, k, b = (draw(st.integers(0, 4)) for _ in range(4))
        spec, shapes_ = draw(st.sampled_from([
            ("ij,jk->ik", [(i, j), (j, k)]), ("ii->i", [(i, i)]), ("ij->", [(i, j)]), ("i,i->", [(i,), (i,)]),
            ("bij,bjk->bik", [(b, i, j), (b, j, k)]), ("ij->ji", [(i, j)]), ("i,j->ij", [(i,), (j,)]),
            ("ij,ij->i", [(i, j), (i, j)])]))
        operands = [draw(arrs(draw(st.sampled_from([F32, F32, F64, np.dtype(np.int32)])), s, style="moderate",
                              specials=False)) for s in shapes_]
        names = ", ".join(f"x{n}" for n in range(len(operands)))

        def einsum_terms(*args: Any) -> Any:
            arrays = args[:-1]
            return np.einsum(spec, *(A(a) for a in arrays)) * (sum(a.size for a in arrays) + 4)

        return Case(f"np.einsum({spec!r}, {names})", lambda *xs: np.einsum(spec, *xs), operands, einsum_terms, 1)
    if name == "unique":
        x = draw(arrs(dtype, draw(shapes(max_dims=2)), style="small" if draw(st.booleans()) else "wide"))
        flags = {f: draw(st.booleans()) for f in ("return_index", "return_inverse", "return_counts")}
        return Case(f"np.unique(x0, {_kwargs_code(flags)})", lambda x0: np.unique(x0, **flags), [x])
    if name == "bincount":
        n = draw(st.integers(0, 8))
        int_dtype = draw(st.sampled_from([np.dtype(np.int64), np.dtype(np.int32), np.dtype(np.uint8), F32]))
        values = st.integers(0, 20) if draw(st.integers(0, 5)) else st.integers(-2, 20)
        x = Arr(np.array(draw(st.lists(values, min_size=n, max_size=n))).astype(int_dtype), "", draw(st.booleans()))
        minlength = draw(st.integers(0, 5))
        if draw(st.booleans()):
            w = draw(arrs(draw(st.sampled_from([F32, F64])), (n if draw(st.integers(0, 7)) else n + 1,),
                          style="moderate", specials=False))

            def bincount_terms(x64: Any, w64: Any, r: Any) -> Any:
                return np.bincount(x64.astype(np.int64), A(w64), minlength=minlength) * (x64.size + 4)

            return Case(f"np.bincount(x0, x1, minlength={minlength})",
                        lambda x0, x1: np.bincount(x0, x1, minlength=minlength), [x, w], bincount_terms, 1)
        return Case(f"np.bincount(x0, minlength={minlength})", lambda x0: np.bincount(x0, minlength=minlength), [x])
    shape = draw(shapes(max_dims=3))
    ndim = len(shape)
    x = draw(arrs(dtype, shape, style="moderate"))
    if name in ("sort", "argsort", "cumsum"):
        axis = draw(st.one_of(st.none(), st.integers(-ndim - 1, ndim)))
        if name == "sort":
            return Case(f"np.sort(x0, axis={axis!r})", lambda x0: np.sort(x0, axis=axis), [x])
        if name == "argsort":
            return Case(f"np.argsort(x0, axis={axis!r}, kind='stable')",
                        lambda x0: np.argsort(x0, axis=axis, kind="stable"), [x])

        def cumsum_terms(x64: Any, r: Any) -> Any:
            n = x64.size if axis is None else (x64.shape[axis % x64.ndim] if x64.ndim else 1)
            return np.cumsum(A(x64), axis=axis) * (n + 4)

        return Case(f"np.cumsum(x0, axis={axis!r})", lambda x0: np.cumsum(x0, axis=axis), [x], cumsum_terms, 1)
    if name == "tile":
        reps = draw(st.one_of(st.integers(0, 3), st.lists(st.integers(0, 3), min_size=1, max_size=3).map(tuple)))
        return Case(f"np.tile(x0, {reps!r})", lambda x0: np.tile(x0, reps), [x])
    if name == "repeat":
        axis = draw(st.one_of(st.none(), st.integers(-ndim - 1, ndim)))
        length = x.size if axis is None else (shape[axis % ndim] if ndim and -ndim <= axis < ndim else 1)
        repeats = draw(st.one_of(st.integers(0, 3), st.lists(st.integers(0, 3), min_size=length,
                                                              max_size=length).map(np.array)))
        return Case(f"np.repeat(x0, {fmt_index(repeats)}, axis={axis!r})",
                    lambda x0: np.repeat(x0, repeats, axis=axis), [x])
    if name == "clip":
        lo = draw(st.one_of(st.none(), st.integers(-5, 5), normal_floats(-5, 5), arrs(dtype, shape[1:], plain=None)))
        hi = draw(st.one_of(st.none(), st.integers(-5, 5), normal_floats(-5, 5)))
        if isinstance(lo, Arr):
            return Case(f"np.clip(x0, x1, {hi!r})", lambda x0, x1: np.clip(x0, x1, hi), [x, lo])
        return Case(f"np.clip(x0, {lo!r}, {hi!r})", lambda x0: np.clip(x0, lo, hi), [x])
    axis = draw(st.one_of(st.none(), st.integers(-ndim - 1, max(ndim, 0))))

    def spread_terms(*args: Any) -> Any:
        finite = A(args[0])[np.isfinite(args[0])]
        return np.max(finite, initial=0.0)

    if name == "percentile":
        q = draw(st.one_of(normal_floats(0, 100), st.lists(normal_floats(0, 100), min_size=1, max_size=3)))
        return Case(f"np.percentile(x0, {q!r}, axis={axis!r})", lambda x0: np.percentile(x0, q, axis=axis), [x],
                    spread_terms, 8)
    return Case(f"np.median(x0, axis={axis!r})", lambda x0: np.median(x0, axis=axis), [x], spread_terms, 8)


def test_numpy_functions(backend: Backend) -> None:
    """concatenate, stack, where (3-argument and 1-argument), einsum, unique (with its flags), bincount
    (weights, negative values, floats), sort, argsort, cumsum, tile, repeat, clip, percentile, median."""
    run_property(backend, function_cases(), 120)


# -- to_device itself ------------------------------------------------------------------------------------


@st.composite
def converted(draw: Any) -> Arr:
    return draw(arrs(draw(DTYPE), draw(shapes())))  # type: ignore[no-any-return]


def test_to_device_gives_ndarray_views(backend: Backend) -> None:
    """Each numeric array becomes a DeviceArray: an ndarray on the same memory (writes reach the input),
    whatever its dtype, shape or strides, with numpy's repr; other values pass untouched."""

    @settings(max_examples=backend.examples(60), deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck), print_blob=True)
    @given(x=converted())
    def prop(x: Arr) -> None:
        ref_args, dev_args, _, dev_bases = prepare(backend, [x])
        dev, ref = dev_args[0], ref_args[0]
        if backend.on_gpu:
            assert isinstance(dev, DeviceArray), f"to_device left a {type(dev).__name__} of {dev.dtype}"
        assert isinstance(dev, np.ndarray)
        assert dev.dtype == ref.dtype and dev.shape == ref.shape
        if ref.size:
            assert np.shares_memory(dev, dev_bases[0]), "the DeviceArray does not view the input's memory"
        assert repr(dev) == repr(ref)
        assert np.array_equal(np.asarray(dev), ref, equal_nan=ref.dtype.kind == "f")
        if ref.size:
            first = (0,) * ref.ndim
            new = ref.dtype.type(1) if ref.dtype.kind == "b" else ref.dtype.type(7)
            dev[first] = new
            view = x.view(dev_bases[0])
            assert view[first] == new, "a write through the DeviceArray did not reach the input array"

    prop()
    text = np.array(["a", "b"])
    objects = np.array([1, "x"], dtype=object)
    out = backend.to_device({"s": "text", "t": text, "o": objects, "n": 3})
    assert out["s"] == "text" and out["n"] == 3
    assert out["t"] is text and out["o"] is objects, "non-numeric arrays pass untouched"


def test_dot_method_runs_on_the_gpu(backend: Backend) -> None:
    """x.dot(y), the method, is a matmul of DeviceArrays as np.dot(x, y) is: a kernel, numpy's answer."""
    a, b = np.arange(24, dtype=np.float32).reshape(6, 4) / 8, np.arange(12, dtype=np.float32).reshape(4, 3) / 4
    terms = lambda x, y, r: np.matmul(A(x), A(y)) * 8  # noqa: E731
    check(backend, Case("x0.dot(x1)", lambda x0, x1: x0.dot(x1), [Arr(a), Arr(b)], terms, 1, "yes"))
    check(backend, Case("x0.dot(x1)", lambda x0, x1: x0.dot(x1), [Arr(a), Arr(b, plain=True)], terms, 1, "yes"))


ONE_ELEMENT_CASES: list[tuple[str, Callable[..., Any], int]] = [
    *[(f"np.{u.__name__}(x0)", u, 1) for u in (np.negative, np.absolute, np.exp, np.log, np.sqrt, np.tanh)],
    *[(f"np.{u.__name__}(x0, x1)", u, 2) for u in (np.add, np.subtract, np.multiply, np.divide, np.power,
                                                  np.maximum, np.minimum, np.greater, np.greater_equal, np.less,
                                                  np.less_equal, np.equal, np.not_equal)],
    ("x0 + 1.0", lambda x0: x0 + 1.0, 1), ("x0.sum()", lambda x0: x0.sum(), 1),
    ("x0.mean()", lambda x0: x0.mean(), 1), ("x0.max()", lambda x0: x0.max(), 1),
    ("x0.min()", lambda x0: x0.min(), 1), ("x0 @ x1", lambda x0, x1: x0 @ x1, 2),
]


@pytest.mark.parametrize("shape", [(), (1,), (1, 1)], ids=["0-d", "(1,)", "(1, 1)"])
def test_one_element_on_the_gpu(backend: Backend, shape: tuple[int, ...]) -> None:
    """The contract's kernel operations on float32 operands of one element report a kernel (0-d operands
    are numpy's: a scalar's operation isn't worth a kernel), and give numpy's answer (its scalar type for
    a 0-d result)."""
    failures = []
    for code, fn, count in ONE_ELEMENT_CASES:
        if code == "x0 @ x1" and shape == ():
            continue
        operands = [Arr(np.full(shape, 2.5 - i, dtype=np.float32)) for i in range(count)]
        try:
            check(backend, Case(code, fn, operands, lambda *args: A(args[-1]) + 1, 8, "yes" if shape else None))
        except AssertionError as exc:
            failures.append(f"{code}: {str(exc).splitlines()[0]}")
    assert not failures, "\n".join(failures)


def test_subnormal_float32_values(backend: Backend) -> None:
    """float32 subnormals (below 1.2e-38) in and out: numpy's values, except that a GPU that flushes them
    to zero (SwiftShader does; lavapipe doesn't) may give a zero of either sign where numpy gives one:
    docs/gpu.md says so. Kept apart from the properties, whose values are normal floats."""
    sub = np.array([0.0, 3e-39, -4.2e-44, 1.0], dtype=np.float32)
    for code, fn in [("x0.min()", lambda x0: x0.min()), ("x0.max()", lambda x0: x0.max()),
                     ("x0 + 0", lambda x0: x0 + 0), ("x0 * 1", lambda x0: x0 * 1), ("-x0", lambda x0: -x0),
                     ("x0 * 1e-10", lambda x0: x0 * np.float32(1e-10))]:
        want = fn(sub)
        got = fn(backend.to_device({"x0": sub.copy()})["x0"])
        assert type(got) in (type(want), DeviceArray) and got.dtype == want.dtype and np.shape(got) == np.shape(want)
        got64, want64 = np.asarray(got, np.float64), np.asarray(want, np.float64)
        flushed = (np.abs(want64) < F32_TINY) & (got64 == 0)
        assert np.all((got64 == want64) | flushed), f"{code}: {got!r}, numpy {want!r}"


def test_float64_beyond_float32_range(backend: Backend) -> None:
    """float64 values and results outside float32's range: numpy's float64 answer (within float32
    precision), not float32's overflow to inf or underflow to 0."""
    cases = [
        ("np.exp(x0)", np.exp, [np.array([100.0, 500.0, -100.0])]),
        ("x0 * x0", lambda x0: x0 * x0, [np.array([1e30, 1e-30, 3.0])]),
        ("x0 * 1e300", lambda x0: x0 * 1e300, [np.array([1e-300, 2.0])]),
        ("x0 + 1", lambda x0: x0 + 1, [np.array([1e300, -1e300, 1e-300])]),
        ("x0.sum()", lambda x0: x0.sum(), [np.array([1e300, 1e300, -1e300])]),
        ("x0.max()", lambda x0: x0.max(), [np.array([1e300, 1e-300, 5.0])]),
        ("np.log(x0)", np.log, [np.array([1e-300, 1e300])]),
        ("x0 @ x0", lambda x0: x0 @ x0, [np.array([[1e200, 0.0], [0.0, 1e-200]])]),
    ]
    failures = []
    for code, fn, arrays in cases:
        with np.errstate(all="ignore"):
            ref = fn(*arrays)
        _, dev_args, _, _ = prepare(backend, [Arr(a) for a in arrays])
        try:
            with np.errstate(all="ignore"):
                got = fn(*dev_args)
        except Exception as exc:  # noqa: BLE001
            failures.append(f"{code}: raised {type(exc).__name__}({exc}); numpy gives {ref!r}")
            continue
        if type(got) is not type(ref) and not (isinstance(ref, np.ndarray) and isinstance(got, np.ndarray)):
            failures.append(f"{code}: a {type(got).__name__}; numpy gives a {type(ref).__name__}")
        elif np.asarray(got).dtype != np.asarray(ref).dtype:
            failures.append(f"{code}: dtype {np.asarray(got).dtype}; numpy's is {np.asarray(ref).dtype}")
        elif not np.allclose(np.asarray(got), ref, rtol=1e-6, atol=0, equal_nan=True):
            failures.append(f"{code}: {np.asarray(got)!r}; numpy gives {ref!r}")
    assert not failures, "\n".join(failures)


def test_oracle_catches_a_wrong_answer() -> None:
    """The comparison itself: it rejects what a broken device side would give."""
    x = np.array([1.0, np.nan, 3.0], np.float32)

    def bad(got: Any, want: Any, spec: Any = None, ulps: float = 4, ran: bool = True) -> None:
        with pytest.raises(AssertionError):
            compare(snapshot(got), snapshot(want), spec, ulps, ran)

    bad(x.astype(np.float64), x)                               # dtype
    bad(x[:2], x)                                              # shape
    bad(np.array([1.0, 2.0, 3.0], np.float32), x)              # NaN lost
    bad(np.array([1.0, np.nan, 3.01], np.float32), x, A(x))    # value
    bad(np.array(2.0, np.float32), np.float32(2.0))            # 0-d array for a scalar
    bad(np.float64(2.0), np.float32(2.0))                      # scalar type
    bad(np.array([np.inf]), np.array([-np.inf]), A([1.0]))     # infinity sign
    bad(np.array([1.0 + 1e-9]), np.array([1.0]), None, 4, False)  # float64 without a kernel: exact
    compare(snapshot(np.array([1.0, np.nan, 3.0000002], np.float32)), snapshot(x), A(x), 4, True)
    compare(snapshot(np.array([1.0 + 1e-9])), snapshot(np.array([1.0])), A(1.0), 4, True)
    assert public_type(np.exceptions.AxisError("x")) is np.exceptions.AxisError
    try:
        np.add(np.array(["a"]), np.array([1]))
    except TypeError as exc:
        assert public_type(exc) is TypeError
