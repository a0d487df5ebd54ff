"""Which numpy values the GPU computes with exactly, and their float32 form.

The kernels compute in float32. A value is *exact* in float32 when converting it loses nothing:
float32 and bool always, small integer types always, wider integers when every value is within
±2**24. float64 is *lossy*: a GPU cell computes it in float32 (WebGPU has no float64) and gives
the result numpy's dtype (float64), with a notice naming the arrays. Integer results are exact
when every result is within ±2**24 and inside the result dtype's range; :func:`exact_integers`
checks that after the fact, and the caller computes with numpy when it fails.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from remote_magic.errors import GpuError

EXACT_INTEGER = 2 ** 24
"""Largest magnitude up to which every integer is exact in float32 (16,777,216)."""

FLOAT32 = np.finfo(np.float32)
_ALWAYS_EXACT = frozenset(np.dtype(t) for t in (np.float32, np.bool_, np.int8, np.int16, np.uint8, np.uint16))
_RANGE_CHECKED = frozenset(np.dtype(t) for t in (np.int32, np.int64, np.uint32, np.uint64))


class NotExact(Exception):
    """This value or result can't be computed in float32 as numpy computes it; its message says why."""


def is_lossy_float(dtype: np.dtype[Any]) -> bool:
    """True for floating dtypes wider than float32 (computed in float32 in a GPU cell)."""
    return dtype.kind == "f" and dtype.itemsize > 4


def within_float32(array: np.ndarray) -> bool:
    """True if every value of an integer array is exact in float32 (|x| <= 2**24)."""
    if array.size == 0:
        return True
    return max(abs(int(array.max())), abs(int(array.min()))) <= EXACT_INTEGER


def check_exact(array: np.ndarray) -> None:
    """Raise :class:`NotExact` unless ``array`` converts to float32 without loss (float64 aside)."""
    dtype = array.dtype
    if dtype in _ALWAYS_EXACT or dtype == np.float64:
        return
    if dtype in _RANGE_CHECKED:
        if not within_float32(array):
            raise NotExact(f"with {dtype} values beyond ±2**24")
        return
    raise NotExact(f"with {dtype} values")


def as_float32(array: np.ndarray) -> np.ndarray:
    """The float32 values a kernel computes with for ``array``; raises :class:`NotExact` where float32
    can't hold them (integers beyond ±2**24; float64 beyond float32's range, or nonzero below its
    smallest normal number, where float32 would lose the value rather than digits)."""
    check_exact(array)
    if array.dtype == np.float32:
        return array
    if array.dtype == np.float64 and array.size:
        with np.errstate(invalid="ignore"):
            magnitude = np.abs(array)
            outside = (magnitude > FLOAT32.max) | ((magnitude < FLOAT32.smallest_normal) & (magnitude != 0))
        if outside.any():
            raise NotExact("with float64 values outside float32's range")
    return array.astype(np.float32)


def exact_integers(values: np.ndarray, dtype: np.dtype[Any]) -> bool:
    """True if float32 ``values`` are exact integer results for ``dtype``: integral, within ±2**24
    (strictly: a larger exact result may have been rounded to 2**24) and in ``dtype``'s range."""
    if values.size == 0:
        return True
    info = np.iinfo(dtype)
    high, low = float(values.max()), float(values.min())
    return (np.isfinite(high) and np.isfinite(low) and max(abs(high), abs(low)) < EXACT_INTEGER
            and low >= info.min and high <= info.max)


def from_float32(values: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    """float32 kernel results as numpy's result dtype (bool from 0/1)."""
    result: np.ndarray = values != 0 if dtype == np.bool_ else values.astype(dtype, copy=False)
    return result


def to_float32(value: Any, what: str) -> np.ndarray:
    """``value`` as float32 for a kernel the user called by name (``gpu.NAME``, custom kernels).

    Raises :class:`GpuError` for integers that float32 cannot hold exactly, and ``TypeError`` for
    dtypes with no float32 meaning (complex, strings, objects). ``what`` names the value.
    """
    array = np.asarray(value)
    kind = array.dtype.kind
    if kind == "f" and array.dtype.itemsize == 4:
        return array
    if kind in "fb":
        return array.astype(np.float32)
    if kind in "iu":
        if not within_float32(array):
            raise GpuError(
                f"{what} is an {array.dtype} array with values beyond ±2**24 (16,777,216), which float32 "
                "cannot hold exactly, so this GPU kernel refuses it. Convert it yourself if rounding is "
                f"acceptable (e.g. {what}.astype(np.float32))")
        return array.astype(np.float32)
    raise TypeError(f"{what} has dtype {array.dtype}, which the GPU cannot compute with; "
                    "GPU kernels take float, integer or bool data")
