"""The hub's bookkeeping: who is connected, which jobs wait, which worker runs what.

No sockets here: the hub feeds events in and acts on what comes back. Every peer is one record
(``records.Peer``) in ``peers``, by routing id, and leaves in one place: ``forget``.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Mapping

from ..errors import RemoteMagicError
from ..wire.lifecycle import JobState
from ..wire.protocol import Role
from . import placement
from .records import JobRecord, Peer


class Fleet:
    """Peers (by routing id), the job queue and the matching of jobs to idle workers."""

    def __init__(self) -> None:
        self.peers: dict[bytes, Peer] = {}
        self.jobs: dict[str, JobRecord] = {}
        self.queue: deque[JobRecord] = deque()
        self._queued: dict[bytes, tuple[int, int]] = {}  # per client: its jobs waiting, and their bytes

    def join(self, peer: Peer) -> None:
        """A peer said HELLO: it replaces whatever the fleet held for its routing id."""
        self.peers[peer.routing_id] = peer

    def forget(self, peer: Peer) -> None:
        """The peer left: its link, cache and everything else held for it go with its record."""
        self.peers.pop(peer.routing_id, None)
        peer.link.close()

    def workers(self) -> list[Peer]:
        return [p for p in self.peers.values() if p.role is Role.WORKER]

    def worker_named(self, name: str) -> Peer | None:
        return next((w for w in self.workers() if w.name == name), None)

    def listing(self) -> list[dict[str, Any]]:
        """The workers as a client sees them (WELCOME, WORKERS)."""
        return [describe(worker) for worker in self.workers()]

    def unique_name(self, wanted: str, routing_id: bytes) -> str:
        """``wanted``, or ``wanted-2``, ... if another worker already has that name."""
        taken = {w.name for w in self.workers() if w.routing_id != routing_id}
        name, n = wanted, 1
        while name in taken:
            n += 1
            name = f"{wanted}-{n}"
        return name

    def enqueue(self, job: JobRecord) -> None:
        self.jobs[job.id] = job
        self.queue.append(job)
        count, held = self.queued_by(job.client)
        self._queued[job.client] = (count + 1, held + _size(job))

    def queued_by(self, client: bytes) -> tuple[int, int]:
        """How many of ``client``'s jobs wait for a worker, and the bytes the hub holds for them."""
        return self._queued.get(client, (0, 0))

    def queued_bytes(self) -> int:
        """The bytes the hub holds for every job waiting for a worker."""
        return sum(held for _, held in self._queued.values())

    def _dequeue(self, job: JobRecord) -> None:
        self.queue.remove(job)
        count, held = self.queued_by(job.client)
        if count <= 1:
            self._queued.pop(job.client, None)
        else:
            self._queued[job.client] = (count - 1, held - _size(job))

    def next_assignments(self) -> list[tuple[JobRecord, Peer]]:
        """Match waiting jobs to idle workers that fit them (``placement``), oldest job first; marks them sent.
        A worker out of reach takes none: a job waits for it to be back, or goes to another."""
        assigned = []
        idle = [w for w in self.workers() if w.job is None and not w.out_of_reach]
        for job in list(self.queue):
            if not idle:
                break
            worker = placement.choose(job, idle)
            if worker is None:
                continue
            idle.remove(worker)
            self._dequeue(job)
            job.worker, worker.job = worker.routing_id, job
            job.sent_at = time.monotonic()
            job.lifecycle.move(JobState.SENT, f"to worker {worker.name!r}")
            assigned.append((job, worker))
        return assigned

    def finish(self, job_id: str, error: Mapping[str, Any] | RemoteMagicError | None = None) -> JobRecord | None:
        """End a job (with ``error``, an exception or ERROR header, when it failed) and forget it;
        frees its worker."""
        job = self.jobs.pop(job_id, None)
        if job is None:
            return None
        job.lifecycle.end(error)
        if job in self.queue:
            self._dequeue(job)
        worker = self.peers.get(job.worker) if job.worker else None
        if worker is not None and worker.job is job:
            worker.job = None
            worker.jobs_done += 1
            worker.usage.busy_s += time.monotonic() - job.sent_at
        return job

    def could_run(self, job: JobRecord) -> bool:
        """Does a connected worker fit the job (its name and requirements), busy or not? True with none
        connected: a job waits for the first worker to join."""
        workers = self.workers()
        return not workers or any(placement.fits(job, w) for w in workers)

    def silent(self, now: float, seconds: float) -> list[Peer]:
        """Peers that said nothing for more than ``seconds``."""
        return [p for p in self.peers.values() if now - p.last_seen > seconds]

    def jobs_of_client(self, routing_id: bytes) -> list[JobRecord]:
        return [j for j in self.jobs.values() if j.client == routing_id]


def _size(job: JobRecord) -> int:
    return sum(len(frame) for frame in job.frames)


def describe(worker: Peer) -> dict[str, Any]:
    """The listing a client sees for a worker."""
    running_s = time.monotonic() - worker.job.sent_at if worker.job and worker.job.sent_at else 0.0
    return {
        **worker.capabilities,
        "name": worker.name,
        "versions": worker.versions,
        "state": "busy" if worker.job else "idle",
        "reachable": not worker.out_of_reach,
        "job": worker.job.id if worker.job else None,
        "job_summary": worker.job.summary if worker.job else None,  # its code's first line, or its kind
        "running_s": round(running_s, 1),
        "jobs_done": worker.jobs_done,
        "stats": worker.stats,
        "battery": placement.battery(worker),
        "held": placement.power_hold(worker),
        **worker.usage.as_dict(running_s),
    }
