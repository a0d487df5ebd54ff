"""Messages between an executor's tab device, the worker's tab bridge and the tab itself.

One binary message is a little-endian u32 header length, the header as JSON, then the blobs it
refers to (array data going up, values read back coming down), each at an 8-byte-aligned offset
so the tab can view them as typed arrays without a copy. The bridge puts a u32 sequence number in
front of each message it relays to a tab, and the tab puts it back on the reply.
"""

from __future__ import annotations

import json
import struct
from typing import Any, Sequence

from remote_magic.errors import ProtocolError

ALIGN = 8
MAX_BATCH_BYTES = 32 * 10**6
"""Blob bytes one batch carries at most: larger uploads and readbacks are split into several."""
MAX_MESSAGE_BYTES = MAX_BATCH_BYTES + 4 * 10**6
"""What a tab or an executor may send in one message (a batch and its header); more is refused."""

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


def error_reply(message: str, *, lost: bool) -> bytes:
    """The reply the bridge gives an executor for a tab that can't answer; ``lost``: the tab is gone."""
    return encode({"error": {"message": message, "lost": lost}})
