"""Pickle named values into frames and back, with large buffers out of band.

Each value is pickled on its own (cloudpickle, protocol 5) so that a failure names the
variable. Buffers that support pickle protocol 5 (numpy arrays, bytearrays) become separate
frames, sent without being copied into the pickle stream. A header carries the names and
how many frames belong to each.

The two sides run different Python and library versions, so pickling also records, per value,
the libraries its objects come from (with their versions) and the notebook definitions it had
to send as bytecode; a value that fails to load is explained by them. Functions and classes
defined in the notebook travel as source (``definitions.py``).
"""

from __future__ import annotations

import io
import pickle
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import cloudpickle

from ..errors import InputError, OutputError, SerializationError
from . import definitions, portable, tracebacks
from .handles import CLOSED_FILE, SHUT_DOWN_POOL
from .identity import PATCH_PREFIX
from .imported_names import NotebookImport
from .versions import bytecode_loads_here, explain_load_failure

PICKLE_PROTOCOL = 5

INLINE_BUFFER_BYTES = 1024
"""Buffers smaller than this stay inside the pickle stream; a frame costs more than a copy."""


@dataclass
class Packed:
    """Named values as frames: ``counts[i]`` frames belong to ``names[i]``."""

    names: list[str]
    counts: list[int]
    frames: list[Any]
    about: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per name, what a receiver needs to explain a failure to load it (libraries, bytecode)."""
    kept: dict[str, Any] = field(default_factory=dict)  # name -> why (the executor adds its handle)
    """Names left out by ``keep_back``, with the reason."""
    unpicklable: set[str] = field(default_factory=set)
    """Those of ``kept`` that can't be pickled: they can never leave the worker."""
    one_memo: bool = False
    """The values were pickled with one memo: the receiver loads them all, in order, with one unpickler."""

    def header(self) -> dict[str, Any]:
        """The part of a message header that describes the frames."""
        header: dict[str, Any] = {"names": self.names, "counts": self.counts}
        if self.about:
            header["about"] = self.about
        if self.one_memo:
            header["one_memo"] = True
        return header


def per_name(names: Sequence[str], counts: Sequence[int], frames: Sequence[Any]) -> Iterator[tuple[str, Sequence[Any]]]:
    """Each name with its frames: the pickle stream first, then its out-of-band buffers."""
    position = 0
    for name, count in zip(names, counts):
        yield name, frames[position:position + count]
        position += count


@dataclass(frozen=True)
class ModuleRef:
    """A module travels by name; the receiving side imports it if it can. Where it can't (a module only
    the worker has: ``import torch`` on a GPU box), the name stays bound to this reference, which the next
    offloaded cell that reads it sends back, so the module is there again for that cell."""

    name: str

    def __repr__(self) -> str:
        return f"<module {self.name!r} on the worker only: offloaded cells use it; it can't be imported here>"

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        raise AttributeError(f"module {self.name!r} is imported on the worker only, as it can't be imported here: "
                             f"offloaded cells use it; install it here to use {self.name}.{attribute} in a local cell")


KeepBack = Callable[[Any], "str | None"]
"""Says why an object must not travel (it is left out, with that reason), or None."""


class _KeptBack(Exception):
    pass


