"""What one link sends, in order and numbered, with large messages in paced chunks; and chunks put back together.

On a slow link one large message would hold the connection for as long as it takes to cross, and
every heartbeat, libzmq PONG and interrupt queued behind it would wait as long: the far side takes
the peer for gone. So a message larger than the window below (at most ``CHUNKED_OVER`` bytes) leaves as
CHUNK messages, each naming its transfer, its byte offset and the whole message's frame sizes. The
receiver copies each into place and answers CHUNK_ACK with how many bytes it holds in order. The sender
keeps about ``PACE_S`` seconds of what the link drained lately (acknowledged bytes over time)
unacknowledged, in chunks of at most a quarter of that, so whatever is queued behind waits about that
long, whatever the size and the loss. Messages keep their order, but for one: while a large message waits
for acknowledgements, a small numbered one of another job queued right behind it may leave between its
chunks (``passes`` in its header names the number it passes), when the far side's link takes such
messages (``Outbox.overtaking``, wire/link.py). A job's own messages never pass each other.

Nothing is sent again on a timer: on a live connection TCP loses nothing, however slowly it delivers.
What a broken connection had in flight is sent again when the link says so (``rewind``, wire/link.py):
numbered messages that left but were not acknowledged, and a large message from its last acknowledged
byte. A receiver remembers the transfers it finished, so a chunk of one sent again is acknowledged, not
assembled twice.

A chunk whose bytes compress well (zstd, decided from a sample of the message) is compressed when
the link is slow enough for that to win; on a fast link everything goes raw.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import zstandard

from ..errors import ProtocolError
from .protocol import Message, MessageType as T, encode
from .sizes import human_size

log = logging.getLogger(__name__)

CHUNK_BYTES = 256 << 10
"""The most payload one chunk carries; on a slow link chunks are smaller (a quarter of the window)."""

MIN_CHUNK_BYTES = 16 << 10
"""The least payload a chunk carries (its header and encryption cost about 1% of that)."""

CHUNKED_OVER = 1 << 20
"""Messages larger than this travel in chunks; smaller ones whole."""

PASSING_BYTES = 64 << 10
"""A message of at most this many bytes may pass a large message of another job (its output, a small result)."""

PACE_S = 1.0
"""How many seconds of the link's measured rate may be unacknowledged at once."""

FIRST_WINDOW_BYTES = 256 << 10
"""What may be unacknowledged before the link's rate is known."""

MIN_WINDOW_BYTES = 64 << 10
MAX_WINDOW_BYTES = 64 << 20

RATE_SPAN_S = 2.0
"""The rate is what was acknowledged over about the last this-many seconds of a transfer."""

FINISHED_KEPT = 1024
"""How many finished transfers a receiver remembers, to acknowledge their chunks sent again."""

MAX_UNFINISHED = 4
"""How many large messages one link may have part-received at once: a sender sends one at a time, and
after a reconnect may start one again."""

COMPRESS_BELOW_RATIO = 0.7
"""A message is worth compressing when a sample of it shrinks to less than this."""

ZSTD_BYTES_PER_S = 300e6
"""A conservative single-core speed of zstd level 1 (it compresses at 300-500 MB/s, decompresses faster)."""

SLOW_LINK_BYTES_PER_S = 2e6
"""Below this (16 Mbit/s) chunks are compressed at zstd level 3: slower (still 100 MB/s and more, far
above the link), a few percent smaller; above it, level 1."""

UNNUMBERED = frozenset({T.HELLO, T.WELCOME, T.HEARTBEAT, T.BYE, T.CHUNK, T.CHUNK_ACK, T.LINK_ACK})
"""What a link never numbers: greetings, liveness, and its own chunks and acknowledgements. Everything
else (jobs, their output and results, cancels, kernels' frames, listings) is numbered."""

_UNNUMBERED_WIRE = frozenset(t.value.encode() for t in UNNUMBERED)

_SAMPLE_BYTES = 16 << 10
_SAMPLES = 4

OnProgress = Callable[[Mapping[str, Any], int, int], None]
"""Called with a transfer's ``about`` (job id and message type), bytes done and bytes in all."""


def _about(frames: Sequence[memoryview]) -> dict[str, Any]:
    """What progress reports say a message is: its type, and its job if it has one."""
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


