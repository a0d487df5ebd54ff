"""Content-addressed transfer (issue 11, item 1): a large value the hub holds for this notebook crosses
as its digest, both what the notebook sent before and what came back from a cell; a hub that no longer
holds one gets it again, and the job runs as if nothing happened."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

import remote_magic
from remote_magic.notebook.tables import WorkersTable
from support import WorkerProcess, free_port, start_worker, wait_for

MB = 10**6


def _bytes_from(client: remote_magic.Client, worker: str = "shared") -> int:
    """What the hub has handed that worker so far: the jobs, with their values."""
    return int(next(w for w in client.workers() if w["name"] == worker)["bytes_in"])


def test_a_value_sent_again_or_sent_back_crosses_as_its_digest(worker: WorkerProcess) -> None:
    x = np.random.default_rng(1).random(1_000_000)  # 8 MB
    with remote_magic.connect(worker.token) as client:
        for _ in range(2):  # the hub's cache holds x after the first; the worker still gets all of it
            before = _bytes_from(client)
            assert client.run("total = float(x.sum())", {"x": x})["total"] == pytest.approx(x.sum())
            assert _bytes_from(client) - before > 8 * MB
        table = repr(WorkersTable(client.workers(), client.hub_cache))  # what %offload_workers shows
        assert client.hub_cache == {"bytes": 8 * MB, "max_bytes": 1 << 30}
        assert "The hub keeps 8.0 MB of this notebook's large values (at most 1.1 GB)" in table
        y = client.run("y = x * 2", {"x": x})["y"]
        np.testing.assert_array_equal(y, x * 2)
        assert client.run("same = bool((y == x * 2).all())", {"x": x, "y": y})["same"]


def test_a_hub_that_lost_a_value_gets_it_again_and_the_job_runs(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    port, home = free_port(), tmp_path / "home"
    first = start_worker(tmp_path / "first", "--listen", f"127.0.0.1:{port}", "--gpu", "off", home=home)
    x = np.arange(1_000_000.0)
    caplog.set_level(logging.INFO, logger="remote_magic.client_jobs")
    with remote_magic.connect(first.token, timeout=10) as client:
        assert client.run("total = float(x.sum())", {"x": x})["total"] == x.sum()
        first.stop()  # a new hub: it holds nothing of this notebook's
        second = start_worker(tmp_path / "second", "--listen", f"127.0.0.1:{port}", "--gpu", "off",
                              "--cache-size", "64M", home=home)
        try:
            wait_for(lambda: _ran(client), 30, "the client to be known to the new hub")
            assert client.run("total = float(x.sum())", {"x": x})["total"] == x.sum()
            client.workers()
            assert client.hub_cache == {"bytes": 8 * MB, "max_bytes": 64_000_000}
        finally:
            second.stop()
    assert "the hub no longer holds 1 of the values" in caplog.text


def _ran(client: remote_magic.Client) -> bool:
    try:
        return client.run("ok = True")["ok"] is True
    except remote_magic.RemoteMagicError:
        return False
