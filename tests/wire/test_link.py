"""Exactly once across a link's reconnects (remote_magic/wire/link.py): two real Link ends joined by lists
instead of sockets, so each way a connection can lose what it had in flight is exact."""

from __future__ import annotations

import os
from typing import Any

from remote_magic.wire.chunks import CHUNK_BYTES
from remote_magic.wire.link import ACK_EVERY_S, LINK_VERSION, Link
from remote_magic.wire.protocol import Message, MessageType as T, decode, encode


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Wire:
    """Two link ends and what each has put on the wire towards the other, not yet delivered."""

    def __init__(self, versions: dict[str, str] | None = None) -> None:
        self.clock = Clock()
        self.to_b: list[list[Any]] = []
        self.to_a: list[list[Any]] = []
        self.a = Link(self._sender(self.to_b), clock=self.clock)
        self.b = Link(self._sender(self.to_a), clock=self.clock)
        for link in (self.a, self.b):  # what each learns of the other from the hello and welcome
            link.far_side(versions if versions is not None else {"link": LINK_VERSION})
        self.got_a: list[Message] = []
        self.got_b: list[Message] = []

    @staticmethod
    def _sender(queue: list[list[Any]]) -> Any:
        def send(frames: list[Any]) -> bool:
            queue.append([bytes(memoryview(f).cast("B")) if not isinstance(f, bytes) else f for f in frames])
            return True
        return send

    def flow(self, rounds: int = 10_000) -> None:
        """Deliver everything both ways (acknowledgements included) until the wire is quiet."""
        for _ in range(rounds):
            if not self.to_a and not self.to_b:
                self.clock.now += ACK_EVERY_S
                self.a.tick()
                self.b.tick()
                if not self.to_a and not self.to_b:
                    return
            for queue, link, got in ((self.to_b, self.b, self.got_b), (self.to_a, self.a, self.got_a)):
                while queue:
                    taken = link.receive(decode(queue.pop(0)))
                    if taken is not None:
                        got.append(taken)

    def lose_in_flight(self) -> None:
        """The connection broke: what it carried is gone, both ways."""
        self.to_a.clear()
        self.to_b.clear()


def texts(messages: list[Message]) -> list[str]:
    return [m.header["text"] for m in messages if m.type is T.STREAM]


def test_what_a_broken_connection_had_in_flight_arrives_once_in_order_after_the_reconnect() -> None:
    wire = Wire()
    for text in "abc":
        wire.a.put(encode(T.STREAM, {"job": "j", "text": text}))
    wire.flow()
    for text in "def":
        wire.a.put(encode(T.STREAM, {"job": "j", "text": text}))
        wire.b.put(encode(T.STREAM, {"job": "k", "text": text.upper()}))
    wire.lose_in_flight()
    wire.clock.now += 3600  # however long: on a live connection nothing is sent again
    wire.a.tick()
    wire.b.tick()
    assert wire.to_a == [] and wire.to_b == []
    wire.a.reconnected()  # the peer's socket saw a new handshake: both directions go again
    wire.flow()
    assert texts(wire.got_b) == list("abcdef") and texts(wire.got_a) == list("DEF")


def test_messages_delivered_but_unacknowledged_are_sent_again_and_dropped_as_repeats() -> None:
    wire = Wire()
    wire.a.put(encode(T.SUBMIT, {"job": "j1"}))
    first = wire.b.receive(decode(wire.to_b.pop(0)))  # arrived; its acknowledgement is lost with the connection
    assert first is not None and first.header == {"job": "j1"}
    wire.lose_in_flight()
    wire.a.reconnected()
    wire.flow()
    assert wire.a.outbox.acked_seq == 1 and wire.got_b == []  # sent again, and dropped as a repeat


def test_a_blip_at_the_end_of_a_chunked_message_does_not_deliver_it_twice() -> None:
    wire = Wire()
    payload = os.urandom(5 * CHUNK_BYTES)
    wire.a.put(encode(T.SUBMIT, {"job": "big"}, [payload]))
    while wire.to_b:  # every chunk arrives ...
        while wire.to_b:
            wire.got_b += [m for m in [wire.b.receive(decode(wire.to_b.pop(0)))] if m is not None]
        if len(wire.got_b) == 1:
            break
        while wire.to_a:
            wire.a.receive(decode(wire.to_a.pop(0)))
    assert len(wire.got_b) == 1 and bytes(wire.got_b[0].buffers[0]) == payload
    wire.lose_in_flight()  # ... but the last chunk_acks are lost: the sender doesn't know
    wire.a.reconnected()
    wire.flow()
    assert [m.header["job"] for m in wire.got_b] == ["big"]
    assert not wire.a.outbox and wire.a.outbox.acked_seq == 1


def test_a_gap_makes_the_receiver_ask_for_what_was_lost() -> None:
    wire = Wire()
    wire.a.put(encode(T.STREAM, {"text": "1"}))
    wire.to_b.clear()  # lost, and nobody noticed a reconnect
    wire.a.put(encode(T.STREAM, {"text": "2"}))
    wire.flow()
    assert texts(wire.got_b) == ["1", "2"]


