"""A worker's sessions: one executor process per connected notebook, so its interpreter state
(imports, module globals, RNG state, print options, working directory) lasts between its cells
and no other notebook sees it.

The hub names each job's session (derived from its client's key) and says when one ends.
A spare executor, started ahead, is what a new session takes, so its first cell doesn't wait for
Python and numpy to start. At most ``max_sessions`` live at once: a new one beyond that evicts the
least recently used (all are idle then: a worker runs one job at a time). A session whose state
was lost without the notebook asking (a crash, an eviction) keeps a note, told with its next job.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from . import DEFAULT_MAX_SESSIONS
from .executor_processes import ExecutorLink, ExecutorProcess

log = logging.getLogger(__name__)

MAX_NOTES = 256
"""Notes kept for sessions whose state was lost (a few short strings each): the oldest go first."""


@dataclass
class Session:
    """One notebook's interpreter on this worker."""

    id: str
    executor: ExecutorProcess
    last_used: float = field(default_factory=time.monotonic)


class Sessions:
    """The live sessions, least recently used first, and the spare executor."""

    def __init__(self, link: ExecutorLink, max_sessions: int = DEFAULT_MAX_SESSIONS) -> None:
        if max_sessions < 1:
            raise ValueError("a worker needs at least one session (--max-sessions 1 or more)")
        self.max_sessions = max_sessions
        self.spare: ExecutorProcess | None = None
        self._link = link
        self._live: OrderedDict[str, Session] = OrderedDict()
        self._notes: OrderedDict[str, str] = OrderedDict()  # session -> why its state was lost

    def live(self) -> list[Session]:
        return list(self._live.values())

    def __len__(self) -> int:
        return len(self._live)

    def start_spare(self) -> None:
        """Start the executor the next new session takes, unless one is there."""
        if self.spare is None:
            self.spare = self._link.spawn()

    def drop_spare(self) -> None:
        if self.spare is not None:
            self._link.stop(self.spare)
            self.spare = None

    def get(self, session_id: str) -> Session | None:
        return self._live.get(session_id)

    def open(self, session_id: str) -> Session:
        """The session's, or a new one on the spare (or a fresh) executor; it becomes the most recently used."""
        session = self._live.get(session_id)
        if session is not None:
            self._live.move_to_end(session_id)
            session.last_used = time.monotonic()
            return session
        if len(self._live) >= self.max_sessions:
            oldest = next(iter(self._live))
            log.info("evicting session %s, the least recently used, for a new one (--max-sessions %d)",
                     oldest, self.max_sessions)
            self.end(oldest, f"the worker keeps at most {self.max_sessions} sessions (remote-worker "
                             "--max-sessions) and this notebook's was the least recently used")
        executor, self.spare = self.spare or self._link.spawn(), None
        session = self._live[session_id] = Session(session_id, executor)
        log.info("session %s started on executor %d", session_id, executor.number)
        return session

    def end(self, session_id: str, lost: str | None = None) -> bool:
        """Stop a session's executor; False if it had none. ``lost``: why its state went without the
        notebook asking, told with the session's next job."""
        if lost is not None:
            self._notes[session_id] = lost
            self._notes.move_to_end(session_id)
            while len(self._notes) > MAX_NOTES:
                self._notes.popitem(last=False)
        session = self._live.pop(session_id, None)
        if session is None:
            return False
        self._link.stop(session.executor)
        log.info("session %s ended%s", session_id, f": {lost}" if lost else "")
        return True

    def forget_note(self, session_id: str) -> None:
        self._notes.pop(session_id, None)

    def take_note(self, session_id: str) -> str | None:
        """Why the session's state was lost since its last job, once."""
        return self._notes.pop(session_id, None)

    def memory(self) -> dict[str, int]:
        """Resident bytes of each session's executor and the processes it started."""
        return {session.id: session.executor.memory_bytes() for session in self._live.values()}

    def close(self) -> None:
        for session_id in list(self._live):
            self.end(session_id)
        self.drop_spare()
