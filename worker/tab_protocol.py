"""The browser-tab protocol, written once: what an executor's tab device (``gpu/tab_device.py``), the
worker's tab server (``browser/``) and the page (``browser/page/tab.js``) say to each other.
docs/tab-protocol.md describes it; ``tests/browser/test_tab_protocol.py`` holds tab.js to the names here.

A binary message is a little-endian u32 header length, the header as JSON, then the blobs it refers
to (array data going up, values read back coming down), each at an 8-byte-aligned offset so the tab
can view them as typed arrays without a copy. The bridge puts a u32 sequence number in front of each
batch it relays to a tab, and the tab puts it back on its answer. Text messages are the page's
control messages (``PAGE_SAYS``) and the server's (``SERVER_SAYS``).

Everything a tab sends is checked here before anything reads it (``check_answer``, ``check_control``),
as ``remote_magic/wire/schema.py`` checks what peers send the hub.
"""

from __future__ import annotations

import json
import struct
from typing import Any, Mapping, Sequence

from remote_magic.errors import ProtocolError
from remote_magic.wire.schema import Field, Flag, Integer, ListOf, MapOf, Maybe, Number, Object, Record, Text, describe

ALIGN = 8
MAX_BATCH_BYTES = 32 * 10**6
"""Blob bytes one batch carries at most: larger uploads and readbacks are split into several."""
MAX_MESSAGE_BYTES = MAX_BATCH_BYTES + 4 * 10**6
"""What a tab or an executor may send in one message (a batch and its header); more is refused."""

OPERATIONS: dict[str, int] = {"call": 5, "get": 4, "device": 2, "compile": 4, "read": 4, "drop": 2, "dispatches": 3}
"""A batch's calls, each a list ``[operation, ...]`` of this many items:

- ``["call", target, method, args, result]``: ``target.method(...args)``, kept as ``result`` (an id) or not (null);
- ``["get", target, attribute, result]``: ``target.attribute``, kept as ``result``;
- ``["device", id]``: the tab's device (shared by the tab's executors), kept as ``id``;
- ``["compile", id, label, code]``: a WGSL module, its compile errors with their line and column;
- ``["read", buffer, offset, size]``: the buffer's bytes, a blob of the answer;
- ``["drop", [ids]]``: objects the executor no longer holds;
- ``["dispatches", pass, [[pipeline, bind_group, x, y, z], ...]]``: each run's pipeline, its bind group 0 and its
  workgroups, recorded into the compute pass (a jitted step's kernels: one call for all of them)."""

PAGE_SAYS = ("hello", "alive", "lost")
"""The page's control messages: its hello (the secret first), that it is alive (every second, with how many
calls it has run: its progress), and that a device was lost."""
SERVER_SAYS = ("ticket", "welcome", "job")
"""The server's control messages: on ``/hello``, the one-time ticket a proven hello gets; on ``/ws``, the tab's
worker name, once it is known and again once it joined, and the id of the job its worker runs whenever that
changes (null: idle), so the page can say what it is doing."""

# Close codes the page reads: 44xx means "refused, don't retry".
BACKGROUND = 4000
"""The page closes with this code when it goes to the background..."""
CLOSED = 4001
"""...and with this one when it is closed or reloaded."""
REFUSED_MESSAGE = 4400
REFUSED_SECRET = 4401
TOO_MANY_TABS = 4429
CLOSE_CODES = {"background": BACKGROUND, "closed": CLOSED, "refused_message": REFUSED_MESSAGE,
               "refused_secret": REFUSED_SECRET, "too_many_tabs": TOO_MANY_TABS}

MAX_SECRET_CHARS = 100
MAX_NAME_CHARS = 100
MAX_REASON_CHARS = 1000

