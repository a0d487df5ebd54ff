"""Object identity across the wire: names bound to one object stay bound to one object, and a numpy
array that views another one's memory stays a view of it.

Each name's value is pickled on its own, so without this two names sharing one list would arrive as
two lists, and ``v = x[:2]`` as a copy that no longer writes through to ``x``. The sender replaces
such values by references (``Refs``, a JSON-able dict in the message header); the receiver rebuilds
them from the values it got, or from the objects it already holds under those names (``known``).

Both directions use it: the notebook for the cell's inputs, the worker for what comes back.

Identity reaches inside values too. The inputs travel with one pickle memo, so an object reached
from several names (``a = d["k"]``) arrives as one object. Both sides then walk the inputs alike
(``shared_objects``) and number every object in them that can be updated in place; what the cell
sends back refers to those by number, and the notebook updates its own object in place with what
the worker's became (``PATCH_PREFIX``), so every name and container that held it here sees the
change, as locally.
"""

from __future__ import annotations

import gc
import hashlib
import itertools
import sys
from typing import Any, Iterator, Mapping, Sequence

from ..errors import ProtocolError
from .in_place import CONTAINER_LIMIT, IMMUTABLE, LIBRARY_CONTAINERS, plain_notebook_instance, plain_state, updatable

Refs = dict[str, dict[str, Any]]
"""name -> {"same": other}, {"input": number} (one of ``shared_objects``), {"view": base, "offset":
bytes, "shape", "strides", "dtype", "layout", "recarray"}, {"dict_view": "keys"/"values"/"items", "of":
a dict's name} or {"list_iterator": a list's name, "position": n}."""

PATCH_PREFIX = "\x00input "
"""A value named ``PATCH_PREFIX + number`` is what that input object became: the receiver's own object
takes it in place."""

WALK_LIMIT = 10_000
"""How many objects ``shared_objects`` looks at before giving up (then identity is kept between names
only): inputs made of many containers would otherwise cost each cell a long walk on both sides."""

_LEAVES = tuple(kind for kind in IMMUTABLE if kind is not tuple)
"""What ``shared_objects`` neither numbers nor looks into (a tuple may hold lists)."""


def references(values: Mapping[str, Any], known: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], Refs]:
    """``values`` without the names that refer to another's object, and those references.

    ``known`` are objects the receiver holds already under the same names (a cell's inputs, for the
    values coming back): a value that is one of them, or views one, is sent as a reference too.
    """
    known = known or {}
    sent: dict[str, Any] = {}
    refs: Refs = {}
    owners: dict[int, str] = {id(value): name for name, value in known.items() if not isinstance(value, IMMUTABLE)}
    for name, value in values.items():
        if isinstance(value, IMMUTABLE):
            sent[name] = value
        elif id(value) in owners:
            refs[name] = {"same": owners[id(value)]}
        else:
            owners[id(value)] = name
            sent[name] = value
    for name, value in list(sent.items()):  # a live view of a dict or list sent too: a view of it there
        follows = _follows(value, owners)
        if follows is not None:
            refs[name] = follows
            del sent[name]
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        # Arrays of plain data only (memory can't carry objects), and no subclass but recarray, a view
        # with another dtype (a MaskedArray has its mask too): the others travel as themselves.
        plain = {name for name, value in [*known.items(), *sent.items()]
                 if type(value) in (numpy.ndarray, numpy.recarray) and not value.dtype.hasobject}
        bases = [(name, value) for name, value in [*known.items(), *sent.items()]
                 if name in plain and value.flags.c_contiguous and value.nbytes]
        arrays = [(name, value) for name, value in [*known.items(), *sent.items()] if isinstance(value, numpy.ndarray)]
        for name, value in list(sent.items()):
            if name in plain:
                view = _view_of(name, value, [(n, b) for n, b in bases if n not in refs])
                if view is not None:
                    refs[name] = view
                    del sent[name]
            elif isinstance(value, numpy.ndarray):  # it goes as itself: the receiver is told it's a copy
                base = next((n for n, other in arrays if other is not value and numpy.may_share_memory(value, other)),
                            None)
                if base is not None:
                    refs[name] = {"copy": base, "kind": type(value).__name__ if type(value) is not numpy.ndarray
                                  else f"{value.dtype} array"}
    return sent, refs