def test_a_message_stopped_midway_leaves_no_gap_and_no_part_behind() -> None:
    wire = Wire()
    wire.a.put(encode(T.SUBMIT, {"job": "up"}, [os.urandom(20 * CHUNK_BYTES)]))
    first = wire.to_b.pop(0)
    wire.b.receive(decode(first))
    assert wire.a.outbox.abort("up") is True
    assert wire.a.outbox.abort("up") is False  # nothing of it is left to stop
    wire.a.put(encode(T.STREAM, {"text": "next"}))
    wire.flow()
    assert [m.type for m in wire.got_b] == [T.HEARTBEAT, T.STREAM]  # its number, kept by a heartbeat
    assert wire.got_b[0].header.get("abandons") and not wire.b._inbox._partial


def test_a_hello_starts_the_numbering_again_on_both_sides() -> None:
    wire = Wire()
    wire.a.put(encode(T.STREAM, {"text": "old"}))
    wire.flow()
    wire.a.restart_sending()
    wire.b.restart_receiving()
    wire.a.put(encode(T.STREAM, {"text": "new"}))
    wire.flow()
    assert texts(wire.got_b) == ["old", "new"]


def test_chunks_cut_to_another_size_after_a_reconnect_still_make_the_message() -> None:
    wire = Wire()
    payload = os.urandom(5 * CHUNK_BYTES)
    wire.a.put(encode(T.RESULT, {"job": "j"}, [payload]))
    first, second = wire.to_b.pop(0), wire.to_b.pop(0)
    wire.b.receive(decode(first))
    wire.b.receive(decode(second))  # two chunks held, and only the first acknowledged when the link broke
    wire.a.receive(decode(wire.to_a.pop(0)))
    wire.lose_in_flight()
    wire.a.outbox._rate = 64e6  # the window grew meanwhile: chunks are cut larger now
    wire.a.reconnected()
    wire.flow()
    assert [bytes(m.buffers[0]) for m in wire.got_b] == [payload]


def test_a_large_message_that_arrived_after_a_gap_is_sent_again_after_what_was_lost() -> None:
    wire = Wire()
    wire.a.put(encode(T.STREAM, {"text": "small"}))
    wire.to_b.clear()  # lost with the old connection; the sender hasn't seen the reconnect yet
    payload = os.urandom(5 * CHUNK_BYTES)
    wire.a.put(encode(T.RESULT, {"job": "big"}, [payload]))
    while wire.to_b:  # every chunk of it arrives and is acknowledged; the receiver drops it: a gap before it
        while wire.to_b:
            wire.b.receive(decode(wire.to_b.pop(0)))
        while wire.to_a:
            message = decode(wire.to_a.pop(0))
            if message.type is T.CHUNK_ACK:
                wire.a.receive(message)
    assert wire.got_b == [] and not wire.a.outbox  # the sender thinks it crossed
    wire.a.reconnected()
    wire.flow()
    assert [m.type for m in wire.got_b] == [T.STREAM, T.RESULT] and bytes(wire.got_b[1].buffers[0]) == payload


def jobs_in_order(messages: list[Message]) -> list[str]:
    return [f"{m.header.get('job')}:{m.type.value}" for m in messages]


def a_large_result_then_small_messages(wire: Wire) -> None:
    """A large result of job ``big`` leaves in chunks; behind it come another job's result and ``big``'s own."""
    wire.a.put(encode(T.RESULT, {"job": "big"}, [os.urandom(20 * CHUNK_BYTES)]))
    wire.a.put(encode(T.RESULT, {"job": "small"}))
    wire.a.put(encode(T.STREAM, {"job": "big", "text": "after"}))


def test_a_small_message_of_another_job_passes_a_large_one_and_a_jobs_own_do_not() -> None:
    """Before: a short job's result waited behind every chunk of another job's large result on the same link."""
    wire = Wire()
    a_large_result_then_small_messages(wire)
    assert any(decode(frames).type is T.RESULT for frames in wire.to_b)  # it left with the first chunks
    wire.flow()
    assert jobs_in_order(wire.got_b) == ["small:result", "big:result", "big:stream"]
    assert not wire.a.outbox and wire.a.outbox.acked_seq == 3


def test_what_passed_a_large_message_arrives_once_across_a_reconnect() -> None:
    wire = Wire()
    a_large_result_then_small_messages(wire)
    while wire.to_b:  # the passing result and the first chunks arrive; the acknowledgements are lost
        wire.got_b += [m for m in [wire.b.receive(decode(wire.to_b.pop(0)))] if m is not None]
    wire.lose_in_flight()
    wire.a.reconnected()
    wire.flow()
    assert jobs_in_order(wire.got_b) == ["small:result", "big:result", "big:stream"]


def test_nothing_passes_on_a_link_whose_far_side_does_not_take_it_nor_with_what_another_link_passed() -> None:
    wire = Wire(versions={})  # an older peer: its link would drop a message ahead of its number
    a_large_result_then_small_messages(wire)
    wire.flow()
    assert jobs_in_order(wire.got_b) == ["big:result", "small:result", "big:stream"]
    forwarded = Wire()
    forwarded.a.put(encode(T.STREAM, {"job": "x", "text": "1"}))
    forwarded.to_b.clear()  # lost: the receiver sees a gap
    # Forwarded as it came, with the number it passed on the link it came by: here it passes nothing.
    forwarded.a.put(encode(T.STREAM, {"job": "x", "text": "2", "seq": 7, "passes": 1}))
    forwarded.flow()
    assert texts(forwarded.got_b) == ["1", "2"]
