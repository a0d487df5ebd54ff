"""Executor child processes and the one socket they all dial.

A worker runs one executor per session (``sessions.py``), plus a spare. Each executor dials the
same local ROUTER socket with its own routing id, so the supervisor's I/O thread watches one
socket however many sessions come and go; messages from an executor that was replaced are
recognised by their routing id and dropped.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import psutil
import zmq

from remote_magic.wire.protocol import Message, MessageType as T, decode

from . import shared_frames
from .descendants import child_environment, tree

log = logging.getLogger(__name__)

EXECUTOR_START_TIMEOUT_S = 120.0
"""Starting Python, numpy and a GPU device; lavapipe on a busy machine is the slow case."""

EXECUTOR_LAUNCHER = ("import sys\nif sys.path[:1] == ['']: del sys.path[0]\n"
                     "from remote_magic.worker.executor import main\nmain(sys.argv[1:])")
"""Starts the executor with the working directory off sys.path while remote-magic loads (`python -m`
would put it first, where a folder or module of the user's could shadow the package); the executor
puts it back for the cells."""

TEMP_PREFIX = "remote-magic-"
"""Each worker's temporary folders (the executors' socket and runtime dir, each kernel's connection file)
start with TEMP_PREFIX + its pid + "-"."""

PID_REUSE_SLACK_S = 1.0
"""A process that started this long after a worker's folder last changed is not that worker (its pid was
reused); the slack covers the coarse clocks of process start times."""


_OWNER_NUMBERS = itertools.count(1)


@dataclass
class ExecutorOptions:
    gpu: str = "auto"
    adapter: str | None = None
    backend: str | None = None
    max_memory_bytes: int | None = None
    gpu_memory_bytes: int | None = None
    """Bytes of arrays each executor keeps on the GPU between cells (None: its default)."""
    tab: str | None = None
    """The bridge endpoint of the browser tab whose WebGPU is the executors' GPU (``worker/browser``)."""


def remove_abandoned_dirs() -> list[Path]:
    """Remove the temporary folders (TEMP_PREFIX + pid + ...) of this user's workers that were killed: their
    pid is gone, or belongs to a process that started after the folder was last changed. The ones removed."""
    removed = []
    roots = [Path(tempfile.gettempdir()), *filter(None, [shared_frames.shared_memory_root()])]
    for folder in (found for root in roots for found in root.glob(f"{TEMP_PREFIX}*-*")):
        pid = folder.name[len(TEMP_PREFIX):].partition("-")[0]
        try:
            info = folder.lstat()
        except OSError:  # removed meanwhile
            continue
        if not pid.isdigit() or info.st_uid != os.getuid() or _still_running(int(pid), info.st_mtime):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
        log.info("removed %s, left by a worker that was killed", folder)
    return removed


