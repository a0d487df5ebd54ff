"""A running job's output on its way to the hub, short writes put together.

The executor sends each flush at once (so what a job printed before it crashed has left its process);
here, on the worker, consecutive STREAM messages of one stream travel as one when they come within
``BATCH_S`` of the first: a job that prints and flushes 20,000 short lines sends a few dozen messages,
not 20,000, each line still reaching the notebook within a few tens of milliseconds. Order is kept:
anything else the job sends (a display, its end, the other stream) goes after what waits.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from remote_magic.wire.protocol import Message, MessageType as T, encode

from .outputs import STREAM_FLUSH_BYTES

BATCH_S = 0.03
"""How long the first text of a batch waits for more."""

_PLAIN_STREAM = frozenset({"job", "name", "text"})
"""A STREAM with nothing else in its header can join a batch."""


class StreamBatches:
    """Puts consecutive STREAM messages of one job's stream together; ``send`` takes encoded frames."""

    def __init__(self, send: Callable[[list[Any]], None], clock: Callable[[], float] = time.monotonic) -> None:
        self._send = send
        self._clock = clock
        self._header: dict[str, Any] | None = None  # the batch's job and stream
        self._parts: list[str] = []
        self._chars = 0
        self._since = 0.0

    def add(self, msg: Message, frames: list[Any]) -> None:
        """One message of the running job, in the order it came."""
        text = msg.header.get("text")
        if msg.type is not T.STREAM or msg.buffers or set(msg.header) != _PLAIN_STREAM or not isinstance(text, str):
            self.flush()
            self._send(frames)
            return
        header = self._header
        if header is None or (header["job"], header["name"]) != (msg.header["job"], msg.header["name"]) \
                or self._chars + len(text) > STREAM_FLUSH_BYTES:
            self.flush()
            self._header, self._since = {"job": msg.header["job"], "name": msg.header["name"]}, self._clock()
        self._parts.append(text)
        self._chars += len(text)

    def flush(self) -> None:
        """Send what waits now."""
        if self._header is None:
            return
        header = {**self._header, "text": "".join(self._parts)}
        self._header, self._parts, self._chars = None, [], 0
        self._send(encode(T.STREAM, header))

    def due_in(self) -> float | None:
        """Seconds until what waits must go, sending it once it is due; None when nothing waits."""
        if self._header is None:
            return None
        left = BATCH_S - (self._clock() - self._since)
        if left > 0:
            return left
        self.flush()
        return None