# Modules that aren't libraries a user installs: their versions never explain a failure.
_NOT_LIBRARIES = frozenset(getattr(sys, "stdlib_module_names", ())) | {"__main__", "builtins", "copyreg"}


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle, plus: notebook definitions as source, and a record of what the value is made of."""

    def __init__(self, file: io.BytesIO, buffer_callback: Callable[[pickle.PickleBuffer], bool],
                 keep_back: KeepBack | None, portable_pandas: bool) -> None:
        super().__init__(file, protocol=PICKLE_PROTOCOL, buffer_callback=buffer_callback)
        self.modules: set[str] = set()
        self.by_value: list[str] = []
        self._keep_back = keep_back
        self._portable_pandas = portable_pandas

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, NotebookImport):  # the notebook's own import, or else the value (imported_names.py)
            return obj.reduction(self._alone(obj.value))
        named = isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType))
        module = getattr(obj, "__module__", None) if named else type(obj).__module__
        if isinstance(module, str):
            self.modules.add(module.partition(".")[0])
        if self._keep_back is not None and (reason := self._keep_back(obj)):
            raise _KeptBack(reason)
        if self._portable_pandas and (reduced := portable.reduce(obj)) is not None:
            return reduced
        if (dispatching := definitions.single_dispatch(obj)) is not None:
            return dispatching
        if (raised := tracebacks.reduce(obj)) is not None:  # with the places it was raised at
            return raised
        if definitions.is_notebook_definition(obj):
            found = definitions.find_definition(obj)
            if found is not None:
                return definitions.reduction(obj, found)
            self.by_value.append(obj.__qualname__)
        if (by_name := _module_singleton_method(obj)) is not None:
            return by_name
        return _with_slots(obj, super().reducer_override(obj))

    def _alone(self, value: Any) -> bytes:
        """``value``'s pickle on its own, as a value is pickled (a module as a ModuleRef), its buffers in
        band; what it is made of is recorded as this value's."""
        stream = io.BytesIO()
        pickler = _Pickler(stream, _in_band, self._keep_back, self._portable_pandas)
        pickler.dump(ModuleRef(value.__name__) if isinstance(value, types.ModuleType) else value)
        self.modules |= pickler.modules
        self.by_value += pickler.by_value
        return stream.getvalue()

    def about(self) -> dict[str, Any]:
        """What a receiver needs to explain a failure to load this value."""
        libraries = {}
        for name in sorted(self.modules - _NOT_LIBRARIES):
            version = getattr(sys.modules.get(name), "__version__", None)
            if isinstance(version, str):
                libraries[name] = version
        about: dict[str, Any] = {"libraries": libraries} if libraries else {}
        # Name what the user defined, not the methods and helpers that travelled with it.
        outermost = {n for n in self.by_value if not n.startswith("__")
                     and not any(n.startswith(f"{other}.") for other in self.by_value)}
        if outermost:
            about["by_value"] = sorted(outermost)
        return about


def _in_band(buffer: pickle.PickleBuffer) -> bool:
    return True  # true means: serialise in band


def _with_slots(cls: Any, reduced: Any) -> Any:
    """cloudpickle's reduction of a class by value, rebuilding its ``__slots__`` as slots: cloudpickle makes
    the class without them (only the attribute), so its instances get a ``__dict__``, and an instance from
    the class with real slots (on the side that made it) no longer loads into it, or back."""
    if (isinstance(cls, type) and vars(cls).get("__slots__") and isinstance(reduced, tuple)
            and reduced[0] is cloudpickle.cloudpickle._make_skeleton_class):
        args = list(reduced[1])
        args[3] = {**args[3], "__slots__": vars(cls)["__slots__"]}  # the class's type_kwargs
        return (reduced[0], tuple(args), *reduced[2:])
    return reduced


def _module_singleton_method(obj: Any) -> tuple[Any, tuple[Any, str]] | None:
    """A method of a module's own instance that the module exports (``random.random``, numpy's
    ``rand``) travels by name, so it is the receiver's: by value it would draw from a copy of that
    instance, apart from ``random.seed`` and the other methods of the one instance."""
    owner = getattr(obj, "__self__", None)
    if not isinstance(obj, (types.BuiltinMethodType, types.MethodType)) or owner is None or isinstance(
            owner, types.ModuleType):
        return None
    name, module = getattr(obj, "__name__", None), sys.modules.get(type(owner).__module__)
    if isinstance(name, str) and module is not None and getattr(module, name, None) is obj:
        return getattr, (module, name)
    return None


class _NumberingPickler(_Pickler):
    """Also: objects the receiver holds (``numbered``: id -> number) travel as their number, except the
    value being pickled itself (``root``); ``referenced`` lists the numbers sent."""

    def __init__(self, *args: Any, numbered: Mapping[int, int], referenced: dict[int, None]) -> None:
        super().__init__(*args)
        self._numbered = numbered
        self.root: Any = None
        self.referenced = referenced  # ordered

    def persistent_id(self, obj: Any) -> int | None:
        number = self._numbered.get(id(obj))
        if number is None or obj is self.root:
            return None
        self.referenced[number] = None
        return number


