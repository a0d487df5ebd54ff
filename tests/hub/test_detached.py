"""Jobs that outlive their notebook (issue 11, item 5): when a notebook's process dies (Colab drops a
runtime), its running job goes on; a notebook connecting with the same token lists it (%offload_jobs) and
collects it (%offload_attach): the whole output again, in order, and the values in its namespace."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest
from IPython.core.error import UsageError

import remote_magic
from remote_magic import NoSuchJob
from support import WorkerProcess, connected_shell, run, start_worker, wait_for

NOTEBOOK = r'''
import sys, remote_magic
client = remote_magic.connect(sys.argv[1])
code = ("import os, time\nprint('before', flush=True)\nwhile not os.path.exists(RELEASE):\n    time.sleep(0.05)\n"
        "print('after')\nx = 42\nx * 2")
client.execute(code, {"RELEASE": sys.argv[2]},
               on_stream=lambda h: (sys.stdout.write(h["text"]), sys.stdout.flush()))
'''


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[WorkerProcess]:
    worker = start_worker(tmp_path / "hub", "--listen", "127.0.0.1:0", "--gpu", "off", "--name", "box",
                          "--heartbeat-interval", "0.25", "--outage-grace", "1", "-v")  # a notebook gone is forgotten
    yield worker
    worker.stop()


def _a_notebook_that_dies_mid_job(hub: WorkerProcess, release: Path) -> str:
    """Run a job from a notebook process, kill that process once the job printed, return the job's id."""
    notebook = subprocess.Popen([sys.executable, "-c", NOTEBOOK, hub.token, str(release)], stdout=subprocess.PIPE,
                                text=True)
    assert notebook.stdout is not None
    assert notebook.stdout.readline() == "before\n"
    notebook.kill()  # as Colab drops a runtime: no goodbye
    notebook.wait(10)
    with remote_magic.connect(hub.token) as observer:
        wait_for(lambda: observer.jobs(), 15, "the hub to let the dead notebook's job run on")
        (job,) = observer.jobs()
    assert job["state"] == "running" and job["worker"] == "box" and job["summary"] == "import os, time"
    return str(job["job"])


def test_a_job_outlives_its_notebook_and_a_new_one_collects_its_output_and_values(
        hub: WorkerProcess, tmp_path: Path) -> None:
    release = tmp_path / "release"
    job_id = _a_notebook_that_dies_mid_job(hub, release)
    release.touch()  # the job goes on, with nobody to hear it
    with connected_shell(hub.token) as (shell, _):
        wait_for(lambda: "done" in run(shell, "%offload_jobs")[1].stdout, 15, "the job to end")
        result, out = run(shell, "%offload_jobs")
        assert job_id in out.stdout and "import os, time" in out.stdout
        result, out = run(shell, f"%offload_attach {job_id}")
        assert result.success, out.stderr
        assert out.stdout.startswith("before\nafter\n") and result.result == 84  # all of it, in order, then the value
        assert shell.user_ns["x"] == 42
        result, out = run(shell, f"%offload_attach {job_id}")  # collected: it no longer waits
        assert isinstance(result.error_in_exec, UsageError) and "no job" in str(result.error_in_exec)
        assert "No job waits to be collected" in run(shell, "%offload_jobs")[1].stdout


def test_a_job_collected_while_it_runs_streams_the_rest(hub: WorkerProcess, tmp_path: Path) -> None:
    release = tmp_path / "release"
    job_id = _a_notebook_that_dies_mid_job(hub, release)
    printed: list[str] = []
    with remote_magic.connect(hub.token) as client:
        def on_stream(header: dict[str, str]) -> None:
            printed.append(header["text"])
            if header["text"] == "before\n":  # what it printed before we came is shown first
                release.touch()

        result = client.attach(job_id, on_stream=on_stream)
        assert "".join(printed) == "before\nafter\n" and result.values["x"] == 42 and result.value == 84
        with pytest.raises(NoSuchJob, match="was collected already"):
            client.attach(job_id)


