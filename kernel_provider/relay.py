"""The notebook machine's half of a kernel on a worker: local channel sockets relayed through the hub.

``python -m remote_magic.kernel_provider.relay --connection-file F --kernel-id ID [--worker NAME]``,
started by the provisioner with the client token in ``$REMOTE_MAGIC_TOKEN``. It binds the five ports
of the connection file on 127.0.0.1 (ROUTER sockets for shell, control, stdin and heartbeat, a PUB for
iopub), so the Jupyter client connects to it as to a local kernel; it dials the hub as a client and
asks for the kernel (KERNEL_START, with the connection file's key); then every message on a channel
crosses the hub as one KERNEL_FRAMES, untouched, both ways.

It talks to the provisioner that started it through its standard streams: its first line on stdout is
one JSON object, ``{"started": {...}}`` or ``{"error": TYPE, "message": ...}``; on stdin it reads
``signal N``, ``terminate`` and ``kill``. It ends when the kernel does, with the kernel's exit status
(128 + N for a kernel killed by signal N), and it stops the kernel first when its stdin closes or its
parent process dies, so the remote kernel never outlives the notebook machine's side. SIGINT and
SIGTERM sent to it go to the kernel as an interrupt and a gentle stop.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

import zmq

from remote_magic.errors import ConnectionFailed, KernelError, RemoteMagicError
from remote_magic.wire.connection import Connection, dial
from remote_magic.wire.protocol import Message, MessageType as T, Role, encode
from remote_magic.wire.tokens import Token
from remote_magic.wire.versions import local_versions

log = logging.getLogger("remote_magic.kernel_provider.relay")

TOKEN_ENV = "REMOTE_MAGIC_TOKEN"
REMOTE_ENV = "REMOTE_MAGIC_KERNEL_ENV"
"""Environment variables for the kernel on the worker (JSON), from the provisioner."""
CHANNELS = ("shell", "control", "stdin", "hb", "iopub")
STOP_WAIT_S = 5.0
"""After asking the worker to stop the kernel, how long to wait for it to say the kernel is gone."""
EXIT_NO_KERNEL = 2
"""The relay's exit status when the kernel never started (the first line on stdout says why)."""


