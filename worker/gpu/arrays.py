"""DeviceArray: the ndarray a GPU cell's code gets, whose numpy operations may run as kernels.

It is a numpy ndarray (``isinstance(x, np.ndarray)``), with the dtype, values and memory of the
array it views: a cell input is viewed in place, so item and slice assignment, in-place operators
and views behave as in a local run. Its values are always on the host; what differs is where
numpy's operations on it compute. Ufuncs (operators, ``np.exp``, the reductions behind
``x.sum()``) and ``np.dot`` run as GPU kernels where that gives numpy's answer (``numpy_api.py``, ``numpy_kernels.py``);
everything else is numpy's own code on the same values. Results are DeviceArrays too, so later
operations on them may use kernels; a kernel's input whose values are already on the GPU (kept
from an earlier operation or cell, found by digest) is not uploaded again.

It prints and pickles as the plain array it holds, and its type prints as ``numpy.ndarray``: what a
cell shows of it, and what leaves the cell, is numpy's.
"""

from __future__ import annotations

import sys
from types import FunctionType, ModuleType
from typing import Any, Callable

import numpy as np

from .dispatch import Dispatcher
from .numpy_api import array_function, array_ufunc, counted, with_kernel
from .numpy_counting import argpartition, partition, sort
from .numpy_indexing import LABEL as INDEXING, picks_rows, take_rows
from .numpy_kernels import arg_extreme, plain

HOST_METHODS = ("argsort", "cumsum", "cumprod", "prod",
                "any", "all", "round", "clip", "diagonal", "trace", "nonzero", "searchsorted", "std", "var",
                "repeat", "take", "choose", "compress")
"""ndarray methods counted in the cell's stats: numpy computes them (std and var through ufuncs,
which may use kernels)."""


class DeviceArray(np.ndarray):
    """An ndarray whose numpy operations may run as GPU kernels; see the module docstring."""

    _dispatcher: Dispatcher | None = None
    _enabled: frozenset[str] | None = None
    """The built-in kernels its operations may use (None: all)."""

    def __array_finalize__(self, obj: Any) -> None:
        self._dispatcher = getattr(obj, "_dispatcher", None)
        self._enabled = getattr(obj, "_enabled", None)

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        return array_ufunc(self._dispatcher, ufunc, method, inputs, kwargs, caller=sys._getframe(1))

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        return array_function(self._dispatcher, func, args, kwargs,
                              lambda: super(DeviceArray, self).__array_function__(func, types, args, kwargs))

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickle as the plain numpy array it views, so values leave the cell as numpy arrays."""
        return plain(self).__reduce_ex__(protocol)

    def __getitem__(self, key: Any) -> Any:
        """numpy's indexing; by an integer array (``x[rows]``), the take kernel where it gives numpy's answer."""
        if picks_rows(key):
            return with_kernel(self._dispatcher, "take", INDEXING, lambda d: take_rows(d, self, key),
                               lambda: np.ndarray.__getitem__(self, key), self)
        return np.ndarray.__getitem__(self, key)

    def argmax(self, axis: Any = None, out: Any = None, *, keepdims: bool = False) -> Any:
        """numpy's argmax: the arg_reduce kernel where it gives numpy's answer."""
        return with_kernel(self._dispatcher, "argmax", "ndarray.argmax",
                           lambda d: arg_extreme(d, "argmax", self, axis, out, keepdims=keepdims),
                           lambda: np.ndarray.argmax(self, axis, out, keepdims=keepdims), self)

    def argmin(self, axis: Any = None, out: Any = None, *, keepdims: bool = False) -> Any:
        """numpy's argmin: the arg_reduce kernel where it gives numpy's answer."""
        return with_kernel(self._dispatcher, "argmin", "ndarray.argmin",
                           lambda d: arg_extreme(d, "argmin", self, axis, out, keepdims=keepdims),
                           lambda: np.ndarray.argmin(self, axis, out, keepdims=keepdims), self)

    def sort(self, axis: Any = -1, kind: Any = None, order: Any = None, *, stable: Any = None) -> None:
        """numpy's sort, in place: the sort kernel where it gives numpy's answer."""
        def on_gpu(dispatcher: Dispatcher) -> None:
            if axis is None:
                raise TypeError("numpy's: an in-place sort needs an axis")
            np.copyto(plain(self), plain(sort(dispatcher, self, axis, kind, order, stable=stable)))

        with_kernel(self._dispatcher, "sort", "ndarray.sort", on_gpu,
                    lambda: np.ndarray.sort(self, axis, kind, order, **({} if stable is None else {"stable": stable})),
                    self)  # (numpy 1.x has no stable=)

    def partition(self, kth: Any, axis: Any = -1, kind: Any = "introselect", order: Any = None) -> None:
        """numpy's partition, in place: the partition kernel (rows sorted) where it gives numpy's answer."""
        def on_gpu(dispatcher: Dispatcher) -> None:
            if axis is None:
                raise TypeError("numpy's: an in-place partition needs an axis")
            np.copyto(plain(self), plain(partition(dispatcher, self, kth, axis, kind, order)))

        with_kernel(self._dispatcher, "partition", "ndarray.partition", on_gpu,
                    lambda: np.ndarray.partition(self, kth, axis, kind, order), self)

    def argpartition(self, kth: Any, axis: Any = -1, kind: Any = "introselect", order: Any = None) -> Any:
        """numpy's argpartition: the partition kernel's indices where it gives numpy's answer."""
        return with_kernel(self._dispatcher, "partition", "ndarray.argpartition",
                           lambda d: argpartition(d, self, kth, axis, kind, order),
                           lambda: np.ndarray.argpartition(self, kth, axis, kind, order), self)

    def dot(self, b: Any, out: Any = None) -> Any:
        """``np.dot(self, b)``: the matmul kernel for 1-D and 2-D operands, as ``np.dot`` has."""
        return np.dot(self, b, out=out)

    def __repr__(self) -> str:
        return repr(plain(self))

    def __str__(self) -> str:
        return str(plain(self))


