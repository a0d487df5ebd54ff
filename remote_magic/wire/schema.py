"""What each message's header may carry: every field's type and range, checked where messages arrive.

``protocol.decode`` makes sure a message is framed right and that its header is a JSON object of bounded
size and depth; this module says what may be inside it. ``HEADERS`` lists, per message type (keyed by
the type's wire name, so the table doesn't depend on which types ``MessageType`` has today), each field a
peer may send and what it must be: an id of 1 to 64 characters, an integer within bounds (``true`` is
not an integer here, nor ``1e400``, which JSON reads as infinity), a finite number, a list of names, an
object of strings... ``check`` refuses a message one of whose fields is wrong with a ``ProtocolError``
that names the message type, the field, what it was and what is allowed. Fields the table doesn't list
pass unchecked, so a newer peer may add some; a type the table doesn't list is checked for the fields
every message may carry (``COMMON``).

Where it is checked: the hub checks what every peer sends it (``hub/broker.py``), a worker what the hub
forwards to it (``worker/supervisor.py``), and an executor each job it runs (``worker/executor.py``, on a
Dask worker too). A value the table allows may still be refused for what it means (a requirement that
doesn't parse, frames that don't match ``counts``), by the code that reads it, with an error reply.
"""

from __future__ import annotations

import math
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple

from ..errors import ProtocolError
from .chunks import CHUNK_BYTES
from .protocol import MAX_HEADER_BYTES, Message

__all__ = ["COMMON", "HEADERS", "Field", "Refusal", "check", "check_header", "describe", "job_of"]

MAX_INTEGER = 2**63 - 1
"""The largest integer any field takes: every count, size and offset fits a signed 64-bit integer."""

MAX_ID_CHARS = 64
"""The longest id a peer chooses (jobs, kernels, transfers, requests): uuid4 hex is 32 characters."""

MAX_NAME_CHARS = 1024
"""The longest name: a variable, a worker, a library, a mime type, a requirement, a version."""

MAX_TEXT_CHARS = MAX_HEADER_BYTES
"""The longest free text (code, printed text, an error's message): only the header's size bounds it."""


class Refusal(NamedTuple):
    """Why a value is refused: where in the header (``figure_formats[0]``), what it was, what is allowed."""

    where: str
    value: Any
    allowed: str


_MISSING = object()  # the value of a required field a header lacks


class Field(ABC):
    """What one value in a header must be."""

    @property
    @abstractmethod
    def allowed(self) -> str:
        """What is allowed, in words: "a string of 1 to 64 characters"."""

    def refuse(self, value: Any, where: str) -> Refusal | None:
        """None when ``value`` (found at ``where``) is allowed; else what is wrong, and where inside it."""
        return None if self.accepts(value) else Refusal(where, value, self.allowed)

    def accepts(self, value: Any) -> bool:
        """Is ``value`` allowed? (Containers say where inside a value is wrong through ``refuse``.)"""
        return self.refuse(value, "") is None


@dataclass(frozen=True)
class Text(Field):
    """A string of ``min_chars`` to ``max_chars`` characters; one of ``choices`` when given, never one of
    ``reserved``."""

    max_chars: int
    min_chars: int = 0
    choices: tuple[str, ...] = ()
    reserved: tuple[str, ...] = ()

    @property
    def allowed(self) -> str:
        if self.choices:
            return "one of " + ", ".join(f'"{choice}"' for choice in self.choices)
        size = (f"at most {self.max_chars:,}" if self.min_chars == 0
                else f"{self.min_chars:,} to {self.max_chars:,}")
        other = f" other than {', '.join(repr(r) for r in self.reserved)}" if self.reserved else ""
        return f"a string of {size} characters{other}"

    def accepts(self, value: Any) -> bool:
        if not isinstance(value, str) or not self.min_chars <= len(value) <= self.max_chars:
            return False
        return (not self.choices or value in self.choices) and value not in self.reserved


@dataclass(frozen=True)
class Integer(Field):
    """An integer from ``low`` to ``high`` (JSON's ``true`` is not one, nor ``1.0``)."""

    low: int = 0
    high: int = MAX_INTEGER

    @property
    def allowed(self) -> str:
        if self.high == MAX_INTEGER:
            return f"an integer of at least {self.low:,}"
        return f"an integer from {self.low:,} to {self.high:,}"

    def accepts(self, value: Any) -> bool:
        return type(value) is int and self.low <= value <= self.high