def resolve(values: dict[str, Any], refs: Mapping[str, Any], known: Mapping[str, Any] | None = None,
            shared: Sequence[Any] = ()) -> tuple[dict[str, Any], list[str]]:
    """``values`` with the referenced names filled in, and, in words, each view that is a copy here
    (its base here is laid out differently than where it was made, or it is a kind of array that
    can't be rebuilt as a view). ``shared``: the objects ``shared_objects`` numbered here."""
    known = known or {}
    resolved = dict(values)
    copies: list[str] = []

    def lookup(name: str) -> Any:
        return resolved[name] if name in resolved else known[name]

    # A name may be the same object as a view (`v = x[::-1]; v` as the cell's value): views first.
    for name, ref in sorted(refs.items(), key=lambda item: isinstance(item[1], dict) and "same" in item[1]):
        if not isinstance(ref, dict):
            continue
        if "same" in ref:
            resolved[name] = lookup(str(ref["same"]))
        elif "input" in ref and isinstance(ref["input"], int) and 0 <= ref["input"] < len(shared):
            resolved[name] = shared[ref["input"]]
        elif "dict_view" in ref and ref["dict_view"] in _DICT_VIEWS.values():
            resolved[name] = getattr(lookup(str(ref["of"])), str(ref["dict_view"]))()
        elif "list_iterator" in ref:
            iterator = iter(lookup(str(ref["list_iterator"])))
            iterator.__setstate__(int(ref.get("position") or 0))
            resolved[name] = iterator
        elif "view" in ref:
            resolved[name], exact = _rebuild_view(lookup(str(ref["view"])), ref)
            if not exact:
                copies.append(f"`{name}` is a copy here, not a view of `{ref['view']}` as where it was made: "
                              f"`{ref['view']}` is laid out differently here (not C-contiguous)")
        elif "copy" in ref:
            copies.append(f"`{name}` is a copy here, not a view of `{ref['copy']}` as where it was made: a view "
                          f"that is a {ref.get('kind')} can't cross as a view, so writing through it won't change "
                          f"`{ref['copy']}`")
    return resolved, copies


_DICT_VIEWS: dict[type, str] = {type({}.keys()): "keys", type({}.values()): "values", type({}.items()): "items"}
_LIST_ITERATOR: type = type(iter([]))


def _follows(value: Any, owners: Mapping[int, str]) -> dict[str, Any] | None:
    """A reference for a dict's view or a list's iterator whose dict or list is sent too (``owners``), so
    it stays a live view of it: ``ks = d.keys()`` sees what a cell adds to ``d``, as locally."""
    kind = _DICT_VIEWS.get(type(value))
    if kind is not None:
        mapping = gc.get_referents(value.mapping)  # the mappingproxy refers to the dict itself, and only to it
        of = owners.get(id(mapping[0])) if len(mapping) == 1 else None
        return None if of is None else {"dict_view": kind, "of": of}
    if type(value) is _LIST_ITERATOR:
        reduced = value.__reduce__()  # (iter, (the list,), index); exhausted: (iter, ((),))
        assert isinstance(reduced, tuple)
        _, arguments, *position = reduced
        of = owners.get(id(arguments[0])) if isinstance(arguments[0], list) and position else None
        return None if of is None else {"list_iterator": of, "position": int(position[0])}
    return None


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
                    "shape": list(array.shape), "strides": list(array.strides), "dtype": _descr(array.dtype),
                    "layout": [list(base.shape), list(base.strides), str(base.dtype)],
                    "recarray": type(array).__name__ == "recarray"}
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

    shape, strides, dtype = tuple(ref["shape"]), tuple(ref["strides"]), _dtype(ref["dtype"])
    exact = [list(base.shape), list(base.strides), str(base.dtype)] == list(ref["layout"]) and base.flags.c_contiguous
    memory = base if exact else numpy.ascontiguousarray(base)
    if dtype.hasobject and (memory.dtype != dtype or any(int(n) % dtype.itemsize for n in (ref["offset"], *strides))):
        # Python objects are pointers: a view over other bytes, or between elements, would crash the process.
        raise ProtocolError("a view that holds Python objects must lie on its base's own elements")
    view = numpy.ndarray(shape, dtype, buffer=memory, offset=int(ref["offset"]), strides=strides)
    if ref.get("recarray") is True:
        view = view.view(numpy.recarray)
    if not memory.flags.writeable:
        view.flags.writeable = False
    return view, exact


