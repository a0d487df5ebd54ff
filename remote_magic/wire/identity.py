"""Object identity across the wire: names bound to one object stay bound to one object, and a numpy
array that views another one's memory stays a view of it.

Each name's value is pickled on its own, so without this two names sharing one list would arrive as
two lists, and ``v = x[:2]`` as a copy that no longer writes through to ``x``. The sender replaces
such values by references (``Refs``, a JSON-able dict in the message header); the receiver rebuilds
them from the values it got, or from the objects it already holds under those names (``known``).

Both directions use it: the notebook for the cell's inputs, the worker for what comes back.
"""

from __future__ import annotations

import sys
import types
from typing import Any, Mapping

Refs = dict[str, dict[str, Any]]
"""name -> {"same": other} or {"view": base, "offset": bytes, "shape", "strides", "dtype", "layout"}."""

_IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), tuple, frozenset, range, types.ModuleType,
              types.FunctionType, types.BuiltinFunctionType, type)
"""Values whose identity a cell can't observe by changing them: sharing them needs no reference."""


def references(values: Mapping[str, Any], known: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], Refs]:
    """``values`` without the names that refer to another's object, and those references.

    ``known`` are objects the receiver holds already under the same names (a cell's inputs, for the
    values coming back): a value that is one of them, or views one, is sent as a reference too.
    """
    known = known or {}
    sent: dict[str, Any] = {}
    refs: Refs = {}
    owners: dict[int, str] = {id(value): name for name, value in known.items() if not isinstance(value, _IMMUTABLE)}
    for name, value in values.items():
        if isinstance(value, _IMMUTABLE):
            sent[name] = value
        elif id(value) in owners:
            refs[name] = {"same": owners[id(value)]}
        else:
            owners[id(value)] = name
            sent[name] = value
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        bases = [(name, value) for name, value in [*known.items(), *sent.items()]
                 if isinstance(value, numpy.ndarray) and value.flags.c_contiguous and value.nbytes]
        for name, value in list(sent.items()):
            if isinstance(value, numpy.ndarray):
                view = _view_of(name, value, [(n, b) for n, b in bases if n not in refs])
                if view is not None:
                    refs[name] = view
                    del sent[name]
    return sent, refs


def resolve(values: dict[str, Any], refs: Mapping[str, Any], known: Mapping[str, Any] | None = None
            ) -> tuple[dict[str, Any], list[str]]:
    """``values`` with the referenced names filled in, and, in words, any view that could only be
    rebuilt as a copy (its base here is laid out differently than where it was made)."""
    known = known or {}
    resolved = dict(values)
    copies: list[str] = []

    def lookup(name: str) -> Any:
        return resolved[name] if name in resolved else known[name]

    for name, ref in refs.items():
        if not isinstance(ref, dict):
            continue
        if "same" in ref:
            resolved[name] = lookup(str(ref["same"]))
        elif "view" in ref:
            resolved[name], exact = _rebuild_view(lookup(str(ref["view"])), ref)
            if not exact:
                copies.append(f"`{name}` (a view of `{ref['view']}`)")
    return resolved, copies


def _view_of(name: str, array: Any, bases: list[tuple[str, Any]]) -> dict[str, Any] | None:
    """A reference for ``array`` if its elements lie in the memory of one of ``bases`` (C-contiguous
    arrays: pickling lays any other array out anew, so only those arrive as they were), else None.
    Compared by address, since numpy's ``.base`` may skip past the array that holds the memory."""
    low, high = _bounds(array)
    for base_name, base in bases:
        if base_name == name or base is array:
            continue
        start = base.__array_interface__["data"][0]
        if start <= low and high <= start + base.nbytes:
            return {"view": base_name, "offset": array.__array_interface__["data"][0] - start,
                    "shape": list(array.shape), "strides": list(array.strides), "dtype": array.dtype.str,
                    "layout": [list(base.shape), list(base.strides), base.dtype.str]}
    return None


def _bounds(array: Any) -> tuple[int, int]:
    """The addresses of the array's lowest byte and one past its highest (strides may be negative)."""
    start = array.__array_interface__["data"][0]
    if array.size == 0:
        return start, start
    low = sum((n - 1) * s for n, s in zip(array.shape, array.strides) if s < 0)
    high = sum((n - 1) * s for n, s in zip(array.shape, array.strides) if s > 0) + array.itemsize
    return start + low, start + high


def _rebuild_view(base: Any, ref: Mapping[str, Any]) -> tuple[Any, bool]:
    """The view ``ref`` describes, into ``base``; or, when ``base`` here is laid out differently, the
    same elements in a C-contiguous copy of it (then False)."""
    import numpy

    shape, strides, dtype = tuple(ref["shape"]), tuple(ref["strides"]), numpy.dtype(ref["dtype"])
    exact = [list(base.shape), list(base.strides), base.dtype.str] == list(ref["layout"]) and base.flags.c_contiguous
    memory = base if exact else numpy.ascontiguousarray(base)
    view = numpy.ndarray(shape, dtype, buffer=memory, offset=int(ref["offset"]), strides=strides)
    if not memory.flags.writeable:
        view.flags.writeable = False
    return view, exact


def update_in_place(old: Any, new: Any) -> bool:
    """Make ``old`` hold what ``new`` holds, keeping its identity, where its type allows; False if not
    (then the receiver binds ``new`` instead)."""
    if type(old) is not type(new) or old is new:
        return old is new
    if isinstance(old, (list, bytearray)):
        old[:] = new
    elif isinstance(old, (dict, set)):
        old.clear()
        old.update(new)
    elif (numpy := sys.modules.get("numpy")) is not None and isinstance(old, numpy.ndarray):
        if old.shape != new.shape or old.dtype != new.dtype or not old.flags.writeable:
            return False
        numpy.copyto(old, new)
    elif numpy is not None and isinstance(old, numpy.random.Generator):
        old.bit_generator.state = new.bit_generator.state
    elif numpy is not None and isinstance(old, numpy.random.RandomState):
        old.set_state(new.get_state())
    elif type(old).__module__ == "__main__" and hasattr(old, "__dict__") and not hasattr(type(old), "__slots__"):
        old.__dict__.clear()  # an instance of a notebook class: its attributes are its state
        old.__dict__.update(new.__dict__)
    else:
        return False
    return True
