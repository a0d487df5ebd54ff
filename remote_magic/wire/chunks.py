"""Large messages in chunks, paced by their acknowledgements, so heartbeats never wait behind them.

On a slow link one large message would hold the connection for as long as it takes to cross, and
every heartbeat, libzmq PONG and interrupt queued behind it would wait as long: the far side takes
the peer for gone. So a message over ``CHUNKED_OVER`` bytes leaves as CHUNK messages of at most
``CHUNK_BYTES``, each naming its transfer, its byte offset and the whole message's frame sizes. The
receiver copies each into place and answers CHUNK_ACK with how many bytes it holds in order. The
sender keeps about ``PACE_S`` seconds of the link's measured rate unacknowledged, so what is queued
behind waits about that long, whatever the size. A chunk lost with a dropped connection is sent
again from the last acknowledged byte once acknowledgements stop for ``RESEND_AFTER_S``. Messages
keep their order: one that follows a large message leaves once its last chunk is acknowledged.

A chunk whose bytes compress well (zstd, decided from a sample of the message) is compressed when
the link is slow enough for that to win; on a fast link everything goes raw.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import zstandard

from ..errors import ProtocolError
from .protocol import Message, MessageType as T, encode

log = logging.getLogger(__name__)

CHUNK_BYTES = 256 << 10
"""The most payload one chunk carries: at 1 Mbit/s it crosses in 2 s, well inside the heartbeat bound."""

CHUNKED_OVER = 1 << 20
"""Messages larger than this travel in chunks; smaller ones whole."""

PACE_S = 1.0
"""How many seconds of the link's measured rate may be unacknowledged at once."""

MIN_WINDOW_BYTES = 2 * CHUNK_BYTES
MAX_WINDOW_BYTES = 64 << 20

RESEND_AFTER_S = 4.0
"""With chunks unacknowledged and no acknowledgement for this long, send again from the last one."""

COMPRESS_BELOW_RATIO = 0.7
"""A message is worth compressing when a sample of it shrinks to less than this."""

ZSTD_BYTES_PER_S = 300e6
"""A conservative single-core speed of zstd level 1 (it compresses at 300-500 MB/s, decompresses faster)."""

SLOW_LINK_BYTES_PER_S = 2e6
"""Below this (16 Mbit/s) chunks are compressed at zstd level 3: slower (still 100 MB/s and more, far
above the link), a few percent smaller; above it, level 1."""

_SAMPLE_BYTES = 16 << 10
_SAMPLES = 4

OnProgress = Callable[[Mapping[str, Any], int, int], None]
"""Called with a transfer's ``about`` (job id and message type), bytes done and bytes in all."""


def _about(frames: Sequence[memoryview]) -> dict[str, Any]:
    """What progress reports say a large message is: its type, and its job if it has one."""
    about: dict[str, Any] = {"type": bytes(frames[1]).decode(errors="replace")}
    try:
        job = json.loads(bytes(frames[2])).get("job")
    except (ValueError, AttributeError):
        job = None
    if isinstance(job, str):
        about["job"] = job
    return about


def _flat(frame: Any) -> memoryview:
    view = frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