def test_output_in_flight_when_a_connection_breaks_arrives_once_in_order(tmp_path: Path) -> None:
    from tcp_relay import Relay, listening_port

    tunnel = Relay()  # the stand-in for a tunnel between the notebook and the hub
    worker = start_worker(tmp_path / "far", "--listen", "127.0.0.1:0", "--advertise", tunnel.address, "--gpu", "off",
                          "--heartbeat-interval", "0.25", "--outage-grace", "1")
    try:
        tunnel.target = listening_port(worker.process.pid)
        printed: list[str] = []
        with remote_magic.connect(worker.token) as client:
            def on_stream(header: dict[str, str]) -> None:
                printed.append(header["text"])
                if "100" in header["text"].split():  # while the cell prints: what is in flight is lost, then the
                    tunnel.losing = True  # connection breaks, for less than the heartbeat bound
                    time.sleep(0.3)  # how much is lost, not a wait for anything
                    tunnel.stop()
                    tunnel.start()

            code = "import time\nfor i in range(600):\n    print(i, flush=True)\n    time.sleep(0.002)\ndone = True"
            result = client.execute(code, on_stream=on_stream, timeout=60)
        assert tunnel.connections >= 2, "the link was not cut"
        assert "".join(printed).split() == [str(i) for i in range(600)] and result.values["done"] is True
    finally:
        tunnel.stop()
        worker.stop()


def test_a_job_that_ends_while_its_notebook_is_cut_off_waits_for_it(tmp_path: Path) -> None:
    release = tmp_path / "release"
    with _behind_a_tunnel(tmp_path) as (tunnel, worker):
        with remote_magic.connect(worker.token) as client:
            def cut_off(header: dict[str, str]) -> None:
                tunnel.stop()  # the link goes down for longer than the heartbeat bound,
                release.touch()  # and meanwhile the job ends: its result has nowhere to go

            code = ("import os, time\nprint('started', flush=True)\nwhile not os.path.exists(RELEASE):\n"
                    "    time.sleep(0.05)\nz = 7")
            with pytest.raises(remote_magic.ConnectionFailed, match="the job goes on there") as lost:
                client.execute(code, {"RELEASE": str(release)}, on_stream=cut_off)
            _forgotten(worker)
            tunnel.start()
            wait_for(lambda: _waiting(client), 30, "the job to wait for this notebook")
            (job,) = client.jobs()
            assert job["state"] == "done"
            # Short, and it names the command that collects this job (before: a 420-character paragraph).
            assert f"%offload_attach {job['job']} (Client.attach) collects it once" in str(lost.value)
            assert len(str(lost.value)) < 250, str(lost.value)
            printed: list[str] = []
            result = client.attach(job["job"], on_stream=lambda header: printed.append(header["text"]))
            assert result.values["z"] == 7 and printed == ["started\n"]


@contextmanager
def _behind_a_tunnel(tmp_path: Path) -> Iterator[tuple[Any, WorkerProcess]]:
    """A worker whose token points at a relay (a tunnel stand-in) that the test can cut and restore."""
    from tcp_relay import Relay, listening_port

    tunnel = Relay()
    worker = start_worker(tmp_path / "far", "--listen", "127.0.0.1:0", "--advertise", tunnel.address, "--gpu", "off",
                          "--heartbeat-interval", "0.25", "--outage-grace", "1", "-v")  # (-v: it logs who left)
    try:
        tunnel.target = listening_port(worker.process.pid)
        yield tunnel, worker
    finally:
        tunnel.stop()
        worker.stop()


def _forgotten(worker: WorkerProcess) -> None:
    """Wait for the hub to forget the cut-off notebook. The notebook gives up as the hub forgets it, each at its own
    bound: back before the hub forgot it, it would be the hub's notebook still, with no job left waiting for it."""
    wait_for(lambda: "left: stopped answering" in worker.log(), 30, "the hub to forget the cut-off notebook")


def _waiting(client: remote_magic.Client) -> bool:
    try:
        return bool(client.jobs(timeout=2))
    except remote_magic.ConnectionFailed:  # not connected again yet
        return False


def test_the_same_notebook_back_after_an_outage_collects_each_line_once_in_order(tmp_path: Path) -> None:
    """A notebook cut off past the heartbeat bound says hello again as the same client: what its job
    prints meanwhile waits in the job's journal, and `attach` shows each line once, in its place."""
    release = tmp_path / "release"
    with _behind_a_tunnel(tmp_path) as (tunnel, worker):
        with remote_magic.connect(worker.token) as client:
            code = ("import os, time\ni = 0\nwhile not os.path.exists(RELEASE):\n    print(i, flush=True)\n"
                    "    i += 1\n    time.sleep(0.02)\nprint('end')\nz = i")
            with pytest.raises(remote_magic.ConnectionFailed, match="the job goes on there"):
                client.execute(code, {"RELEASE": str(release)}, on_stream=lambda header: tunnel.stop())
            _forgotten(worker)
            tunnel.start()
            wait_for(lambda: _waiting(client), 30, "the job to wait for this notebook")
            printed: list[str] = []

            def on_stream(header: dict[str, str]) -> None:
                printed.append(header["text"])
                if len(printed) == 200:
                    release.touch()

            result = client.attach(client.jobs()[0]["job"], on_stream=on_stream)
        lines = "".join(printed).split()
        assert lines[-1] == "end" and lines[:-1] == [str(i) for i in range(result.values["z"])]


