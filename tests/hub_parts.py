"""The hub's parts in one process, without a socket: a fake ``PeerSender`` (``remote_magic/hub/sender.py``, the
seam ``scheduler``, ``delivery`` and ``jupyter_kernels`` send through) and the real parts wired to it as
``broker.Hub`` wires them.

The fake numbers each peer's messages as a link would, and holds them unacknowledged until the test says the
peer acknowledged them (``acknowledge``): what the delivery of a job's end waits for. Everything else is the
project's own code: the fleet, the records, placement, the scheduler, delivery, the kernel relay.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Sequence

from remote_magic.hub.delivery import JobDelivery
from remote_magic.hub.fleet import Fleet
from remote_magic.hub.jupyter_kernels import KernelRelay
from remote_magic.hub.records import Peer
from remote_magic.hub.scheduler import Scheduler
from remote_magic.wire.link import Link
from remote_magic.wire.protocol import Message, MessageType, Role, decode, encode
from remote_magic.wire.throttle import WarningThrottle

log = logging.getLogger(__name__)


@dataclass
class Sent:
    """One message the hub's parts sent: to whom, its number on that peer's link, and the message."""

    to: bytes
    seq: int | None
    message: Message
    abandoned: bool = False


@dataclass
class RecordingSender:
    """A ``PeerSender`` that records every message, numbered per peer as the peer's link numbers them.

    A message counts as on its way until ``acknowledge`` says its peer holds it; ``abandon`` marks a job's
    messages that are still on their way as never to arrive, as the hub's outbox drops them.
    """

    fleet: Fleet
    sent: list[Sent] = field(default_factory=list)
    acked: dict[bytes, int] = field(default_factory=dict)
    _seq: dict[bytes, int] = field(default_factory=dict)

    # -- the PeerSender protocol -----------------------------------------------------------------

    def send(self, routing_id: bytes, msg_type: MessageType, header: dict[str, Any] | None = None,
             buffers: Sequence[Any] = ()) -> None:
        self.send_frames(routing_id, encode(msg_type, header, buffers))

    def send_frames(self, routing_id: bytes, frames: list[Any]) -> int | None:
        message = decode(frames)  # what the peer would read: the frames must be a well-formed message
        seq = None
        if routing_id in self.fleet.peers:  # the hub numbers only what goes on a peer's link
            seq = self._seq[routing_id] = self._seq.get(routing_id, 0) + 1
        self.sent.append(Sent(routing_id, seq, message))
        return seq

    def abandon(self, routing_id: bytes, job: str) -> bool:
        waiting = [s for s in self._on_their_way(routing_id) if s.message.header.get("job") == job]
        for sent in waiting:
            sent.abandoned = True
        return bool(waiting)

    def unacknowledged_jobs(self, routing_id: bytes) -> set[str]:
        return {str(s.message.header["job"]) for s in self._on_their_way(routing_id) if "job" in s.message.header}

    def acknowledged_seq(self, routing_id: bytes) -> int:
        return self.acked.get(routing_id, 0)

    # -- what a test asks of it ------------------------------------------------------------------

    def acknowledge(self, routing_id: bytes) -> None:
        """The peer acknowledges every numbered message sent to it so far."""
        self.acked[routing_id] = self._seq.get(routing_id, 0)

    def to(self, peer: Peer | bytes, *types: MessageType) -> list[Message]:
        """What was sent to ``peer`` and not abandoned, in order; only messages of ``types`` when given."""
        routing_id = peer.routing_id if isinstance(peer, Peer) else peer
        return [s.message for s in self.sent if s.to == routing_id and not s.abandoned
                and (not types or s.message.type in types)]

    def types_to(self, peer: Peer | bytes) -> list[MessageType]:
        return [message.type for message in self.to(peer)]

    def clear(self) -> None:
        """Forget what was sent so far (the numbering and acknowledgements stay)."""
        self.sent.clear()

    def _on_their_way(self, routing_id: bytes) -> list[Sent]:
        acked = self.acked.get(routing_id, 0)
        return [s for s in self.sent if s.to == routing_id and s.seq is not None and s.seq > acked and not s.abandoned]


GPU = {"active": True, "adapter": "NVIDIA H100", "adapter_type": "DiscreteGPU"}
SOFTWARE_GPU = {"active": True, "adapter": "llvmpipe", "adapter_type": "software"}
NO_GPU = {"active": False}


class HubParts:
    """A fleet, a recording sender, and the scheduler, delivery and kernel relay over them, as the hub has them.

    ``join`` adds a peer the way the hub's HELLO handler does (a record with its own link; a worker is
    then offered the waiting jobs); ``leave`` takes one out the way ``broker.Hub._forget`` does.
    """

    def __init__(self, *, max_queued_bytes: int = 1 << 30, kernels: bool = True) -> None:
        self.fleet = Fleet()
        self.sender = RecordingSender(self.fleet)
        self.delivery = JobDelivery(self.fleet, self.sender)
        self.scheduler = Scheduler(self.fleet, self.sender, self.delivery, WarningThrottle(log),
                                   cache_bytes=64 << 20, max_queued_bytes=max_queued_bytes)
        self.kernels = KernelRelay(self.fleet, self.sender, allowed=kernels)
        self._ids = 0

    def client(self, name: str = "notebook", key: bytes = b"client-key") -> Peer:
        return self.join(Role.CLIENT, name, {}, key)

    def worker(self, name: str, *, gpu: dict[str, Any] | None = None, labels: dict[str, str] | None = None,
               **capabilities: Any) -> Peer:
        caps = {"gpu": gpu or NO_GPU, "hostname": f"{name}.local", "cpu_count": 4, "kernels": True,
                "labels": labels or {}, **capabilities}
        return self.join(Role.WORKER, name, caps, b"worker-key")

    def join(self, role: Role, name: str, capabilities: dict[str, Any], key: bytes) -> Peer:
        self._ids += 1
        routing_id = f"{role.value}-{self._ids}".encode()
        peer = Peer(routing_id, role, name, {"protocol": "test"}, capabilities, key=key,
                    link=Link(lambda frames: True))  # the parts under test never reach a link (test_layout.py)
        self.fleet.join(peer)
        if role is Role.WORKER:
            self.scheduler.assign()
        return peer

    def leave(self, peer: Peer, why: str) -> None:
        """The peer is gone: its record first, then what its jobs and kernels become, then the queue moves."""
        self.delivery.forget_acknowledged_ends()
        self.fleet.forget(peer)
        if peer.role is Role.WORKER:
            self.scheduler.worker_left(peer, why)
            self.kernels.worker_left(peer, why)
        else:
            self.scheduler.client_left(peer, why)
            self.kernels.client_left(peer, why)
        self.scheduler.assign()

    # -- messages from peers, as the hub's table hands them on ------------------------------------------

    def submit(self, client: Peer, job: str, /, code: str = "x = 1", buffers: Sequence[bytes] = (),
               **header: Any) -> None:
        message = Message(MessageType.SUBMIT, {"job": job, "kind": "code", "code": code, **header}, list(buffers))
        self.scheduler.on_submit(client, message, encode(message.type, message.header, message.buffers))

    def from_worker(self, worker: Peer, msg_type: MessageType, job: str, /, buffers: Sequence[bytes] = (),
                    **header: Any) -> None:
        """STARTED, STREAM, DISPLAY, RESULT or ERROR about ``job`` from ``worker``."""
        message = Message(msg_type, {"job": job, **header}, list(buffers))
        self.scheduler.on_job_event(worker, message, encode(message.type, message.header, message.buffers))

