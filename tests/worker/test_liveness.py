"""Liveness that tells the truth (issue 10, defect 8): a process busy in one long call that holds
the GIL is alive, and keeps its jobs; libzmq's own heartbeats, answered without the GIL, say so.

The GIL is held with a C call made through ``ctypes.PyDLL``, which (unlike ``ctypes.CDLL``) keeps
the GIL for the whole call, as a long numpy or builtin call in a notebook does.
"""

from __future__ import annotations

import ctypes
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest

import remote_magic
from remote_magic.hub.served import ServedHub
from remote_magic.wire.keys import HubKeys
from remote_magic.wire.protocol import HEARTBEAT_LIVENESS, LINK_PING_INTERVAL_S, Role
from support import WorkerProcess, start_worker, wait_for

HEARTBEAT_INTERVAL_S = 0.2
EXPIRY_S = HEARTBEAT_INTERVAL_S * HEARTBEAT_LIVENESS
GIL_HELD_S = 3 * EXPIRY_S


def hold_the_gil(seconds: float) -> None:
    """Block this whole process's Python for ``seconds``: no other thread of it runs meanwhile."""
    ctypes.PyDLL(None).usleep(int(seconds * 1e6))


def slow_square() -> Callable[[int], int]:
    """A slow job's function; made inside a function, so it travels by value to the worker."""
    def square(x: int) -> int:
        time.sleep(1.5)
        return x * x
    return square


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[WorkerProcess]:
    worker = start_worker(tmp_path, "--listen", "127.0.0.1:0", "--gpu", "off", "--name", "home", "-v",
                          "--heartbeat-interval", str(HEARTBEAT_INTERVAL_S), "--outage-grace", "1")
    yield worker
    worker.stop()


def test_a_client_holding_the_gil_keeps_its_jobs(hub: WorkerProcess) -> None:
    with remote_magic.connect(hub.token) as client:
        future = client.submit(slow_square(), 7)
        wait_for(lambda: client.workers()[0]["state"] == "busy", 10, "the job to start")
        held_from = time.monotonic()
        hold_the_gil(GIL_HELD_S)
        assert time.monotonic() - held_from >= GIL_HELD_S  # this process really was stalled that long
        # Before: the hub dropped this client after EXPIRY_S of silence and cancelled its job.
        assert future.result(timeout=20) == 49
        assert client.run("after = 1") == {"after": 1}
    assert "client" in hub.log() and "stopped answering" not in hub.log()  # the hub never took it for gone


@dataclass
class ServedFleet:
    """A hub served by this process, as %offload_serve does, a worker process that joined it, and a client."""

    served: ServedHub
    joiner: WorkerProcess
    client: remote_magic.Client


@pytest.fixture
def served(tmp_path: Path) -> Iterator[ServedFleet]:
    hub = ServedHub(HubKeys.generate(), "127.0.0.1", 0, heartbeat_interval=HEARTBEAT_INTERVAL_S, outage_grace=1.0)
    try:
        joiner = start_worker(tmp_path, "--join", "--gpu", "off", "--name", "joiner", token_file=False,
                              env={"REMOTE_MAGIC_JOIN_TOKEN": hub.loopback_token(Role.WORKER).encode()})
        try:
            with remote_magic.connect(hub.loopback_token(Role.CLIENT)) as client:
                yield ServedFleet(hub, joiner, client)
        finally:
            joiner.process.send_signal(signal.SIGCONT)  # in case a test left it stopped
            joiner.stop()
    finally:
        hub.close()


def test_a_hub_in_a_busy_notebook_keeps_its_workers_jobs(served: ServedFleet) -> None:
    """%offload_serve: the hub runs in the notebook's process, so the notebook stalls it too."""
    future = served.client.submit(slow_square(), 9)
    wait_for(lambda: served.client.workers()[0]["state"] == "busy", 10, "the job to start")
    hold_the_gil(GIL_HELD_S)
    # Before: the worker took the silent hub for gone after EXPIRY_S and stopped the job.
    assert future.result(timeout=20) == 81
    assert [w["name"] for w in served.client.workers()] == ["joiner"]
    assert "reconnecting" not in served.joiner.log()


def test_a_stopped_worker_is_still_noticed_within_the_heartbeat_bound(served: ServedFleet) -> None:
    """The other side of the same rule: a process that can't answer libzmq's heartbeats is gone, at the
    heartbeat bound ("stopped answering"), not the far longer one for a hung process ("said nothing")."""
    future = served.client.submit(slow_square(), 3)
    wait_for(lambda: served.client.workers()[0]["state"] == "busy", 10, "the job to start")
    served.joiner.process.send_signal(signal.SIGSTOP)
    with pytest.raises(remote_magic.WorkerLost, match="'joiner'.*stopped answering"):
        future.result(timeout=30)


def test_output_that_piles_up_while_the_client_holds_the_gil_all_arrives(hub: WorkerProcess) -> None:
    """The hub keeps what a busy client can't take yet; before, it dropped it past 1000 messages."""
    lines, size = 3000, 64 * 1024  # far more than the queues and TCP buffers between hub and client hold
    code = f"for i in range({lines}):\n    print(str(i).rjust({size - 1}, '.'), flush=True)\ndone = {lines}"
    texts: list[str] = []  # a line may come in two pieces (a flush between print's text and its newline)
    first = threading.Event()
    outcome: dict[str, object] = {}

    def on_stream(header: dict[str, object]) -> None:
        texts.append(str(header["text"]))
        first.set()

    with remote_magic.connect(hub.token) as client:
        def run() -> None:
            try:
                outcome["values"] = client.execute(code, on_stream=on_stream).values
            except Exception as exc:  # the test reports whatever it raised
                outcome["error"] = exc

        runner = threading.Thread(target=run)
        runner.start()
        assert first.wait(30), "no output arrived"
        # Longer than the client's own link timeout: libzmq used to abort this process then (its
        # input stopped for a full queue when a heartbeat timed out, zeromq/libzmq#3937).
        hold_the_gil(LINK_PING_INTERVAL_S * HEARTBEAT_LIVENESS + 1)
        runner.join(60)
        received = [int(line.lstrip(".")) for line in "".join(texts).splitlines()]
        assert not runner.is_alive(), f"the job never ended for the client ({len(received)} of {lines} lines came)"
    assert outcome == {"values": {"i": lines - 1, "done": lines}}
    assert received == list(range(lines))
