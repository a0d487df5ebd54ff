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

import array
import collections
import copyreg
import datetime
import enum
import gc
import hashlib
import itertools
import numbers
import pathlib
import random
import sys
import types
import uuid
from typing import Any, Iterator, Mapping, Sequence

from ..errors import ProtocolError

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

CONTAINER_LIMIT = 1_000
"""How many items of one container ``shared_objects`` looks at (the first ones): a list of a million
numbers costs a thousand steps, and objects past them come back as copies."""

_IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), tuple, frozenset, range, types.ModuleType,
              types.FunctionType, types.BuiltinFunctionType, type)
"""Values whose identity a cell can't observe by changing them: sharing them needs no reference."""

_LEAVES = tuple(kind for kind in _IMMUTABLE if kind is not tuple)
"""What ``shared_objects`` neither numbers nor looks into (a tuple may hold lists)."""


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


def update_in_place(old: Any, new: Any) -> bool:
    """Make ``old`` hold what ``new`` holds, keeping its identity, where its type allows; False if not
    (then the receiver binds ``new`` instead)."""
    if type(old) is not type(new) or old is new:
        return old is new
    _remember_copies(old, new)
    if isinstance(old, (list, bytearray)):
        old[:] = new
    elif isinstance(old, (dict, set)):
        old.clear()
        old.update(new)
        if isinstance(old, collections.defaultdict):
            old.default_factory = new.default_factory
    elif (numpy := sys.modules.get("numpy")) is not None and isinstance(old, numpy.ndarray):
        if old.shape != new.shape or old.dtype != new.dtype or not old.flags.writeable:
            return False
        numpy.copyto(old, new)
    elif numpy is not None and isinstance(old, numpy.random.Generator):
        old.bit_generator.state = new.bit_generator.state
    elif numpy is not None and isinstance(old, numpy.random.RandomState):
        old.set_state(new.get_state())
    elif _pandas_data(old):
        old._update_inplace(new)  # what pandas' own `inplace=True` does: the new data, in this object
        for name in old._metadata:  # a Series' name; a subclass's own fields
            object.__setattr__(old, name, getattr(new, name, None))
        old.attrs = new.attrs
    elif (type(old).__module__ == "__main__" and hasattr(old, "__dict__") and not hasattr(type(old), "__slots__")
          and not isinstance(old, type)):  # a class's own attributes come back with it (definitions.py)
        old.__dict__.clear()  # an instance of a notebook class: its attributes are its state
        old.__dict__.update(new.__dict__)
    else:
        return _update_library_object(old, new)
    return True


_copies: list[tuple[Any, Any, str]] = []
_COPIES_KEPT = 100


def _remember_copies(old: Any, new: Any) -> None:
    """Before ``old`` takes ``new``'s contents: each object in it that ``new`` holds a copy of in its place
    (of a type that can't be updated in place, so it wasn't numbered), for ``copies_made``."""
    def items(value: Any) -> dict[str, Any]:
        if type(value) in (list, collections.deque):
            return {f"[{i}]": item for i, item in enumerate(itertools.islice(value, CONTAINER_LIMIT))}
        if isinstance(value, dict):
            return {f"[{key!r}]": item for key, item in itertools.islice(value.items(), CONTAINER_LIMIT)}
        state = vars(value) if _plain_notebook_instance(value) else _plain_state(value)
        own = state[0] if isinstance(state, tuple) else state
        return {f".{name}": item for name, item in (own or {}).items()}

    after = items(new)
    for where, item in items(old).items():
        copy = after.get(where)
        if (copy is not item and type(copy) is type(item) and not isinstance(item, _IMMUTABLE)
                and not _looks_immutable(item) and not _updatable(item)):
            _copies.append((item, old, where))
    del _copies[:-_COPIES_KEPT]


def _looks_immutable(value: Any) -> bool:
    """A number, a date or time, an Enum member, a path: a copy of one is as good as the object."""
    numpy = sys.modules.get("numpy")
    return isinstance(value, (numbers.Number, datetime.date, datetime.time, datetime.timedelta, enum.Enum,
                              pathlib.PurePath, uuid.UUID)) or (numpy is not None and isinstance(value, numpy.generic))


def copies_made() -> list[tuple[Any, Any, str]]:
    """The objects inside the notebook's containers that ``update_in_place`` replaced by copies since last
    asked: (the object, the container that held it, where in it: ``['w']``, ``[0]``, ``.coef``). Names
    that still hold one hold an object their container no longer does."""
    taken = list(_copies)
    _copies.clear()
    return taken


def _update_library_object(old: Any, new: Any) -> bool:
    """``update_in_place`` for the standard library's containers and generators of numbers, and for any
    object that pickles as its class and a state (a scikit-learn estimator, an ``argparse.Namespace``):
    that state, set on ``old`` as unpickling sets it on a new object."""
    if isinstance(old, collections.deque):
        if old.maxlen != new.maxlen:
            return False
        old.clear()
        old.extend(new)
    elif isinstance(old, array.array):  # of one typecode: an array's typecode can't change
        old[:] = new
    elif isinstance(old, random.Random):
        old.setstate(new.getstate())
    elif (state := _plain_state(new)) is not None and (before := _plain_state(old)) is not None:
        try:
            _set_state(old, state)
        except Exception:  # the class's own __setstate__ refused: as it was, and the receiver binds `new`
            _set_state(old, before)
            return False
    else:
        return False
    if hasattr(old, "__dict__") and isinstance(old, (collections.deque, array.array, random.Random)):
        vars(old).clear()  # a subclass's own attributes
        vars(old).update(vars(new))
    return True


