"""Indexing by an integer array as a kernel, with numpy's answer: ``x[rows]`` and ``np.take(x, rows, axis=0)``.

The first axis of a float32, int32 or uint32 array, picked by an integer array (or a list of Python ints):
values move as their bits, so the result is numpy's exactly. Every other case (booleans, 64-bit values, a row
number numpy refuses with its IndexError) is numpy's, silently: indexing computes nothing a notice could warn
about.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .dispatch import Dispatcher
from .gather import MAX_VALUES
from .numpy_kernels import Silently, deliver, plain, worth_a_kernel

KERNEL = "take"
LABEL = "indexing by an integer array"


def picks_rows(key: Any) -> bool:
    """Whether ``key`` indexes an array's first axis with an integer array (what :func:`take_rows` may run)."""
    if isinstance(key, np.ndarray):
        return key.dtype.kind in "iu" and key.ndim > 0
    return type(key) is list and bool(key) and all(type(k) is int for k in key)


def take_rows(dispatcher: Dispatcher, x: Any, key: Any) -> Any:
    """``x[key]`` for a ``key`` that :func:`picks_rows`: the take kernel, or Silently for numpy to answer."""
    x, rows = plain(x), np.asarray(plain(key))
    if x.ndim == 0 or x.dtype.kind not in "fiu" or x.dtype.itemsize != 4 or not x.dtype.isnative:
        raise Silently
    width = math.prod(x.shape[1:])
    worth_a_kernel(dispatcher, rows.size * width)
    if rows.size * width > MAX_VALUES or x.size > MAX_VALUES:
        raise Silently
    count = x.shape[0]
    if rows.size:
        low, high = int(rows.min()), int(rows.max())
        if low < -count or high >= count:
            raise Silently  # numpy's IndexError
        if low < 0:
            rows = np.where(rows < 0, rows + count, rows)
    return deliver(dispatcher, dispatcher.take_rows(x, rows), None, "unsafe", [x])


def take(dispatcher: Dispatcher, a: Any, indices: Any, axis: Any = None, out: Any = None, mode: Any = "raise") -> Any:
    """``np.take(a, indices, axis)`` for axis 0 or None (the flattened array): :func:`take_rows`."""
    if out is not None or mode != "raise" or axis not in (0, None) or not picks_rows(indices):
        raise Silently
    values = plain(a)
    if not isinstance(values, np.ndarray):
        raise Silently
    return take_rows(dispatcher, values.reshape(-1) if axis is None else values, indices)
