"""The worker's supervisor: joins a hub, runs each notebook's jobs in that notebook's session, keeps
the executors alive.

Everything runs on the hub connection's I/O thread: messages from the hub and from the executors
arrive there, and a tick after every poll checks the running executor's health, the job's timeout
and an interrupt's grace period. User code can kill its executor in any way; the job fails with a
clear reason, the session's state is reset, and the session's next job runs in a fresh executor.
One job runs at a time; sessions (``sessions.py``) only keep each notebook's interpreter apart.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Mapping

import zmq

from remote_magic.errors import (
    ConnectionFailed,
    ExecutorDied,
    JobCancelled,
    JobError,
    JobTimeout,
    OutputError,
    ProtocolError,
    WorkerLost,
)
from remote_magic.wire import schema, serialization
from remote_magic.wire.connection import Connection, dial
from remote_magic.wire.failures import error_header
from remote_magic.wire.handles import CELL_VALUE
from remote_magic.wire.lifecycle import JobState, Lifecycle
from remote_magic.wire.protocol import DEFAULT_MAX_MESSAGE_BYTES, Message, MessageType as T, Role, encode
from remote_magic.wire.sizes import human_size
from remote_magic.wire.tokens import Token
from remote_magic.wire.versions import local_versions

from . import DEFAULT_MAX_SESSIONS, DEFAULT_ORPHAN_GRACE_S
from .capabilities import battery_state, host_capabilities, where_python_runs
from .executor_processes import EXECUTOR_START_TIMEOUT_S, ExecutorLink, ExecutorOptions
from .jupyter_kernels import KernelHost
from .sessions import Session, Sessions
from .stream_batches import StreamBatches

__all__ = ["ExecutorOptions", "HeldJob", "Supervisor"]

log = logging.getLogger(__name__)

INTERRUPT_GRACE_S = 2.0
"""After SIGINT, how long user code has to stop before the executor is killed and replaced."""

HEALTH_CHECK_INTERVAL_S = 0.05
"""While a job runs: how often the executor's liveness and memory are checked."""

VERSIONS_REFRESH_S = 10.0
"""How often the worker reads its libraries' versions again for its heartbeats, so that one installed while it
runs (matplotlib after a cell failed for want of it) shows in the hub's listing and in %offload_connect's notices."""

RECENT_JOBS = 100_000
"""How many job ids a worker remembers having taken, so a SUBMIT that comes twice never runs twice."""

STATE_RESET = "the session's state was reset"
"""Said in every error and notice about a session whose executor was replaced without the notebook asking."""


@dataclass
class HeldJob:
    """A job this worker holds: queued while its executor is busy or starting, then running there."""

    id: str
    frames: list[Any]  # the SUBMIT for the executor, until it has it
    timeout: float | None
    lifecycle: Lifecycle
    session: str = ""
    kind: str = "code"
    deadline: float | None = None
    interrupted_at: float | None = None
    reason: str = ""  # why it was interrupted: "cancel", "timeout" or "lost"
    digests: dict[int, str] = field(default_factory=dict)  # the large frames', by index in ``frames`` (the hub's)

    @classmethod
    def from_submit(cls, msg: Message, party: str) -> "HeldJob":
        asked = msg.header.get("timeout")
        valid = isinstance(asked, (int, float)) and 0 < asked <= sys.float_info.max  # not NaN, inf, 10**400
        job_id = str(msg.header["job"])
        digests = msg.header.get("digests") or {}  # {buffer index: digest}; the buffers follow 3 frames
        return cls(job_id, encode(T.SUBMIT, msg.header, msg.buffers), float(asked) if valid else None,  # type: ignore[arg-type]
                   Lifecycle(job_id, party), str(msg.header.get("session") or ""), str(msg.header.get("kind")),
                   digests={3 + int(index): key for index, key in digests.items() if index.isdigit()})


