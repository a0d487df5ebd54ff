"""Helpers for tests: start real remote-worker processes on 127.0.0.1, poll with deadlines."""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import pytest

if TYPE_CHECKING:
    from netns import Link

STARTUP_TIMEOUT_S = 120.0
INSTALL_TIMEOUT_S = 600
REPO = Path(__file__).resolve().parents[1]
WHEEL_SOURCES = ("pyproject.toml", "README.md", "remote_magic", "worker", "kernel_provider", "shaders")


def wait_for(condition: Callable[[], object], timeout: float, what: str, interval: float = 0.02) -> object:
    """Poll ``condition`` until it is truthy or ``timeout`` passes (then fail, saying ``what``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)  # polling period, not synchronisation: the deadline bounds it
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


@dataclass
class WorkerProcess:
    """A running `remote-worker` and what a test needs to reach it."""

    process: subprocess.Popen[str]
    home: Path
    token_file: Path
    log_file: Path
    cwd: Path
    """The folder it runs in (its executors too), where cells write their files."""

    @property
    def token(self) -> str:
        return self.token_file.read_text().strip()

    def log(self) -> str:
        return self.log_file.read_text()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_worker(tmp: Path, *args: str, token_file: bool = True, env: dict[str, str] | None = None,
                 home: Path | None = None, executable: str | Path | None = None,
                 cwd: Path | None = None, wrapper: tuple[str, ...] = ()) -> WorkerProcess:
    """Start `remote-worker ARGS` (the one on PATH, or ``executable``) with its own config dir; wait
    until it accepts jobs. ``wrapper`` goes before the command (`ip netns exec NS`: it execs it, same pid)."""
    tmp.mkdir(parents=True, exist_ok=True)
    home = home or tmp / "home"
    token = tmp / "token"
    log = tmp / "worker.log"
    executable = executable or shutil.which("remote-worker")
    assert executable, "remote-worker is not on PATH: install the project (pip install -e .)"
    command = [*wrapper, str(executable), *args]
    if token_file:
        command += ["--token-file", str(token)]
    environment = {**os.environ, "REMOTE_MAGIC_HOME": str(home), **(env or {})}
    handle = log.open("w")
    process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=environment, text=True,
                               cwd=cwd)
    handle.close()
    worker = WorkerProcess(process, home, token, log, cwd or Path.cwd())
    ready_line = "is ready" if token_file else "joined"
    try:
        wait_for(lambda: process.poll() is not None or ready_line in log.read_text(), STARTUP_TIMEOUT_S,
                 "remote-worker to start")
    except AssertionError:
        worker.stop()
        raise
    if process.poll() is not None:
        raise AssertionError(f"remote-worker exited with {process.returncode}:\n{log.read_text()}")
    return worker


def require_a_gpu(worker: WorkerProcess) -> dict[str, Any]:
    """Skip unless the worker computes on a wgpu adapter (lavapipe without a GPU); under
    REMOTE_MAGIC_REQUIRE_GPU=1 (CI) fail instead, the worker stopped first either way. Returns how the worker
    describes its GPU."""
    import remote_magic

    with remote_magic.connect(worker.token) as client:
        [info] = client.workers()
    if not info["gpu"].get("active"):
        worker.stop()
        message = f"no wgpu adapter on this machine: {info['gpu']}"
        if os.environ.get("REMOTE_MAGIC_REQUIRE_GPU") == "1":
            pytest.fail(message)
        pytest.skip(message)
    gpu: dict[str, Any] = info["gpu"]
    return gpu


@contextmanager
def connected_shell(token: str) -> Iterator[tuple[Any, str]]:
    """The real IPython shell with the extension loaded and ``%offload_connect TOKEN`` run (an empty
    token falls back to $REMOTE_MAGIC_TOKEN), and what connecting printed; unloaded and reset after."""
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "remote_magic")
    try:
        with capture_output() as out:
            shell.run_line_magic("offload_connect", token)
        yield shell, out.stdout
    finally:
        shell.run_line_magic("unload_ext", "remote_magic")
        shell.reset(new_session=False)


def run(shell: Any, cell: str) -> tuple[Any, Any]:
    """Run a cell in an IPython shell; its ExecutionResult and its captured output."""
    from IPython.utils.capture import capture_output

    with capture_output() as out:
        result = shell.run_cell(cell)
    return result, out


def run_command(*args: str | Path, cwd: Path, env: dict[str, str] | None = None,
                timeout: float = INSTALL_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run a command to completion; fail with its output when it fails."""
    result = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                            env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **(env or {})})
    assert result.returncode == 0, f"{args} failed:\n{result.stdout}\n{result.stderr}"
    return result


