"""A job's lifecycle, written once: the states the client, the hub and the worker move a job through.

::

    queued ──> sent ──> running ──> done | failed | cancelled | timed_out | lost
      │          │                      ▲
      └──────────┴──────────────────────┘   (a job can end before it runs)

Each party keeps its own ``Lifecycle`` per job, for the part of the way it sees: the client's job
is *sent* once it is on its way to the hub, the hub's once a worker has it, and the worker's is
*queued* while its executor restarts. Every move is logged at DEBUG (logger
``remote_magic.wire.lifecycle``); a move the diagram doesn't allow raises ``InvalidTransition``, so
a job ends exactly once.

The promise the three parties keep together (docs/protocol.md, "Job lifecycle"): every job ends,
within its timeout or the heartbeat bound, in its result or an error that names the cause; and no
job runs twice: the hub hands a job to one worker once, and never to another, whatever happens to it,
and the hub and the worker each drop a job id they took already (wire/link.py carries a message again
after a reconnect).
"""

from __future__ import annotations

import logging
from enum import Enum
from typing import Any, Mapping

from ..errors import (
    ConnectionFailed,
    InvalidTransition,
    JobCancelled,
    JobTimeout,
    RemoteMagicError,
    WorkerLost,
)
from .failures import is_error

log = logging.getLogger(__name__)


class JobState(str, Enum):
    """Where a job is; the last five are terminal."""

    QUEUED = "queued"        # waiting for a hub (client), a worker (hub) or an executor (worker)
    SENT = "sent"            # handed on: to the hub (client), to a worker (hub)
    RUNNING = "running"      # its worker started it
    DONE = "done"            # its result arrived
    FAILED = "failed"        # it ended with an error: the user's code raised, the executor died, ...
    CANCELLED = "cancelled"  # interrupted, or its client went away
    TIMED_OUT = "timed_out"  # it ran past its timeout
    LOST = "lost"            # its worker, or the link to it, went away while it was there


TERMINAL = frozenset({JobState.DONE, JobState.FAILED, JobState.CANCELLED, JobState.TIMED_OUT, JobState.LOST})

_NEXT: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.SENT, JobState.RUNNING}) | TERMINAL,
    JobState.SENT: frozenset({JobState.RUNNING}) | TERMINAL,
    JobState.RUNNING: TERMINAL,
}


def terminal_state(error: Mapping[str, Any] | RemoteMagicError | None) -> JobState:
    """The state a job ends in: DONE without an error, else the one its error (or ERROR header) names."""
    if error is None:
        return JobState.DONE

    def carries(kind: type[RemoteMagicError]) -> bool:
        return isinstance(error, kind) if isinstance(error, RemoteMagicError) else is_error(error, kind)

    if carries(JobTimeout):
        return JobState.TIMED_OUT
    if carries(JobCancelled):
        return JobState.CANCELLED
    if carries(WorkerLost) or carries(ConnectionFailed):
        return JobState.LOST
    return JobState.FAILED


class Lifecycle:
    """One job's state as one party (``"client"``, ``"hub"``, ``"worker 'w1'"``) sees it."""

    def __init__(self, job_id: str, party: str) -> None:
        self.job_id = job_id
        self.party = party
        self.state = JobState.QUEUED
        log.debug("%s: job %s queued", party, job_id)

    @property
    def ended(self) -> bool:
        return self.state in TERMINAL

    def move(self, state: JobState, why: str = "") -> None:
        """Go to ``state``; raises InvalidTransition when the diagram has no such step."""
        if state not in _NEXT.get(self.state, frozenset()):
            raise InvalidTransition(f"{self.party}: job {self.job_id} can't go from {self.state.value} to "
                                    f"{state.value}{f' ({why})' if why else ''}")
        log.debug("%s: job %s %s -> %s%s", self.party, self.job_id, self.state.value, state.value,
                  f" ({why})" if why else "")
        self.state = state

    def end(self, error: Mapping[str, Any] | RemoteMagicError | None = None, why: str = "") -> JobState:
        """Move to the terminal state ``error`` stands for (DONE for None); returns it."""
        state = terminal_state(error)
        if not why and error is not None:
            why = str(error.get("error", "error")) if isinstance(error, Mapping) else type(error).__name__
        self.move(state, why)
        return state

    def __repr__(self) -> str:
        return f"<job {self.job_id} {self.state.value} ({self.party})>"