class _Dumper:
    """Pickles values one after another, each into its own stream and buffers; with ``one_memo``, with
    one memo, so that a later value refers to what an earlier one holds instead of copying it."""

    def __init__(self, keep_back: KeepBack | None, portable_pandas: bool, one_memo: bool,
                 numbered: Mapping[int, int] | None) -> None:
        self._options = (keep_back, portable_pandas)
        self._numbered = numbered
        self._one_memo = one_memo
        self._buffers: list[pickle.PickleBuffer] = []
        self._stream = io.BytesIO()
        self.referenced: dict[int, None] = {}
        self._pickler = self._new_pickler() if one_memo else None

    def _keep_large(self, buf: pickle.PickleBuffer) -> bool:
        if buf.raw().nbytes < INLINE_BUFFER_BYTES:
            return True  # true means: serialise in band
        self._buffers.append(buf)
        return False

    def _new_pickler(self) -> _Pickler:
        if self._numbered:
            return _NumberingPickler(self._stream, self._keep_large, *self._options, numbered=self._numbered,
                                     referenced=self.referenced)
        return _Pickler(self._stream, self._keep_large, *self._options)

    def dumps(self, value: Any) -> tuple[list[Any], dict[str, Any]]:
        """The value's frames (its pickle stream, then its out-of-band buffers), and its ``about``."""
        if self._pickler is None:
            self._stream = io.BytesIO()
        pickler = self._pickler or self._new_pickler()
        pickler.modules, pickler.by_value = set(), []
        if isinstance(pickler, _NumberingPickler):
            pickler.root = value
        start, self._buffers = self._stream.tell(), []
        pickler.dump(value)
        return [self._stream.getvalue()[start:], *(buf.raw() for buf in self._buffers)], pickler.about()

    def close(self) -> None:
        """Let go of what was pickled: a pickler's memo holds every object it pickled, and the pickler and
        this (its buffer callback) refer to each other, so only the garbage collector would free them,
        some time later; a large input would stay in memory (and its shared file mapped) until then."""
        if self._pickler is not None:
            self._pickler.clear_memo()
            self._pickler = None
        self._buffers = []


def pack(values: Mapping[str, Any], error: type[SerializationError] = InputError,
         keep_back: KeepBack | None = None, portable_pandas: bool = False, keep_unpicklable: bool = False,
         one_memo: bool = False, shared: Sequence[Any] = (), patch: Iterable[int] = ()) -> Packed:
    """Pickle each value; a failure raises ``error`` naming the variable, or with ``keep_unpicklable``
    leaves that value out, listed in ``kept`` with why, and packs the others.

    A value holding an object that ``keep_back`` refuses is left out and listed in ``kept``.
    With ``portable_pandas`` (the receiver's pandas differs), pandas objects travel in a form
    any pandas release loads (``portable.py``). ``one_memo``: an object several values hold arrives
    as one object (when any value fails, each is pickled on its own instead).

    ``shared``: objects the receiver holds too, numbered alike (``identity.shared_objects``). Inside a
    value, each travels as its number; what it is now follows as the value named
    ``identity.PATCH_PREFIX`` + number, for the receiver to update its own in place. So do those
    numbered in ``patch``.
    """
    dumper = _Dumper(keep_back, portable_pandas, one_memo, {id(value): number for number, value in enumerate(shared)})
    try:
        return _pack(values, dumper, error, keep_back, portable_pandas, keep_unpicklable, one_memo, shared, patch)
    finally:
        dumper.close()


