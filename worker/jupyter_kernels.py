"""Whole Jupyter kernels on this worker: started, supervised and relayed for clients through the hub.

A client's kernel provisioner (``remote_magic.kernel_provider``) sends KERNEL_START with the key its
Jupyter client signs messages with; the worker starts ``PYTHON -m ipykernel_launcher -f CONNFILE``
as its child, in a process group of its own, bound to 127.0.0.1 on ports only this machine sees, and
connects one socket to each of the kernel's five channels. Each message a channel carries crosses the
hub as one KERNEL_FRAMES, untouched: the kernel checks its signatures as for a local client.

- shell, control, stdin and heartbeat: a DEALER each (shell and stdin share one routing id, so the
  kernel's ``input_request``, addressed to the shell request's sender, reaches this worker's stdin
  socket); the client's routing id travels as the first frame, as through a ZeroMQ proxy;
- iopub: a SUB socket subscribed to everything.

Everything runs on one thread of its own (``KernelHost``): the hub connection's I/O thread hands it
messages over an inproc socket, and it sends to the hub with the connection's thread-safe ``send``.
A kernel that exits (shut down, killed, a segfault, ``os._exit``) is reported as KERNEL_DIED with its
exit code, whatever it started is killed (also what left its process group: ``descendants``), and the
worker carries on. A kernel beyond --max-jupyter-kernels is refused; over --max-memory (all kernels together,
with what they started), the largest is killed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import zmq
from jupyter_client.connect import write_connection_file

from remote_magic.errors import ConnectionFailed
from remote_magic.wire.protocol import Message, MessageType as T, decode, encode
from remote_magic.wire.sizes import human_size

from . import DEFAULT_ORPHAN_GRACE_S
from .descendants import child_environment, tree
from .executor_processes import TEMP_PREFIX

log = logging.getLogger(__name__)

CHANNELS = ("shell", "control", "stdin", "hb", "iopub")
SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGKILL, signal.SIGQUIT, signal.SIGHUP, signal.SIGUSR1,
           signal.SIGUSR2}
"""The signals a client may have delivered to its kernel's process group."""

TERMINATE_GRACE_S = 2.0
"""After SIGTERM (a kernel stopped gently), how long before its process group is killed."""


SUPERVISE_INTERVAL_S = 0.05
"""How often each kernel process is checked for having exited."""

MEMORY_CHECK_INTERVAL_S = 0.5
"""How often the kernels' memory, all they started included, is checked against --max-memory."""

SendToHub = Callable[[T, dict[str, Any], list[Any]], object]


@dataclass
class HostedKernel:
    """One ipykernel process this worker runs for a client, and its sockets."""

    id: str
    process: subprocess.Popen[bytes]
    sockets: dict[str, zmq.Socket[Any]]
    folder: Path
    owner: str = ""  # its mark in descendants.tree(): what it started, wherever it went
    kill_at: float | None = None  # after a gentle stop: when its process group is killed
    why: str = ""  # what stopped it, when the worker or its client did
    by_channel: dict[zmq.Socket[Any], str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.by_channel = {sock: name for name, sock in self.sockets.items()}

    def signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.process.pid, signum)
        except (ProcessLookupError, PermissionError):  # already gone
            pass


