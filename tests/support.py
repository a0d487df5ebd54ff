"""Helpers for tests: start real remote-worker processes on 127.0.0.1, poll with deadlines."""

from __future__ import annotations

import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

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
    worker = WorkerProcess(process, home, token, log)
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
    """Build the project's wheel from a clean copy, in an isolated build as a user's `pip install` does."""
    source = tmp / "source"  # building in place would leave build/ in the repository
    source.mkdir(parents=True)
    for name in WHEEL_SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(path, source / name)
    dist = tmp / "dist"
    run_command(sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", dist, source, cwd=tmp)
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
