"""Chunked transfer (remote_magic/wire/chunks.py): a sender's Outbox and a receiver's Inbox, joined here by
lists instead of sockets so each case (a lost chunk, a receiver that forgot, a full queue) is exact."""

from __future__ import annotations

import os
from typing import Any

import pytest

from remote_magic.errors import ProtocolError
from remote_magic.wire import chunks
from remote_magic.wire.chunks import CHUNK_BYTES, CHUNKED_OVER, FIRST_WINDOW_BYTES, Inbox, Outbox
from remote_magic.wire.protocol import Message, MessageType as T, decode, encode


class Clock:
    """Time as the test says it is."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Link:
    """An outbox whose sends land in a list (``room`` says how many more it takes), an inbox at its far
    end, and one clock for both."""

    def __init__(self, room: int = 10**9) -> None:
        self.sent: list[Message] = []
        self.room = room
        self.clock = Clock()
        self.outbox = Outbox(self.send, clock=self.clock)
        self.inbox = Inbox(clock=self.clock)

    def ack(self, chunk: Message, received: int, at: float) -> None:
        self.clock.now = at
        self.outbox.on_ack({"transfer": chunk.header["transfer"], "received": received})

    def send(self, frames: list[Any]) -> bool:
        if self.room <= 0:
            return False
        self.room -= 1
        self.sent.append(decode(frames))
        return True


def deliver(link: Link) -> list[Message]:
    """Hand every sent chunk to the inbox, acknowledge each, and return the whole messages that arrived."""
    arrived = []
    while link.sent:
        msg = link.sent.pop(0)
        if msg.type is not T.CHUNK:
            arrived.append(msg)
            continue
        received, whole = link.inbox.add(msg)
        if whole is not None:
            arrived.append(decode(whole))
        link.ack(msg, received, link.clock.now)
    return arrived


def deliver_all(link: Link) -> list[Message]:
    arrived = []
    while link.sent:
        arrived += deliver(link)
    return arrived


def carried(chunk: Message) -> int:
    """How many of its message's bytes a chunk carries."""
    return sum(len(b) for b in chunk.buffers)


def acknowledge_first_window(link: Link, seconds_per_chunk: float) -> None:
    """Deliver what left before the link's rate was known, one chunk each ``seconds_per_chunk``."""
    for chunk in [link.sent.pop(0) for _ in range(len(link.sent))]:
        link.ack(chunk, link.inbox.add(chunk)[0], at=link.clock.now + seconds_per_chunk)


def big_message(size: int, job: str = "j1") -> tuple[list[Any], bytes]:
    payload = os.urandom(size)
    return encode(T.RESULT, {"job": job}, [b"small frame", payload]), payload


def test_a_large_message_crosses_in_chunks_and_arrives_whole_with_its_frames() -> None:
    link = Link()
    frames, payload = big_message(5 * CHUNK_BYTES + 123)
    link.outbox.put(frames)
    assert {m.type for m in link.sent} == {T.CHUNK}  # the first window, until the link's rate is known
    assert sum(carried(m) for m in link.sent) == FIRST_WINDOW_BYTES
    link.clock.now = 1.0
    arrived = deliver_all(link)
    assert len(arrived) == 1 and arrived[0].header == {"job": "j1", "seq": 1}  # numbered by the outbox
    assert [bytes(b) for b in arrived[0].buffers] == [b"small frame", payload]
    assert not link.outbox and link.outbox.pending_bytes == 0


def test_small_messages_stay_whole_and_keep_their_place_behind_a_large_one() -> None:
    link = Link()
    link.outbox.put(encode(T.STREAM, {"job": "j1", "text": "before"}))
    frames, _ = big_message(CHUNKED_OVER + 1)
    link.outbox.put(frames)
    link.outbox.put(encode(T.STREAM, {"job": "j1", "text": "after"}))
    link.clock.now = 1.0
    assert [m.header.get("text", "RESULT") for m in deliver_all(link)] == ["before", "RESULT", "after"]