def _descr(dtype: Any) -> Any:
    """A dtype as JSON, fields included (``dtype.str`` of a record is only ``|V16``)."""
    from numpy.lib.format import dtype_to_descr

    return dtype_to_descr(dtype)


def _dtype(descr: Any) -> Any:
    """The dtype ``_descr`` described (JSON turned its tuples into lists)."""
    import numpy
    from numpy.lib.format import descr_to_dtype

    def fields(descr: Any) -> Any:
        return descr if isinstance(descr, str) else [
            (tuple(name) if isinstance(name, list) else name, fields(kind), *map(tuple, shape))
            for name, kind, *shape in descr]

    return numpy.dtype(descr) if isinstance(descr, str) else descr_to_dtype(fields(descr))


def shared_objects(values: Mapping[str, Any]) -> tuple[list[Any], str] | None:
    """The objects inside ``values`` that ``in_place.update_in_place`` can update, each once, in an order both
    sides of the wire find alike, and a digest of their types that says they did; None past WALK_LIMIT.

    Only containers whose pickle is their contents are looked into (lists, tuples, dicts' values,
    instances of notebook classes that pickle their ``__dict__``, notebook classes' data attributes):
    what pickling rebuilds otherwise may come out in another shape. Sets aren't: their order differs
    between processes.
    """
    found: list[Any] = []
    seen: set[int] = set()
    stack = [values[name] for name in sorted(values, reverse=True)]
    looked = 0
    while stack:
        looked += 1
        if looked > WALK_LIMIT:
            return None
        value = stack.pop()
        if isinstance(value, _LEAVES) and not _notebook_class(value) or id(value) in seen:
            continue
        seen.add(id(value))
        if updatable(value):
            found.append(value)
        stack.extend(reversed(list(itertools.islice(_contents(value), CONTAINER_LIMIT))))
    kinds = ",".join(f"{type(value).__module__}.{type(value).__qualname__}" for value in found)
    return found, hashlib.blake2b(kinds.encode(), digest_size=16).hexdigest()


def past_limits(changed: Sequence[str], inputs: Mapping[str, Any]) -> list[str]:
    """In words, for each input the cell changed in place that holds more items than ``shared_objects``
    looks at: what the notebook's other names that held its later items keep."""
    return [f"`{name}` holds {len(inputs[name]):,} items, and only objects among its first {CONTAINER_LIMIT:,} keep "
            f"their identity across the wire: the cell changed `{name}`, so its later items are new objects here, "
            "and other names that held one of them still hold the old one"
            for name in changed
            if type(inputs.get(name)) in (list, tuple, dict) and len(inputs[name]) > CONTAINER_LIMIT]


def _contents(value: Any) -> Iterator[Any]:
    kind = type(value)
    if kind is list or kind is tuple:
        yield from value
    elif kind is dict:
        yield from value.values()
    elif plain_notebook_instance(value):
        yield from vars(value).values()
        yield type(value)  # its class's data attributes, which come back with the class
    elif _notebook_class(value):
        from .definitions import class_data

        yield from class_data(value).values()
    elif kind in LIBRARY_CONTAINERS:
        yield from value.values() if isinstance(value, dict) else value
    elif (state := plain_state(value)) is not None:  # an object that pickles as its attributes
        for part in state if isinstance(state, tuple) else (state,):
            yield from (part or {}).values()


def _notebook_class(value: Any) -> bool:
    return isinstance(value, type) and value.__module__ == "__main__"


