"""The worker's supervisor: joins a hub, hands jobs to an executor child process, keeps it alive.

Everything runs on the hub connection's I/O thread: messages from the hub and from the executor
arrive there, and a tick after every poll checks the executor's health, the job's timeout and an
interrupt's grace period. User code can kill the executor in any way; the job fails with a
clear reason and a fresh executor takes the next job.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import zmq

from remote_magic.errors import (
    ConnectionFailed,
    ExecutorDied,
    JobCancelled,
    JobError,
    JobTimeout,
    OutputError,
    WorkerLost,
)
from remote_magic.wire import serialization
from remote_magic.wire.connection import Connection, dial
from remote_magic.wire.failures import error_header
from remote_magic.wire.lifecycle import JobState, Lifecycle
from remote_magic.wire.protocol import DEFAULT_MAX_MESSAGE_BYTES, Message, MessageType as T, Role, decode, encode
from remote_magic.wire.tokens import Token
from remote_magic.wire.versions import local_versions

from .capabilities import host_capabilities

log = logging.getLogger(__name__)

EXECUTOR_START_TIMEOUT_S = 120.0
"""Starting Python, numpy and a GPU device; lavapipe on a busy machine is the slow case."""

EXECUTOR_LAUNCHER = ("import sys\nif sys.path[:1] == ['']: del sys.path[0]\n"
                     "from remote_magic.worker.executor import main\nmain(sys.argv[1:])")
"""Starts the executor with the working directory off sys.path while remote-magic loads (`python -m`
would put it first, where a folder or module of the user's could shadow the package); the executor
puts it back for the cells."""

INTERRUPT_GRACE_S = 2.0
"""After SIGINT, how long user code has to stop before the executor is killed and replaced."""

HEALTH_CHECK_INTERVAL_S = 0.05
"""While a job runs: how often the executor's liveness and memory are checked."""


@dataclass
class ExecutorOptions:
    gpu: str = "auto"
    adapter: str | None = None
    backend: str | None = None
    max_memory_bytes: int | None = None


@dataclass
class HeldJob:
    """A job this worker holds: queued while its executor is busy or restarting, then running there."""

    id: str
    frames: list[Any]  # the SUBMIT for the executor, until it has it
    timeout: float | None
    lifecycle: Lifecycle
    deadline: float | None = None
    interrupted_at: float | None = None
    reason: str = ""  # why it was interrupted: "cancel", "timeout" or "lost"

    @classmethod
    def from_submit(cls, msg: Message, party: str) -> "HeldJob":
        asked = msg.header.get("timeout")
        valid = isinstance(asked, (int, float)) and 0 < asked <= sys.float_info.max  # not NaN, inf, 10**400
        job_id = str(msg.header["job"])
        return cls(job_id, encode(T.SUBMIT, msg.header, msg.buffers), float(asked) if valid else None,  # type: ignore[arg-type]
                   Lifecycle(job_id, party))


TEMP_PREFIX = "remote-magic-"
"""Each worker's temporary folder (the executor's socket, its runtime dir) is TEMP_PREFIX + its pid."""


def remove_abandoned_dirs() -> list[Path]:
    """Remove the temporary folders of workers that were killed (their pid is gone); the ones removed."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(f"{TEMP_PREFIX}*-*"):
        pid = folder.name[len(TEMP_PREFIX):].partition("-")[0]
        if not pid.isdigit() or psutil.pid_exists(int(pid)) or folder.stat().st_uid != os.getuid():
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
        log.info("removed %s, left by a worker that was killed", folder)
    return removed


class ExecutorProcess:
    """One executor child and the ROUTER socket it dials; restartable."""

    def __init__(self, context: zmq.Context[Any], options: ExecutorOptions) -> None:
        self.options = options
        remove_abandoned_dirs()
        self._dir = tempfile.TemporaryDirectory(prefix=f"{TEMP_PREFIX}{os.getpid()}-")
        self.socket = context.socket(zmq.ROUTER)
        self.socket.linger = 0
        self.socket.router_mandatory = True
        if zmq.has("ipc"):
            self.socket.bind(f"ipc://{Path(self._dir.name) / 'executor'}")
        else:
            self.socket.bind("tcp://127.0.0.1:0")
        self.endpoint = self.socket.last_endpoint.decode()
        self.generation = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.spawned_at = 0.0
        self.ready = False
        self.capabilities: dict[str, Any] = {}

    @property
    def identity(self) -> bytes:
        return b"executor-%d" % self.generation

    def spawn(self) -> None:
        self.generation += 1
        self.ready = False
        self.spawned_at = time.monotonic()
        command = [sys.executable, "-c", EXECUTOR_LAUNCHER, self.endpoint, str(self.generation),
                   "--gpu", self.options.gpu]
        if self.options.adapter:
            command += ["--adapter", self.options.adapter]
        if self.options.backend:
            command += ["--backend", self.options.backend]
        # Vulkan loaders complain on headless machines without it; a private one is enough.
        env = {**os.environ, "XDG_RUNTIME_DIR": os.environ.get("XDG_RUNTIME_DIR") or self._dir.name}
        # Its own session: a Ctrl-C in the worker's terminal is the worker's, not the job's.
        self.process = subprocess.Popen(command, start_new_session=True, env=env)
        log.info("started executor %d (pid %d)", self.generation, self.process.pid)

    def wait_ready(self, timeout: float) -> None:
        """Block until the new executor says hello (used before the hub connection exists)."""
        deadline = time.monotonic() + timeout
        while not self.ready:
            if self.died() is not None:
                raise RuntimeError(f"the executor process exited during start-up ({self.died()}); "
                                   "run with -v to see its output")
            if self.socket.poll(min(0.2, max(0.0, deadline - time.monotonic())) * 1000):
                self.on_message(self.socket.recv_multipart(copy=False))
            elif time.monotonic() > deadline:
                raise RuntimeError(f"the executor did not start within {timeout:g} s")

    def on_message(self, frames: list[zmq.Frame]) -> Message | None:
        """Decode a message from the current executor; HELLO marks it ready. Stale ones return None."""
        if frames[0].bytes != self.identity:
            return None
        msg = decode(frames[1:])
        if msg.type is T.HELLO:
            self.ready = True
            self.capabilities = msg.header.get("gpu") or {}
            return None
        return msg

    def send(self, frames: list[Any]) -> None:
        self.socket.send_multipart([self.identity, *frames], copy=False)

    def died(self) -> str | None:
        """None while alive, else how it ended, in words."""
        code = self.process.poll() if self.process else None
        if code is None:
            return None
        if code < 0:
            try:
                return f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with status {code}"

    def memory_bytes(self) -> int:
        """What the executor and every process it started use (resident), for --max-memory."""
        if self.process is None:
            return 0
        try:
            executor = psutil.Process(self.process.pid)
            processes = [executor, *executor.children(recursive=True)]
        except psutil.Error:
            return 0
        total = 0
        for process in processes:
            try:
                total += process.memory_info().rss
            except psutil.Error:  # ended meanwhile
                continue
        return total

    def interrupt(self) -> None:
        if self.process and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGINT)

    def kill(self) -> None:
        """Kill the executor and everything it started: its process group, which outlives it while
        any of its children run (an executor that crashed leaves them behind)."""
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # its own session: the group's id is its pid
        except ProcessLookupError:
            pass  # the group is gone: nothing left to stop
        self.process.wait()

    def close(self) -> None:
        self.kill()
        self.socket.close()
        self._dir.cleanup()


class Supervisor:
    """Joins the hub a worker token points at and serves jobs until ``stop``.

    Pass the hub's ``context`` when the token's address is the hub's in-process endpoint.
    """

    def __init__(self, token: Token, name: str, options: ExecutorOptions, connect_timeout: float = 10.0,
                 context: zmq.Context[Any] | None = None) -> None:
        if token.role is not Role.WORKER:
            raise ConnectionFailed("this is a client token (rmc1.…); a worker joins with the worker token "
                                   "(rmw1.…) that `remote-worker token --worker` prints on the hub's machine")
        self.token = token
        self.name = name
        self.options = options
        self.connect_timeout = connect_timeout
        self.job: HeldJob | None = None  # the one running in the executor
        self._pending: list[HeldJob] = []  # jobs that came while the executor was busy or restarting
        self._own_context = context is None
        self._context = context or zmq.Context()
        self.executor = ExecutorProcess(self._context, options)
        self._connection: Connection | None = None
        self.welcome: Message | None = None
        self._next_health_check = 0.0
        self._start_failure: str | None = None  # why the last fresh executor never said hello
        self.totals: dict[str, Any] = {"kernels": {}, "gpu_time_s": 0.0, "bytes_uploaded": 0, "bytes_downloaded": 0}

    def start(self) -> None:
        """Start the executor, join the hub; returns once the worker accepts jobs."""
        self.executor.spawn()
        self.executor.wait_ready(EXECUTOR_START_TIMEOUT_S)
        hello = {"role": Role.WORKER.value, "name": self.name, "versions": local_versions(),
                 "capabilities": {**host_capabilities(), "gpu": self.executor.capabilities}}
        sock, self.welcome = dial(self._context, self.token, hello, self.connect_timeout)
        self.name = str(self.welcome.header.get("name", self.name))
        self._connection = Connection(
            self._context, sock, self.welcome, hello, self._on_hub_message, self._on_hub_lost,
            heartbeat_header=lambda: {"stats": {"gpu": self.totals}},
            watch={self.executor.socket: self._on_executor_message}, on_tick=self._tick,
            name="remote-worker-io")
        self._connection.start()  # only now: its callbacks use self._connection
        log.info("worker %r joined %s", self.name, self.token.redacted())

    def stop(self) -> None:
        """Leave the hub and stop the executor."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        self.executor.close()
        if self._own_context:
            self._context.term()

    # -- from the hub ----------------------------------------------------------------------

    def _on_hub_message(self, msg: Message) -> None:
        if msg.type is T.SUBMIT:
            self._pending.append(HeldJob.from_submit(msg, f"worker {self.name!r}"))
            self._start_pending()
        elif msg.type is T.CANCEL:
            job_id = msg.header.get("job")
            if self.job is not None and self.job.id == job_id:
                self._interrupt("cancel")
            for job in [j for j in self._pending if j.id == job_id]:
                self._end_pending(job, JobCancelled("the job was cancelled before it started"))
        elif msg.type is T.ERROR:
            log.warning("the hub says: %s", msg.header.get("message"))

    def _on_hub_lost(self, reason: str) -> None:
        if self._connection is not None and self._connection.refused:
            log.error("%s", reason)  # final: these credentials won't work again
        else:
            log.warning("%s; reconnecting", reason)
        # Their clients can't get their results: stop the running job (its executor is killed if it
        # doesn't stop), so this worker is free when the hub takes it back, and drop the waiting ones.
        if self.job is not None:
            self._interrupt("lost")
        for job in list(self._pending):
            self._end_pending(job, WorkerLost(f"worker {self.name!r} lost its link to the hub before the job "
                                              f"started ({reason}); run it again"))

    def _start_job(self, job: HeldJob) -> None:
        try:
            self.executor.send(job.frames)
        except zmq.ZMQError:  # no route to the executor: it died idle, and the job never reached it
            log.info("the idle executor is gone; starting a new one")
            self._pending.insert(0, job)
            self._replace_executor()
            return
        self.job = job
        job.frames = []
        job.deadline = time.monotonic() + job.timeout if job.timeout else None
        job.lifecycle.move(JobState.RUNNING)
        self._send_hub(T.STARTED, {"job": job.id, "worker": self.name})

    def _end_pending(self, job: HeldJob, error: JobError) -> None:
        self._pending.remove(job)
        job.lifecycle.end(error)
        self._send_hub(T.ERROR, error_header(error, job.id))

    def _send_hub(self, msg_type: T, header: dict[str, Any]) -> None:
        assert self._connection is not None
        self._connection.send_now(encode(msg_type, header))

    # -- from the executor -----------------------------------------------------------------

    def _on_executor_message(self, frames: list[zmq.Frame]) -> None:
        try:
            msg = self.executor.on_message(frames)
        except Exception as exc:  # a garbled message from user code's process must not stop the worker
            log.warning("dropped a malformed message from the executor: %s", exc)
            return
        if msg is None:
            self._start_pending()
            return
        if self.job is None or msg.header.get("job") != self.job.id:
            return
        if msg.type in (T.RESULT, T.ERROR):
            if msg.type is T.ERROR and self.job.reason:
                msg.header.update(error_header(self._interrupted_error(self.job)))
            self._count(msg.header.get("stats"))
            replace = bool(msg.header.pop("replace_executor", False))
            if msg.type is T.RESULT and (too_large := self._oversized(msg)) is not None:
                msg = Message(T.ERROR, error_header(too_large, self.job.id))
            self.job.lifecycle.end(msg.header if msg.type is T.ERROR else None)
            self._connection.send_now(encode(msg.type, msg.header, msg.buffers))  # type: ignore[union-attr]
            self.job = None
            if replace:
                log.info("replacing the executor: a job was interrupted in the middle of an import")
                self._replace_executor()
            self._start_pending()
        else:
            self._connection.send_now(list(frames[1:]))  # type: ignore[union-attr]

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
        shown = "the cell's value" if name == "__value__" else f"`{name}`"
        return OutputError(
            f"{shown} needs a {largest / 2**20:.1f} MiB frame, over the hub's {limit / 2**20:.1f} MiB limit: "
            "return less (or a part at a time), or start the hub's remote-worker with a larger "
            "--max-message-size", None if name == "__value__" else name)

    def _count(self, stats: Any) -> None:
        """Add one job's GPU counters to the totals the worker listing shows."""
        if not isinstance(stats, dict):
            return
        for name, count in (stats.get("kernels") or {}).items():
            self.totals["kernels"][name] = self.totals["kernels"].get(name, 0) + int(count)
        for key in ("gpu_time_s", "bytes_uploaded", "bytes_downloaded"):
            self.totals[key] += stats.get(key) or 0

    def _start_pending(self) -> None:
        if self.job is None and self._pending and self._start_failure is not None:
            self._start_failure = None  # a new job: try a fresh executor once more, for it
            self.executor.spawn()
        if self.job is None and self.executor.ready and self._pending and not self._replaced_dead_executor():
            self._start_job(self._pending.pop(0))

    def _failed_to_start(self) -> str | None:
        """Why the executor being started will never say hello (None while it still may)."""
        if (death := self.executor.died()) is not None:
            return f"{death} while starting"
        if time.monotonic() - self.executor.spawned_at > EXECUTOR_START_TIMEOUT_S:
            return f"did not start within {EXECUTOR_START_TIMEOUT_S:g} s"
        return None

    def _give_up_starting(self, why: str) -> None:
        """Fail the jobs waiting for an executor that won't start; the next job that comes tries again."""
        log.error("the worker's job process %s; run remote-worker with -v to see its output", why)
        self._start_failure = why
        self.executor.kill()
        for job in list(self._pending):
            self._end_pending(job, ExecutorDied(
                f"the worker's job process {why}, so this job did not run. The worker starts another for "
                "the next job; if this repeats, see the worker's log (remote-worker -v)"))

    def _replaced_dead_executor(self) -> bool:
        """An idle executor that died (killed from outside) is replaced; the next job waits for the new one."""
        if (death := self.executor.died()) is None:
            return False
        log.info("the idle executor %s; starting a new one", death)
        self._replace_executor()
        return True

    # -- health ----------------------------------------------------------------------------

    def _tick(self) -> float:
        if self.job is None:
            if self.executor.ready:
                self._replaced_dead_executor()
            elif self._start_failure is None and (why := self._failed_to_start()) is not None:
                self._give_up_starting(why)
            return 0.5
        now = time.monotonic()
        if now < self._next_health_check:
            return HEALTH_CHECK_INTERVAL_S
        self._next_health_check = now + HEALTH_CHECK_INTERVAL_S
        job = self.job
        death = self.executor.died()
        limit = self.options.max_memory_bytes
        if death is None and limit and (used := self.executor.memory_bytes()) > limit:
            death = (f"was killed by remote-worker: it used {used / 2**30:.2f} GiB, over the "
                     f"{limit / 2**30:.2f} GiB limit (--max-memory)")  # _fail_job kills it
        if death is None and job.interrupted_at is not None and now - job.interrupted_at > INTERRUPT_GRACE_S:
            self._fail_job(job, self._interrupted_error(
                job, f" (it ignored the interrupt for {INTERRUPT_GRACE_S:g} s, so its process was replaced)"))
            return HEALTH_CHECK_INTERVAL_S
        if death is not None:
            self._fail_job(job, ExecutorDied(
                f"the job's process {death} while running this job"
                f"{' (a crash in native code?)' if 'SIG' in death else ''}. The worker "
                "started a fresh process; run the cell again after fixing the cause."))
            return HEALTH_CHECK_INTERVAL_S
        if job.deadline is not None and now > job.deadline and job.interrupted_at is None:
            self._interrupt("timeout")
        return HEALTH_CHECK_INTERVAL_S

    def _interrupt(self, reason: str) -> None:
        assert self.job is not None
        if self.job.interrupted_at is None:
            self.job.interrupted_at = time.monotonic()
            self.job.reason = reason
            self.executor.interrupt()

    def _interrupted_error(self, job: HeldJob, detail: str = "") -> JobError:
        if job.reason == "timeout":
            return JobTimeout(f"the job ran past its {job.timeout:g} s timeout and was stopped "
                              f"(raise it with --timeout){detail}")
        if job.reason == "lost":
            return WorkerLost(f"worker {self.name!r} lost its link to the hub while running this job, so it "
                              f"stopped the job{detail}; run it again")
        return JobCancelled(f"the job was interrupted{detail}")

    def _fail_job(self, job: HeldJob, error: JobError) -> None:
        job.lifecycle.end(error)
        self._send_hub(T.ERROR, error_header(error, job.id))
        self.job = None
        self._replace_executor()

    def _replace_executor(self) -> None:
        self.executor.kill()
        self.executor.spawn()  # the next job waits in _pending until it says hello