def test_nothing_is_sent_again_on_a_timer_only_after_a_reconnect_from_the_last_acknowledged_byte() -> None:
    link = Link()
    frames, payload = big_message(4 * CHUNK_BYTES)
    link.outbox.put(frames)
    first = link.sent.pop(0)
    link.ack(first, link.inbox.add(first)[0], at=0.5)
    acknowledged = first.header["offset"] + carried(first)
    link.sent.clear()  # what was in flight is lost
    link.clock.now = 1e6  # however long acknowledgements take: a live connection loses nothing
    link.outbox.pump()
    assert link.sent == []
    link.outbox.rewind()  # the connection broke and came back
    assert link.sent[0].header["offset"] == acknowledged
    assert bytes(deliver_all(link)[0].buffers[1]) == payload


def test_a_receiver_that_forgot_the_transfer_gets_it_again_from_the_start() -> None:
    link = Link()
    frames, payload = big_message(4 * CHUNK_BYTES)
    link.outbox.put(frames)
    link.ack(link.sent[0], carried(link.sent[0]), at=0.1)
    link.sent.clear()
    link.inbox = Inbox(clock=link.clock)  # say, the hub restarted
    link.outbox.rewind()
    stale = link.sent[:]
    link.sent.clear()
    assert link.inbox.add(stale[0]) == (0, None)  # a chunk from the middle: it holds nothing of it
    link.ack(stale[0], 0, at=5.0)
    assert link.sent[0].header["offset"] == 0
    assert bytes(deliver_all(link)[0].buffers[1]) == payload


def test_a_full_queue_holds_the_rest_until_it_has_room() -> None:
    link = Link(room=1)
    for text in "abc":
        link.outbox.put(encode(T.STREAM, {"text": text}))
    assert [m.header["text"] for m in link.sent] == ["a"] and link.outbox.waiting_for_room
    link.room = 5
    link.outbox.pump()
    assert [m.header["text"] for m in link.sent] == ["a", "b", "c"] and not link.outbox.waiting_for_room


def test_the_window_follows_the_measured_rate_so_a_slow_link_holds_about_a_second_of_data() -> None:
    link = Link()
    frames, _ = big_message(40 * CHUNK_BYTES)
    link.outbox.put(frames)
    first = link.sent.pop(0)
    link.ack(first, link.inbox.add(first)[0], at=0.0625)  # 64 KiB in 1/16 s: 1 MiB/s
    in_flight = sum(carried(m) for m in link.sent)
    assert (1 << 20) * chunks.PACE_S <= in_flight < (1 << 20) * chunks.PACE_S + CHUNK_BYTES  # a chunk over at most
    slow = Link()
    slow.outbox.put(frames)
    for at in (2.0, 4.0, 6.0, 8.0):  # 64 KiB every 2 s: 32 KiB/s, as a lossy link drains
        chunk = slow.sent.pop(0)
        slow.ack(chunk, slow.inbox.add(chunk)[0], at=at)
    # The window's floor, in small chunks: what waits behind them waits about PACE_S.
    assert sum(carried(m) for m in slow.sent) == chunks.MIN_WINDOW_BYTES
    assert {carried(m) for m in slow.sent} == {chunks.MIN_CHUNK_BYTES}


def test_the_rate_follows_what_drains_now_not_the_transfers_average() -> None:
    link = Link()
    frames, _ = big_message(400 * CHUNK_BYTES)
    link.outbox.put(frames)
    for _ in range(3):  # a fast start: each window acknowledged within 10 ms ...
        link.clock.now += 0.01
        for msg in [link.sent.pop(0) for _ in range(len(link.sent))]:
            link.ack(msg, link.inbox.add(msg)[0], at=link.clock.now)
    fast = link.outbox.window()
    for _ in range(20):  # ... then one chunk a second: the link got slow (a lossy stretch)
        msg = link.sent.pop(0)
        link.clock.now += 1.0
        link.ack(msg, link.inbox.add(msg)[0], at=link.clock.now)
    assert link.outbox.window() == CHUNK_BYTES * chunks.PACE_S < fast  # a second of what drains now