def _pack(values: Mapping[str, Any], dumper: _Dumper, error: type[SerializationError], keep_back: KeepBack | None,
          portable_pandas: bool, keep_unpicklable: bool, one_memo: bool, shared: Sequence[Any],
          patch: Iterable[int]) -> Packed:
    packed = Packed([], [], [], one_memo=one_memo)
    for name, value in _with_patches(values, shared, dumper.referenced, patch):
        if isinstance(value, types.ModuleType):
            value = ModuleRef(value.__name__)
        try:
            parts, about = dumper.dumps(value)
        except Exception as exc:  # pickling runs arbitrary __reduce__ code; any failure names the variable
            if one_memo:  # what this one left in the memo can't be referred to: each on its own, then
                return pack(values, error, keep_back, portable_pandas, keep_unpicklable, shared=shared, patch=patch)
            if name.startswith(PATCH_PREFIX) and keep_unpicklable:  # it travels inside its holders, then, which
                number = int(name[len(PATCH_PREFIX):])  # stay here as handles if they can't be pickled either
                return pack(values, error, keep_back, portable_pandas, keep_unpicklable,
                            shared=[_UNNUMBERED if i == number else v for i, v in enumerate(shared)],
                            patch=[n for n in patch if n != number])
            if name.startswith(PATCH_PREFIX):  # its holders went: it can't stay behind on its own
                raise error(f"an object inside the cell's inputs ({type(value).__name__}) can't be pickled: "
                            f"{type(exc).__name__}: {exc}") from exc
            if isinstance(exc, _KeptBack):
                packed.kept[name] = str(exc)
                continue
            if keep_unpicklable:
                packed.kept[name] = CLOSED_FILE if isinstance(value, io.IOBase) and value.closed else (
                    SHUT_DOWN_POOL if _shut_down(value) else
                    f"{_a(type(value).__name__)}, which can't be pickled: {type(exc).__name__}: {exc}")
                packed.unpicklable.add(name)
                continue
            raise error(
                f"`{name}` ({type(value).__name__}) can't be pickled: {type(exc).__name__}: {exc}. "
                "Recreate it inside the cell instead of passing it in, or convert it to plain data.",
                name,
            ) from exc
        packed.names.append(name)
        packed.counts.append(len(parts))
        packed.frames.extend(parts)
        if about:
            packed.about[name] = about
    return packed


_UNNUMBERED = object()
"""Stands in the numbered objects for one that can't be pickled: nothing refers to it."""


def _with_patches(values: Mapping[str, Any], shared: Sequence[Any], referenced: dict[int, None],
                  patch: Iterable[int]) -> Iterator[tuple[str, Any]]:
    """The values, then each shared object they referred to (or ``patch`` names), and those they did."""
    yield from values.items()
    referenced.update(dict.fromkeys(patch))
    done: set[int] = set()
    while pending := [number for number in referenced if number not in done]:
        for number in pending:
            done.add(number)
            yield f"{PATCH_PREFIX}{number}", shared[number]


def _shut_down(value: Any) -> bool:
    """Is ``value`` a ``concurrent.futures`` executor or a ``multiprocessing`` pool that was shut down?"""
    futures, pool = sys.modules.get("concurrent.futures"), sys.modules.get("multiprocessing.pool")
    if futures is not None and isinstance(value, futures.Executor):
        return bool(getattr(value, "_shutdown_thread", False) or getattr(value, "_shutdown", False))
    return pool is not None and isinstance(value, pool.Pool) and getattr(value, "_state", pool.RUN) != pool.RUN