def numbered(frames: list[Any], seq: int, key: bytes = b"seq") -> list[Any]:
    """The message with ``seq`` last in its header (as ``key``): spliced in, not parsed again. A message
    forwarded as it came carries its sender's number too, earlier in the header; JSON's last key wins."""
    header = _flat(frames[2]).tobytes().rstrip()
    if header[:1] != b"{" or header[-1:] != b"}":
        raise ValueError("a header is a JSON object")
    spliced = b'%s%s"%s":%d}' % (header[:-1], b"" if header[1:-1].strip() == b"" else b",", key, seq)
    return [frames[0], frames[1], spliced, *frames[3:]]


@dataclass
class _Whole:
    """A message that leaves in one piece."""

    frames: list[Any]
    size: int
    seq: int | None = None
    passes: int | None = None  # the large message it passed (its number), once it did

    @property
    def job(self) -> str | None:
        return _about([_flat(f) for f in self.frames[:3]]).get("job")


class _Drain:
    """What a link drained lately: wire bytes acknowledged per second over about the last ``RATE_SPAN_S``
    it was busy, whatever it did before it last went idle."""

    def __init__(self) -> None:
        self.acked = 0
        self._samples: deque[tuple[float, int]] = deque()

    def busy_from(self, now: float) -> None:
        """The link had nothing in flight, and now sends: measure from here."""
        self._samples.clear()
        self._samples.append((now, self.acked))

    def add(self, now: float, wire: int) -> float | None:
        """``wire`` more bytes acknowledged; the rate now (None until there is time to measure)."""
        self.acked += wire
        self._samples.append((now, self.acked))
        while len(self._samples) > 2 and now - self._samples[1][0] >= RATE_SPAN_S:
            self._samples.popleft()
        since, acked_then = self._samples[0]
        return (self.acked - acked_then) / (now - since) if now - since > 1e-6 else None