def test_on_a_slow_link_zeros_cross_compressed_and_random_bytes_raw() -> None:
    for payload, compressed in ((bytes(8 * CHUNK_BYTES), True), (os.urandom(8 * CHUNK_BYTES), False)):
        link = Link()
        link.outbox.put(encode(T.RESULT, {"job": "j"}, [payload]))
        acknowledge_first_window(link, seconds_per_chunk=0.25)  # 256 KiB/s; that window left raw
        after = list(link.sent)
        assert after and all(("raw" in m.header) is compressed for m in after)
        assert bytes(deliver_all(link)[0].buffers[0]) == payload


def test_on_a_fast_link_nothing_is_compressed() -> None:
    link = Link()
    link.outbox.put(encode(T.RESULT, {"job": "j"}, [bytes(64 * CHUNK_BYTES)]))
    first = link.sent.pop(0)
    link.ack(first, link.inbox.add(first)[0], at=0.0001)  # 640 MiB/s: compressing would cost more than it saves
    assert link.sent and not any("raw" in m.header for m in link.sent)


def test_a_chunk_that_cant_be_part_of_a_message_is_refused_saying_why() -> None:
    inbox = Inbox(max_bytes=1 << 20)
    with pytest.raises(ProtocolError, match="over this hub's 1.0 MB limit"):
        inbox.add(Message(T.CHUNK, {"transfer": "t", "offset": 0, "sizes": [3, 6, 2, 2 << 20]}, [b"RM2"]))
    with pytest.raises(ProtocolError, match="transfer id, an offset"):
        inbox.add(Message(T.CHUNK, {"transfer": "t", "offset": "0", "sizes": [3, 6, 2]}, [b"RM2"]))


def test_a_transfer_whose_sender_went_quiet_is_forgotten() -> None:
    link = Link()
    frames, _ = big_message(4 * CHUNK_BYTES)
    link.outbox.put(frames)
    link.inbox.add(link.sent[0])
    link.clock.now = 61.0
    link.inbox.drop_older_than(60)
    assert link.inbox.add(link.sent[1]) == (0, None)  # the rest no longer fits anything it holds


def test_compressed_chunks_acknowledged_quickly_dont_switch_compression_off() -> None:
    # The link's rate counts bytes on the wire: 128 MiB of zeros acknowledged within a second is
    # a few KiB on a 256 KiB/s link, not a 128 MiB/s one.
    link = Link()
    link.outbox.put(encode(T.RESULT, {"job": "j"}, [bytes(512 * CHUNK_BYTES)]))
    acknowledge_first_window(link, seconds_per_chunk=0.25)
    link.clock.now += 0.001
    compressed = []
    while link.sent:
        compressed += ["raw" in m.header for m in link.sent[1:] if m.type is T.CHUNK]
        deliver(link)
    assert len(compressed) > 500 and all(compressed)


def test_a_compressed_chunk_never_costs_more_than_a_chunk_whatever_it_claims() -> None:
    import zstandard

    bomb = zstandard.ZstdCompressor().compress(bytes(64 << 20))  # 2 KiB that states 64 MiB inside
    assert len(bomb) < 16 << 10
    header = {"transfer": "t", "offset": 0, "sizes": [3, 6, 2, 1 << 30]}
    for raw, reason in ((CHUNK_BYTES, "states another size"), (1 << 30, "raw length must be"),
                        (1e400, "raw length must be")):
        with pytest.raises(ProtocolError, match=reason):
            Inbox().add(Message(T.CHUNK, {**header, "raw": raw}, [bomb]))
    with pytest.raises(ProtocolError, match="doesn't decompress"):
        Inbox().add(Message(T.CHUNK, {**header, "raw": 100}, [b"not zstd at all"]))
