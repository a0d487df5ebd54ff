"""The seam between the hub's router and the modules that act on messages: how they send to a peer.

``broker.Hub`` implements it; ``scheduler``, ``delivery`` and ``jupyter_kernels`` use only this, so
none of them knows the socket, the links or each other's internals.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

from ..wire.protocol import MessageType


class PeerSender(Protocol):
    """Sends to peers by routing id, in order, never blocking: what a peer can't take now waits for it."""

    def send(self, routing_id: bytes, msg_type: MessageType, header: dict[str, Any] | None = None,
             buffers: Sequence[Any] = ()) -> None:
        """Send one message."""

    def send_frames(self, routing_id: bytes, frames: list[Any]) -> int | None:
        """Send one encoded message; its seq on the peer's link (None when it isn't numbered, or the
        routing id is no peer's)."""

    def abandon(self, routing_id: bytes, job: str) -> bool:
        """Send no more of ``job``'s messages to the peer that haven't wholly left (its result coming down
        when the notebook pressed Ctrl-C); True when some hadn't."""

    def unacknowledged_jobs(self, routing_id: bytes) -> set[str]:
        """The jobs with messages to the peer that it hasn't acknowledged yet: waiting to leave, or on their way
        (none for a routing id that is no peer's)."""

    def acknowledged_seq(self, routing_id: bytes) -> int:
        """The seq up to which the peer holds every numbered message sent to it (0: none yet, or no peer)."""