def _a(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _writable(frame: Any) -> Any:
    # A zmq.Frame exposes a writable buffer; arrays built on it stay writable without a copy.
    return memoryview(frame) if not isinstance(frame, (bytes, memoryview)) else frame


BUFFER_ALIGNMENT = 16
"""What an out-of-band buffer's address must be a multiple of, as memory numpy allocates is."""


def _aligned(frame: Any) -> Any:
    """The frame's buffer, or a copy of it where it starts at an odd address: a small message's frame
    may sit anywhere in what ZeroMQ read, and numpy computes on misaligned data along other paths
    (float results that differ in the last bit from the same computation on the notebook's array)."""
    import numpy

    buffer = _writable(frame)
    if len(buffer) and numpy.frombuffer(buffer, numpy.uint8).ctypes.data % BUFFER_ALIGNMENT:
        return bytearray(buffer)
    return buffer


def _load_module(ref: ModuleRef) -> types.ModuleType:
    import importlib

    return importlib.import_module(ref.name)


class _Unpickler(pickle.Unpickler):
    """Loads what ``pack`` pickled; a number in it (``pack``'s ``numbered``) is ``numbered[number]`` here."""

    def __init__(self, file: io.BytesIO, buffers: Iterable[Any], numbered: Sequence[Any]) -> None:
        super().__init__(file, buffers=buffers)
        self._numbered = numbered

    def persistent_load(self, pid: Any) -> Any:
        if not isinstance(pid, int) or not 0 <= pid < len(self._numbered):
            raise pickle.UnpicklingError(f"the value refers to object {pid!r} of the cell's inputs, which isn't here")
        return self._numbered[pid]


def _loaders(header: Mapping[str, Any], frames: Sequence[Any],
             numbered: Sequence[Any]) -> Iterator[tuple[str, Callable[[], Any]]]:
    """Each name with what loads its value; with ``one_memo``, one unpickler loads them all, in order."""
    names, counts = header.get("names", []), header.get("counts", [])
    if header.get("one_memo") is True:
        values = list(per_name(names, counts, frames))
        stream = io.BytesIO(b"".join(bytes(_writable(parts[0])) for _, parts in values))
        shared = _Unpickler(stream, (_aligned(b) for _, parts in values for b in parts[1:]), numbered)
        for name, _ in values:
            yield name, shared.load
        return
    for name, (stream, *buffers) in per_name(names, counts, frames):
        unpickler = _Unpickler(io.BytesIO(_writable(stream)), [_aligned(b) for b in buffers], numbered)
        yield name, unpickler.load


def unpack(header: Mapping[str, Any], frames: Sequence[Any],
           error: type[SerializationError] = OutputError,
           on_module_error: Callable[[str, ModuleRef, Exception], None] | None = None,
           sides: tuple[str, str] = ("here", "on the other side"), numbered: Sequence[Any] = ()) -> dict[str, Any]:
    """Rebuild the values that ``pack`` turned into frames.

    A value that fails to load raises ``error`` naming it and, from what the sender recorded
    (``about``, and its ``versions`` in the header), the library or Python version that
    differs; ``sides`` names where this runs and where the values were made. A module that
    can't be imported here is passed to ``on_module_error`` (and stays a ModuleRef) when given, else it
    raises too. ``numbered``: the objects here that the sender's ``numbered`` referred to.
    """
    names, counts = header.get("names", []), header.get("counts", [])
    if (not isinstance(names, list) or not isinstance(counts, list) or len(names) != len(counts)
            or not all(isinstance(c, int) and c >= 1 for c in counts) or sum(counts) != len(frames)):
        raise error(f"the message's frames don't match its header ({len(frames)} frames for counts {counts!r:.80})")
    about, sender = header.get("about"), header.get("versions")
    about = about if isinstance(about, dict) else {}
    sender = sender if isinstance(sender, dict) else {}
    values: dict[str, Any] = {}
    with definitions.loading():  # a definition the message holds is found by those after it
        for name, load in _loaders(header, frames, numbered):
            entry = about.get(name)
            recorded: dict[str, Any] = entry if isinstance(entry, dict) else {}
            if not bytecode_loads_here(recorded, sender):
                raise error(explain_load_failure(name, None, recorded, sender, *sides), name)
            try:
                value = load()
            except Exception as exc:  # unpickling runs arbitrary code; any failure names the variable
                raise error(explain_load_failure(name, exc, recorded, sender, *sides), name) from exc
            if isinstance(value, ModuleRef):
                try:
                    value = _load_module(value)
                except ImportError as exc:
                    if on_module_error is None:
                        raise error(f"`{name}` is the module {value.name!r}, which can't be imported {sides[0]}: "
                                    f"{exc}", name) from exc
                    on_module_error(name, value, exc)  # it stays bound to the reference: later cells send it
            values[name] = value
    return values


def frame_over(names: Sequence[str], counts: Sequence[int], frames: Sequence[Any],
               limit: int) -> tuple[str, int] | None:
    """The first value with a frame over ``limit`` bytes (what a hub's socket refuses), and its size."""
    for name, parts in per_name(names, counts, frames):
        largest = max(nbytes([part]) for part in parts)
        if largest > limit:
            return name, largest
    return None


def nbytes(frames: Iterable[Any]) -> int:
    """Total payload size of some frames, for stats and logs."""
    total = 0
    for frame in frames:
        total += memoryview(frame).nbytes if not hasattr(frame, "buffer") else len(frame.buffer)
    return total