_NEWOBJ: Any = getattr(copyreg, "__newobj__")  # (not in typeshed)

_STAYS_ON_THE_WORKER = {"matplotlib", "tinygrad"}
"""Libraries whose objects a cell's results leave on the worker (figures, GPU tensors): not numbered, so a
container holding one that a cell changes stays there too, as it did."""


def _set_state(obj: Any, state: Any) -> None:
    """Set a ``_plain_state`` on ``obj`` as unpickling sets it on a new object."""
    own, slots = state if isinstance(state, tuple) else (state, None)
    if hasattr(obj, "__dict__"):
        obj.__dict__.clear()
    if hasattr(type(obj), "__setstate__"):  # the class's own (scikit-learn checks its version there)
        obj.__setstate__(state)
        return
    if own:
        vars(obj).update(own)
    for name, value in (slots or {}).items():
        setattr(obj, name, value)


def _plain_state(value: Any) -> Any:
    """The state ``value`` pickles as, where its pickle is its class and that state only (``copyreg.__newobj__``
    with no arguments: what ``object.__reduce_ex__`` gives, scikit-learn's estimators too): a dict of its
    attributes, or a (dict or None, slots' dict) pair. None for any other pickle."""
    if isinstance(value, type) or not hasattr(value, "__dict__") and not hasattr(type(value), "__slots__"):
        return None
    if type(value).__module__.partition(".")[0] in _STAYS_ON_THE_WORKER:
        return None
    try:
        reduced = value.__reduce_ex__(5)
    except Exception:  # pickling runs the class's own code; what can't be pickled has no state to take
        return None
    if not isinstance(reduced, tuple) or len(reduced) < 3 or reduced[0] is not _NEWOBJ:
        return None
    if tuple(reduced[1]) != (type(value),) or any(item is not None for item in reduced[3:]):
        return None
    state = reduced[2]
    if isinstance(state, dict):  # (a copy: it may be the object's own __dict__)
        return dict(state)
    if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict) and (
            state[0] is None or isinstance(state[0], dict)):
        return None if state[0] is None else dict(state[0]), dict(state[1])
    return None


def shared_objects(values: Mapping[str, Any]) -> tuple[list[Any], str] | None:
    """The objects inside ``values`` that ``update_in_place`` can update, each once, in an order both
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
        if _updatable(value):
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
    elif _plain_notebook_instance(value):
        yield from vars(value).values()
        yield type(value)  # its class's data attributes, which come back with the class
    elif _notebook_class(value):
        from .definitions import class_data

        yield from class_data(value).values()
    elif kind in _LIBRARY_CONTAINERS:
        yield from value.values() if isinstance(value, dict) else value
    elif (state := _plain_state(value)) is not None:  # an object that pickles as its attributes
        for part in state if isinstance(state, tuple) else (state,):
            yield from (part or {}).values()


def _notebook_class(value: Any) -> bool:
    return isinstance(value, type) and value.__module__ == "__main__"


def _plain_notebook_instance(value: Any) -> bool:
    """An instance of a class the notebook defined, pickled as its ``__dict__``."""
    kind = type(value)
    return (kind.__module__ == "__main__" and hasattr(value, "__dict__") and not isinstance(value, type)
            and not any(_OWN_PICKLING & vars(cls).keys() for cls in kind.__mro__[:-1]))


_OWN_PICKLING = {"__slots__", "__reduce__", "__reduce_ex__", "__getstate__", "__setstate__", "__getnewargs__",
                 "__getnewargs_ex__"}
"""A class that defines any of these may pickle as something other than its ``__dict__``."""


def _pandas_data(value: Any) -> bool:
    """A pandas DataFrame or Series (or a subclass)."""
    pandas = sys.modules.get("pandas")
    return pandas is not None and isinstance(value, (pandas.DataFrame, pandas.Series))


def _updatable(value: Any) -> bool:
    """Can ``update_in_place`` make this object hold another of its kind's state?"""
    kind = type(value)
    if (kind in (list, dict, set, bytearray, array.array, random.Random, *_LIBRARY_CONTAINERS)
            or _plain_notebook_instance(value) or _pandas_data(value)):
        return True
    numpy = sys.modules.get("numpy")
    if numpy is not None and (kind is numpy.ndarray
                              or isinstance(value, (numpy.random.Generator, numpy.random.RandomState))):
        return True
    return _plain_state(value) is not None


_LIBRARY_CONTAINERS = (collections.deque, collections.OrderedDict, collections.defaultdict, collections.Counter)
"""The standard library's containers that pickle as their items, looked into as lists and dicts are."""