def build_wheel(tmp: Path) -> Path:
    """Build the project's wheel from a clean copy, in an isolated build as a user's `pip install` does.

    pip's verbose output, the build backend's warnings included, is left in `tmp / "build.log"`.
    """
    source = tmp / "source"  # building in place would leave build/ in the repository
    source.mkdir(parents=True)
    for name in WHEEL_SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(path, source / name)
    dist = tmp / "dist"
    built = run_command(sys.executable, "-m", "pip", "wheel", "--verbose", "--no-deps", "-w", dist, source, cwd=tmp)
    (tmp / "build.log").write_text(built.stdout + built.stderr)
    (wheel,) = dist.glob("remote_magic-*.whl")
    return wheel


def make_venv(python: str | Path, path: Path) -> Path:
    """A fresh virtual environment that sees no package of the interpreter it was made from; its python."""
    run_command(python, "-m", "venv", path, cwd=path.parent)
    return path / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def find_python(*minors: str) -> tuple[str, str]:
    """The first interpreter found for these minor versions, in order: (path, version).

    Falls back to the interpreter running the tests.
    """
    pyenv = shutil.which("pyenv")
    installed = subprocess.run([pyenv, "versions", "--bare"], capture_output=True, text=True).stdout.split() \
        if pyenv else []
    for minor in minors:
        candidates = [shutil.which(f"python{minor}")]
        for name in sorted((v for v in installed if v.startswith(f"{minor}.")), reverse=True):
            root = subprocess.run([pyenv, "prefix", name], capture_output=True, text=True).stdout.strip()
            candidates.append(str(Path(root) / "bin" / "python"))
        for candidate in filter(None, candidates):
            probe = subprocess.run([candidate, "-c", "import platform; print(platform.python_version())"],
                                   capture_output=True, text=True)
            version = probe.stdout.strip()
            if probe.returncode == 0 and version.startswith(f"{minor}."):
                return candidate, version
    return sys.executable, platform.python_version()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a hub restarted on the same port)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def worker_token(hub: WorkerProcess, address: str | None = None) -> str:
    """The worker token of ``hub`` (what `remote-worker token --worker` prints), for joining it at its own
    address or at ``address`` (a proxy or a tunnel in front of it)."""
    from remote_magic.wire.tokens import Token

    printed = subprocess.run(["remote-worker", "token", "--worker"], capture_output=True, text=True, check=True,
                             timeout=60, env={**os.environ, "REMOTE_MAGIC_HOME": str(hub.home)}).stdout.strip()
    return Token.decode(printed).with_address(address or Token.decode(hub.token).address).encode()


def hub_port(hub: WorkerProcess) -> int:
    """The TCP port a `remote-worker`'s hub listens on (from its client token)."""
    from remote_magic.wire.tokens import Token

    return int(Token.decode(hub.token).address.rsplit(":", 1)[1])


RAW_PYZMQ = r'''
import json, os, statistics, sys, time, zmq
role, address = sys.argv[1], sys.argv[2]
context = zmq.Context()
if role == "server":  # a ROUTER: "get:N" answers N random bytes; anything else, its length
    sock = context.socket(zmq.ROUTER)
    sock.curve_server, sock.curve_publickey, sock.curve_secretkey = True, sys.argv[3].encode(), sys.argv[4].encode()
    print(sock.bind_to_random_port(f"tcp://{address}"), flush=True)
    while True:
        identity, data = sock.recv_multipart(copy=False)
        asked = bytes(data.buffer[:4]) == b"get:"
        sock.send_multipart([identity.bytes, os.urandom(int(bytes(data.buffer[4:]))) if asked
                             else str(len(data)).encode()])
else:  # a DEALER: ten tiny round trips, then SIZE random bytes sent (up) or fetched (down)
    direction, size = sys.argv[4], int(sys.argv[5])
    public, secret = zmq.curve_keypair()
    sock = context.socket(zmq.DEALER)
    sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = sys.argv[3].encode(), public, secret
    sock.connect(f"tcp://{address}")
    sock.send(b"x")
    sock.recv()
    times = []
    for _ in range(10):
        start = time.perf_counter()
        sock.send(b"x")
        sock.recv()
        times.append(time.perf_counter() - start)
    payload = os.urandom(size) if direction == "up" else f"get:{size}".encode()
    start = time.perf_counter()
    sock.send(payload, copy=False)
    answer = sock.recv(copy=False)
    seconds = time.perf_counter() - start
    assert (int(bytes(answer.buffer)) if direction == "up" else len(answer)) == size
    print(json.dumps({"rtt_s": statistics.median(times), "seconds": seconds}), flush=True)
'''
"""Raw pyzmq with CurveZMQ, as remote-magic's sockets are: the peer a link's figures are measured beside."""


@dataclass
class RawTimes:
    """What raw pyzmq took on a link: seconds per direction, a tiny message's round trip, and (one direction
    at a time only) the bytes the sending end put on the wire per direction."""

    seconds: dict[str, float]
    rtt_s: float
    wire: dict[str, int]


