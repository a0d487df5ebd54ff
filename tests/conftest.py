"""Fixtures that start real remote-worker processes on 127.0.0.1 and connect real clients."""

from __future__ import annotations

from typing import Iterator

import pytest

import remote_magic
from support import WorkerProcess, start_worker


@pytest.fixture(scope="session")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    """One shared worker (hub + worker in one process, GPU off) for tests that don't break it."""
    w = start_worker(tmp_path_factory.mktemp("worker"), "--listen", "127.0.0.1:0", "--gpu", "off",
                     "--name", "shared", "--heartbeat-interval", "0.25")
    yield w
    w.stop()


@pytest.fixture
def client(worker: WorkerProcess) -> Iterator[remote_magic.Client]:
    with remote_magic.connect(worker.token, timeout=10) as c:
        yield c