@dataclass
class _ChunkedMessage:
    """One large message on its way out."""

    frames: list[memoryview]
    about: dict[str, Any]
    seq: int | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    sent: int = 0        # bytes handed to the socket
    acked: int = 0       # bytes the far side holds in order
    compressible: bool | None = None  # decided from a sample when the link is slow enough to care
    # What the link carries, compressed or not: the chunks in flight (their end, their size on the
    # wire, when they left), and the wire bytes acknowledged. The rate and the window count these.
    in_flight: deque[tuple[int, int, float]] = field(default_factory=deque)
    wire_in_flight: int = 0

    def __post_init__(self) -> None:
        self.sizes = [f.nbytes for f in self.frames]
        self.total = sum(self.sizes)

    @property
    def job(self) -> str | None:
        return self.about.get("job")

    @property
    def size(self) -> int:
        return self.total

    def piece(self, offset: int, length: int) -> list[memoryview]:
        """The bytes [offset, offset + length) of the frames laid end to end, as views."""
        views, start = [], 0
        for frame in self.frames:
            end = start + frame.nbytes
            if end > offset and start < offset + length:
                views.append(frame[max(0, offset - start):min(frame.nbytes, offset + length - start)])
            start = end
        return views

    def rewind(self) -> None:
        """What was in flight is gone: send again from the last acknowledged byte."""
        self.sent = self.acked
        self.in_flight.clear()
        self.wire_in_flight = 0

    def sample_shrinks(self, compressor: zstandard.ZstdCompressor) -> bool:
        """Does a sample from across the message compress well?"""
        step = max(1, self.total // _SAMPLES)
        sample = b"".join(b"".join(bytes(v) for v in self.piece(i * step, _SAMPLE_BYTES)) for i in range(_SAMPLES))
        return len(compressor.compress(sample)) < COMPRESS_BELOW_RATIO * len(sample)


class Outbox:
    """What one link sends, in order: small messages whole, large ones in paced chunks, numbered.

    ``put(frames)`` queues one message and sends what the link takes now; ``send`` (given) says False
    when the link's queue has no room (nothing was sent). Call ``pump`` when the link may take more (it
    has room again, an acknowledgement came); ``on_ack`` with each CHUNK_ACK, ``acked`` with each
    link acknowledgement, and ``rewind`` when the connection broke and what was in flight is gone.
    """

    def __init__(self, send: Callable[[list[Any]], bool], *, chunked: bool = True,
                 on_progress: OnProgress | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._send = send
        self._clock = clock
        self._chunked = chunked
        self._on_progress = on_progress
        self._queue: deque[_Whole | _ChunkedMessage] = deque()
        # Numbered messages that left (a large one: all its chunks acknowledged), until the far side says it
        # took them.
        self._unacked: deque[_Whole | _ChunkedMessage] = deque()
        self._next_seq = 1
        self.acked_seq = 0  # the far side holds every numbered message up to this one
        self.pending_bytes = 0
        self.waiting_for_room = False  # True: the socket is full; False with items queued: acknowledgements
        self.overtaking = False
        """May a small message of another job pass a large one (the far side's link delivers it ahead)?"""
        self._rate: float | None = None  # wire bytes/s the far side acknowledged lately
        self._drain = _Drain()
        self._min_rtt: float | None = None  # the link's round trip without queueing, at least
        self._compressors: dict[int, zstandard.ZstdCompressor] = {}

    def __len__(self) -> int:
        return len(self._queue)

    def put(self, frames: list[Any]) -> int | None:
        """Queue an encoded message behind what is queued, and send what the link takes now; its ``seq``
        (None for the kinds a link doesn't number)."""
        seq = None
        if _flat(frames[1]).tobytes() not in _UNNUMBERED_WIRE:
            seq, self._next_seq = self._next_seq, self._next_seq + 1
            frames = numbered(frames, seq)
            if b'"passes"' in frames[2]:  # forwarded as it came: what it passed on its last link, none here
                frames = numbered(frames, 0, b"passes")
        views = [_flat(f) for f in frames]
        size = sum(v.nbytes for v in views)
        if self._chunked and size > min(CHUNKED_OVER, self.window()):
            self._queue.append(_ChunkedMessage(views, _about(views), seq))
        else:
            self._queue.append(_Whole(frames, size, seq))
        self.pending_bytes += size
        self.pump()
        return seq

    def clear(self) -> None:
        """Drop everything, and number from 1 again (the far side forgot this link, and what it was for)."""
        self._queue.clear()
        self._unacked.clear()
        self._next_seq, self.acked_seq = 1, 0
        self.pending_bytes = 0
        self.waiting_for_room = False

    def acked(self, upto: int) -> None:
        """The far side holds every numbered message up to ``upto``."""
        self.acked_seq = max(self.acked_seq, min(upto, self._next_seq - 1))
        while self._unacked and (self._unacked[0].seq or 0) <= self.acked_seq:
            self._unacked.popleft()

    def rewind(self) -> None:
        """The connection broke: send again, in order, what left but wasn't acknowledged, and a large
        message from its last acknowledged byte. (One whose chunks all arrived goes again from its start:
        the far side may have dropped it, after a gap; if it took it, it says so at the first chunk.)"""
        for item in sorted(self._unacked, key=_number, reverse=True):  # in order, those that passed one too
            if isinstance(item, _ChunkedMessage):
                item.acked = 0
                item.rewind()
            self._queue.appendleft(item)
            self.pending_bytes += item.size
        if self._unacked:
            log.info("the connection broke: sending %d unacknowledged messages again", len(self._unacked))
        self._unacked.clear()
        for item in self._queue:
            if isinstance(item, _ChunkedMessage) and item.sent > item.acked:
                log.info("the connection broke: sending again from byte %d of %d", item.acked, item.total)
                item.rewind()
        self.pump()

    def abort(self, job: str) -> bool:
        """Send nothing more of ``job``'s messages that haven't wholly left; True if there were any.

        A numbered one leaves as a numbered heartbeat instead (the far side's numbering has no gap),
        naming the transfer the far side may hold part of, so it drops that part."""
        found, kept = False, deque[_Whole | _ChunkedMessage]()
        for item in self._queue:
            if item.job != job:
                kept.append(item)
                continue
            found = True
            self.pending_bytes -= item.size
            if item.seq is not None:
                header: dict[str, Any] = {"seq": item.seq}
                if isinstance(item, _ChunkedMessage) and item.sent:
                    header["abandons"] = item.id
                stand_in = encode(T.HEARTBEAT, header)
                kept.append(_Whole(stand_in, sum(len(f) for f in stand_in), item.seq))
                self.pending_bytes += kept[-1].size
        self._queue = kept
        self.pump()
        return found

    def jobs(self) -> set[str]:
        """The jobs of the messages not yet acknowledged or not yet sent."""
        return {job for item in (*self._unacked, *self._queue) if (job := item.job) is not None}

    def pump(self) -> None:
        """Send what the link takes now, in order."""
        now = self._clock()
        self.waiting_for_room = False
        while self._queue:
            head = self._queue[0]
            if isinstance(head, _ChunkedMessage):
                if not self._pump_chunks(head, now):
                    if self.overtaking and not self.waiting_for_room:
                        self._pass(head)
                    return
                if head.seq is not None and head.seq > self.acked_seq:
                    self._unacked.append(head)
                    if len(self._unacked) > 1 and _number(self._unacked[-2]) > _number(head):
                        self._unacked = deque(sorted(self._unacked, key=_number))  # behind those that passed it
            elif self._send(head.frames):
                self.pending_bytes -= head.size
                if head.seq is not None:
                    self._unacked.append(head)
            else:
                self.waiting_for_room = True
                return
            self._queue.popleft()

    def _pass(self, head: _ChunkedMessage) -> None:
        """While ``head`` waits for acknowledgements, send the small numbered messages of other jobs right behind
        it, each saying which number it passes (the far side delivers it ahead of that one)."""
        while len(self._queue) > 1 and head.seq is not None:
            item = self._queue[1]
            if not isinstance(item, _Whole) or item.seq is None or item.size > PASSING_BYTES \
                    or item.job in (None, head.job):
                return
            if item.passes is None:
                item.frames, item.passes = numbered(item.frames, head.seq, b"passes"), head.seq
            if not self._send(item.frames):
                self.waiting_for_room = True
                return
            del self._queue[1]
            self.pending_bytes -= item.size
            self._unacked.append(item)

    def window(self) -> int:
        """How many bytes may be unacknowledged: ``PACE_S`` of the measured rate (or two round trips,
        when those take longer), within bounds."""
        if self._rate is None:
            return FIRST_WINDOW_BYTES
        span = max(PACE_S, 2 * (self._min_rtt or 0.0))
        return int(min(MAX_WINDOW_BYTES, max(MIN_WINDOW_BYTES, self._rate * span)))

    def _pump_chunks(self, message: _ChunkedMessage, now: float) -> bool:
        """Send the message's next chunks; True once all of it is acknowledged."""
        if message.acked >= message.total:
            return True
        window = self.window()
        chunk = max(MIN_CHUNK_BYTES, min(CHUNK_BYTES, window // 4))
        while message.sent < message.total and message.wire_in_flight < window:
            if not message.wire_in_flight:
                self._drain.busy_from(now)
            length = min(chunk, message.total - message.sent)
            header: dict[str, Any] = {"transfer": message.id, "offset": message.sent, "sizes": message.sizes,
                                      **message.about}
            piece: Sequence[Any] = message.piece(message.sent, length)
            if self._worth_compressing(message):
                level = 3 if self._rate is not None and self._rate < SLOW_LINK_BYTES_PER_S else 1
                packed = self._compressor(level).compress(b"".join(bytes(v) for v in piece))
                if len(packed) < length:
                    header["raw"], piece = length, [packed]
            if not self._send(encode(T.CHUNK, header, piece)):
                self.waiting_for_room = True
                return False
            message.sent += length
            wire = sum(memoryview(p).nbytes for p in piece)
            message.in_flight.append((message.sent, wire, now))
            message.wire_in_flight += wire
        return False

    def _worth_compressing(self, message: _ChunkedMessage) -> bool:
        # Compressing a chunk costs length / ZSTD_BYTES_PER_S; it wins when the link is several times slower.
        if self._rate is None or self._rate * 4 > ZSTD_BYTES_PER_S:
            return False
        if message.compressible is None:
            message.compressible = message.sample_shrinks(self._compressor(1))
        return message.compressible

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
        if not isinstance(head, _ChunkedMessage) or head.id != header.get("transfer") or type(received) is not int:
            return  # an acknowledgement of something already done, or dropped
        if received < head.acked:  # the far side lost what it held (it forgot this link): start again there
            head.acked = max(0, received)
            head.rewind()
        elif received > head.acked:
            head.acked = min(received, head.total)
            head.sent = max(head.sent, head.acked)
            arrived = []
            while head.in_flight and head.in_flight[0][0] <= head.acked:
                _, wire, left = head.in_flight.popleft()
                head.wire_in_flight -= wire
                arrived.append((wire, now - left))
            if (rate := self._drain.add(now, sum(wire for wire, _ in arrived))) is not None:
                self._rate = rate
            for wire, took in arrived:  # less the chunk's own time on the link: the round trip's latency
                rtt = max(0.0, took - wire / max(self._rate or 0.0, 1.0))
                self._min_rtt = rtt if self._min_rtt is None else min(self._min_rtt, rtt)
            log.debug("message %s: %d of %d bytes acknowledged, %s bytes/s",
                      head.id, head.acked, head.total, self._rate)
            if self._on_progress is not None:
                self._on_progress(head.about, head.acked, head.total)
        if head.acked >= head.total:
            self.pending_bytes -= head.size
        self.pump()


def _number(item: _Whole | _ChunkedMessage) -> int:
    return item.seq or 0


FRAME_ALIGNMENT = 64
"""Where each frame of a message put back together starts in its buffer: at a multiple of this (a cache
line). The buffer itself starts where malloc puts it, 16-aligned, so each frame starts at least as
aligned as numpy's own arrays, and arrays unpickled over it need no aligned copy (wire/serialization.py)."""


@dataclass
class _Partial:
    """One large message arriving: its frames laid out in one buffer, each at an aligned offset."""

    sizes: list[int]
    buffer: bytearray
    about: dict[str, Any]
    received: int = 0  # bytes of the message (its frames end to end) held, in order
    touched: float = 0.0
    starts: list[int] = field(default_factory=list)  # where each frame begun so far starts in ``buffer``
    frame: int = 0  # the frame the next byte belongs to
    into: int = 0  # how many bytes of it are held

    def append(self, data: memoryview) -> None:
        """The message's next bytes: each frame's first byte goes at an aligned offset of the buffer."""
        while data.nbytes:
            while self.into == self.sizes[self.frame]:  # a frame done, or empty (it starts anywhere)
                if len(self.starts) == self.frame:
                    self.starts.append(len(self.buffer))
                self.frame, self.into = self.frame + 1, 0
            if self.into == 0:
                self.buffer += bytes(-len(self.buffer) % FRAME_ALIGNMENT)
                self.starts.append(len(self.buffer))
            take = min(data.nbytes, self.sizes[self.frame] - self.into)
            self.buffer += data[:take]  # grows with what arrived, never to a claim
            self.received, self.into, data = self.received + take, self.into + take, data[take:]

    def frames(self) -> list[memoryview]:
        """The whole message's frames, as views of the buffer."""
        self.starts += [len(self.buffer)] * (len(self.sizes) - len(self.starts))  # empty frames at its end
        whole = memoryview(self.buffer)
        return [whole[start:start + size] for start, size in zip(self.starts, self.sizes)]


class HeldBytes:
    """What every link of one receiver (the hub) holds of part-received large messages, and its bound."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.held = 0


class Inbox:
    """Large messages arriving in chunks from one link, put back together.

    ``add`` takes a CHUNK and returns how many bytes of its transfer are held in order (to
    acknowledge) and, once it is whole, the message's frames. At most ``MAX_UNFINISHED`` messages
    arrive at once, each at most ``max_bytes``, and with ``held`` all the receiver's links together
    hold at most its bound.
    """

    def __init__(self, max_bytes: int | None = None, on_progress: OnProgress | None = None,
                 clock: Callable[[], float] = time.monotonic, held: HeldBytes | None = None) -> None:
        self._max_bytes = max_bytes
        self._held = held
        self._clock = clock
        self._on_progress = on_progress
        self._partial: dict[str, _Partial] = {}
        self._finished: OrderedDict[str, int] = OrderedDict()  # transfer -> its size, lately finished
        self._decompressor = zstandard.ZstdDecompressor()

    def add(self, msg: Message) -> tuple[int, list[memoryview] | None]:
        """Take one chunk; raises ProtocolError for one that can't be part of a message."""
        now = self._clock()
        header = msg.header
        transfer, offset, sizes = header.get("transfer"), header.get("offset"), header.get("sizes")
        if not isinstance(transfer, str) or len(transfer) > 64 or type(offset) is not int or offset < 0 \
                or not isinstance(sizes, list) or len(sizes) < 3 \
                or not all(type(s) is int and s >= 0 for s in sizes):
            raise ProtocolError("a chunk needs a transfer id, an offset and its message's frame sizes")
        total = sum(sizes)
        if self._max_bytes is not None and total > self._max_bytes:
            raise ProtocolError(f"a message of {human_size(total)} is over this hub's "
                                f"{human_size(self._max_bytes)} limit (remote-worker --max-message-size)")
        if transfer in self._finished:  # sent again after a reconnect: we have it all
            return self._finished[transfer], None
        partial = self._partial.get(transfer)
        if partial is None:
            if offset != 0:
                return 0, None  # we hold nothing of it (we forgot, or restarted): the sender starts again
            if len(self._partial) >= MAX_UNFINISHED:
                raise ProtocolError(f"more than {MAX_UNFINISHED} large messages arriving at once on one link: "
                                    "send one after the other")
            partial = self._partial[transfer] = _Partial(sizes, bytearray(), {
                k: header[k] for k in ("job", "type") if k in header})
        elif sizes != partial.sizes:
            self._forget(transfer)
            raise ProtocolError("a chunk's frame sizes differ from those of its message's first chunk")
        partial.touched = now
        data = memoryview(b"".join(bytes(_flat(b)) for b in msg.buffers)) if len(msg.buffers) != 1 \
            else _flat(msg.buffers[0])
        if "raw" in header:
            data = self._decompressed(data, header["raw"])
        end = offset + data.nbytes
        # Sent again after a reconnect, a chunk may start before what we hold (its sender cuts chunks to
        # the window it has now): take the part that is new.
        if offset <= partial.received < end <= total:
            if self._held is not None:
                if self._held.held + end - partial.received > self._held.max_bytes:
                    self._forget(transfer)
                    raise ProtocolError(f"the hub holds {human_size(self._held.held)} of large messages still "
                                        "arriving, its bound: this one was dropped; send it again later")
                self._held.held += end - partial.received
            partial.append(data[partial.received - offset:])
            if self._on_progress is not None:
                self._on_progress(partial.about, partial.received, total)
        if partial.received < total:
            return partial.received, None
        self._forget(transfer)
        self._finished[transfer] = total
        if len(self._finished) > FINISHED_KEPT:
            self._finished.popitem(last=False)
        return total, partial.frames()

    def _decompressed(self, data: memoryview, raw: Any) -> memoryview:
        """A compressed chunk's bytes, never more than a chunk holds, whatever its header claims."""
        if type(raw) is not int or not 0 < raw <= CHUNK_BYTES:
            raise ProtocolError(f"a compressed chunk's raw length must be 1 to {CHUNK_BYTES} bytes")
        try:
            # A frame that states its size is decompressed to that size, whatever max_output_size says.
            if zstandard.frame_content_size(data) not in (raw, -1):
                raise ProtocolError(f"a compressed chunk states another size than the {raw} bytes its header says")
            out = self._decompressor.decompress(bytes(data), max_output_size=raw)
        except zstandard.ZstdError as exc:
            raise ProtocolError(f"a compressed chunk doesn't decompress: {exc}") from None
        if len(out) != raw:
            raise ProtocolError(f"a compressed chunk holds {len(out)} bytes, not the {raw} its header says")
        return memoryview(out)

    def abandon(self, transfer: str) -> None:
        """The sender won't send the rest of ``transfer``, or will send all of it again: forget it."""
        self._forget(transfer)
        self._finished.pop(transfer, None)

    def close(self) -> None:
        """The link is gone: what it held of messages arriving is given back."""
        for transfer in list(self._partial):
            self._forget(transfer)

    def _forget(self, transfer: str) -> None:
        partial = self._partial.pop(transfer, None)
        if partial is not None and self._held is not None:
            self._held.held -= partial.received

    def drop_older_than(self, seconds: float) -> None:
        """Forget messages no chunk of which came for ``seconds`` (their sender gave up)."""
        now = self._clock()
        for transfer in [t for t, p in self._partial.items() if now - p.touched > seconds]:
            log.info("dropped a message that stopped arriving %.0f s ago", now - self._partial[transfer].touched)
            self._forget(transfer)


def ack(msg: Message, received: int) -> list[Any]:
    """The CHUNK_ACK answering a chunk."""
    return encode(T.CHUNK_ACK, {"transfer": msg.header.get("transfer"), "received": received})