@contextmanager
def raw_pyzmq_server(link: Link, script: Path, source: str) -> Iterator[tuple[str, str]]:
    """Run ``source`` (a raw pyzmq script, as ``RAW_PYZMQ``) as ``script server`` in namespace ``a``, with a
    fresh CurveZMQ key pair; yields the address it listens on and its public key, for its clients."""
    import zmq

    script.write_text(source)
    public, secret = (key.decode() for key in zmq.curve_keypair())
    server = subprocess.Popen([*link.run(link.a), sys.executable, str(script), "server", link.a_ip, public, secret],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        yield f"{link.a_ip}:{int(server.stdout.readline())}", public
    finally:
        server.terminate()
        server.wait(30)


def raw_pyzmq_over(link: Link, size: int, tmp: Path, directions: tuple[str, ...] = ("up", "down"),
                   together: bool = False, timeout: float = 3600) -> RawTimes:
    """Time raw pyzmq + CurveZMQ moving ``size`` random bytes over ``link``: up from namespace ``b`` to a
    ROUTER in ``a``, and down (fetched by ``b``), one after the other (counting the sending end's bytes on
    the wire) or, with ``together``, at once."""
    script = tmp / "raw_pyzmq.py"
    with raw_pyzmq_server(link, script, RAW_PYZMQ) as (address, public):
        def start(direction: str) -> subprocess.Popen[str]:
            return subprocess.Popen([*link.run(link.b), sys.executable, str(script), "client", address, public,
                                     direction, str(size)], stdout=subprocess.PIPE, text=True)

        deadline = time.monotonic() + timeout
        answers: dict[str, dict[str, float]] = {}
        wire: dict[str, int] = {}
        running = {direction: start(direction) for direction in directions} if together else {}
        for direction in directions:
            sender = link.b if direction == "up" else link.a
            before = link.sent_bytes(sender)
            client = running.get(direction) or start(direction)
            out, _ = client.communicate(timeout=max(1.0, deadline - time.monotonic()))
            assert client.returncode == 0, f"raw pyzmq {direction} failed ({client.returncode})"
            answers[direction] = json.loads(out)
            if not together:
                wire[direction] = link.sent_bytes(sender) - before
        return RawTimes({d: a["seconds"] for d, a in answers.items()},
                        statistics.median(a["rtt_s"] for a in answers.values()), wire)


def in_thread(call: Callable[[], Any], name: str) -> "Future[Any]":
    """Run a blocking call in a daemon thread; its Future, so a caller can wait with a deadline."""
    future: Future[Any] = Future()

    def target() -> None:
        try:
            future.set_result(call())
        except BaseException as exc:  # the caller inspects whatever it raised
            future.set_exception(exc)

    threading.Thread(target=target, name=name, daemon=True).start()
    return future


def join_worker(hub: WorkerProcess, folder: Path, name: str) -> WorkerProcess:
    """Start a worker process that joins ``hub`` as ``name``."""
    return start_worker(folder, "--join", "--gpu", "off", "--name", name, token_file=False,
                        env={"REMOTE_MAGIC_JOIN_TOKEN": worker_token(hub)})


def notebook_client(nb: Any, folder: Path, kernel_name: str = "python3", timeout: float = 120,
                    **options: Any) -> Any:
    """nbclient's NotebookClient for ``nb``, run in ``folder``, its kernel's sockets IPC ones in a folder of their
    own: over TCP, a port jupyter_client picked for the kernel could be taken by another test's process before
    the kernel binds it ("Kernel died before replying to kernel_info")."""
    from nbclient import NotebookClient
    from traitlets.config import Config

    sockets = tempfile.mkdtemp(prefix="kernel-")  # short: a socket's path holds at most 107 characters
    config = Config({"KernelManager": {"transport": "ipc", "ip": os.path.join(sockets, "kernel")}})
    client = NotebookClient(nb, kernel_name=kernel_name, timeout=timeout, config=config,
                            resources={"metadata": {"path": str(folder)}}, **options)
    weakref.finalize(client, shutil.rmtree, sockets, True)
    return client


def saved_outputs(cell: Any) -> list[dict[str, Any]]:
    """A cell's outputs as a Jupyter front end saves them: consecutive text of one stream merged into one
    output (how a kernel splits a print into messages depends on its output thread's timing)."""
    merged: list[dict[str, Any]] = []
    for output in cell.get("outputs", []):
        last = merged[-1] if merged else None
        if (output["output_type"] == "stream" and last is not None and last["output_type"] == "stream"
                and last["name"] == output["name"]):
            merged[-1] = {**last, "text": last["text"] + output["text"]}
        else:
            merged.append(dict(output))
    return merged


def cell_text(cell: Any) -> str:
    """Everything a notebook cell (as nbclient left it) shows: streams, plain text, markdown, tracebacks."""
    parts = []
    for output in cell.get("outputs", []):
        parts.append(output.get("text", ""))
        parts.append(output.get("data", {}).get("text/plain", ""))
        parts.append(output.get("data", {}).get("text/markdown", ""))
        parts.extend(output.get("traceback", []))
    return "".join(parts)