class Supervisor:
    """Joins the hub a worker token points at and serves jobs until ``stop``.

    Pass the hub's ``context`` when the token's address is the hub's in-process endpoint.
    """

    def __init__(self, token: Token, name: str, options: ExecutorOptions, connect_timeout: float = 10.0,
                 context: zmq.Context[Any] | None = None, max_sessions: int = DEFAULT_MAX_SESSIONS,
                 placement: Mapping[str, Any] | None = None, jupyter_kernels: bool = True,
                 jupyter_kernel_python: str | None = None,
                 jupyter_kernel_grace_s: float = DEFAULT_ORPHAN_GRACE_S,
                 max_jupyter_kernels: int | None = None) -> None:
        if token.role is not Role.WORKER:
            raise ConnectionFailed("this is a client token (rmc1.…); a worker joins with the worker token "
                                   "(rmw1.…) that `remote-worker token --worker` prints on the hub's machine")
        self.token = token
        self.name = name
        self.options = options
        self.placement = dict(placement or {})  # labels, on_battery, min_battery: told to the hub at HELLO
        self.connect_timeout = connect_timeout
        self.job: HeldJob | None = None  # the one running in its session's executor
        self._pending: list[HeldJob] = []  # jobs that came while an executor was busy or starting
        self._taken: OrderedDict[str, None] = OrderedDict()  # job ids taken lately: none runs twice
        self._own_context = context is None
        self._context = context or zmq.Context()
        self._link = ExecutorLink(self._context, options)
        self.sessions = Sessions(self._link, max_sessions)
        self.jupyter_kernels = KernelHost(self._context, lambda: self.name, jupyter_kernel_python or sys.executable,
                                          jupyter_kernels, jupyter_kernel_grace_s, max_jupyter_kernels,
                                          options.max_memory_bytes)
        self._connection: Connection | None = None
        self._batches = StreamBatches(self._send_frames)  # the running job's output, short writes together
        self.welcome: Message | None = None
        self._next_health_check = 0.0
        self.totals: dict[str, Any] = {"kernels": {}, "gpu_time_s": 0.0, "bytes_uploaded": 0, "bytes_downloaded": 0,
                                       "resident_hits": 0, "bytes_resident": 0}
        self.gpu: dict[str, Any] = {}
        self._versions: dict[str, str] = {}
        self._versions_due = 0.0  # time.monotonic() at which they are read again

    def start(self) -> None:
        """Start the spare executor, join the hub; returns once the worker accepts jobs."""
        self.sessions.start_spare()
        assert self.sessions.spare is not None
        self._link.wait_ready(self.sessions.spare, EXECUTOR_START_TIMEOUT_S)
        self.gpu = dict(self.sessions.spare.capabilities)  # what every executor of this worker has
        machine = where_python_runs() if self.options.tab else host_capabilities()  # a tab's CPUs etc.: unknown
        hello = {"role": Role.WORKER.value, "name": self.name, "versions": local_versions(),
                 "capabilities": {**machine, **self.placement, **self.jupyter_kernels.describe(), "gpu": self.gpu}}
        sock, self.welcome = dial(self._context, self.token, hello, self.connect_timeout)
        self.name = str(self.welcome.header.get("name", self.name))
        self._connection = Connection(
            self._context, sock, self.welcome, hello, self._on_hub_message, self._on_hub_lost,
            heartbeat_header=self._heartbeat, watch={self._link.socket: self._on_executor_message},
            on_tick=self._tick, name="remote-worker-io", on_reconnect=self._resume)
        self.jupyter_kernels.start(self._connection.send)
        self._connection.start()  # only now: its callbacks use self._connection
        log.info("worker %r joined %s", self.name, self.token.redacted())

    def stop(self) -> None:
        """Leave the hub and stop every executor."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        self.jupyter_kernels.close()  # after the connection's thread, the one that hands it messages, is gone
        self.sessions.close()
        self._link.close()
        if self._own_context:
            self._context.term()

    def _heartbeat(self) -> dict[str, Any]:
        battery = None if self.options.tab else battery_state()  # a tab's is unknown, and this host's isn't the tab's
        now = time.monotonic()
        if now >= self._versions_due:  # a few ms: not at every heartbeat
            self._versions, self._versions_due = local_versions(fresh=True), now + VERSIONS_REFRESH_S
        return {"stats": {"gpu": self.totals, "sessions": self.sessions.memory(),
                          "max_sessions": self.sessions.max_sessions, "battery": battery,
                          "kernels": self.jupyter_kernels.stats()}, "versions": self._versions}

    # -- from the hub ----------------------------------------------------------------------

    def _on_hub_message(self, msg: Message) -> None:
        try:
            schema.check(msg)  # the hub checked what it forwards; whatever slipped through must not reach a session
        except ProtocolError as exc:
            log.warning("dropped a malformed %s from the hub: %s", msg.type.value, exc)
            if msg.type is T.SUBMIT and (refused := schema.job_of(msg.header)) is not None:
                self._send_hub(T.ERROR, error_header(exc, refused))
            return
        if msg.type is T.SUBMIT:
            submitted = str(msg.header["job"])
            if submitted in self._taken:  # the hub never hands a job on twice; a bug must not run it twice either
                log.warning("dropped a second SUBMIT of job %s: it runs, or ran, here already", submitted)
                return
            self._taken[submitted] = None
            if len(self._taken) > RECENT_JOBS:
                self._taken.popitem(last=False)
            self._pending.append(HeldJob.from_submit(msg, f"worker {self.name!r}"))
            self._start_pending()
        elif msg.type is T.CANCEL:
            job_id = msg.header.get("job")
            if self.job is not None and self.job.id == job_id:
                self._interrupt("cancel")
            for job in [j for j in self._pending if j.id == job_id]:
                self._end_pending(job, JobCancelled("the job was cancelled before it started"))
        elif msg.type is T.SESSION_END:
            self._end_session(str(msg.header.get("session") or ""), str(msg.header.get("reason") or "it ended"))
        elif msg.type in (T.KERNEL_START, T.KERNEL_FRAMES, T.KERNEL_SIGNAL, T.KERNEL_STOP):
            self.jupyter_kernels.handle(msg)
        elif msg.type is T.ERROR:
            log.warning("the hub says: %s", msg.header.get("message"))

    def _resume(self) -> None:
        """After the connection broke and came back: name the jobs this worker holds, so the hub fails those it
        handed over that never arrived, and has this worker stop those it no longer has (wire/link.py)."""
        assert self._connection is not None
        held = [job.id for job in (self.job, *self._pending) if job is not None]
        self._send_hub(T.RESUME, {"jobs": held, "received": self._connection.received})

    def _on_hub_lost(self, reason: str) -> None:
        if self._connection is not None and self._connection.refused:
            log.error("%s", reason)  # final: these credentials won't work again
        else:
            log.warning("%s; reconnecting", reason)
        # The hub told each kernel's client that it is gone (or can't any more): nobody can reach them.
        self.jupyter_kernels.stop_all(f"worker {self.name!r} lost its link to the hub ({reason})")
        # Their clients can't get their results: stop the running job (its executor is killed if it
        # doesn't stop), so this worker is free when the hub takes it back, and drop the waiting ones.
        # Sessions stay: a notebook keeps its routing id, and so its session, across a reconnect.
        if self.job is not None:
            self._interrupt("lost")
        for job in list(self._pending):
            self._end_pending(job, WorkerLost(f"worker {self.name!r} lost its link to the hub before the job "
                                              f"started ({reason}); run it again"))

    def _end_session(self, session_id: str, reason: str) -> None:
        """The hub says the session's notebook is gone: its jobs end, and so does its executor."""
        gone = JobCancelled("the notebook that submitted it went away")
        if self.job is not None and self.job.session == session_id:
            job, self.job = self.job, None
            job.lifecycle.end(gone)
            self._send_hub(T.ERROR, error_header(gone, job.id))
        for job in [j for j in self._pending if j.session == session_id]:
            self._end_pending(job, gone)
        # A notebook the hub timed out may come back with the same routing id: tell it its state went.
        self.sessions.end(session_id, lost=f"the hub ended this notebook's session ({reason})")
        self._start_pending()

    def _reset(self, job: HeldJob) -> None:
        """A "reset" job: end the session, so its next job starts in a fresh interpreter. No executor runs it."""
        job.lifecycle.move(JobState.RUNNING)
        self._send_hub(T.STARTED, {"job": job.id, "worker": self.name})
        self.sessions.forget_note(job.session)  # the notebook asked: nothing to tell it later
        existed = self.sessions.end(job.session)
        job.lifecycle.end()
        self._send_hub(T.RESULT, {"job": job.id, "names": [], "counts": [], "reset": existed,
                                  "duration_s": 0.0, "versions": local_versions()})

    def _start_pending(self) -> None:
        """Start the first waiting job if its session's executor is free and ready."""
        while self.job is None and self._pending:
            job = self._pending[0]
            if job.kind == "reset":
                self._pending.pop(0)
                self._reset(job)
                continue
            session = self.sessions.open(job.session)
            if not session.executor.ready:
                return  # it says hello soon; the tick fails the job if it never does
            if not session.executor.frames.settled:
                return  # it says which of its last job's inputs it holds as soon as that job's objects are gone
            if self._start_job(job, session):
                self._pending.pop(0)

    def _start_job(self, job: HeldJob, session: Session) -> bool:
        """Hand the job to the session's executor; False when that executor turned out dead (the session
        is reset and the job waits for the next)."""
        if (death := session.executor.died()) is not None:
            self._lose_session(session, f"its process {death} while idle")
            return False
        try:
            session.executor.send(job.frames, job.digests)
        except zmq.ZMQError:  # no route to the executor: it died idle, and the job never reached it
            self._lose_session(session, "its process ended while idle")
            return False
        self.job = job
        job.frames = []
        started = time.monotonic()
        job.deadline = started + job.timeout if job.timeout else None
        # A job shorter than one interval is never checked: a memory check reads the job's processes
        # (worker/descendants.py), which an empty cell's round trip need not pay.
        self._next_health_check = started + HEALTH_CHECK_INTERVAL_S
        job.lifecycle.move(JobState.RUNNING)
        self._send_hub(T.STARTED, {"job": job.id, "worker": self.name})
        if (lost := self.sessions.take_note(job.session)) is not None:
            self._send_hub(T.STREAM, {"job": job.id, "name": "stderr", "text": (
                f"remote-magic: worker {self.name!r} runs this cell in a fresh interpreter: {lost}, so "
                f"{STATE_RESET}. Imports, module globals, random seeds and the working directory set by "
                "earlier offloaded cells are gone (the notebook's variables are not).\n")})
        self.sessions.start_spare()  # for the next new session, while this job runs
        return True

    def _end_pending(self, job: HeldJob, error: JobError) -> None:
        self._pending.remove(job)
        job.lifecycle.end(error)
        self._send_hub(T.ERROR, error_header(error, job.id))

    def _send_hub(self, msg_type: T, header: dict[str, Any]) -> None:
        self._batches.flush()  # behind the output the job sent before
        self._send_frames(encode(msg_type, header))

    def _send_frames(self, frames: list[Any]) -> None:
        assert self._connection is not None
        self._connection.send_now(frames)

    # -- from the executors ----------------------------------------------------------------

    def _on_executor_message(self, frames: list[zmq.Frame]) -> None:
        try:
            received = self._link.receive(frames)
        except Exception as exc:  # a garbled message from user code's process must not stop the worker
            log.warning("dropped a malformed message from an executor: %s", exc)
            return
        if received is None:  # from an executor stopped since
            return
        executor, msg = received
        if msg is None:  # a hello: the executor a job may wait for is ready
            self._start_pending()
            return
        job = self.job
        session = self.sessions.get(job.session) if job is not None else None
        if job is None or session is None or session.executor is not executor or msg.header.get("job") != job.id:
            return
        if msg.type in (T.RESULT, T.ERROR):
            if msg.type is T.ERROR and job.reason:
                msg.header.update(error_header(self._interrupted_error(job)))
            self._count(msg.header.get("stats"))
            replace = bool(msg.header.pop("replace_executor", False))
            if replace:
                msg.header["message"] = (f"{msg.header.get('message')}; it cut an import short, which can leave a "
                                         f"module unimportable in that process, so the worker replaced it and "
                                         f"{STATE_RESET}")
            if msg.type is T.RESULT and (too_large := self._oversized(msg)) is not None:
                msg = Message(T.ERROR, error_header(too_large, job.id))
            job.lifecycle.end(msg.header if msg.type is T.ERROR else None)
            self._batches.flush()
            self._send_frames(encode(msg.type, msg.header, msg.buffers))
            self.job = None
            if replace:
                log.info("replacing session %s's executor: a job was interrupted in the middle of an import",
                         session.id)
                self._lose_session(session, "an interrupted import could have left a module unimportable")
            self._start_pending()
        else:
            self._batches.add(msg, list(frames[1:]))

    def _oversized(self, result: Message) -> OutputError | None:
        """A result with a frame the hub would refuse (and cut this connection for): its job fails instead."""
        limit = int((self.welcome.header if self.welcome else {}).get("max_message_bytes") or DEFAULT_MAX_MESSAGE_BYTES)
        try:
            over = serialization.frame_over(result.header["names"], result.header["counts"], result.buffers, limit)
        except (KeyError, TypeError):
            return None
        if over is None:
            return None
        name, largest = over
        shown = "the cell's value" if name == CELL_VALUE else f"`{name}`"
        return OutputError(
            f"{shown} needs a {human_size(largest)} frame, over the hub's {human_size(limit)} limit: "
            "return less (or a part at a time), or start the hub's remote-worker with a larger "
            "--max-message-size", None if name == CELL_VALUE else name)

    def _count(self, stats: Any) -> None:
        """Add one job's GPU counters to the totals the worker listing shows."""
        if not isinstance(stats, dict):
            return
        for name, count in (stats.get("kernels") or {}).items():
            self.totals["kernels"][name] = self.totals["kernels"].get(name, 0) + int(count)
        for key in ("gpu_time_s", "bytes_uploaded", "bytes_downloaded", "resident_hits", "bytes_resident"):
            self.totals[key] += stats.get(key) or 0

    # -- health ----------------------------------------------------------------------------

    def _tick(self) -> float:
        wait = self._check_health()
        due = self._batches.due_in()
        return wait if due is None else min(wait, due)

    def _check_health(self) -> float:
        if self.job is None:
            self._check_idle_executors()
            return 0.5
        now = time.monotonic()
        if now < self._next_health_check:
            return HEALTH_CHECK_INTERVAL_S
        self._next_health_check = now + HEALTH_CHECK_INTERVAL_S
        job = self.job
        session = self.sessions.get(job.session)
        if session is None:  # can't happen: a session ends only with its running job
            return HEALTH_CHECK_INTERVAL_S
        death = session.executor.died()
        limit = self.options.max_memory_bytes
        if death is None and limit and (used := session.executor.memory_bytes()) > limit:
            death = (f"was killed by remote-worker: it used {human_size(used)}, over the "
                     f"{human_size(limit)} limit (--max-memory)")  # _fail_job kills it
        if death is None and job.interrupted_at is not None and now - job.interrupted_at > INTERRUPT_GRACE_S:
            self._fail_job(job, session, self._interrupted_error(
                job, f" (it ignored the interrupt for {INTERRUPT_GRACE_S:g} s, so its process was replaced and "
                     f"{STATE_RESET})"), "a job ignored an interrupt, so its process was replaced")
            return HEALTH_CHECK_INTERVAL_S
        if death is not None:
            self._fail_job(job, session, ExecutorDied(
                f"the job's process {death} while running this job"
                f"{' (a crash in native code?)' if 'SIG' in death else ''}, so {STATE_RESET}: the next cell "
                "runs in a fresh process. Run the cell again after fixing the cause, with the cells whose "
                "imports and settings it needs."), f"the previous job's process {death}")
            return HEALTH_CHECK_INTERVAL_S
        if job.deadline is not None and now > job.deadline and job.interrupted_at is None:
            self._interrupt("timeout")
        return HEALTH_CHECK_INTERVAL_S

    def _check_idle_executors(self) -> None:
        """Between jobs: reset sessions whose executor died (a job waiting for one runs in a fresh one), and
        fail the jobs of one that can't start."""
        for session in self.sessions.live():
            if session.executor.ready and (death := session.executor.died()) is not None:
                self._lose_session(session, f"its process {death} while idle")
                self._start_pending()
            elif not session.executor.ready and (why := session.executor.failed_to_start()) is not None:
                self._give_up_starting(session, why)
        spare = self.sessions.spare
        if spare is not None and (why := None if spare.ready else spare.failed_to_start()) is not None:
            # Not started again until a job needs it: an executor that can't start would loop.
            log.error("the worker's spare job process %s; run remote-worker with -v to see its output", why)
            self.sessions.drop_spare()
        elif spare is not None and spare.ready and (death := spare.died()) is not None:
            log.info("the spare executor %s; starting another", death)
            self.sessions.drop_spare()
            self.sessions.start_spare()

    def _give_up_starting(self, session: Session, why: str) -> None:
        """Fail the jobs waiting for a session's executor that won't start; its next job tries again."""
        log.error("the worker's job process %s; run remote-worker with -v to see its output", why)
        self.sessions.end(session.id)
        for job in [j for j in self._pending if j.session == session.id]:
            self._end_pending(job, ExecutorDied(
                f"the worker's job process {why}, so this job did not run. The worker starts another for "
                "the next job; if this repeats, see the worker's log (remote-worker -v)"))
        self._start_pending()

    def _interrupt(self, reason: str) -> None:
        assert self.job is not None
        session = self.sessions.get(self.job.session)
        if self.job.interrupted_at is None and session is not None:
            self.job.interrupted_at = time.monotonic()
            self.job.reason = reason
            session.executor.interrupt()

    def _interrupted_error(self, job: HeldJob, detail: str = "") -> JobError:
        if job.reason == "timeout":
            return JobTimeout(f"the job ran past its {job.timeout:g} s timeout and was stopped "
                              f"(raise it with --timeout){detail}")
        if job.reason == "lost":
            return WorkerLost(f"worker {self.name!r} lost its link to the hub while running this job, so it "
                              f"stopped the job{detail}; run it again")
        return JobCancelled(f"the job was interrupted{detail}")

    def _fail_job(self, job: HeldJob, session: Session, error: JobError, lost: str) -> None:
        job.lifecycle.end(error)
        self._send_hub(T.ERROR, error_header(error, job.id))
        self.job = None
        self._lose_session(session, lost)
        self._start_pending()

    def _lose_session(self, session: Session, why: str) -> None:
        """End a session whose executor is gone or unusable; its next job starts a fresh one and is told why."""
        log.info("session %s lost its executor: %s", session.id, why)
        self.sessions.end(session.id, lost=why)
