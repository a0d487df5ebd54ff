"""Updating an object in place with what another of its kind holds: how an input a cell changed on the other
side of the wire becomes, here, the same object holding the new state.

``identity.py`` numbers the objects both sides can update so (``updatable``); the receiver makes its own
object take what the sender's became (``update_in_place``): lists, dicts and sets their items, numpy arrays
their values, random generators their state, pandas objects their data, instances of notebook classes their
attributes, and the standard library's containers and any object that pickles as its class and a state (a
scikit-learn estimator) that state, as unpickling would set it. Objects inside that came back as copies
(of a type that can't be updated) are remembered, so the notebook can name who still holds the old one
(``copies_made``).
"""

from __future__ import annotations

import array
import collections
import copyreg
import datetime
import enum
import itertools
import numbers
import pathlib
import random
import sys
import types
import uuid
from typing import Any

CONTAINER_LIMIT = 1_000
"""How many items of one container are looked at (the first ones), here and by ``identity.shared_objects``: a
list of a million numbers costs a thousand steps, and objects past them come back as copies."""

IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), tuple, frozenset, range, types.ModuleType,
             types.FunctionType, types.BuiltinFunctionType, type)
"""Values whose identity a cell can't observe by changing them: sharing them needs no reference."""


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
        state = vars(value) if plain_notebook_instance(value) else plain_state(value)
        own = state[0] if isinstance(state, tuple) else state
        return {f".{name}": item for name, item in (own or {}).items()}

    after = items(new)
    for where, item in items(old).items():
        copy = after.get(where)
        if (copy is not item and type(copy) is type(item) and not isinstance(item, IMMUTABLE)
                and not _looks_immutable(item) and not updatable(item)):
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
    elif (state := plain_state(new)) is not None and (before := plain_state(old)) is not None:
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
    """Set a ``plain_state`` on ``obj`` as unpickling sets it on a new object."""
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


def plain_state(value: Any) -> Any:
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


def plain_notebook_instance(value: Any) -> bool:
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


def updatable(value: Any) -> bool:
    """Can :func:`update_in_place` make this object hold another of its kind's state?"""
    kind = type(value)
    if (kind in (list, dict, set, bytearray, array.array, random.Random, *LIBRARY_CONTAINERS)
            or plain_notebook_instance(value) or _pandas_data(value)):
        return True
    numpy = sys.modules.get("numpy")
    if numpy is not None and (kind is numpy.ndarray
                              or isinstance(value, (numpy.random.Generator, numpy.random.RandomState))):
        return True
    return plain_state(value) is not None


LIBRARY_CONTAINERS = (collections.deque, collections.OrderedDict, collections.defaultdict, collections.Counter)
"""The standard library's containers that pickle as their items, looked into as lists and dicts are."""
