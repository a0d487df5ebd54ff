"""Host values to float32 for the GPU: the float64 and integer rules.

WebGPU has no float64. float64 values are computed in float32 (a notice says so, and results
are float32). Integers become float32 only when every value is exact in float32
(|x| <= 2**24); otherwise they are refused, since a silently rounded index or count is a wrong
answer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from remote_magic.errors import GpuError

EXACT_INTEGER = 2 ** 24
"""Largest magnitude up to which every integer is exact in float32 (16,777,216)."""

FLOAT64_NOTICE = "float64 values are computed in float32 on the GPU (WebGPU has no float64); results are float32"


def convertible(value: Any) -> bool:
    """True for numpy arrays and scalars whose dtype the GPU path accepts (float, int, bool)."""
    return isinstance(value, (np.ndarray, np.generic)) and value.dtype.kind in "fiub"


def is_lossy_float(dtype: np.dtype) -> bool:
    """True for floating dtypes wider than float32 (computed in float32 with a notice)."""
    return dtype.kind == "f" and dtype.itemsize > 4


def to_float32(value: np.ndarray | np.generic, what: str) -> np.ndarray:
    """``value`` as a float32 array (no copy when it already is one); bool stays 0/1.

    Raises :class:`GpuError` for integers that float32 cannot hold exactly, and ``TypeError``
    for dtypes with no float32 meaning (complex, strings, objects). ``what`` names the value in
    messages. The float64 notice is the caller's (it knows how to word it once).
    """
    array = np.asarray(value)
    kind = array.dtype.kind
    if kind == "f" and array.dtype.itemsize == 4:
        return array
    if kind in "fb":
        return array.astype(np.float32)
    if kind in "iu":
        if array.size and _largest_magnitude(array) > EXACT_INTEGER:
            raise GpuError(
                f"{what} is an {array.dtype} array with values beyond ±2**24 (16,777,216), which float32 "
                "cannot hold exactly, so the GPU refuses it. Convert it yourself if rounding is acceptable "
                f"(e.g. {what}.astype(np.float32)), or leave it off the GPU (list only the kernels you need, "
                "e.g. %%offload matmul, or compute it outside the GPU cell)")
        return array.astype(np.float32)
    raise TypeError(f"{what} has dtype {array.dtype}, which the GPU cannot compute with; "
                    "GPU arrays are float32 (from float, integer or bool data)")


def _largest_magnitude(array: np.ndarray) -> int:
    high = int(array.max())
    low = int(array.min())
    return max(abs(high), abs(low))