@dataclass
class _Transfer:
    """One large message on its way out."""

    frames: list[memoryview]
    about: dict[str, Any]
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    sent: int = 0        # bytes handed to the socket
    acked: int = 0       # bytes the far side holds in order
    started: float | None = None
    last_ack: float = 0.0
    compressible: bool | None = None  # decided from a sample when the link is slow enough to care
    # What the link carries, compressed or not: the chunks in flight (their end, their size on the
    # wire), and the wire bytes acknowledged. The rate and the window count these.
    in_flight: deque[tuple[int, int]] = field(default_factory=deque)
    wire_in_flight: int = 0
    wire_acked: int = 0

    def __post_init__(self) -> None:
        self.sizes = [f.nbytes for f in self.frames]
        self.total = sum(self.sizes)

    def piece(self, offset: int, length: int) -> list[memoryview]:
        """The bytes [offset, offset + length) of the frames laid end to end, as views."""
        views, start = [], 0
        for frame in self.frames:
            end = start + frame.nbytes
            if end > offset and start < offset + length:
                views.append(frame[max(0, offset - start):min(frame.nbytes, offset + length - start)])
            start = end
        return views

    def sample_shrinks(self, compressor: zstandard.ZstdCompressor) -> bool:
        """Does a sample from across the message compress well?"""
        step = max(1, self.total // _SAMPLES)
        sample = b"".join(b"".join(bytes(v) for v in self.piece(i * step, _SAMPLE_BYTES)) for i in range(_SAMPLES))
        return len(compressor.compress(sample)) < COMPRESS_BELOW_RATIO * len(sample)


class Outbox:
    """What one link sends, in order: small messages whole, large ones in paced chunks.

    ``send(frames)`` tries to send one message now and says False when the link's queue has no
    room (nothing was sent). Call ``pump`` when the link may take more (it has room again, an
    acknowledgement came, time passed); ``on_ack`` with each CHUNK_ACK.
    """

    def __init__(self, send: Callable[[list[Any]], bool], *, chunked: bool = True,
                 on_progress: OnProgress | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._send = send
        self._clock = clock
        self._chunked = chunked
        self._on_progress = on_progress
        self._queue: deque[list[Any] | _Transfer] = deque()
        self.pending_bytes = 0
        self.waiting_for_room = False  # True: the socket is full; False with items queued: acknowledgements
        self._rate: float | None = None  # bytes/s the far side acknowledged, from the last transfer
        self._compressors: dict[int, zstandard.ZstdCompressor] = {}

    def __len__(self) -> int:
        return len(self._queue)

    def put(self, frames: list[Any]) -> None:
        """Queue an encoded message behind what is queued, and send what the link takes now."""
        views = [_flat(f) for f in frames]
        size = sum(v.nbytes for v in views)
        large = self._chunked and size > CHUNKED_OVER
        self._queue.append(_Transfer(views, _about(views)) if large else frames)
        self.pending_bytes += size
        self.pump()

    def clear(self) -> None:
        """Drop everything queued (the far side forgot this link, and what it was for)."""
        self._queue.clear()
        self.pending_bytes = 0
        self.waiting_for_room = False

    def pump(self) -> None:
        """Send what the link takes now, in order."""
        now = self._clock()
        self.waiting_for_room = False
        while self._queue:
            head = self._queue[0]
            if isinstance(head, _Transfer):
                if not self._pump_transfer(head, now):
                    return
            elif self._send(head):
                self.pending_bytes -= sum(_flat(f).nbytes for f in head)
            else:
                self.waiting_for_room = True
                return
            self._queue.popleft()

    def window(self) -> int:
        """How many bytes may be unacknowledged: ``PACE_S`` of the measured rate, within bounds."""
        if self._rate is None:
            return MIN_WINDOW_BYTES
        return int(min(MAX_WINDOW_BYTES, max(MIN_WINDOW_BYTES, self._rate * PACE_S)))

    def _pump_transfer(self, transfer: _Transfer, now: float) -> bool:
        """Send the transfer's next chunks; True once all of it is acknowledged."""
        if transfer.acked >= transfer.total:
            return True
        if transfer.started is None:
            transfer.started = transfer.last_ack = now
        elif transfer.sent > transfer.acked and now - transfer.last_ack > RESEND_AFTER_S:
            log.info("no acknowledgement for %.0f s: sending again from byte %d of %d",
                     now - transfer.last_ack, transfer.acked, transfer.total)
            transfer.sent, transfer.last_ack = transfer.acked, now
            transfer.in_flight.clear()
            transfer.wire_in_flight = 0
        while transfer.sent < transfer.total and transfer.wire_in_flight < self.window():
            length = min(CHUNK_BYTES, transfer.total - transfer.sent)
            header: dict[str, Any] = {"transfer": transfer.id, "offset": transfer.sent, "sizes": transfer.sizes,
                                      **transfer.about}
            piece: Sequence[Any] = transfer.piece(transfer.sent, length)
            if self._worth_compressing(transfer):
                level = 3 if self._rate is not None and self._rate < SLOW_LINK_BYTES_PER_S else 1
                packed = self._compressor(level).compress(b"".join(bytes(v) for v in piece))
                if len(packed) < length:
                    header["raw"], piece = length, [packed]
            if not self._send(encode(T.CHUNK, header, piece)):
                self.waiting_for_room = True
                return False
            transfer.sent += length
            wire = sum(memoryview(p).nbytes for p in piece)
            transfer.in_flight.append((transfer.sent, wire))
            transfer.wire_in_flight += wire
        return False

    def _worth_compressing(self, transfer: _Transfer) -> bool:
        # Compressing a chunk costs length / ZSTD_BYTES_PER_S; it wins when the link is several times slower.
        if self._rate is None or self._rate * 4 > ZSTD_BYTES_PER_S:
            return False
        if transfer.compressible is None:
            transfer.compressible = transfer.sample_shrinks(self._compressor(1))
        return transfer.compressible

    def _compressor(self, level: int) -> zstandard.ZstdCompressor:
        # One per outbox and level: an outbox is used by one thread, and compressors aren't thread-safe.
        if level not in self._compressors:
            self._compressors[level] = zstandard.ZstdCompressor(level=level)
        return self._compressors[level]

    def on_ack(self, header: Mapping[str, Any]) -> None:
        """The far side holds ``received`` bytes of ``transfer`` in order."""
        now = self._clock()
        head = self._queue[0] if self._queue else None
        received = header.get("received")
        if not isinstance(head, _Transfer) or head.id != header.get("transfer") or not isinstance(received, int):
            return  # an acknowledgement of something already done, or dropped
        if received < head.acked:  # the far side lost what it held (it forgot this link): start again there
            head.sent = head.acked = max(0, received)
            head.in_flight.clear()
            head.wire_in_flight = 0
        elif received > head.acked:
            head.acked, head.last_ack = min(received, head.total), now
            while head.in_flight and head.in_flight[0][0] <= head.acked:
                wire = head.in_flight.popleft()[1]
                head.wire_in_flight -= wire
                head.wire_acked += wire
            started = now if head.started is None else head.started
            self._rate = head.wire_acked / max(now - started, 1e-6)
            log.debug("transfer %s: %d of %d bytes acknowledged, %.0f bytes/s",
                      head.id, head.acked, head.total, self._rate)
            if self._on_progress is not None:
                self._on_progress(head.about, head.acked, head.total)
        if head.acked >= head.total:
            self.pending_bytes -= head.total
        self.pump()


@dataclass
class _Partial:
    """One large message arriving."""

    sizes: list[int]
    buffer: bytearray
    about: dict[str, Any]
    received: int = 0
    touched: float = 0.0


class Inbox:
    """Large messages arriving in chunks from one link, put back together.

    ``add`` takes a CHUNK and returns how many bytes of its transfer are held in order (to
    acknowledge) and, once it is whole, the message's frames.
    """

    def __init__(self, max_bytes: int | None = None, on_progress: OnProgress | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._max_bytes = max_bytes
        self._clock = clock
        self._on_progress = on_progress
        self._partial: dict[str, _Partial] = {}
        self._decompressor = zstandard.ZstdDecompressor()

    def add(self, msg: Message) -> tuple[int, list[memoryview] | None]:
        """Take one chunk; raises ProtocolError for one that can't be part of a message."""
        now = self._clock()
        header = msg.header
        transfer, offset, sizes = header.get("transfer"), header.get("offset"), header.get("sizes")
        if not isinstance(transfer, str) or not isinstance(offset, int) or not isinstance(sizes, list) \
                or not all(isinstance(s, int) and s >= 0 for s in sizes) or len(sizes) < 3:
            raise ProtocolError("a chunk needs a transfer id, an offset and its message's frame sizes")
        total = sum(sizes)
        if self._max_bytes is not None and total > self._max_bytes:
            raise ProtocolError(f"a message of {total / 2**20:.0f} MiB is over this hub's "
                                f"{self._max_bytes / 2**20:.0f} MiB limit (remote-worker --max-message-mb)")
        partial = self._partial.get(transfer)
        if partial is None:
            if offset != 0:
                return 0, None  # we hold nothing of it (we forgot, or restarted): the sender starts again
            partial = self._partial[transfer] = _Partial(sizes, bytearray(), {
                k: header[k] for k in ("job", "type") if k in header})
        partial.touched = now
        data = memoryview(b"".join(bytes(_flat(b)) for b in msg.buffers)) if len(msg.buffers) != 1 \
            else _flat(msg.buffers[0])
        if "raw" in header:
            data = memoryview(self._decompressor.decompress(bytes(data), max_output_size=int(header["raw"])))
        if offset == partial.received and offset + data.nbytes <= total:
            partial.buffer += data  # grows with what arrived, never to what a header merely claims
            partial.received += data.nbytes
            if self._on_progress is not None:
                self._on_progress(partial.about, partial.received, total)
        if partial.received < total:
            return partial.received, None
        del self._partial[transfer]
        whole, frames, start = memoryview(partial.buffer), [], 0
        for size in partial.sizes:
            frames.append(whole[start:start + size])
            start += size
        return total, frames

    def drop_older_than(self, seconds: float) -> None:
        """Forget messages no chunk of which came for ``seconds`` (their sender gave up)."""
        now = self._clock()
        for transfer in [t for t, p in self._partial.items() if now - p.touched > seconds]:
            log.info("dropped a message that stopped arriving %.0f s ago", now - self._partial[transfer].touched)
            del self._partial[transfer]


def ack(msg: Message, received: int) -> list[Any]:
    """The CHUNK_ACK answering a chunk."""
    return encode(T.CHUNK_ACK, {"transfer": msg.header.get("transfer"), "received": received})
