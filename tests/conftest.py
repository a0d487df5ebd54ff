"""Fixtures that start real remote-worker processes on 127.0.0.1 and connect real clients."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Iterator

import pytest
from IPython.core.interactiveshell import InteractiveShell

import remote_magic
from support import WorkerProcess, build_wheel, connected_shell, start_worker

# tinygrad's own tests: tests/gpu/test_tinygrad_ops.py runs them in a process of their own
collect_ignore = ["gpu/tinygrad"]

# A shell starts background jobs with SIGINT ignored, and Python then leaves it ignored: the tests
# that press Ctrl-C need Python's usual handler wherever the suite is started from.
signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    """One shared worker (hub + worker in one process, GPU off) for tests that don't break it."""
    # In a folder of its own: what cells write (%offload_put too) stays out of the repository.
    # A notebook gone (killed, cut off) is taken for gone in 2 s: its session's process stops then.
    w = start_worker(tmp_path_factory.mktemp("worker"), "--listen", "127.0.0.1:0", "--gpu", "off", "--name", "shared",
                     "--heartbeat-interval", "0.25", "--outage-grace", "2", cwd=tmp_path_factory.mktemp("worker-cwd"))
    yield w
    w.stop()


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built once per session as `pip install` would build it."""
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture
def client(worker: WorkerProcess) -> Iterator[remote_magic.Client]:
    with remote_magic.connect(worker.token, timeout=10) as c:
        yield c


@pytest.fixture
def ip(worker: WorkerProcess, monkeypatch: pytest.MonkeyPatch) -> Iterator[InteractiveShell]:
    """A real IPython shell with the extension loaded, connected to the shared worker."""
    monkeypatch.setenv("REMOTE_MAGIC_TOKEN", worker.token)
    with connected_shell("") as (shell, printed):  # falls back to REMOTE_MAGIC_TOKEN
        assert "Connected to tcp://127.0.0.1" in printed and "shared" in printed
        yield shell
