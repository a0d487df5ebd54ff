"""A job's messages on their way to its client, and jobs that outlive their notebook (JOBS, ATTACH).

What a worker says about a job goes into the job's journal (``detached.Journal``) and on to the job's
client, unless that client went away: then the job is detached (``detached.DetachedJobs``) and its
messages wait in the journal for a client with the same credentials to list and collect it. A job's
RESULT or ERROR counts as delivered only once the client's link acknowledges it; until then the client's
record keeps the job as it would wait for collection (``records.UnacknowledgedEnd``), so a client that
goes away first finds it waiting, ended, instead of losing it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..errors import NoSuchJob
from ..wire.failures import error_header
from ..wire.protocol import Message, MessageType as T, decode, encode, session_id
from ..wire.sizes import human_size
from .detached import DetachedJob, DetachedJobs
from .fleet import Fleet
from .records import JobRecord, Peer, UnacknowledgedEnd
from .sender import PeerSender

log = logging.getLogger(__name__)


class JobDelivery:
    """Sends a job's messages to its client, or keeps them for whoever collects the job."""

    def __init__(self, fleet: Fleet, sender: PeerSender, detached: DetachedJobs | None = None) -> None:
        self.fleet = fleet
        self.sender = sender
        self.detached = detached if detached is not None else DetachedJobs()

    # -- a job's messages to its client ---------------------------------------------------------

    def journaled(self, job: JobRecord, msg: Message) -> None:
        """One of the hub's own messages about a job (its end, a notice): into its journal, then on to its client."""
        job.journal.add(encode(msg.type, msg.header), ending=msg.type in (T.RESULT, T.ERROR))
        self.to_job_client(job, msg)

    def to_job_client(self, job: JobRecord, msg: Message) -> None:
        """Send one of a job's messages to its client, unless it went away: then the message waits in the job's
        journal for whoever collects it (even when the same notebook comes back, until it collects it)."""
        if job.id not in self.detached:
            self.to_client(job.client, msg, self._ending(job) if msg.type in (T.RESULT, T.ERROR) else None)

    def to_client(self, routing_id: bytes, msg: Message, ending: DetachedJob | None = None) -> None:
        """Send one of a job's messages to a client, on its link (numbered, kept until acknowledged). The job
        a RESULT or ERROR ends (``ending``) is kept too until then: if the client goes away first, the job
        waits for collection, ended, as one that ended after it went."""
        seq = self.sender.send_frames(routing_id, encode(msg.type, msg.header, msg.buffers))
        client = self.fleet.peers.get(routing_id)
        if ending is not None and seq is not None and client is not None:
            client.unacknowledged_ends[ending.id] = UnacknowledgedEnd(seq, ending)

    def _ending(self, job: JobRecord) -> DetachedJob | None:
        """An ended job as it waits for collection if its client goes away before hearing of its end."""
        client = self.fleet.peers.get(job.client)
        if client is None:
            return None
        worker = self.fleet.peers.get(job.worker) if job.worker else None
        return DetachedJob(job.id, client.key, job.summary, worker.name if worker else "?", job.journal,
                           ended_at=time.monotonic(), state=job.lifecycle.state.value)

    def forget_acknowledged_ends(self) -> None:
        """Jobs whose end their client acknowledged need not wait for collection any more."""
        for client in self.fleet.peers.values():
            acked = self.sender.acknowledged_seq(client.routing_id)
            for job_id in [j for j, end in client.unacknowledged_ends.items() if end.seq <= acked]:
                del client.unacknowledged_ends[job_id]

    def unacknowledged_jobs(self) -> set[str]:
        """The jobs whose end some client has yet to acknowledge."""
        return {job_id for peer in self.fleet.peers.values() for job_id in peer.unacknowledged_ends}

    # -- jobs whose client went away ---------------------------------------------------------------

    def detach(self, job: JobRecord, client: Peer) -> None:
        """A job's client went away: the job (running on, or cancelled) waits for a client with the same token
        to collect it."""
        worker = self.fleet.peers.get(job.worker) if job.worker else None
        where = "" if job.worker is None else worker.name if worker else "?"  # ("": it never started)
        self.detached.detach(DetachedJob(job.id, client.key, job.summary, where, job.journal))
        log.info("job %s waits for a notebook with the same token to collect it", job.id)

    def detach_unacknowledged_ends(self, client: Peer) -> None:
        """The client won't hear of these jobs' ends on its link: they wait for collection instead."""
        for job_id, end in list(client.unacknowledged_ends.items()):
            del client.unacknowledged_ends[job_id]
            self.detached.detach(end.ending)
            self.detached.ended(job_id, end.ending.state)

    def ended(self, job: JobRecord) -> None:
        """A job ended: if its client went away, its result waits for collection. The session it ran in ends once
        the notebook it belongs to is gone and none of that notebook's jobs runs on, collected by another or not."""
        if job.id in self.detached:
            self.detached.ended(job.id, job.lifecycle.state.value)
        owner = job.session_owner
        worker = self.fleet.peers.get(job.worker) if job.worker else None
        if worker is not None and owner not in self.fleet.peers and not any(
                j.session_owner == owner for j in self.fleet.jobs.values()):
            self.sender.send(worker.routing_id, T.SESSION_END, {"session": session_id(owner),
                                                                  "reason": "its notebook went away"})

    def expire(self) -> None:
        """Forget ended jobs nobody collected in time."""
        self.detached.expire()

    # -- handlers ---------------------------------------------------------------------------------

    def on_jobs(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        """JOBS: the detached jobs this client's credentials may collect."""
        self.sender.send(peer.routing_id, T.JOBS, {"request": msg.header.get("request"),
                                                     "jobs": self.detached.listing(peer.key)})

    def on_attach(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        """ATTACH: collect a detached job; its journal is replayed in order (less the first ``received``
        messages, which the client had), then what comes next follows."""
        job_id = str(msg.header["job"])
        detached = self.detached.take(job_id, peer.key)
        if detached is None:
            self.sender.send(peer.routing_id, T.ERROR, error_header(NoSuchJob(
                f"no job {job_id!r} waits to be collected here: it was collected already, ended more than "
                f"{self.detached.keep_s / 60:.0f} minutes ago, or was never submitted with this token "
                "(%offload_jobs lists those that wait)"), job_id))
            return
        journal = detached.journal
        received = int(msg.header.get("received") or 0)
        if detached.ended_at is not None:  # its end was never received, whatever a client says
            received = min(received, journal.count - 1)
        if journal.last_dropped >= received:  # (not journaled: a client counts what it had of the journal)
            self.to_client(peer.routing_id, Message(T.STREAM, {"job": job_id, "name": "stderr", "journaled": False,
                "text": f"remote-magic: some of this job's output came while no notebook was there to show it, past "
                        f"what the hub keeps ({human_size(journal.dropped)} not kept); it is not shown.\n"}))
        replayed = journal.since(received)
        for index, journaled in enumerate(replayed):  # as they came, then what comes next
            last = index == len(replayed) - 1
            # Collected once it is acknowledged: a collector gone before that leaves it waiting again.
            self.to_client(peer.routing_id, decode(journaled), detached if last and detached.ended_at else None)
        job = self.fleet.jobs.get(job_id)
        if job is not None:  # still running: it is this client's now
            job.client = peer.routing_id
        log.info("client %r collected job %s (%s)", peer.name, job_id, detached.state)