class Relay:
    """One kernel's channels: local sockets on one side, the hub connection on the other."""

    def __init__(self, info: dict[str, Any], token: Token, kernel_id: str, worker: str | None,
                 connect_timeout: float) -> None:
        self.kernel_id = kernel_id
        self.worker = worker
        self.info = info
        self.env: dict[str, str] = {}  # for the kernel, on the worker
        self.context: zmq.Context[Any] = zmq.Context()
        self.sockets: dict[str, zmq.Socket[Any]] = {}
        self.done = threading.Event()
        self.ended: dict[str, Any] | None = None  # KERNEL_DIED's header, or why the kernel is out of reach
        self.failure: dict[str, Any] | None = None  # why it never started
        self.started: dict[str, Any] | None = None
        self._reported = False
        self._stop_asked_at: float | None = None
        for channel in CHANNELS:
            sock = self.context.socket(zmq.PUB if channel == "iopub" else zmq.ROUTER)
            sock.linger = 0
            sock.bind(f"tcp://127.0.0.1:{info[f'{channel}_port']}")
            self.sockets[channel] = sock
        hello = {"role": Role.CLIENT.value, "name": f"kernel {kernel_id[:8]}", "versions": local_versions()}
        sock, welcome = dial(self.context, token, hello, connect_timeout)
        watch = {s: self._from_channel(name) for name, s in self.sockets.items() if name != "iopub"}
        # Its link to the hub carries each message once, in order, across reconnects (wire/link.py).
        self.connection = Connection(self.context, sock, welcome, hello, self._on_message, self._on_lost,
                                     watch=watch, name="remote-magic-kernel-relay")

    def _from_channel(self, channel: str) -> Any:
        def forward(frames: list[zmq.Frame]) -> None:
            self.connection.send_now(encode(T.KERNEL_FRAMES, {"kernel": self.kernel_id, "channel": channel}, frames))
        return forward

    def start(self) -> None:
        self.connection.start()
        header = {"kernel": self.kernel_id, "key": self.info.get("key", ""),
                  "signature_scheme": self.info.get("signature_scheme", "hmac-sha256"), "env": self.env}
        if self.worker:
            header["worker"] = self.worker
        self.connection.send(T.KERNEL_START, header)

    # -- from the hub (the connection's I/O thread, which owns the local sockets too) ----------

    def _on_message(self, msg: Message) -> None:
        if msg.header.get("kernel") not in (self.kernel_id, None):
            return
        if msg.type is T.KERNEL_FRAMES:
            sock = self.sockets.get(str(msg.header.get("channel")))
            if sock is not None and msg.buffers:
                sock.send_multipart(msg.buffers, copy=False)
        elif msg.type is T.KERNEL_STARTED:
            self.started = msg.header
            self._report({"started": msg.header})
        elif msg.type is T.KERNEL_DIED:
            self._end(msg.header)
        elif msg.type is T.ERROR:
            if self.started is None:
                self.failure = msg.header
                self._report({"error": msg.header.get("error"), "message": msg.header.get("message")})
                self.done.set()
            else:
                log.warning("the hub says: %s", msg.header.get("message"))

    def _on_lost(self, reason: str) -> None:
        self._end({"kernel": self.kernel_id, "exit_code": None,
                   "reason": f"the kernel is out of reach: {reason}"})

    def _end(self, header: dict[str, Any]) -> None:
        self.ended = header
        if self.started is None:
            self.failure = {"error": KernelError.__name__, "message": str(header.get("reason"))}
            self._report(self.failure)
        quiet = header.get("exit_code") == 0 or self._stop_asked_at is not None
        log.log(logging.INFO if quiet else logging.WARNING, "%s", header.get("reason"))
        self.done.set()

    def _report(self, line: dict[str, Any]) -> None:
        if not self._reported:
            self._reported = True
            sys.stdout.write(json.dumps(line) + "\n")
            sys.stdout.flush()

    # -- from the provisioner ------------------------------------------------------------------

    def command(self, line: str) -> None:
        """One line from the provisioner: ``signal N``, ``terminate`` or ``kill``."""
        word, _, argument = line.strip().partition(" ")
        try:
            if word == "signal":
                self.connection.send(T.KERNEL_SIGNAL, {"kernel": self.kernel_id, "signum": int(argument)})
            elif word in ("terminate", "kill"):
                self._stop_asked_at = self._stop_asked_at or time.monotonic()
                self.connection.send(T.KERNEL_STOP, {"kernel": self.kernel_id, "how": word,
                                                     "reason": "the notebook's side asked"})
            elif word:
                log.warning("ignored an unknown command %r", word)
        except (ConnectionFailed, ValueError) as exc:
            log.warning("could not pass %r on to the kernel: %s", line.strip(), exc)
            if word in ("terminate", "kill"):  # nobody can stop it through this hub now: it is gone for us
                self._end({"kernel": self.kernel_id, "exit_code": None, "reason": str(exc)})

    def read_commands(self) -> None:
        for line in sys.stdin:
            self.command(line)
        log.info("the provisioner closed our stdin: stopping the kernel")
        self.command("kill")

    def wait(self, start_timeout: float) -> int:
        """Until the kernel is gone; the exit status to end with."""
        parent = os.getppid()
        started_by = time.monotonic() + start_timeout
        while not self.done.wait(0.1):
            now = time.monotonic()
            if os.getppid() != parent and self._stop_asked_at is None:
                log.warning("the process that started this relay is gone: stopping the kernel")
                self.command("kill")
            if self._stop_asked_at is not None and now - self._stop_asked_at > STOP_WAIT_S:
                log.warning("the worker did not confirm the kernel stopped within %g s", STOP_WAIT_S)
                return 1
            if self.started is None and now > started_by:
                self._report({"error": KernelError.__name__, "message": (
                    f"the worker did not start the kernel within {start_timeout:g} s")})
                self.command("kill")
                return EXIT_NO_KERNEL
        if self.failure is not None or self.ended is None:
            return EXIT_NO_KERNEL
        code = self.ended.get("exit_code")
        return code if isinstance(code, int) and code >= 0 else 128 - code if isinstance(code, int) else 1

    def close(self) -> None:
        self.connection.close()
        for sock in self.sockets.values():
            sock.close()
        self.context.term()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m remote_magic.kernel_provider.relay",
                                     description="Relay a Jupyter kernel's channels to a remote-magic worker.")
    parser.add_argument("--connection-file", required=True)
    parser.add_argument("--kernel-id", required=True)
    parser.add_argument("--worker", default="")
    parser.add_argument("--connect-timeout", type=float, default=10.0)
    parser.add_argument("--start-timeout", type=float, default=60.0)
    parser.add_argument("-v", "--verbose", action="count", default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
                        format="remote-magic kernel relay: %(levelname)s %(message)s")
    try:
        with open(args.connection_file) as f:
            info = json.load(f)
        token = Token.decode(os.environ.get(TOKEN_ENV, ""))
        relay = Relay(info, token, args.kernel_id, args.worker or None, args.connect_timeout)
        relay.env = {str(k): str(v) for k, v in json.loads(os.environ.get(REMOTE_ENV) or "{}").items()}
    except (RemoteMagicError, OSError, ValueError, zmq.ZMQError) as exc:
        error = type(exc).__name__ if isinstance(exc, RemoteMagicError) else KernelError.__name__
        sys.stdout.write(json.dumps({"error": error, "message": str(exc)}) + "\n")
        return EXIT_NO_KERNEL
    signal.signal(signal.SIGINT, lambda *_: relay.command(f"signal {int(signal.SIGINT)}"))
    signal.signal(signal.SIGTERM, lambda *_: relay.command("terminate"))
    relay.start()
    threading.Thread(target=relay.read_commands, name="remote-magic-relay-commands", daemon=True).start()
    try:
        return relay.wait(args.start_timeout)
    finally:
        relay.close()


if __name__ == "__main__":
    sys.exit(main())