class KernelHost:
    """Starts and relays the kernels this worker runs; ``handle`` is called from the hub connection's thread."""

    def __init__(self, context: zmq.Context[Any], worker_name: Callable[[], str], python: str,
                 enabled: bool = True, orphan_grace_s: float = DEFAULT_ORPHAN_GRACE_S,
                 max_kernels: int | None = None, max_memory_bytes: int | None = None) -> None:
        self.python = python
        self.enabled = enabled
        self.orphan_grace_s = orphan_grace_s
        self.max_kernels = max_kernels  # --max-jupyter-kernels: a start beyond it is refused
        self.max_memory_bytes = max_memory_bytes  # --max-memory: all kernels together, all they started included
        self._started = 0
        self._next_memory_check = 0.0
        self._worker_name = worker_name
        self._context = context
        self._send: SendToHub | None = None
        self._kernels: dict[str, HostedKernel] = {}
        self._inbox_endpoint = f"inproc://remote-magic-kernels-{id(self)}"
        self._inbox = context.socket(zmq.PULL)
        self._inbox.bind(self._inbox_endpoint)
        self._outbox: zmq.Socket[Any] | None = None  # used by the hub connection's I/O thread only
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="remote-worker-kernels", daemon=True)
        self.snapshot: dict[str, dict[str, int]] = {}  # replaced whole by the relay thread, read by any

    def start(self, send: SendToHub) -> None:
        """Start the relay thread; ``send`` queues a message for the hub from any thread."""
        self._send = send
        self._thread.start()

    def handle(self, msg: Message) -> None:
        """A kernel message from the hub: hand it to the relay thread (the caller's thread never blocks on it)."""
        if self._outbox is None:
            self._outbox = self._context.socket(zmq.PUSH)
            self._outbox.linger = 0
            self._outbox.connect(self._inbox_endpoint)
        self._outbox.send_multipart(encode(msg.type, msg.header, msg.buffers), copy=False)

    def stop_all(self, why: str) -> None:
        """Orphan every kernel (the hub is gone, so their clients are too): each is killed after the grace
        period; from the hub connection's thread."""
        if self._outbox is not None and self._thread.is_alive():
            self.handle(Message(T.KERNEL_STOP, {"kernel": "*", "how": "orphaned", "reason": why}))

    def close(self) -> None:
        """Kill every kernel and stop the thread; nothing this host started is left running."""
        self._stop.set()
        if self._thread.is_alive():
            with self._context.socket(zmq.PUSH) as wake:
                wake.linger = 0
                wake.connect(self._inbox_endpoint)
                with contextlib.suppress(zmq.Again):  # (a full inbox wakes it anyway)
                    wake.send(b"", zmq.NOBLOCK)
            self._thread.join(5)
        else:
            self._inbox.close()
        if self._outbox is not None:
            self._outbox.close()

    def stats(self) -> dict[str, dict[str, int]]:
        """For the worker's heartbeat: each kernel's pid."""
        return self.snapshot

    def describe(self) -> dict[str, Any]:
        """What the worker tells the hub at HELLO: whether it runs kernels."""
        return {"kernels": self.enabled}

    # -- the relay thread ------------------------------------------------------------------

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._inbox, zmq.POLLIN)
        registered: set[zmq.Socket[Any]] = set()
        try:
            while not self._stop.is_set():
                sockets = {s: k for k in self._kernels.values() for s in k.by_channel}
                for sock in registered - sockets.keys():
                    poller.unregister(sock)
                for sock in sockets.keys() - registered:
                    poller.register(sock, zmq.POLLIN)
                registered = set(sockets)
                # With no kernel to watch, only the hub's messages (or close's wake-up) can give it work.
                ready = dict(poller.poll(int(SUPERVISE_INTERVAL_S * 1000) if self._kernels else None))
                for sock in [s for s in ready if s in sockets]:
                    kernel = sockets[sock]
                    if kernel.id in self._kernels:  # the link to the hub carries it once, in order (wire/link.py)
                        header = {"kernel": kernel.id, "channel": kernel.by_channel[sock]}
                        self._to_hub(T.KERNEL_FRAMES, header, sock.recv_multipart(copy=False))
                if self._inbox in ready:
                    for _ in range(1000):  # what the hub sent, in order, without starving the kernels' sockets
                        try:
                            frames = self._inbox.recv_multipart(zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        if len(frames) > 1:  # (one empty frame: close's wake-up)
                            self._guarded(frames)
                self._supervise()
        except Exception:
            log.exception("the worker's kernel relay failed; its kernels are stopped")
        finally:
            for kernel in list(self._kernels.values()):
                kernel.signal_group(signal.SIGKILL)
                kernel.process.wait()
                self._forget(kernel)
            self._inbox.close()

    def _guarded(self, frames: list[Any]) -> None:
        try:
            self._on_message(decode(frames))
        except Exception:  # a bad message costs that message, not the worker's kernels
            log.exception("dropped a kernel message the worker failed to handle")

    def _on_message(self, msg: Message) -> None:
        kernel_id = str(msg.header.get("kernel") or "")
        if msg.type is T.KERNEL_START:
            self._start(kernel_id, msg.header)
            return
        targets = list(self._kernels.values()) if kernel_id == "*" else \
            [self._kernels[kernel_id]] if kernel_id in self._kernels else []
        for kernel in targets:
            if msg.type is T.KERNEL_FRAMES:
                sock = kernel.sockets.get(str(msg.header.get("channel")))
                if sock is not None and sock.socket_type != zmq.SUB and msg.buffers:
                    sock.send_multipart(msg.buffers, copy=False)
            elif msg.type is T.KERNEL_SIGNAL:
                signum = int(msg.header.get("signum", 0))
                if signum in SIGNALS:
                    log.debug("kernel %s: signal %d", kernel.id, signum)
                    kernel.signal_group(signum)
            elif msg.type is T.KERNEL_STOP:
                kernel.why = str(msg.header.get("reason") or "")
                if msg.header.get("how") == "orphaned":  # nobody can reach it: it may finish what it does
                    log.warning("kernel %s: its notebook is gone (%s); it is killed in %g s unless it ends first",
                                kernel.id, kernel.why, self.orphan_grace_s)
                    if kernel.kill_at is None:
                        kernel.kill_at = time.monotonic() + self.orphan_grace_s
                elif msg.header.get("how") == "terminate":
                    kernel.signal_group(signal.SIGTERM)
                    kernel.kill_at = time.monotonic() + TERMINATE_GRACE_S
                else:
                    kernel.signal_group(signal.SIGKILL)

    def _start(self, kernel_id: str, header: dict[str, Any]) -> None:
        if not kernel_id or kernel_id in self._kernels:
            return
        if not self.enabled:
            self._died(kernel_id, None, "this worker does not run kernels (remote-worker --jupyter-kernels off)")
            return
        if self.max_kernels is not None and len(self._kernels) >= self.max_kernels:
            self._died(kernel_id, None, f"worker {self._worker_name()!r} runs {len(self._kernels)} kernel(s) "
                       f"already, the most it allows: shut one down, or start that remote-worker with a larger "
                       f"--max-jupyter-kernels (now {self.max_kernels})")
            return
        # Owner-only (the key is inside), and named after this worker: removed if it is killed (executor_processes.py).
        folder = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-kernel-"))
        self._started += 1
        owner = f"kernel-{folder.name}"  # unique in the process, which may hold several workers (browser tabs')
        try:
            connection_file, info = write_connection_file(
                str(folder / "kernel.json"), ip="127.0.0.1", transport="tcp", key=str(header["key"]).encode(),
                signature_scheme=str(header.get("signature_scheme") or "hmac-sha256"))
            asked = header.get("env")
            asked = asked if isinstance(asked, dict) else {}
            # No credential of the worker's: only what the kernelspec passes (the client token, with --share-token).
            env = child_environment(tree().mark(owner), {**{str(k): str(v) for k, v in asked.items()},
                                                         "JPY_PARENT_PID": str(os.getpid())})  # exits if we die
            process = tree().start(owner, [self.python, "-m", "ipykernel_launcher", "-f", connection_file], env)
        except (OSError, KeyError, ValueError) as exc:
            shutil.rmtree(folder, ignore_errors=True)
            self._died(kernel_id, None, f"the worker could not start {self.python} -m ipykernel_launcher: {exc}")
            return
        routing_id = os.urandom(16)
        sockets: dict[str, zmq.Socket[Any]] = {}
        for channel in CHANNELS:
            sock = self._context.socket(zmq.SUB if channel == "iopub" else zmq.DEALER)
            sock.linger = 0
            if channel == "iopub":
                sock.setsockopt(zmq.SUBSCRIBE, b"")
            else:
                sock.routing_id = routing_id if channel in ("shell", "stdin") else os.urandom(16)
            sock.connect(f"tcp://127.0.0.1:{info[f'{channel}_port']}")  # type: ignore[literal-required]
            sockets[channel] = sock
        self._kernels[kernel_id] = HostedKernel(kernel_id, process, sockets, folder, owner)
        log.info("kernel %s started (pid %d, %s)", kernel_id, process.pid, self.python)
        self._to_hub(T.KERNEL_STARTED, {"kernel": kernel_id, "pid": process.pid, "python": self.python,
                                        "worker": self._worker_name(), "orphan_grace_s": self.orphan_grace_s})

    def _supervise(self) -> None:
        now = time.monotonic()
        self._check_memory(now)
        self.snapshot = {k.id: {"pid": k.process.pid} for k in self._kernels.values()}
        for kernel in list(self._kernels.values()):
            code = kernel.process.poll()
            if code is None:
                if kernel.kill_at is not None and now > kernel.kill_at:
                    kernel.signal_group(signal.SIGKILL)
                continue
            kernel.signal_group(signal.SIGKILL)  # what the kernel started dies with it
            self._forget(kernel)
            how = f"exited with code {code}" if code >= 0 else f"was killed by {signal.Signals(-code).name}"
            log.info("kernel %s %s%s", kernel.id, how, f" ({kernel.why})" if kernel.why else "")
            self._died(kernel.id, code, f"the kernel's process on worker {self._worker_name()!r} {how}"
                       + (f": {kernel.why}" if kernel.why else ""))

    def _check_memory(self, now: float) -> None:
        """Over --max-memory, all kernels together: kill the one that uses the most (reported dead, saying why)."""
        if not self.max_memory_bytes or now < self._next_memory_check or not self._kernels:
            return
        self._next_memory_check = now + MEMORY_CHECK_INTERVAL_S
        used = {kernel.id: tree().memory(kernel.owner) for kernel in self._kernels.values()}
        total = sum(used.values())
        if total <= self.max_memory_bytes:
            return
        largest = self._kernels[max(used, key=lambda k: used[k])]
        largest.why = (f"remote-worker killed it: the kernels on this worker used {human_size(total)} together, "
                       f"over the {human_size(self.max_memory_bytes)} limit (--max-memory), and this one the most "
                       f"({human_size(used[largest.id])}, with what it started)")
        log.warning("kernel %s: %s", largest.id, largest.why)
        largest.signal_group(signal.SIGKILL)
        tree().kill(largest.owner)

    def _forget(self, kernel: HostedKernel) -> None:
        tree().kill(kernel.owner)  # what it started outside its process group (setsid, double fork)
        tree().forget(kernel.owner)
        self._kernels.pop(kernel.id, None)
        for sock in kernel.sockets.values():
            sock.close()
        shutil.rmtree(kernel.folder, ignore_errors=True)

    def _died(self, kernel_id: str, code: int | None, reason: str) -> None:
        self._to_hub(T.KERNEL_DIED, {"kernel": kernel_id, "exit_code": code, "reason": reason})

    def _to_hub(self, msg_type: T, header: dict[str, Any], frames: list[Any] | None = None) -> None:
        assert self._send is not None
        try:
            self._send(msg_type, header, frames or [])
        except ConnectionFailed as exc:  # the hub is away: its clients can't read this anyway
            log.debug("kernel message not sent: %s", exc)
