"""One end of a link between a peer and the hub: every message arrives once, in order, across reconnects.

ZeroMQ neither loses nor reorders messages on a live connection, and a peer's socket reconnects by
itself; but what a TCP connection had in flight when it broke (a tunnel that restarted, a NAT that
dropped it, a network that blipped) is gone. So both ends of every link (client ↔ hub, worker ↔ hub)
number the messages that matter (``seq``, from 1: everything but greetings, heartbeats, goodbyes and
the link's own chunks and acknowledgements; ``chunks.UNNUMBERED``), keep each until the far side
acknowledges it (LINK_ACK, at most every ``ACK_EVERY_S``), and send again what is unacknowledged only
when the link says it broke: the peer's socket saw a new handshake (``reconnected``), or the far side
saw a gap in the numbers and asked (LINK_ACK with ``resend``). Never on a timer: on a live connection
TCP loses nothing, and a slow link only delays.

The receiver delivers each number once, in order, and drops repeats and what follows a gap until the
gap is filled (go-back-N). So a job's SUBMIT, its output and its RESULT cross each link exactly once,
whatever the connection did meanwhile. Numbering starts again at 1 with each hello: the hub's memory of
the peer starts there.

One exception to the order: a small message of another job that says it ``passes`` the large message
still arriving (the number expected next) is delivered ahead of it (wire/chunks.py), so a short job's
result doesn't wait for another's large one; a job's own messages never pass each other. Both ends say
that they take such messages with ``LINK_VERSION`` in the versions of their hello and welcome.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from ..errors import ProtocolError
from .chunks import HeldBytes, Inbox, OnProgress, Outbox, ack
from .protocol import Message, MessageType as T, decode, encode

ACK_EVERY_S = 0.05
"""How often a receiver that got something new says so."""

LINK_VERSION = "2"
"""What this end's link takes, announced as ``versions["link"]``: 2 delivers a message that passes a large
one ahead of it."""

MAX_AHEAD = 10_000
"""How many messages one link delivers ahead of the large message they passed."""


class Link:
    """One end of one link: what it sends (``outbox``) and what it receives, numbered both ways.

    ``send`` puts encoded frames on the socket now, or says False (no room, or no route): messages go
    through ``put``, in order; acknowledgements through ``send`` at once, never behind queued data.
    """

    def __init__(self, send: Callable[[list[Any]], bool], *, chunked: bool = True, max_bytes: int | None = None,
                 on_progress: OnProgress | None = None, clock: Callable[[], float] = time.monotonic,
                 held: HeldBytes | None = None) -> None:
        self._send = send
        self._clock = clock
        self.outbox = Outbox(send, chunked=chunked, on_progress=on_progress, clock=clock)
        self._inbox = Inbox(max_bytes=max_bytes, on_progress=on_progress, clock=clock, held=held)
        self.expected = 1   # the next number to deliver
        self._ahead = 0     # the numbers after it delivered already (they passed it)
        self._acked = 0     # the last number this end acknowledged
        self._ack_at = 0.0
        self._repeat = False  # something came again: our acknowledgement may have been lost
        self._resend_asked_at: int | None = None  # the gap (its ``expected``) we asked to have filled
        self._ask_resend = False

    # -- sending ---------------------------------------------------------------------------

    def far_side(self, versions: dict[str, Any]) -> None:
        """The far side's versions (its hello, or the hub's welcome): may a small message pass a large one?"""
        self.outbox.overtaking = versions.get("link") == LINK_VERSION

    def put(self, frames: list[Any]) -> int | None:
        """Queue a message behind what is queued; its ``seq`` (None for the kinds a link doesn't number)."""
        return self.outbox.put(frames)

    def reconnected(self) -> None:
        """The connection broke and came back: what was in flight both ways is gone. Send ours again
        and ask the far side for its own."""
        self.outbox.rewind()
        self._ask_resend = True
        self.tick()

    def restart_sending(self) -> None:
        """A new hello: the far side forgot us; drop what waits and number from 1 again."""
        self.outbox.clear()

    def restart_receiving(self) -> None:
        """Welcomed again: the far side numbers from 1 again."""
        self.expected, self._ahead, self._acked, self._repeat = 1, 0, 0, False
        self._resend_asked_at, self._ask_resend = None, False

    # -- receiving -------------------------------------------------------------------------

    def receive(self, msg: Message) -> Message | None:
        """Take one message off the wire: the message to act on (whole, in order, once), if any.

        Raises ProtocolError for one that can't be taken (a malformed chunk or acknowledgement)."""
        transfer = None
        if msg.type is T.CHUNK:
            received, whole = self._inbox.add(msg)
            self._send(ack(msg, received))
            if whole is None:
                return None
            transfer, msg = str(msg.header["transfer"]), decode(whole)
            if msg.type is T.CHUNK:
                raise ProtocolError("a chunk can't carry another chunk")
        if msg.type is T.CHUNK_ACK:
            self.outbox.on_ack(msg.header)
            return None
        if msg.type is T.LINK_ACK:
            upto = msg.header.get("ack")
            if type(upto) is not int or upto < 0:
                raise ProtocolError("link_ack needs `ack`, a count of messages (an integer, 0 or more)")
            self.outbox.acked(upto)
            if msg.header.get("resend") is True:
                self.outbox.rewind()
            return None
        seq = msg.header.pop("seq", None)  # this link's: whoever forwards the message numbers it anew
        passes = msg.header.pop("passes", None)
        if seq is not None:
            ahead = type(seq) is int and seq > self.expected
            if not self._accept(seq, passes):
                if ahead and transfer is not None:  # dropped after a gap: take it whole when it comes again
                    self._inbox.abandon(transfer)
                return None
        if msg.type is T.HEARTBEAT and isinstance(abandoned := msg.header.get("abandons"), str):
            self._inbox.abandon(abandoned)  # the sender stopped a large message midway (Ctrl-C)
        return msg

    def _accept(self, seq: object, passes: object = None) -> bool:
        if type(seq) is not int or seq < 1:
            raise ProtocolError("seq must be a message number (an integer, 1 or more)")
        if seq == self.expected:  # and those that passed it were delivered already
            self.expected, self._ahead = self.expected + 1 + self._ahead, 0
            return True
        if seq <= self.expected + self._ahead:
            self._repeat = True
        elif type(passes) is int and passes == self.expected and seq == self.expected + self._ahead + 1 \
                and self._ahead < MAX_AHEAD:
            self._ahead += 1
            return True
        elif self._resend_asked_at != self.expected:  # a gap: what came before it was lost; ask once
            self._resend_asked_at, self._ask_resend = self.expected, True
        return False

    @property
    def owes_ack(self) -> bool:
        """Did something come that this end hasn't acknowledged yet?"""
        return self._ask_resend or self.expected - 1 > self._acked or self._repeat

    def tick(self, now: float | None = None, *, force: bool = False) -> float | None:
        """Send the acknowledgement that is due (at once with ``force``, or when asking for a resend);
        how soon to call again, or None when nothing is owed."""
        now = self._clock() if now is None else now
        if not self.owes_ack:
            return None
        if not (force or self._ask_resend) and now - self._ack_at < ACK_EVERY_S:
            return ACK_EVERY_S - (now - self._ack_at)
        upto = self.expected - 1
        header: dict[str, Any] = {"ack": upto, "resend": True} if self._ask_resend else {"ack": upto}
        if self._send(encode(T.LINK_ACK, header)):
            self._acked, self._ack_at, self._repeat, self._ask_resend = upto, now, False, False
            return None
        return ACK_EVERY_S  # no room or no route: try again soon

    def close(self) -> None:
        """The link is gone: give back what it held of large messages arriving."""
        self._inbox.close()

    def drop_stalled(self, seconds: float) -> None:
        """Forget large messages no chunk of which came for ``seconds`` (their sender gave up)."""
        self._inbox.drop_older_than(seconds)