def _counted_method(name: str) -> Callable[..., Any]:
    method = getattr(np.ndarray, name)

    def call(self: DeviceArray, *args: Any, **kwargs: Any) -> Any:
        return counted(self._dispatcher, f"ndarray.{name}", lambda: method(self, *args, **kwargs))

    call.__name__ = name
    call.__doc__ = method.__doc__
    return call


for _name in HOST_METHODS:
    setattr(DeviceArray, _name, _counted_method(_name))

# What `type(x)` shows a cell, and what pickling `type(x)` refers to: numpy's ndarray, as in a local run.
DeviceArray.__module__, DeviceArray.__name__, DeviceArray.__qualname__ = "numpy", "ndarray", "ndarray"


def leave_as_numpy(namespace: dict[str, Any], value: Any = None) -> Any:
    """Every DeviceArray bound in ``namespace`` (and reachable from it through lists, dicts and objects'
    attributes) replaced, in place, by the plain ndarray viewing its memory: one per DeviceArray, so names,
    containers and attributes that shared one still share one, and views still view. Returns ``value``
    (the cell's value) the same way. Tuples can't be changed: theirs pickle as plain arrays anyway."""
    plain_views: dict[int, np.ndarray] = {}
    seen: set[int] = set()

    def as_plain(item: Any) -> Any:
        if isinstance(item, DeviceArray):
            return plain_views.setdefault(id(item), plain(item))
        visit(item)
        return item

    def visit(item: Any) -> None:
        if id(item) in seen or isinstance(item, (type, ModuleType, FunctionType, np.ndarray, str, bytes)):
            return
        seen.add(id(item))
        if type(item) is list:
            item[:] = [as_plain(v) for v in item]
        elif type(item) is dict:
            item.update((k, as_plain(v)) for k, v in list(item.items()))
        elif type(item) is tuple:
            for v in item:
                visit(v)
        elif type(getattr(item, "__dict__", None)) is dict:
            visit(item.__dict__)

    for name, item in list(namespace.items()):
        namespace[name] = as_plain(item)
    return as_plain(value)