@dataclass(frozen=True)
class Number(Field):
    """A finite number (an integer or a float) from ``low`` to ``high``; with ``finite`` False, any number
    (a field whose reader takes what isn't a usable number for none, as a job's ``timeout``)."""

    low: float = -sys.float_info.max
    high: float = sys.float_info.max
    finite: bool = True

    @property
    def allowed(self) -> str:
        if not self.finite:
            return "a number"
        if self.high == sys.float_info.max:
            return "a finite number" if self.low == -sys.float_info.max else f"a finite number of at least {self.low:g}"
        return f"a finite number from {self.low:g} to {self.high:g}"

    def accepts(self, value: Any) -> bool:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return False
        if not self.finite:
            return True
        # Compared as they are: float(10**400) would overflow, and an integer that large is no usable number.
        return (isinstance(value, int) or math.isfinite(value)) and self.low <= value <= self.high


@dataclass(frozen=True)
class Flag(Field):
    """``true`` or ``false``."""

    @property
    def allowed(self) -> str:
        return "true or false"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, bool)


@dataclass(frozen=True)
class Json(Field):
    """Any JSON value: what this side only passes on, or hands to code that checks it itself."""

    @property
    def allowed(self) -> str:
        return "any JSON value"

    def accepts(self, value: Any) -> bool:
        return True


@dataclass(frozen=True)
class Object(Field):
    """A JSON object, whatever is inside it."""

    @property
    def allowed(self) -> str:
        return "a JSON object"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, dict)


@dataclass(frozen=True)
class Maybe(Field):
    """``null``, or what ``field`` allows."""

    field: Field

    @property
    def allowed(self) -> str:
        return f"{self.field.allowed}, or null"

    def refuse(self, value: Any, where: str) -> Refusal | None:
        return None if value is None else self.field.refuse(value, where)


@dataclass(frozen=True)
class AnyOf(Field):
    """What any one of ``options`` allows."""

    options: tuple[Field, ...]

    @property
    def allowed(self) -> str:
        return ", or ".join(option.allowed for option in self.options)

    def accepts(self, value: Any) -> bool:
        return any(option.accepts(value) for option in self.options)


@dataclass(frozen=True)
class ListOf(Field):
    """A list, each item of which ``item`` allows."""

    item: Field

    @property
    def allowed(self) -> str:
        return f"a list, each item {self.item.allowed}"

    def refuse(self, value: Any, where: str) -> Refusal | None:
        if not isinstance(value, list):
            return Refusal(where, value, self.allowed)
        for index, item in enumerate(value):
            if (refusal := self.item.refuse(item, f"{where}[{index}]")) is not None:
                return refusal
        return None


@dataclass(frozen=True)
class MapOf(Field):
    """A JSON object whose keys ``key`` allows, and each of whose values ``value`` allows."""

    value: Field
    key: Text = Text(MAX_NAME_CHARS)

    @property
    def allowed(self) -> str:
        return f"a JSON object, each key {self.key.allowed} and each value {self.value.allowed}"

    def refuse(self, value: Any, where: str) -> Refusal | None:
        if not isinstance(value, dict):
            return Refusal(where, value, self.allowed)
        for key, item in value.items():
            if not self.key.accepts(key):
                return Refusal(f"{where} key", key, self.key.allowed)
            if (refusal := self.value.refuse(item, f"{where}[{_shown_key(key)}]")) is not None:
                return refusal
        return None


@dataclass(frozen=True)
class Record(Field):
    """A JSON object with known ``fields`` (each checked when present; ``required`` ones must be) and
    maybe others, which pass unchecked."""

    fields: Mapping[str, Field]
    required: tuple[str, ...] = ()

    @property
    def allowed(self) -> str:
        return "a JSON object"

    def refuse(self, value: Any, where: str) -> Refusal | None:
        if not isinstance(value, dict):
            return Refusal(where, value, self.allowed)
        for name, spec in self.fields.items():
            inside = f"{where}.{name}" if where else name
            if name not in value:
                if name in self.required:
                    return Refusal(inside, _MISSING, spec.allowed)
                continue
            if (refusal := spec.refuse(value[name], inside)) is not None:
                return refusal
        return None


def _shown_key(key: str) -> str:
    return f'"{key}"' if len(key) <= 40 else f'"{key[:37]}..."'


# -- the fields ------------------------------------------------------------------------------

_ID = Text(MAX_ID_CHARS, 1)
_KERNEL = Text(MAX_ID_CHARS, 1, reserved=("*",))  # inside a worker "*" is all its kernels: no client names one so
_NAME = Text(MAX_NAME_CHARS)
_TEXT = Text(MAX_TEXT_CHARS)
_NAMES = ListOf(_NAME)
_SIZE = Integer()
_SECONDS = Number(low=0.0)
_VERSIONS = MapOf(_NAME)
_SCALAR = Maybe(AnyOf((Flag(), Number(), _NAME)))
_FORMATS = ListOf(Text(32))  # IPython's figure formats: png, retina, jpeg, svg, pdf...
_DIGESTS = MapOf(Text(128), key=Text(20, 1))  # {frame index: xxh3-128 digest}

