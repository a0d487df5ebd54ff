"""Placement across a real fleet (a hub worker plus joined workers, all remote-worker processes on
127.0.0.1): --require by what workers have and by --label, --prefer fastest, the battery policies
(through $REMOTE_MAGIC_BATTERY, not real hardware), and the hub's accounting per worker."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import remote_magic
from remote_magic import JobTimeout, NoMatchingWorker, RequirementError
from remote_magic.notebook.tables import WorkersTable
from remote_magic.wire.sizes import human_size
from remote_magic.wire.tokens import Token
from support import WorkerProcess, start_worker, wait_for


def _join(hub: WorkerProcess, folder: Path, name: str, *args: str, battery: str | None = None) -> WorkerProcess:
    """A worker process that joins ``hub`` as ``name`` (as tests/hub/test_hub.py's), with more options."""
    worker_token = subprocess.run(["remote-worker", "token", "--worker"], capture_output=True, text=True,
                                  env={**os.environ, "REMOTE_MAGIC_HOME": str(hub.home)}, check=True).stdout.strip()
    worker_token = Token.decode(worker_token).with_address(Token.decode(hub.token).address).encode()
    env = {"REMOTE_MAGIC_JOIN_TOKEN": worker_token, **({"REMOTE_MAGIC_BATTERY": battery} if battery else {})}
    return start_worker(folder, "--join", "--gpu", "off", "--name", name, *args, token_file=False, env=env)


def _hub(folder: Path, *args: str, battery: str | None = None) -> WorkerProcess:
    return start_worker(folder, "--listen", "127.0.0.1:0", "--gpu", "off", "--name", "home",
                        "--heartbeat-interval", "0.2", "--outage-grace", "1", *args,
                        env={"REMOTE_MAGIC_BATTERY": battery} if battery else None)


def test_requirements_pick_the_worker_that_has_it_and_an_unmatchable_one_fails_listing_the_fleet(
        tmp_path: Path) -> None:
    hub = _hub(tmp_path / "hub")
    big = _join(hub, tmp_path / "big", "big", "--label", "vram=24GB", "--label", "zone=lab")
    try:
        with remote_magic.connect(hub.token) as client:
            wait_for(lambda: len(client.workers()) == 2, 20, "both workers to join")
            for _ in range(3):  # home joined first and is idle: without the requirement it would take these
                assert client.execute("x = 1", require=["vram>=16GB"]).worker == "big"
            assert client.execute("x = 2", require="zone==LAB", prefer="fastest").worker == "big"
            assert client.submit(os.getpid, require=["zone==lab"]).result(30) != os.getpid()
            with pytest.raises(NoMatchingWorker) as info:
                client.run("x = 3", require=["memory>=1TB"])
            message = str(info.value)
            assert "--require 'memory>=1TB'" in message and "'home' has memory" in message
            assert "'big' has memory" in message and "zone lab" in message and "vram 24 GB" in message
            with pytest.raises(NoMatchingWorker, match="on worker 'home'"):
                client.run("x = 4", worker="home", require="zone==lab")
            with pytest.raises(RequirementError, match="has no order"):
                client.run("x = 5", require="memory>=lots")
            [listed] = [w for w in client.workers() if w["name"] == "big"]
            assert listed["labels"] == {"vram": "24GB", "zone": "lab"} and listed["speed"] > 0
            assert "vram=24GB, zone=lab" in repr(WorkersTable([listed]))
            # A requirement only a leaving worker met: the jobs waiting for it fail at once, saying so.
            busy = client.submit(time.sleep, 60, require="zone==lab")
            wait_for(lambda: any(w["name"] == "big" and w["state"] == "busy" for w in client.workers()), 10,
                     "'big' to be busy")
            waiting = client.submit(os.getpid, require="zone==lab")
            client.workers()  # one round trip: the hub has queued it
            big.stop()
            with pytest.raises(NoMatchingWorker, match="'big' shut down, and it was the one that matched"):
                waiting.result(20)
            with pytest.raises(remote_magic.WorkerLost):
                busy.result(20)
    finally:
        big.stop()
        hub.stop()


def test_a_worker_whose_process_died_takes_no_job_before_its_heartbeats_expire(tmp_path: Path) -> None:
    # Heartbeats every 5 s: silence alone makes a worker out of reach only after 25 s
    hub = start_worker(tmp_path / "hub", "--listen", "127.0.0.1:0", "--gpu", "off", "--name", "home",
                       "--heartbeat-interval", "5")
    doomed = _join(hub, tmp_path / "doomed", "doomed", "--label", "zone=lab")
    spare = _join(hub, tmp_path / "spare", "spare", "--label", "zone=lab")
    try:
        with remote_magic.connect(hub.token) as client:
            wait_for(lambda: len(client.workers()) == 3, 30, "both workers to join")
            doomed.process.kill()  # its connection closes with it
            doomed.process.wait()
            wait_for(lambda: not {w["name"]: w for w in client.workers()}["doomed"]["reachable"], 15,
                     "the hub to take the killed worker for out of reach")
            # before: the first to have joined of those that fit, and lost 25 s later (WorkerLost)
            assert [client.execute("x = 1", require="zone==lab", timeout=20).worker for _ in range(2)] == ["spare"] * 2
    finally:
        spare.stop()
        hub.stop()


def test_jobs_go_to_a_plugged_in_worker_before_one_on_battery(tmp_path: Path) -> None:
    hub = _hub(tmp_path / "hub", battery="80,false")  # on battery, --on-battery last (the default)
    plugged = _join(hub, tmp_path / "plugged", "plugged", battery="95,true")
    try:
        with remote_magic.connect(hub.token) as client:
            wait_for(lambda: len(client.workers()) == 2, 20, "both workers to join")
            assert [client.execute("x = 1").worker for _ in range(3)] == ["plugged"] * 3
            running = client.submit(time.sleep, 60)  # plugged is busy: the one on battery is the last resort
            wait_for(lambda: any(w["name"] == "plugged" and w["state"] == "busy" for w in client.workers()), 10,
                     "'plugged' to be busy")
            assert client.execute("x = 2").worker == "home"
            running.cancel()
            table = repr(WorkersTable(client.workers()))
            assert "battery 80%, last resort" in table and "plugged in, 95%" in table
    finally:
        plugged.stop()
        hub.stop()


def test_workers_held_back_by_battery_take_nothing_and_a_waiting_job_says_why(tmp_path: Path) -> None:
    hub = _hub(tmp_path / "hub", "--on-battery", "never", battery="90,false")
    low = _join(hub, tmp_path / "low", "low", "--min-battery", "30", battery="12,false")
    try:
        with remote_magic.connect(hub.token) as client:
            wait_for(lambda: len(client.workers()) == 2, 20, "both workers to join")
            said: list[str] = []
            started = time.monotonic()
            with pytest.raises(JobTimeout) as info:
                client.execute("x = 1", timeout=1.5, on_stream=lambda h: said.append(h["text"]))
            assert time.monotonic() - started >= 1.5
            for text in (str(info.value), "".join(said)):
                assert "worker 'home' is on battery (90%) and takes no jobs on battery (--on-battery never)" in text
                assert "worker 'low' is on battery at 12%, under its --min-battery 30" in text
            listed = {w["name"]: w for w in client.workers()}
            assert listed["low"]["held"] and listed["low"]["battery"] == {"percent": 12, "plugged_in": False}
            table = repr(WorkersTable(list(listed.values())))
            assert "battery 90%: no jobs (--on-battery never)" in table
            assert "battery 12%: no jobs (under --min-battery)" in table
    finally:
        low.stop()
        hub.stop()


def test_the_hub_counts_each_workers_jobs_busy_time_and_bytes(client: remote_magic.Client) -> None:
    def shared() -> dict:
        return next(w for w in client.workers() if w["name"] == "shared")

    before = shared()
    array = np.ones(2**18)  # 2 MiB
    started = time.monotonic()
    client.run("import time\ntime.sleep(0.5)\nback = a[:1000].copy()", {"a": array})
    elapsed = time.monotonic() - started
    after = shared()
    assert after["jobs_done"] == before["jobs_done"] + 1
    assert after["bytes_in"] - before["bytes_in"] >= array.nbytes
    assert 8000 <= after["bytes_out"] - before["bytes_out"] < array.nbytes
    assert 0.5 <= after["busy_s"] - before["busy_s"] <= elapsed
    assert after["gpu_s"] == before["gpu_s"]  # a CPU-only job
    table = repr(WorkersTable([after]))
    assert f"{after['jobs_done']} (busy {after['busy_s']:.1f} s)" in table
    assert f"{human_size(after['bytes_in'])} / {human_size(after['bytes_out'])}" in table


def test_the_offload_magic_takes_requirements(ip: InteractiveShell) -> None:
    assert ip.run_cell('%%offload --require "cpus>=1" --require python>=3.10 --prefer fastest\nplaced = 1').success
    assert ip.user_ns["placed"] == 1
    with pytest.raises(NoMatchingWorker, match="no connected worker matches --require 'memory>=1TB'"):
        ip.run_cell_magic("offload", '--require "memory>=1TB"', "x = 1")
    with pytest.raises(UsageError, match="not a trait name"):
        ip.run_cell_magic("offload", "--require 9lives", "x = 1")