_TEXT = Text(100_000)
_ANSWER = Record({
    "id": Maybe(Integer(0)), "ms": Number(0.0), "tab": Text(MAX_NAME_CHARS),
    "reads": ListOf(ListOf(Integer(0))), "adapter": Object(), "limits": MapOf(Number()),
    "error": Record({"message": _TEXT, "lost": Flag(), "line": Maybe(Integer(0)), "column": Maybe(Integer(0))},
                    ("message",)),
})
_CONTROL: dict[str, Record] = {
    "hello": Record({"type": Text(16), "secret": Text(MAX_SECRET_CHARS), "name": Text(MAX_NAME_CHARS),
                     "adapter": Object(), "limits": Object()}, ("secret",)),
    "alive": Record({"type": Text(16), "done": Integer(0), "compiling": Flag()}),
    "lost": Record({"type": Text(16), "reason": Text(MAX_REASON_CHARS)}),
}

_LENGTH = struct.Struct("<I")


def padded(n: int) -> int:
    """``n`` rounded up to the blobs' alignment."""
    return -(-n // ALIGN) * ALIGN


def encode(header: dict[str, Any], blobs: Sequence[bytes | memoryview] = ()) -> bytes:
    """One message: ``header`` (JSON) then ``blobs``, each padded to 8 bytes; a header names a blob by its
    offset from the first."""
    text = json.dumps(header, separators=(",", ":")).encode()
    start = padded(_LENGTH.size + len(text))
    parts: list[bytes | memoryview] = [_LENGTH.pack(len(text)), text, bytes(start - _LENGTH.size - len(text))]
    for blob in blobs:
        size = memoryview(blob).nbytes
        parts += [blob, bytes(padded(size) - size)]
    return b"".join(parts)


def decode(message: bytes | memoryview) -> tuple[dict[str, Any], memoryview]:
    """The header and the blob area of a message; :class:`ProtocolError` if it is malformed."""
    view = memoryview(message)
    if view.nbytes < _LENGTH.size:
        raise ProtocolError("a tab message shorter than its header length")
    (length,) = _LENGTH.unpack_from(view)
    if _LENGTH.size + length > view.nbytes:
        raise ProtocolError("a tab message whose header runs past its end")
    try:
        header = json.loads(bytes(view[_LENGTH.size:_LENGTH.size + length]))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"a tab message whose header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ProtocolError("a tab message whose header is not an object")
    return header, view[padded(_LENGTH.size + length):]


def check_answer(header: Mapping[str, Any], blobs: memoryview) -> None:
    """Refuse an answer whose header isn't what a tab sends, or whose reads lie outside its blobs."""
    _check("answer", _ANSWER, header)
    reads = header.get("reads", ())
    if any(len(pair) != 2 for pair in reads):
        raise ProtocolError("an answer's reads must each be [offset, size]")
    for at, size in reads:
        if at + size > blobs.nbytes:
            raise ProtocolError(f"an answer reads {size} bytes at {at}, past its {blobs.nbytes} bytes of blobs")


def check_control(text: str) -> dict[str, Any]:
    """The page's control message in ``text``, checked; :class:`ProtocolError` naming what is wrong."""
    try:
        message = json.loads(text)
    except ValueError:
        raise ProtocolError("a control message that is not JSON") from None
    if not isinstance(message, dict) or message.get("type") not in PAGE_SAYS:
        raise ProtocolError(f"a control message must be a JSON object whose type is one of {', '.join(PAGE_SAYS)}")
    _check(message["type"], _CONTROL[message["type"]], message)
    return message


def _check(kind: str, spec: Field, header: Mapping[str, Any]) -> None:
    refusal = spec.refuse(header, "")
    if refusal is not None:
        where, value, allowed = refusal
        raise ProtocolError(f"a tab's {kind} whose `{where}` is {describe(value)}: it must be {allowed}")


def check_batch(header: Mapping[str, Any]) -> None:
    """Refuse a batch with an operation the page doesn't run, or with the wrong number of items."""
    for call in header.get("calls", ()):
        if not isinstance(call, list) or not call or OPERATIONS.get(call[0]) != len(call):
            raise ProtocolError(f"a batch's call {call!r:.80} is not one of the page's operations "
                                f"({', '.join(OPERATIONS)}) with its items")


def error_reply(message: str, *, lost: bool) -> bytes:
    """The reply the bridge gives an executor for a tab that can't answer; ``lost``: the tab is gone."""
    return encode({"error": {"message": message, "lost": lost}})
