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
from . import definitions, portable
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

    def header(self) -> dict[str, Any]:
        """The part of a message header that describes the frames."""
        header: dict[str, Any] = {"names": self.names, "counts": self.counts}
        if self.about:
            header["about"] = self.about
        return header


def per_name(names: Sequence[str], counts: Sequence[int], frames: Sequence[Any]) -> Iterator[tuple[str, Sequence[Any]]]:
    """Each name with its frames: the pickle stream first, then its out-of-band buffers."""
    position = 0
    for name, count in zip(names, counts):
        yield name, frames[position:position + count]
        position += count


@dataclass(frozen=True)
class ModuleRef:
    """A module travels by name; the receiving side imports it if it can."""

    name: str


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
        named = isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType))
        module = getattr(obj, "__module__", None) if named else type(obj).__module__
        if isinstance(module, str):
            self.modules.add(module.partition(".")[0])
        if self._keep_back is not None and (reason := self._keep_back(obj)):
            raise _KeptBack(reason)
        if self._portable_pandas and (reduced := portable.reduce(obj)) is not None:
            return reduced
        if definitions.is_notebook_definition(obj):
            found = definitions.find_definition(obj)
            if found is not None:
                return definitions.reduction(obj, found)
            self.by_value.append(obj.__qualname__)
        return super().reducer_override(obj)

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


def _dumps(value: Any, keep_back: KeepBack | None, portable_pandas: bool) -> tuple[list[Any], dict[str, Any]]:
    buffers: list[pickle.PickleBuffer] = []

    def keep_large(buf: pickle.PickleBuffer) -> bool:
        if buf.raw().nbytes < INLINE_BUFFER_BYTES:
            return True  # true means: serialise in band
        buffers.append(buf)
        return False

    stream = io.BytesIO()
    pickler = _Pickler(stream, keep_large, keep_back, portable_pandas)
    pickler.dump(value)
    return [stream.getvalue(), *(buf.raw() for buf in buffers)], pickler.about()


def pack(values: Mapping[str, Any], error: type[SerializationError] = InputError,
         keep_back: KeepBack | None = None, portable_pandas: bool = False, keep_unpicklable: bool = False) -> Packed:
    """Pickle each value; a failure raises ``error`` naming the variable, or with ``keep_unpicklable``
    leaves that value out, listed in ``kept`` with why, and packs the others.

    A value holding an object that ``keep_back`` refuses is left out and listed in ``kept``.
    With ``portable_pandas`` (the receiver's pandas differs), pandas objects travel in a form
    any pandas release loads (``portable.py``).
    """
    packed = Packed([], [], [])
    for name, value in values.items():
        if isinstance(value, types.ModuleType):
            value = ModuleRef(value.__name__)
        try:
            parts, about = _dumps(value, keep_back, portable_pandas)
        except _KeptBack as kept:
            packed.kept[name] = str(kept)
            continue
        except Exception as exc:  # pickling runs arbitrary __reduce__ code; any failure names the variable
            if keep_unpicklable:
                packed.kept[name] = f"{_a(type(value).__name__)}, which can't be pickled: {type(exc).__name__}: {exc}"
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


def _a(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _writable(frame: Any) -> Any:
    # A zmq.Frame exposes a writable buffer; arrays built on it stay writable without a copy.
    return memoryview(frame) if not isinstance(frame, (bytes, memoryview)) else frame


def _load_module(ref: ModuleRef) -> types.ModuleType:
    import importlib

    return importlib.import_module(ref.name)


def unpack(header: Mapping[str, Any], frames: Sequence[Any],
           error: type[SerializationError] = OutputError,
           on_module_error: Callable[[str, ModuleRef, Exception], None] | None = None,
           sides: tuple[str, str] = ("here", "on the other side")) -> dict[str, Any]:
    """Rebuild the values that ``pack`` turned into frames.

    A value that fails to load raises ``error`` naming it and, from what the sender recorded
    (``about``, and its ``versions`` in the header), the library or Python version that
    differs; ``sides`` names where this runs and where the values were made. A module that
    can't be imported here is passed to ``on_module_error`` (and left out) when given, else it
    raises too.
    """
    names, counts = header.get("names", []), header.get("counts", [])
    if (not isinstance(names, list) or not isinstance(counts, list) or len(names) != len(counts)
            or not all(isinstance(c, int) and c >= 1 for c in counts) or sum(counts) != len(frames)):
        raise error(f"the message's frames don't match its header ({len(frames)} frames for counts {counts!r:.80})")
    about, sender = header.get("about"), header.get("versions")
    about = about if isinstance(about, dict) else {}
    sender = sender if isinstance(sender, dict) else {}
    values: dict[str, Any] = {}
    for name, (stream, *buffers) in per_name(names, counts, frames):
        entry = about.get(name)
        recorded: dict[str, Any] = entry if isinstance(entry, dict) else {}
        if not bytecode_loads_here(recorded, sender):
            raise error(explain_load_failure(name, None, recorded, sender, *sides), name)
        try:
            value = pickle.loads(_writable(stream), buffers=[_writable(b) for b in buffers])
        except Exception as exc:  # unpickling runs arbitrary code; any failure names the variable
            raise error(explain_load_failure(name, exc, recorded, sender, *sides), name) from exc
        if isinstance(value, ModuleRef):
            try:
                value = _load_module(value)
            except ImportError as exc:
                if on_module_error is None:
                    raise error(f"`{name}` is the module {value.name!r}, which can't be imported {sides[0]}: {exc}",
                                name) from exc
                on_module_error(name, value, exc)
                continue
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