# A name sent as a reference (wire/identity.py): to another name, to an object inside the inputs, or a
# view into another name's array.
_REFS = MapOf(Record({
    "same": _NAME, "input": _SIZE, "view": _NAME, "offset": _SIZE, "shape": ListOf(_SIZE),
    "strides": ListOf(Integer(-MAX_INTEGER)), "dtype": Json(), "layout": ListOf(Json()), "recarray": Flag(),
    "copy": _NAME, "kind": _NAME, "dict_view": Text(8, choices=("keys", "values", "items")), "of": _NAME,
    "list_iterator": _NAME, "position": _SIZE,
}))

# Values and what travels with them (wire/serialization.py): SUBMIT, RESULT, and an ERROR from a cell.
_PAYLOAD: dict[str, Field] = {
    "names": _NAMES, "counts": ListOf(Integer(0, 2**32)), "about": MapOf(Object()), "versions": _VERSIONS,
    "one_memo": Flag(), "refs": _REFS,
}

# What a job sends back, besides its values.
_RESULT: dict[str, Field] = {
    **_PAYLOAD,
    "kept_on_worker": MapOf(Record({"id": _NAME, "type": _TEXT, "why": _TEXT, "summary": _TEXT, "pull": Flag()})),
    "in_place": _NAMES, "deleted": _NAMES, "value_display": Record({"data": Object(), "metadata": Object()}),
    "files": Object(), "file": Object(), "duration_s": _SECONDS, "stats": Object(), "reset": Flag(),
}

_BATTERY = Maybe(Record({"percent": Number(low=0.0), "plugged_in": Maybe(Flag())}))

COMMON: dict[str, Field] = {"seq": Integer(1), "passes": Integer(0)}
"""What any message may carry: its number on the link it crosses, and the number of the large message it
passed there (wire/link.py)."""


def _header(fields: Mapping[str, Field], *required: str) -> Record:
    return Record({**COMMON, **fields}, required)


HEADERS: dict[str, Record] = {
    "hello": _header({
        "role": Text(16), "name": _NAME, "versions": _VERSIONS,
        "capabilities": Record({
            "hostname": _NAME, "platform": _NAME, "system": _NAME, "machine": _NAME, "python": _NAME,
            "cpu_count": _SIZE, "memory_bytes": _SIZE, "speed": _SECONDS, "battery": _BATTERY, "gpu": Object(),
            "labels": MapOf(_NAME), "on_battery": Text(16), "min_battery": Number(0.0, 100.0), "kernels": Flag(),
        }),
    }),
    "welcome": _header({
        "name": _NAME, "versions": _VERSIONS, "heartbeat_interval": _SECONDS, "outage_grace": _SECONDS,
        "max_message_bytes": _SIZE,
        "cache_bytes": _SIZE, "workers": ListOf(Object()),
    }),
    "heartbeat": _header({
        "stats": Record({
            "gpu": Object(), "sessions": MapOf(_SIZE), "max_sessions": _SIZE, "battery": _BATTERY,
            "kernels": MapOf(Record({"pid": _SIZE})),
        }),
        "abandons": _ID,  # the transfer of a large message its sender stopped midway (Ctrl-C)
        "versions": _VERSIONS,  # a worker's, read again now and then: a library installed while it runs
    }),
    "submit": _header({
        "job": _ID, "kind": Text(16, choices=("code", "call", "file", "reset")), "session": _ID, "op": Object(),
        "code": _TEXT, "outputs": Maybe(_NAMES), "worker": Maybe(_NAME),
        "require": Maybe(AnyOf((_NAME, _NAMES))), "prefer": Maybe(Text(32)),
        "timeout": Maybe(Number(finite=False)),  # not a positive, finite number: no timeout
        "gpu": AnyOf((Flag(), _NAMES)), "kernels": MapOf(_TEXT), "figure_formats": _FORMATS,
        "text_format": MapOf(_SCALAR), "keep": _NAMES, "max_result_bytes": _SIZE,
        "cached": _DIGESTS, "digests": _DIGESTS, "shared": Text(MAX_ID_CHARS), **_PAYLOAD,
    }, "job"),
    "started": _header({"job": _ID, "worker": _NAME}, "job"),
    "stream": _header({"job": _ID, "name": Text(16), "text": _TEXT}, "job"),
    "display": _header({
        "job": _ID, "data": MapOf(Json()), "metadata": Object(), "after_cell": Flag(),
        "framed": ListOf(ListOf(_NAME)), "display_id": _ID, "update": Flag(),
        "clear_output": Flag(), "wait": Flag(),
    }, "job"),
    "result": _header({"job": _ID, **_RESULT}, "job"),
    "error": _header({
        **_RESULT, "job": _ID, "error": Text(128), "message": _TEXT, "name": Maybe(_NAME),
        "remote_type": _TEXT, "remote_message": _TEXT, "remote_traceback": _TEXT,
        "line": Maybe(_SIZE), "column": Maybe(_SIZE), "path": Maybe(_TEXT), "missing": ListOf(Text(128)),
        "kernel": _KERNEL, "replace_executor": Flag(),
    }),
    "cancel": _header({"job": _ID, "reason": _TEXT}, "job"),
    "workers": _header({"request": Maybe(_ID), "workers": ListOf(Object()), "cache": Object()}),
    "bye": _header({"reason": _TEXT}),
    "session_end": _header({"session": _ID, "reason": _TEXT}, "session"),
    "jobs": _header({"request": Maybe(_ID), "jobs": ListOf(Object())}),
    "attach": _header({"job": _ID, "received": _SIZE}, "job"),
    "chunk": _header({
        "transfer": _ID, "offset": _SIZE, "sizes": ListOf(_SIZE), "type": Text(32), "job": _ID,
        "raw": Integer(0, CHUNK_BYTES),  # the piece's length before compression: at most one chunk
    }, "transfer", "offset", "sizes"),
    "chunk_ack": _header({"transfer": _ID, "received": _SIZE}, "transfer", "received"),
    # Delivery across reconnects (wire/link.py).
    "link_ack": _header({"ack": _SIZE, "resend": Flag()}, "ack"),
    "resume": _header({"jobs": ListOf(_ID), "received": _SIZE}, "jobs"),
    # Whole kernels on a worker (hub/jupyter_kernels.py, worker/jupyter_kernels.py).
    "kernel_start": _header({
        "kernel": _KERNEL, "key": _NAME, "signature_scheme": Text(64), "worker": Maybe(_NAME),
        "env": MapOf(_TEXT),
    }, "kernel"),
    "kernel_started": _header({
        "kernel": _KERNEL, "pid": _SIZE, "python": _NAME, "worker": _NAME, "orphan_grace_s": _SECONDS,
    }, "kernel"),
    "kernel_frames": _header({
        "kernel": _KERNEL, "channel": Text(16, choices=("shell", "control", "stdin", "hb", "iopub")),
    }, "kernel"),
    "kernel_signal": _header({"kernel": _KERNEL, "signum": Integer(0, 255)}, "kernel"),
    "kernel_stop": _header({
        "kernel": _KERNEL, "how": Text(16, choices=("terminate", "kill", "orphaned")), "reason": _TEXT,
    }, "kernel"),
    "kernel_died": _header({"kernel": _KERNEL, "exit_code": Maybe(Integer(-MAX_INTEGER)), "reason": _TEXT},
                           "kernel"),
}
"""Per message type (its wire name): the header fields it may carry and what each must be."""