def test_a_notebook_the_hub_forgot_collects_its_waiting_cell_itself_each_line_once(tmp_path: Path) -> None:
    """A laptop that sleeps past the hub's outage grace: the hub forgets the notebook, whose clock didn't count
    the sleep, so it still waits (here: a notebook that waits 60 s, cut off for longer than the hub's 1 s). Back,
    it is told the hub doesn't know it, says hello again and collects its waiting job itself: the lines it had
    are not shown again, those printed meanwhile are, and the cell ends with its values."""
    release = tmp_path / "release"
    with _behind_a_tunnel(tmp_path) as (tunnel, worker):
        with remote_magic.connect(worker.token) as client:
            client.outage_grace = 60
            restored = threading.Thread(target=lambda: (_forgotten(worker), tunnel.start()), daemon=True)
            printed: list[str] = []
            notices: list[str] = []

            def on_stream(header: dict[str, str]) -> None:
                if header["name"] == "stderr":
                    notices.append(header["text"])
                    return
                printed.append(header["text"])
                if len(printed) == 20:  # mid-cell, the link goes, for longer than the hub waits
                    tunnel.stop()
                    restored.start()
                elif len(printed) == 300:
                    release.touch()

            code = ("import os, time\ni = 0\nwhile not os.path.exists(RELEASE):\n    print(i, flush=True)\n"
                    "    i += 1\n    time.sleep(0.01)\nprint('end')\nz = i")
            result = client.execute(code, {"RELEASE": str(release)}, on_stream=on_stream, timeout=120)
            assert client.jobs() == [], "the job was collected: nothing waits for a notebook"
        lines = "".join(printed).split()
        assert lines[-1] == "end" and lines[:-1] == [str(i) for i in range(result.values["z"])]
        assert tunnel.connections >= 2 and "left: stopped answering" in worker.log(), "the hub never forgot it"
        collecting = [n for n in notices if "collecting this job again" in n]
        assert len(collecting) == 1 and "the hub forgot this connection" in collecting[0], notices


def _raw_collector(token: str) -> Any:
    """A client socket that says hello and never acknowledges anything: a collector that dies at once."""
    import zmq

    from remote_magic.wire.protocol import MessageType as T, encode
    from remote_magic.wire.tokens import Token
    from remote_magic.wire.versions import local_versions

    parsed = Token.decode(token)
    context = zmq.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = (parsed.server_public, parsed.public,
                                                                        parsed.secret)
    sock.connect(parsed.address)
    sock.send_multipart(encode(T.HELLO, {"role": "client", "name": "dies", "versions": local_versions()}))
    return sock


def test_a_collector_gone_before_it_acknowledged_the_replay_leaves_the_job_waiting(
        hub: WorkerProcess, tmp_path: Path) -> None:
    from remote_magic.wire.protocol import MessageType as T, decode, encode

    release = tmp_path / "release"
    job_id = _a_notebook_that_dies_mid_job(hub, release)
    release.touch()
    with remote_magic.connect(hub.token) as observer:
        wait_for(lambda: observer.jobs()[0]["state"] == "done", 15, "the job to end")
    collector = _raw_collector(hub.token)
    collector.send_multipart(encode(T.ATTACH, {"job": job_id}))
    types = []
    while T.RESULT not in types:  # the replay arrives; the collector acknowledges none of it, and goes
        assert collector.poll(10_000), f"the replay stopped after {types}"
        types.append(decode(collector.recv_multipart()).type)
    collector.close()
    with remote_magic.connect(hub.token) as client:
        wait_for(lambda: [j["job"] for j in client.jobs()] == [job_id], 15, "the job to wait again")
        printed: list[str] = []
        result = client.attach(job_id, on_stream=lambda header: printed.append(header["text"]))
    assert "".join(printed) == "before\nafter\n" and result.values["x"] == 42


def test_jobs_lists_nothing_for_a_notebook_that_closed_after_its_results(hub: WorkerProcess) -> None:
    with remote_magic.connect(hub.token) as client:
        for n in range(20):
            assert client.run(f"v = {n}") == {"v": n}
    with remote_magic.connect(hub.token) as other:
        assert other.jobs() == []