def _still_running(pid: int, changed_at: float) -> bool:
    """Is the worker that made a folder last changed at ``changed_at`` still running as ``pid``? Not when
    the pid is gone, nor when it was reused: a process that started after the folder last changed and
    doesn't run remote-magic (a clock stepped since can make the first look true, never both)."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:  # killed, not yet waited for by its parent
            return False
        return process.create_time() <= changed_at + PID_REUSE_SLACK_S or "remote" in " ".join(process.cmdline())
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # one we may not look at: take it for the worker
        return True


class ExecutorProcess:
    """One executor child: started at once, ready once it says hello."""

    def __init__(self, link: "ExecutorLink", number: int) -> None:
        self.number = number
        self.routing_id = b"executor-%d" % number
        self.ready = False
        self.capabilities: dict[str, Any] = {}
        self._socket = link.socket
        self.frames = shared_frames.FramePool(link.frames_folder)  # the files its jobs' large frames go through
        options = link.options
        command = [sys.executable, "-c", EXECUTOR_LAUNCHER, link.endpoint, str(number), "--gpu", options.gpu,
                   "--parent", str(os.getpid())]
        if link.frames_folder is not None:
            command += ["--frames-folder", link.frames_folder]
        if options.adapter:
            command += ["--adapter", options.adapter]
        if options.backend:
            command += ["--backend", options.backend]
        if options.gpu_memory_bytes is not None:
            command += ["--gpu-memory", str(options.gpu_memory_bytes)]
        if options.tab is not None:
            command += ["--tab", options.tab]
        # Vulkan loaders complain on headless machines without it; a private one is enough. No credential of
        # the worker's reaches the job (descendants.SECRET_ENV), and all it starts carries its owner's mark.
        self.owner = f"executor-{next(_OWNER_NUMBERS)}"  # unique in the process: a tab's worker is a second one
        env = child_environment(tree().mark(self.owner),
                                {"XDG_RUNTIME_DIR": os.environ.get("XDG_RUNTIME_DIR") or link.folder})
        self.spawned_at = time.monotonic()
        # Its own session: a Ctrl-C in the worker's terminal is the worker's, not the job's; and no stdin: a
        # cell's input() can't read the worker's terminal (outputs.JobOutputs says why it can't ask).
        self.process = tree().start(self.owner, command, env)
        log.info("started executor %d (pid %d)", number, self.process.pid)

    def send(self, frames: list[Any], digests: Mapping[int, str] | None = None) -> None:
        """Hand the executor a message (an encoded SUBMIT), its large frames through shared memory, or named by
        their digest (``digests``: {frame index: digest}) where it holds them already (``shared_frames``).
        Raises ZMQError when the executor's connection is gone (it died)."""
        self._socket.send_multipart([self.routing_id, *self.frames.pack(frames, 3, digests)], copy=False)

    def died(self) -> str | None:
        """None while alive, else how it ended, in words."""
        code = self.process.poll()
        if code is None:
            return None
        if code < 0:
            try:
                return f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with status {code}"

    def failed_to_start(self) -> str | None:
        """Why this executor, not ready yet, will never say hello (None while it still may)."""
        if (death := self.died()) is not None:
            return f"{death} while starting"
        if time.monotonic() - self.spawned_at > EXECUTOR_START_TIMEOUT_S:
            return f"did not start within {EXECUTOR_START_TIMEOUT_S:g} s"
        return None

    def memory_bytes(self) -> int:
        """What the executor and every process it started use (resident), for --max-memory: also those
        that left its process group or tree (``descendants``)."""
        return tree().memory(self.owner)

    def interrupt(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGINT)

    def kill(self) -> None:
        """Kill the executor and everything it started: its process group, which outlives it while
        any of its children run (an executor that crashed leaves them behind), and every other process
        of its (``descendants``: started with setsid, double-forked)."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # its own session: the group's id is its pid
        except ProcessLookupError:
            pass  # the group is gone: nothing left to stop
        tree().kill(self.owner)
        self.process.wait()
        tree().forget(self.owner)
        self.frames.close()


class ExecutorLink:
    """The ROUTER socket every executor of this worker dials, in a private temporary folder."""

    def __init__(self, context: zmq.Context[Any], options: ExecutorOptions) -> None:
        self.options = options
        remove_abandoned_dirs()
        self._dir = tempfile.TemporaryDirectory(prefix=f"{TEMP_PREFIX}{os.getpid()}-")
        self.folder = self._dir.name
        # Large frames to and from the executors (shared_frames.py), where the system has a folder in memory;
        # elsewhere (macOS) they go through the socket: a file on disk would be written out to it.
        memory = shared_frames.shared_memory_root()
        self._frames_dir = tempfile.TemporaryDirectory(prefix=f"{TEMP_PREFIX}{os.getpid()}-", dir=memory) \
            if memory is not None else None
        self.frames_folder = self._frames_dir.name if self._frames_dir is not None else None
        self.socket = context.socket(zmq.ROUTER)
        self.socket.linger = 0
        self.socket.router_mandatory = True
        if zmq.has("ipc"):
            self.socket.bind(f"ipc://{Path(self.folder) / 'executor'}")
        else:
            self.socket.bind("tcp://127.0.0.1:0")
        self.endpoint = self.socket.last_endpoint.decode()
        self._started = 0
        self._live: dict[bytes, ExecutorProcess] = {}
        self._owners: list[str] = []  # every executor this link started, by its mark in descendants.tree()

    def spawn(self) -> ExecutorProcess:
        """Start a new executor; it is ready once its hello comes through ``receive``."""
        self._started += 1
        executor = ExecutorProcess(self, self._started)
        self._live[executor.routing_id] = executor
        self._owners.append(executor.owner)
        return executor

    def stop(self, executor: ExecutorProcess) -> None:
        """Kill an executor; what it sent and nobody read yet is dropped from now on."""
        self._live.pop(executor.routing_id, None)
        executor.kill()

    def receive(self, frames: list[zmq.Frame]) -> tuple[ExecutorProcess, Message | None] | None:
        """Decode a message from a live executor: (it, the message), or (it, None) for its hello, which
        marks it ready, and for what it says after a job with large frames, which lets it take the next
        (``FramePool.settled``). None for one from an executor that was stopped, and for one that only says
        which of its jobs' files it let go of (``shared_frames``). Large frames come as views of a shared file."""
        executor = self._live.get(frames[0].bytes)
        if executor is None:
            shared_frames.unpack(frames[1:], self.frames_folder or "", remove=True)  # dropped: its file goes too
            return None
        message, note = shared_frames.unpack(frames[1:], self.frames_folder or "", remove=True)
        settled = executor.frames.told(note)
        if not message:  # only that
            return (executor, None) if settled else None
        msg = decode(message)
        if msg.type is T.HELLO:
            executor.ready = True
            executor.capabilities = msg.header.get("gpu") or {}
            return executor, None
        return executor, msg

    def wait_ready(self, executor: ExecutorProcess, timeout: float) -> None:
        """Block until ``executor`` says hello (used before the hub connection exists)."""
        deadline = time.monotonic() + timeout
        while not executor.ready:
            if executor.died() is not None:
                raise RuntimeError(f"the executor process exited during start-up ({executor.died()}); "
                                   "run with -v to see its output")
            if self.socket.poll(min(0.2, max(0.0, deadline - time.monotonic())) * 1000):
                self.receive(self.socket.recv_multipart(copy=False))
            elif time.monotonic() > deadline:
                raise RuntimeError(f"the executor did not start within {timeout:g} s")

    def close(self) -> None:
        """Stop every executor, then whatever their jobs left running, and the orphans no executor owns (not
        other workers' in this process: a browser tab's worker stops while the machine's goes on)."""
        for executor in list(self._live.values()):
            self.stop(executor)
        for owner in self._owners:
            tree().kill(owner)
        tree().kill("")
        self.socket.close()
        self._dir.cleanup()
        if self._frames_dir is not None:
            self._frames_dir.cleanup()