_ANY_TYPE = _header({})


def check(msg: Message) -> None:
    """Raise ProtocolError when a field of ``msg``'s header is not what ``HEADERS`` allows for its type,
    naming the type, the field, what it was and what is allowed."""
    check_header(msg.type.value, msg.header)


def check_header(kind: str, header: Mapping[str, Any]) -> None:
    """``check`` for a header of the message type whose wire name is ``kind``."""
    refusal = HEADERS.get(kind, _ANY_TYPE).refuse(header, "")
    if refusal is None:
        return
    where, value, allowed = refusal
    article = "an" if kind[:1] in ("a", "e", "i", "o", "u") else "a"
    if value is _MISSING:
        raise ProtocolError(f"{article} {kind} message needs `{where}`: {allowed}")
    raise ProtocolError(f"{article} {kind} message's `{where}` is {describe(value)}; it must be {allowed}")


def job_of(header: Mapping[str, Any]) -> str | None:
    """The header's ``job`` when it is a valid job id (to name in a reply), else None."""
    job = header.get("job")
    return job if _ID.accepts(job) else None


def describe(value: Any) -> str:
    """A value as an error message shows it: short, whatever its size."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if abs(value) < 10**30:
            return f"the integer {value}"
        digits = int(value.bit_length() * math.log10(2)) + 1  # str() of a huge one raises
        return f"an integer of about {digits} digits"
    if isinstance(value, float):
        shown = "1e400 or more (infinity)" if value == math.inf else "-1e400 or less (-infinity)" \
            if value == -math.inf else "NaN" if math.isnan(value) else repr(value)
        return f"the number {shown}"
    if isinstance(value, str):
        return f"the string {value!r}" if len(value) <= 40 else f"a string of {len(value):,} characters"
    if isinstance(value, list):
        return f"a list of {len(value):,} item{'s' if len(value) != 1 else ''}"
    if isinstance(value, dict):
        return f"an object of {len(value):,} field{'s' if len(value) != 1 else ''}"
    return f"a {type(value).__name__}"
