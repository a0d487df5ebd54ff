"""Delivery that survives a reconnect, for one stream of messages (a kernel's channels, each way).

ZeroMQ neither loses nor reorders messages on a healthy connection, and a peer's socket reconnects by
itself; but what was in flight in a TCP connection when it broke (a tunnel that restarted, a network
that dropped for a second) is gone. So each message of the stream carries a number (``seq``, from 1);
the receiver takes only the next one it expects and says how far it got (a cumulative ``ack``, at most
every ``ACK_EVERY_S``); the sender keeps what wasn't acknowledged and sends all of it again when no
acknowledgement came for ``RESEND_AFTER_S`` (go-back-N: after a gap the receiver drops what follows
until the gap is filled). Nothing here owns a socket: the caller sends what these say to.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Generic, TypeVar

RESEND_AFTER_S = 1.0
"""How long unacknowledged messages wait before they are all sent again."""

ACK_EVERY_S = 0.05
"""How often a receiver that got something new says so."""

Item = TypeVar("Item")


class Outbound(Generic[Item]):
    """The sending side: numbers messages and keeps them until they are acknowledged."""

    def __init__(self) -> None:
        self._next = 1
        self.unacked: deque[tuple[int, Item]] = deque()
        self._progress_at = time.monotonic()

    def number(self) -> int:
        """The next message's ``seq``."""
        seq, self._next = self._next, self._next + 1
        return seq

    def keep(self, seq: int, item: Item) -> None:
        """Keep what was sent as ``seq``, to send again if it isn't acknowledged."""
        if not self.unacked:
            self._progress_at = time.monotonic()
        self.unacked.append((seq, item))

    def acked(self, upto: int) -> None:
        """The receiver has everything up to ``upto``."""
        if self.unacked and self.unacked[0][0] <= upto:
            self._progress_at = time.monotonic()
        while self.unacked and self.unacked[0][0] <= upto:
            self.unacked.popleft()

    def due(self, now: float) -> list[Item]:
        """What to send again now, in order: everything unacknowledged, once no ack came for a while."""
        if not self.unacked or now - self._progress_at < RESEND_AFTER_S:
            return []
        self._progress_at = now
        return [item for _, item in self.unacked]


class Inbound:
    """The receiving side: takes messages in order, once each, and says how far it got."""

    def __init__(self) -> None:
        self.expected = 1
        self._acked = 0
        self._ack_at = 0.0
        self._repeat = False  # a message came again: our acknowledgement may have been lost

    def accept(self, seq: object) -> bool:
        """Should the message numbered ``seq`` be delivered? (None: an unnumbered message, always.)"""
        if seq is None:
            return True
        if seq == self.expected:
            self.expected += 1
            return True
        self._repeat = True
        return False

    @property
    def unacknowledged(self) -> bool:
        """Did something come that this side hasn't acknowledged yet?"""
        return self.expected - 1 > self._acked or self._repeat

    def ack_due(self, now: float) -> int | None:
        """The ``ack`` to send now, if one is due."""
        upto = self.expected - 1
        if (upto > self._acked or (self._repeat and upto > 0)) and now - self._ack_at >= ACK_EVERY_S:
            self._acked, self._ack_at, self._repeat = upto, now, False
            return upto
        return None
