"""Pickle named values into frames and back, with large buffers out of band.

Each value is pickled on its own (cloudpickle, protocol 5) so that a failure names the
variable. Buffers that support pickle protocol 5 (numpy arrays, bytearrays) become separate
frames, sent without being copied into the pickle stream. A header carries the names and
how many frames belong to each.
"""

from __future__ import annotations

import pickle
import types
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import cloudpickle

from .errors import InputError, OutputError, SerializationError

PICKLE_PROTOCOL = 5

INLINE_BUFFER_BYTES = 1024
"""Buffers smaller than this stay inside the pickle stream; a frame costs more than a copy."""


@dataclass
class Packed:
    """Named values as frames: ``counts[i]`` frames belong to ``names[i]``."""

    names: list[str]
    counts: list[int]
    frames: list[Any]

    def header(self) -> dict[str, Any]:
        """The part of a message header that describes the frames."""
        return {"names": self.names, "counts": self.counts}


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


def _dumps(value: Any) -> list[Any]:
    buffers: list[pickle.PickleBuffer] = []

    def keep_large(buf: pickle.PickleBuffer) -> bool:
        if buf.raw().nbytes < INLINE_BUFFER_BYTES:
            return True  # true means: serialise in band
        buffers.append(buf)
        return False

    stream = cloudpickle.dumps(value, protocol=PICKLE_PROTOCOL, buffer_callback=keep_large)
    return [stream, *(buf.raw() for buf in buffers)]


def pack(values: Mapping[str, Any], error: type[SerializationError] = InputError) -> Packed:
    """Pickle each value; a failure raises ``error`` naming the variable."""
    names, counts, frames = [], [], []
    for name, value in values.items():
        if isinstance(value, types.ModuleType):
            value = ModuleRef(value.__name__)
        try:
            parts = _dumps(value)
        except Exception as exc:  # pickling runs arbitrary __reduce__ code; any failure names the variable
            raise error(
                f"`{name}` ({type(value).__name__}) can't be pickled: {type(exc).__name__}: {exc}. "
                "Recreate it inside the cell instead of passing it in, or convert it to plain data.",
                name,
            ) from exc
        names.append(name)
        counts.append(len(parts))
        frames.extend(parts)
    return Packed(names, counts, frames)


def _writable(frame: Any) -> Any:
    # A zmq.Frame exposes a writable buffer; arrays built on it stay writable without a copy.
    return memoryview(frame) if not isinstance(frame, (bytes, memoryview)) else frame


def _load_module(ref: ModuleRef) -> types.ModuleType:
    import importlib

    return importlib.import_module(ref.name)


def unpack(header: Mapping[str, Any], frames: Sequence[Any],
           error: type[SerializationError] = OutputError,
           on_module_error: Callable[[str, ModuleRef, Exception], None] | None = None) -> dict[str, Any]:
    """Rebuild the values that ``pack`` turned into frames.

    A value that fails to load raises ``error`` naming it. A module that can't be imported
    here is passed to ``on_module_error`` (and left out) when given, else it raises too.
    """
    names, counts = header.get("names", []), header.get("counts", [])
    if (not isinstance(names, list) or not isinstance(counts, list) or len(names) != len(counts)
            or not all(isinstance(c, int) and c >= 1 for c in counts) or sum(counts) != len(frames)):
        raise error(f"the message's frames don't match its header ({len(frames)} frames for counts {counts!r:.80})")
    values: dict[str, Any] = {}
    for name, (stream, *buffers) in per_name(names, counts, frames):
        try:
            value = pickle.loads(_writable(stream), buffers=[_writable(b) for b in buffers])
        except Exception as exc:  # unpickling runs arbitrary code; any failure names the variable
            raise error(f"`{name}` can't be unpickled here: {type(exc).__name__}: {exc}", name) from exc
        if isinstance(value, ModuleRef):
            try:
                value = _load_module(value)
            except ImportError as exc:
                if on_module_error is None:
                    raise error(f"`{name}` is the module {value.name!r}, which can't be imported here: {exc}",
                                name) from exc
                on_module_error(name, value, exc)
                continue
        values[name] = value
    return values


def nbytes(frames: Iterable[Any]) -> int:
    """Total payload size of some frames, for stats and logs."""
    total = 0
    for frame in frames:
        total += memoryview(frame).nbytes if not hasattr(frame, "buffer") else len(frame.buffer)
    return total
