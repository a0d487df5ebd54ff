"""The numpy version of every built-in kernel, by kernel name.

Used when a kernel is not enabled for a cell, when the runtime computes with numpy (``auto`` on
a software adapter, or no adapter), and as the reference the tests check kernels against.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np


def sigmoid(x: Any) -> np.ndarray:
    """1 / (1 + exp(-x)), without overflow warnings for large |x|."""
    x = np.asarray(x)
    with np.errstate(over="ignore", invalid="ignore"):
        result: np.ndarray = np.where(x >= 0, 1 / (1 + np.exp(-x)), np.exp(x) / (1 + np.exp(x)))
    return result.astype(np.result_type(x, np.float32))


def relu(x: Any) -> np.ndarray:
    """max(x, 0) elementwise, propagating NaN."""
    result: np.ndarray = np.maximum(x, 0)
    return result


def softmax(x: Any, axis: int = -1) -> np.ndarray:
    """exp(x - max) / sum(exp(x - max)) along ``axis``."""
    x = np.asarray(x)
    shifted = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(shifted)
    result: np.ndarray = e / np.sum(e, axis=axis, keepdims=True)
    return result


UNARY: dict[str, Callable[..., Any]] = {
    "negative": np.negative, "abs": np.abs, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "tanh": np.tanh, "sigmoid": sigmoid, "relu": relu,
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "arcsin": np.arcsin, "arccos": np.arccos,
    "arctan": np.arctan, "sinh": np.sinh, "cosh": np.cosh, "arcsinh": np.arcsinh,
    "arccosh": np.arccosh, "arctanh": np.arctanh, "floor": np.floor, "ceil": np.ceil,
    "trunc": np.trunc, "rint": np.rint, "sign": np.sign, "square": np.square,
    "reciprocal": np.reciprocal, "log2": np.log2, "log10": np.log10, "log1p": np.log1p,
    "expm1": np.expm1, "exp2": np.exp2, "fabs": np.fabs, "logical_not": np.logical_not,
    "isnan": np.isnan, "isinf": np.isinf, "isfinite": np.isfinite, "signbit": np.signbit,
    "absolute": np.absolute,
}
BINARY: dict[str, Callable[..., Any]] = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
    "power": np.power, "maximum": np.maximum, "minimum": np.minimum,
    "greater": np.greater, "greater_equal": np.greater_equal, "less": np.less,
    "less_equal": np.less_equal, "equal": np.equal, "not_equal": np.not_equal,
    "arctan2": np.arctan2, "hypot": np.hypot, "fmax": np.fmax, "fmin": np.fmin,
    "copysign": np.copysign, "logaddexp": np.logaddexp, "floor_divide": np.floor_divide,
    "remainder": np.remainder, "fmod": np.fmod,
}
TERNARY: dict[str, Callable[..., Any]] = {"where": np.where, "clip": np.clip}
INTEGER: dict[str, Callable[..., Any]] = {
    "bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor,
    "left_shift": np.left_shift, "right_shift": np.right_shift, "invert": np.invert}
"""Kernels for integers only (the others take integers too, natively where they are 32-bit)."""
REDUCTIONS: dict[str, Callable[..., Any]] = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min,
                                             "any": np.any, "all": np.all, "argmax": np.argmax, "argmin": np.argmin,
                                             "cumsum": np.cumsum, "cumprod": np.cumprod}
def add_at(a: Any, indices: Any, values: Any) -> None:
    """``np.add.at(a, indices, values)``: ``a[indices] += values``, in place, repeated indices adding each time."""
    np.add.at(a, indices, values)


OTHER: dict[str, Callable[..., Any]] = {"matmul": np.matmul, "softmax": softmax, "transpose": np.transpose,
                                        "sort": np.sort, "take": np.take}
COUNTING: dict[str, Callable[..., Any]] = {
    "bincount": np.bincount, "add_at": add_at, "partition": np.partition, "median": np.median,
    "percentile": np.percentile, "quantile": np.quantile, "unique": np.unique}
"""Counting and order statistics (argpartition runs ``partition``, as argsort runs ``sort``)."""

HOST_OPS: dict[str, Callable[..., Any]] = {**UNARY, **BINARY, **TERNARY, **INTEGER, **REDUCTIONS, **OTHER,
                                           **COUNTING}
"""Every built-in kernel name, mapped to its numpy implementation."""

KERNEL_NAMES: tuple[str, ...] = tuple(HOST_OPS)
"""Names of the built-in kernels (what ``kernels=[...]`` may list, and what stats count)."""

GROUPS: dict[str, tuple[str, ...]] = {
    "elementwise": tuple(UNARY) + tuple(BINARY) + tuple(TERNARY) + tuple(INTEGER),
    "reductions": tuple(REDUCTIONS),
    "all": KERNEL_NAMES,
}
"""Group names accepted in a kernel list, standing for several kernels."""
