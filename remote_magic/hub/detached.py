"""Jobs that outlive their notebook: what a job sent its client, kept until someone with the same token
collects it.

Colab drops a runtime when a tab idles; a laptop sleeps. The hub therefore keeps, for every running job,
the messages it sent its client in order (its ``Journal``: STARTED, STREAM, DISPLAY, then RESULT or
ERROR). When a client goes away, its running jobs go on; the hub keeps each one's journal, and once the
job ends, its result, for ``KEEP_S`` seconds, at most ``MAX_BYTES`` in all (the oldest dropped first).
A client connecting with the same credentials (the same client token) lists them (JOBS) and collects one
(ATTACH): the hub replays the journal to it in order, then forwards what comes next, as if it had
submitted the job. The notebook that submitted it, back after the hub forgot its connection (a laptop that
slept), collects its waiting jobs itself, saying how many of each one's messages it had (``received``): only
the rest is replayed.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

KEEP_S = 3600.0
"""How long the result of a job whose client went away is kept for collection."""

MAX_BYTES = 1 << 30
"""At most this much of such jobs' output and results is kept, in all; the oldest finished go first."""

JOURNAL_MAX_BYTES = 64 << 20
"""Output a running job may have journaled; past it, what it prints is forwarded but not kept (a job
collected later says how much it lost). The RESULT and ERROR are always kept."""


def _size(frames: list[Any]) -> int:
    return sum(len(f.buffer) if hasattr(f, "buffer") else memoryview(f).nbytes for f in frames)


@dataclass
class Journal:
    """What a job sent its client, in order, each message kept with its place among all it sent: a client
    that had the first ones (its connection forgotten, say) collects the rest (``since``)."""

    messages: list[tuple[int, list[Any]]] = field(default_factory=list)  # (place, frames)
    count: int = 0  # messages sent, kept or not
    bytes: int = 0
    dropped: int = 0  # bytes of output not kept, past JOURNAL_MAX_BYTES
    last_dropped: int = -1  # the place of the last message not kept

    def add(self, frames: list[Any], ending: bool) -> None:
        place, self.count = self.count, self.count + 1
        size = _size(frames)
        if not ending and self.bytes + size > JOURNAL_MAX_BYTES:
            self.dropped += size
            self.last_dropped = place
            return
        self.messages.append((place, frames))
        self.bytes += size

    def since(self, received: int) -> list[list[Any]]:
        """The messages kept from place ``received`` on, for a client that had the first ``received``."""
        return [frames for place, frames in self.messages if place >= received]


@dataclass
class DetachedJob:
    """A job whose client went away: its journal, whose it is, and how it stands."""

    id: str
    owner: bytes          # the credential (public key) that submitted it: only its holders may collect it
    summary: str          # the first line of its code, or its kind
    worker: str
    journal: Journal
    detached_at: float = field(default_factory=time.monotonic)
    ended_at: float | None = None
    state: str = "running"  # or the state it ended in: done, failed, cancelled, timed_out, lost

    def describe(self) -> dict[str, Any]:
        """The listing a client sees (JOBS)."""
        now = time.monotonic()
        return {"job": self.id, "state": self.state, "worker": self.worker, "summary": self.summary,
                "detached_s": round(now - self.detached_at, 1),
                "ended_s": None if self.ended_at is None else round(now - self.ended_at, 1),
                "output_bytes": self.journal.bytes, "output_dropped": self.journal.dropped}


class DetachedJobs:
    """The hub's detached jobs, running or finished, oldest first."""

    def __init__(self, keep_s: float = KEEP_S, max_bytes: int = MAX_BYTES) -> None:
        self.keep_s = keep_s
        self.max_bytes = max_bytes
        self._jobs: OrderedDict[str, DetachedJob] = OrderedDict()

    def __contains__(self, job_id: str) -> bool:
        return job_id in self._jobs

    def detach(self, job: DetachedJob) -> None:
        self._jobs[job.id] = job

    def ended(self, job_id: str, state: str) -> None:
        """A detached job ended: its journal (with the RESULT or ERROR) now waits for collection."""
        job = self._jobs.get(job_id)
        if job is not None:
            job.state, job.ended_at = state, time.monotonic()
            self._bound()

    def listing(self, owner: bytes) -> list[dict[str, Any]]:
        return [job.describe() for job in self._jobs.values() if job.owner == owner]

    def take(self, job_id: str, owner: bytes) -> DetachedJob | None:
        """The job, for its new client, no longer detached; None if there is none such for ``owner``."""
        job = self._jobs.get(job_id)
        if job is None or job.owner != owner:
            return None
        return self._jobs.pop(job_id)

    def expire(self) -> list[str]:
        """Forget finished jobs kept longer than ``keep_s``; their ids."""
        now = time.monotonic()
        gone = [j.id for j in self._jobs.values() if j.ended_at is not None and now - j.ended_at > self.keep_s]
        for job_id in gone:
            del self._jobs[job_id]
        return gone

    def _bound(self) -> None:
        finished = [j for j in self._jobs.values() if j.ended_at is not None]
        total = sum(j.journal.bytes for j in self._jobs.values())
        for job in finished:  # oldest first
            if total <= self.max_bytes:
                break
            total -= job.journal.bytes
            del self._jobs[job.id]
