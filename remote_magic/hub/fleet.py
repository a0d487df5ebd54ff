"""The hub's bookkeeping: who is connected, which jobs wait, which worker runs what.

No sockets here: the hub feeds events in and acts on what comes back.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..errors import RemoteMagicError
from ..wire.lifecycle import JobState, Lifecycle
from ..wire.protocol import Role
from ..wire.requirements import Requirement, traits
from . import placement
from .detached import Journal


@dataclass
class Usage:
    """What a worker did for the fleet, as the hub counts it."""

    busy_s: float = 0.0   # from a job's hand-over to the worker until it ended, summed
    gpu_s: float = 0.0    # GPU time its results report (stats.gpu_time_s)
    bytes_in: int = 0     # SUBMIT frames the hub sent it
    bytes_out: int = 0    # what it sent back about jobs: results, errors, output

    def as_dict(self, running_s: float = 0.0) -> dict[str, Any]:
        return {"busy_s": round(self.busy_s + running_s, 3), "gpu_s": round(self.gpu_s, 6),
                "bytes_in": self.bytes_in, "bytes_out": self.bytes_out}


@dataclass
class Peer:
    """A client or worker that said HELLO."""

    identity: bytes
    role: Role
    name: str
    versions: dict[str, str]
    capabilities: dict[str, Any] = field(default_factory=dict)
    local: bool = False          # the hub's in-process worker (inproc, no CURVE keys)
    key: bytes = b""             # the public key it authenticated with: clients sharing it share their jobs
    last_seen: float = field(default_factory=time.monotonic)
    last_sent: float = 0.0
    job: "Job | None" = None     # workers: the job running there
    jobs_done: int = 0           # workers: finished jobs, any outcome
    stats: dict[str, Any] = field(default_factory=dict)  # workers: counters from the last heartbeat
    usage: Usage = field(default_factory=Usage)  # workers: what the hub counted
    traits: dict[str, Any] = field(init=False)  # workers: what requirements match against

    def __post_init__(self) -> None:
        self.traits = traits(self.capabilities)

    def describe(self) -> dict[str, Any]:
        """The listing a client sees for a worker."""
        running_s = time.monotonic() - self.job.sent_at if self.job and self.job.sent_at else 0.0
        return {
            **self.capabilities,
            "name": self.name,
            "versions": self.versions,
            "state": "busy" if self.job else "idle",
            "job": self.job.id if self.job else None,
            "jobs_done": self.jobs_done,
            "stats": self.stats,
            "battery": placement.battery(self),
            "held": placement.power_hold(self),
            **self.usage.as_dict(running_s),
        }


@dataclass
class Job:
    """A submitted job: where it came from, what it asks for, its frames while it waits."""

    id: str
    client: bytes
    worker_name: str | None
    frames: list[Any]
    worker: bytes | None = None
    require: list[Requirement] = field(default_factory=list)
    prefer: str | None = None
    timeout: float | None = None  # the job's own; also how long it may wait for a worker held back by battery
    queued_at: float = field(default_factory=time.monotonic)
    sent_at: float = 0.0
    submit_seq: int | None = None  # its SUBMIT's number on its worker's link
    told_why: bool = False  # its client was told why it waits
    summary: str = ""  # the first line of its code, or its kind: what a listing of detached jobs shows
    journal: Journal = field(default_factory=Journal)  # what it sent its client, for a client that collects it
    lifecycle: Lifecycle = field(init=False)

    def __post_init__(self) -> None:
        self.lifecycle = Lifecycle(self.id, "hub")


class Fleet:
    """Peers, the job queue and the matching of jobs to idle workers."""

    def __init__(self) -> None:
        self.peers: dict[bytes, Peer] = {}
        self.jobs: dict[str, Job] = {}
        self.queue: deque[Job] = deque()

    def workers(self) -> list[Peer]:
        return [p for p in self.peers.values() if p.role is Role.WORKER]

    def worker_named(self, name: str) -> Peer | None:
        return next((w for w in self.workers() if w.name == name), None)

    def unique_name(self, wanted: str, identity: bytes) -> str:
        """``wanted``, or ``wanted-2``, ... if another worker already has that name."""
        taken = {w.name for w in self.workers() if w.identity != identity}
        name, n = wanted, 1
        while name in taken:
            n += 1
            name = f"{wanted}-{n}"
        return name

    def enqueue(self, job: Job) -> None:
        self.jobs[job.id] = job
        self.queue.append(job)

    def next_assignments(self) -> list[tuple[Job, Peer]]:
        """Match waiting jobs to idle workers that fit them (``placement``), oldest job first; marks them sent."""
        assigned = []
        idle = [w for w in self.workers() if w.job is None]
        for job in list(self.queue):
            if not idle:
                break
            worker = placement.choose(job, idle)
            if worker is None:
                continue
            idle.remove(worker)
            self.queue.remove(job)
            job.worker, worker.job = worker.identity, job
            job.sent_at = time.monotonic()
            job.lifecycle.move(JobState.SENT, f"to worker {worker.name!r}")
            assigned.append((job, worker))
        return assigned

    def finish(self, job_id: str, error: Mapping[str, Any] | RemoteMagicError | None = None) -> Job | None:
        """End a job (with ``error``, an exception or ERROR header, when it failed) and forget it;
        frees its worker."""
        job = self.jobs.pop(job_id, None)
        if job is None:
            return None
        job.lifecycle.end(error)
        if job in self.queue:
            self.queue.remove(job)
        worker = self.peers.get(job.worker) if job.worker else None
        if worker is not None and worker.job is job:
            worker.job = None
            worker.jobs_done += 1
            worker.usage.busy_s += time.monotonic() - job.sent_at
        return job

    def could_run(self, job: Job) -> bool:
        """Does a connected worker fit the job (its name and requirements), busy or not? True with none
        connected: a job waits for the first worker to join."""
        workers = self.workers()
        return not workers or any(placement.fits(job, w) for w in workers)

    def silent(self, now: float, seconds: float) -> list[Peer]:
        """Peers that said nothing for more than ``seconds``."""
        return [p for p in self.peers.values() if now - p.last_seen > seconds]

    def jobs_of_client(self, identity: bytes) -> list[Job]:
        return [j for j in self.jobs.values() if j.client == identity]
