"""The hub under bad input and lost peers: refusals before unpickling, errors for bad frames,
fail-fast WorkerLost, cancelled jobs of vanished clients, queueing across workers, memory limits."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import psutil
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

import remote_magic
import remote_magic.wire.versions
from remote_magic import ExecutorDied, NoSuchWorker, WorkerLost
from remote_magic.wire.protocol import PROTOCOL_VERSION, MessageType as T, decode, encode
from remote_magic.wire.tokens import Token
from support import WorkerProcess, join_worker, start_worker, wait_for


class CreateFileWhenUnpickled:
    """A payload that creates a file the moment anything unpickles it."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _raw_socket(context: zmq.Context, token: Token, public: bytes, secret: bytes) -> zmq.Socket:
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.curve_serverkey = token.server_public
    sock.curve_publickey, sock.curve_secretkey = public, secret
    sock.connect(token.address)
    return sock


def _recv(sock: zmq.Socket, timeout: float = 5.0):
    assert sock.poll(timeout * 1000), "no reply from the hub"
    return decode(sock.recv_multipart())


def _received_within(sock: zmq.Socket, seconds: float) -> list[T]:
    """The types of what the hub sends in the next `seconds` (heartbeats included: the hub may send one any time)."""
    deadline = time.monotonic() + seconds
    received = []
    while (left := deadline - time.monotonic()) > 0 and sock.poll(left * 1000):
        received.append(decode(sock.recv_multipart()).type)
    return received


def _hello(sock: zmq.Socket, role: str) -> None:
    versions = remote_magic.wire.versions.local_versions()
    sock.send_multipart(encode(T.HELLO, {"role": role, "name": role, "versions": versions}))


def _submit_frames(path: Path, job: str = "evil") -> list[bytes]:
    stream = pickle.dumps(CreateFileWhenUnpickled(path), protocol=5)
    return encode(T.SUBMIT, {"job": job, "kind": "code", "code": "pass", "outputs": None,
                             "names": ["x"], "counts": [1]}, [stream])


def test_unauthenticated_peers_never_get_a_payload_unpickled(worker: WorkerProcess, client, tmp_path: Path) -> None:
    token = Token.decode(worker.token)
    target = tmp_path / "pwned"
    context = zmq.Context()
    try:
        # No CURVE at all, and CURVE with a key pair the hub never issued.
        plain = context.socket(zmq.DEALER)
        plain.linger = 0
        plain.connect(token.address)
        stranger = _raw_socket(context, token, *zmq.curve_keypair())
        for sock in (plain, stranger):
            sock.send_multipart(encode(T.HELLO, {"role": "client", "name": "x", "versions": {"protocol": "RM3"}}))
            sock.send_multipart(_submit_frames(target))
        assert not plain.poll(1000) and not stranger.poll(1000)  # no reply: the handshake never completed
        # Control: the same payload from a peer with the real credentials does reach an unpickler,
        # so the check above could have failed.
        assert client.run("pass", {"x": CreateFileWhenUnpickled(tmp_path / "control")}, outputs=[]) == {}
        assert (tmp_path / "control").exists()
        assert not target.exists()
    finally:
        context.destroy(linger=0)
    assert client.run("ok = 1") == {"ok": 1}


@pytest.mark.parametrize("frames, reason", [
    ([b"RM2"], "at least 3 frames"),
    ([b"XX9", b"hello", b"{}"], "protocol version"),
    ([PROTOCOL_VERSION, b"launch", b"{}"], "unknown message type"),
    ([PROTOCOL_VERSION, b"submit", b"\xff\xfe"], "not valid JSON"),
    ([PROTOCOL_VERSION, b"submit", b"[1, 2]"], "must be a JSON object"),
    ([PROTOCOL_VERSION, b"submit", b"{}"], "send hello first"),
])
def test_malformed_messages_get_an_error_and_the_hub_keeps_serving(
        worker: WorkerProcess, client, frames: list[bytes], reason: str) -> None:
    token = Token.decode(worker.token)
    context = zmq.Context()
    try:
        sock = _raw_socket(context, token, token.public, token.secret)
        sock.send_multipart(frames)
        reply = _recv(sock)
        assert reply.type is T.ERROR
        assert reason in reply.header["message"]
    finally:
        context.destroy(linger=0)
    assert client.run("still = 'serving'") == {"still": "serving"}


def test_a_flood_of_malformed_messages_gets_every_reply_but_few_log_lines(tmp_path: Path) -> None:
    worker = start_worker(tmp_path, "--listen", "127.0.0.1:0", "--gpu", "off")
    token = Token.decode(worker.token)
    context = zmq.Context()
    try:
        sock = _raw_socket(context, token, token.public, token.secret)
        for _ in range(50):
            sock.send_multipart([PROTOCOL_VERSION, b"launch", b"{}"])
        replies = [_recv(sock) for _ in range(50)]
        assert all(r.type is T.ERROR and "unknown message type" in r.header["message"] for r in replies)
        with remote_magic.connect(worker.token, timeout=10) as client:
            assert client.run("ok = 1") == {"ok": 1}  # and the log has caught up with the flood
        assert worker.log().count("malformed message from a client") == 5
    finally:
        context.destroy(linger=0)
        worker.stop()


def test_a_client_token_cannot_act_as_a_worker(worker: WorkerProcess) -> None:
    token = Token.decode(worker.token)
    context = zmq.Context()
    try:
        sock = _raw_socket(context, token, token.public, token.secret)
        _hello(sock, "worker")
        reply = _recv(sock)
        assert reply.type is T.ERROR and "this token is for a client, not a worker" in reply.header["message"]
        _hello(sock, "client")
        assert _recv(sock).type is T.WELCOME
        sock.send_multipart(encode(T.RESULT, {"job": "x", "names": [], "counts": []}))
        reply = _recv(sock)
        assert reply.type is T.ERROR and "a client token can't act as a worker" in reply.header["message"]
    finally:
        context.destroy(linger=0)




@contextmanager
def _fleet(folder: Path) -> Iterator[tuple[WorkerProcess, WorkerProcess]]:
    """A hub with worker 'home', and a second worker process 'joiner' that joined it."""
    hub = start_worker(folder / "hub", "--listen", "127.0.0.1:0", "--gpu", "off", "--name", "home",
                       "--heartbeat-interval", "0.2", "--outage-grace", "1", "--max-message-size", "1M")
    try:
        joiner = join_worker(hub, folder / "joiner", "joiner")
        try:
            yield hub, joiner
        finally:
            joiner.stop()
    finally:
        hub.stop()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[WorkerProcess, WorkerProcess]]:
    """A fleet of its own, for a test that stops, kills or locks out one of its workers."""
    with _fleet(tmp_path) as made:
        yield made


@pytest.fixture(scope="module")
def shared_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[WorkerProcess, WorkerProcess]]:
    """One fleet for the tests after which both workers serve on (each checks that they do)."""
    with _fleet(tmp_path_factory.mktemp("shared-fleet")) as made:
        yield made


def test_fleet_runs_jobs_on_idle_workers_and_fails_fast_when_one_is_lost(fleet, tmp_path: Path) -> None:
    hub, joiner = fleet
    with remote_magic.connect(hub.token) as client:
        wait_for(lambda: len(client.workers()) == 2, 10, "both workers to join")
        # Two jobs that each wait for the other: they finish only if they run at the same time.
        code = textwrap.dedent("""
            import os, time
            open(os.path.join(folder, str(os.getpid())), 'w').close()
            deadline = time.monotonic() + 20
            while len(os.listdir(folder)) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            seen = len(os.listdir(folder))
        """)
        (tmp_path / "meet").mkdir()
        results: list[dict] = []
        threads = [threading.Thread(target=lambda: results.append(
            client.run(code, {"folder": str(tmp_path / "meet")}, ["seen"]))) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert results == [{"seen": 2}, {"seen": 2}]

        # A worker that dies mid-job: its job fails with WorkerLost within the heartbeat expiry.
        def kill_joiner(header: dict) -> None:
            if "running" in header["text"]:
                joiner.process.send_signal(signal.SIGKILL)

        started = time.monotonic()
        with pytest.raises(WorkerLost, match="'joiner'.*stopped answering"):
            client.execute("import time\nprint('running', flush=True)\ntime.sleep(60)", worker="joiner",
                           on_stream=kill_joiner)
        assert time.monotonic() - started < 5
        assert [w["name"] for w in client.workers()] == ["home"]
        assert client.run("after = 1", worker="home") == {"after": 1}


def test_a_job_waiting_for_a_named_worker_that_leaves_fails_at_once(fleet) -> None:
    hub, joiner = fleet
    with remote_magic.connect(hub.token) as client:
        wait_for(lambda: len(client.workers()) == 2, 10, "both workers to join")
        outcomes: dict[str, BaseException | None] = {}

        def run_on_joiner(key: str, code: str) -> None:
            outcomes[key] = _error_of(lambda: client.run(code, worker="joiner"))

        running = threading.Thread(target=run_on_joiner, args=("running", "import time\ntime.sleep(60)"), daemon=True)
        running.start()
        wait_for(lambda: any(w["name"] == "joiner" and w["state"] == "busy" for w in client.workers()), 10,
                 "'joiner' to run the first job")
        queued = threading.Thread(target=run_on_joiner, args=("queued", "x = 1"), daemon=True)
        queued.start()
        wait_for(lambda: len(client._jobs) == 2, 10, "the second job to be submitted")
        client.workers()  # one round trip on the same connection: the hub has queued the submit
        joiner.process.send_signal(signal.SIGKILL)
        started = time.monotonic()
        for thread in (running, queued):
            thread.join(10)
        assert time.monotonic() - started < 5
        assert isinstance(outcomes["running"], WorkerLost), outcomes
        assert isinstance(outcomes["queued"], NoSuchWorker), outcomes  # before: it waited forever
        assert "worker 'joiner', which this job was waiting for, stopped answering" in str(outcomes["queued"])
        assert client.run("after = 2", worker="home") == {"after": 2}


def test_a_worker_stopped_mid_job_and_continued_drops_the_abandoned_job(fleet) -> None:
    hub, joiner = fleet
    with remote_magic.connect(hub.token) as client:
        wait_for(lambda: len(client.workers()) == 2, 10, "both workers to join")

        def stop_joiner(header: dict) -> None:
            if "spinning" in header["text"]:
                joiner.process.send_signal(signal.SIGSTOP)

        with pytest.raises(WorkerLost):
            client.execute("print('spinning', flush=True)\nwhile True:\n    pass", worker="joiner",
                           on_stream=stop_joiner)
        joiner.process.send_signal(signal.SIGCONT)
        wait_for(lambda: "joiner" in [w["name"] for w in client.workers()], 15, "'joiner' to rejoin")
        started = time.monotonic()
        # Before: it rejoined as idle while its executor still spun, and this waited forever.
        assert client.run("after = 4", worker="joiner", timeout=30) == {"after": 4}
        assert time.monotonic() - started < 15


def test_a_job_waiting_when_a_worker_joins_starts_there_and_says_where(tmp_path: Path) -> None:
    """Found by the soak test: the worker's first job could arrive before it kept its connection,
    and the STARTED naming it was lost (the job still ran, but ``worker`` came back empty)."""
    hub = start_worker(tmp_path / "hub", "--listen", "127.0.0.1:0", "--gpu", "off", "--name", "home")
    try:
        with remote_magic.connect(hub.token) as client:
            busy = client.submit(time.sleep, 60)
            wait_for(lambda: client.workers()[0]["state"] == "busy", 10, "'home' to be busy")
            results: list[remote_magic.JobResult] = []
            waiting = threading.Thread(target=lambda: results.append(client.execute("x = 1")))
            waiting.start()  # it waits in the hub's queue: the only worker is busy
            joiner = join_worker(hub, tmp_path / "joiner", "joiner")
            try:
                waiting.join(60)
                assert [(r.values, r.worker) for r in results] == [({"x": 1}, "joiner")]
                assert "Traceback" not in joiner.log()
            finally:
                joiner.stop()
            busy.cancel()
    finally:
        hub.stop()


def test_a_job_for_an_executor_that_died_idle_waits_for_a_fresh_one(tmp_path: Path) -> None:
    """Found by the soak test: such a job failed with ExecutorDied, though it never ran anywhere."""
    hub = start_worker(tmp_path, "--listen", "127.0.0.1:0", "--gpu", "off", "-v")
    try:
        with remote_magic.connect(hub.token) as client:
            executor = psutil.Process(client.run("import os\npid = os.getpid()")["pid"])  # this session's
            executor.kill()
            # Until its last thread exits, a killed process can't be reaped: the worker can't know yet.
            tasks = Path(f"/proc/{executor.pid}/task")

            def dead() -> bool:
                try:
                    return executor.status() == psutil.STATUS_ZOMBIE and len(list(tasks.iterdir())) <= 1
                except (psutil.NoSuchProcess, FileNotFoundError):  # reaped already
                    return True

            wait_for(dead, 10, "the executor to die")
            assert client.run("y = 2", timeout=120) == {"y": 2}
            assert "lost its executor: its process" in hub.log()
    finally:
        hub.stop()


def test_a_job_cancelled_while_it_waits_for_a_fresh_executor_never_runs(tmp_path: Path) -> None:
    """Before: the worker ignored a cancel for a job it hadn't started, and ran it once it could."""
    hooks = tmp_path / "hooks"  # on the executors' sys.path: a sitecustomize.py there runs as each starts
    hooks.mkdir()
    gate = tmp_path / "gate"  # while it exists, an executor that starts waits before saying hello
    (hooks / "sitecustomize.py").write_text(
        f"import os, time\nwhile os.path.exists({str(gate)!r}):\n    time.sleep(0.05)\n")
    hub = start_worker(tmp_path, "--listen", "127.0.0.1:0", "--gpu", "off", env={"PYTHONPATH": str(hooks)})
    ran = tmp_path / "ran"
    try:
        with remote_magic.connect(hub.token) as client:
            gate.touch()  # the spare the first job starts is held at the gate
            with pytest.raises(ExecutorDied):
                client.run("import os\nos._exit(3)")
            # The session's next executor is that spare, still starting; this job waits for it there.
            waiting = client.submit(ran.touch)
            assert waiting.cancel()
            gate.unlink()
            assert client.run("x = 1", timeout=120) == {"x": 1}  # after the fresh executor's first job
            assert not ran.exists()
    finally:
        hub.stop()


def test_jobs_for_an_executor_that_cannot_start_fail_saying_why_and_the_worker_tries_again(tmp_path: Path) -> None:
    """Before: a fresh executor that died while starting left the jobs waiting for it forever."""
    hooks = tmp_path / "hooks"  # on the executors' sys.path: a sitecustomize.py there runs as each starts
    hooks.mkdir()
    hub = start_worker(tmp_path, "--listen", "127.0.0.1:0", "--gpu", "off", env={"PYTHONPATH": str(hooks)})
    try:
        with remote_magic.connect(hub.token) as client:
            hook = hooks / "sitecustomize.py"
            hook.write_text("import os; os._exit(7)")  # every executor started from now on exits at once
            # The spare started with the worker takes this notebook's job; the one started then can't start.
            assert client.run("x = 1") == {"x": 1}
            with remote_magic.connect(hub.token) as other:  # a new session needs a new executor
                with pytest.raises(ExecutorDied, match="exited with status 7 while starting, so this job did not run"):
                    other.submit(int, "1").result(timeout=60)
                hook.unlink()
                assert other.submit(int, "2").result(timeout=120) == 2
    finally:
        hub.stop()


def _error_of(call) -> BaseException | None:
    try:
        call()
    except BaseException as exc:  # the test inspects whatever it raised
        return exc
    return None


def test_a_vanished_clients_job_runs_on_until_a_client_with_its_token_stops_it(shared_fleet, tmp_path: Path) -> None:
    hub, _ = shared_fleet
    script = tmp_path / "vanishing_client.py"
    script.write_text(textwrap.dedent(f"""
        import remote_magic, sys
        client = remote_magic.connect({hub.token!r})
        client.execute("import time\\nprint('busy', flush=True)\\ntime.sleep(60)", worker="home",
                       on_stream=lambda h: print(h["text"], flush=True))
    """))
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert "busy" in process.stdout.readline()
    with remote_magic.connect(hub.token) as client:
        home = lambda: next(w for w in client.workers() if w["name"] == "home")  # noqa: E731
        assert home()["state"] == "busy"
        process.kill()
        process.wait()
        wait_for(lambda: client.jobs(), 15, "the vanished client's job to wait for collection")
        assert home()["state"] == "busy" and client.jobs()[0]["state"] == "running"  # it runs on

        def interrupt(header: dict[str, str]) -> None:  # Ctrl-C once its output is shown again
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            client.attach(client.jobs()[0]["job"], on_stream=interrupt)
        wait_for(lambda: home()["state"] == "idle", 10, "the collected job to be stopped")
        assert client.run("x = 3", worker="home") == {"x": 3}


HOSTILE_SOCKETS = 8
HOSTILE_TRANSFERS = 50
HOSTILE_SLACK_BYTES = 100 << 20
"""The hub's memory under a hostile peer may grow past its bounds by at most this (issue 34's goal)."""


def _chunk(transfer: str, offset: int, sizes: list[int], data: bytes) -> list[bytes]:
    """A CHUNK of a large message that will never be finished."""
    return encode(T.CHUNK, {"transfer": transfer, "offset": offset, "sizes": sizes, "job": transfer}, [data])


def test_a_token_holder_starting_large_messages_it_never_finishes_is_bounded_and_answered(fleet) -> None:
    """Before: one token holder took the hub from 42 MB to 1.2 GB in 2 s, and chunks whose sizes changed
    raised IndexError, one traceback per message. Now a link may have 4 messages arriving at once, and all
    links together hold at most two of the largest messages the hub takes (1 MB here)."""
    hub, _ = fleet
    token = Token.decode(hub.token)
    process = psutil.Process(hub.process.pid)
    before = process.memory_info().rss
    context = zmq.Context()
    answers: list[str] = []
    try:
        sockets = [_raw_socket(context, token, token.public, token.secret) for _ in range(HOSTILE_SOCKETS)]
        for sock in sockets:
            _hello(sock, "client")
            assert _recv(sock).type is T.WELCOME
        sizes = [3, 6, 64, 900_000]  # almost 1 MB, the largest message the hub takes: each transfer one, begun
        for n in range(5):  # one link, five messages begun at once
            sockets[0].send_multipart(_chunk(f"few-{n}", 0, sizes, b"x" * 1000))
        sockets[0].send_multipart(_chunk("few-0", 1000, [3, 6, 64], b"x" * 10))  # its sizes changed midway
        piece = os.urandom(256 << 10)
        for n in range(HOSTILE_TRANSFERS):  # every link, many messages begun
            for i, sock in enumerate(sockets):
                sock.send_multipart(_chunk(f"t{i}-{n}", 0, sizes, piece))
        deadline = time.monotonic() + 30
        for sock in sockets:  # its answers, until a second passes with none (heartbeats aside)
            answered_at = time.monotonic()
            while time.monotonic() < min(deadline, answered_at + 1.0) and sock.poll(100):
                msg = decode(sock.recv_multipart())
                if msg.type is not T.HEARTBEAT:
                    answered_at = time.monotonic()
                if msg.type is T.ERROR:
                    answers.append(str(msg.header.get("message")))
        grown = process.memory_info().rss - before
    finally:
        context.destroy(linger=0)
    assert any("more than 4 large messages arriving at once" in a for a in answers), answers[:5]
    assert any("of large messages still arriving, its bound" in a for a in answers), answers[:5]
    assert any("frame sizes differ from those of its message's first chunk" in a for a in answers), answers[:5]
    assert grown < 2 * 10**6 + HOSTILE_SLACK_BYTES, f"the hub grew by {grown / 1e6:.0f} MB"
    assert "Traceback" not in hub.log() and "IndexError" not in hub.log()
    # Once they are gone (in the outage grace, 1 s here), they hold nothing: a large message arrives whole again.
    with remote_magic.connect(hub.token) as client:
        large = os.urandom(600_000)

        def arrives_whole() -> bool:
            try:
                return client.run("n = len(b)", {"b": large}) == {"n": 600_000}
            except remote_magic.ProtocolError as exc:
                assert "of large messages still arriving, its bound" in str(exc)
                return False

        wait_for(arrives_whole, 30, "the hostile peers' part-sent messages to be dropped with them")


def test_a_notebooks_jobs_waiting_for_a_worker_are_bounded_and_the_one_over_says_so(shared_fleet) -> None:
    """The hub keeps at most two of its largest messages (1 MB here) of one notebook's jobs waiting."""
    hub, _ = shared_fleet
    with remote_magic.connect(hub.token) as client:
        wait_for(lambda: len(client.workers()) == 2, 10, "both workers to join")
        busy = [client.submit(time.sleep, 60) for _ in range(2)]
        wait_for(lambda: all(w["state"] == "busy" for w in client.workers()), 10, "both workers to be busy")
        waiting = [client.submit(len, os.urandom(600_000)) for _ in range(3)]  # 1.8 MB waits
        with pytest.raises(remote_magic.Busy, match=r"the hub holds 3 of this notebook's jobs \(1.8 MB\) waiting "
                           r"for a worker, as many as it keeps for one notebook \(100,000 jobs, 2.0 MB\): this one "
                           "was not queued"):
            client.submit(len, os.urandom(600_000)).result(timeout=30)
        for future in busy:
            future.cancel()
        assert [future.result(timeout=30) for future in waiting] == [600_000] * 3  # the three that waited run


def test_oversized_frames_are_refused_and_the_hub_keeps_serving(shared_fleet) -> None:
    hub, _ = shared_fleet
    with remote_magic.connect(hub.token) as client:
        assert client.run("n = len(small)", {"small": b"x" * 1000}) == {"n": 1000}
        with pytest.raises(remote_magic.InputError, match="`blob` needs a 2.1 MB frame, over the hub's 1.0 MB"):
            client.run("n = len(blob)", {"blob": bytearray(2 * 2**20)})
    # A peer that ignores the limit: libzmq drops the frame (and the connection) before Python sees it.
    token = Token.decode(hub.token)
    context = zmq.Context()
    try:
        sock = _raw_socket(context, token, token.public, token.secret)
        _hello(sock, "client")
        assert _recv(sock).type is T.WELCOME
        sock.send_multipart(encode(T.SUBMIT, {"job": "big", "names": ["b"], "counts": [1]}, [bytes(2 * 2**20)]))
        assert set(_received_within(sock, 1.0)) <= {T.HEARTBEAT}  # no answer: the hub never saw the job
    finally:
        context.destroy(linger=0)
    with remote_magic.connect(hub.token) as client:
        assert client.run("n = 1") == {"n": 1}
        assert hub.process.poll() is None


@pytest.mark.parametrize("worker_name", ["home", "joiner"])  # the in-process worker and a joined one
def test_a_result_over_the_limit_fails_its_job_and_the_worker_serves_on(shared_fleet, worker_name: str) -> None:
    hub, _ = shared_fleet
    with remote_magic.connect(hub.token) as client:
        wait_for(lambda: len(client.workers()) == 2, 10, "both workers to join")
        with pytest.raises(remote_magic.OutputError) as info:  # before: the client waited forever
            client.run("big = bytearray(2 * 2**20)\nsmall = 1", worker=worker_name)
        assert "`big` needs a 2.1 MB frame, over the hub's 1.0 MB limit" in str(info.value)
        assert "--max-message-size" in str(info.value) and info.value.name == "big"
        assert client.run("after = 3", worker=worker_name) == {"after": 3}
        assert {w["name"]: w["state"] for w in client.workers()}[worker_name] == "idle"


def test_runaway_memory_kills_only_the_executor(tmp_path: Path) -> None:
    w = start_worker(tmp_path, "--listen", "127.0.0.1:0", "--gpu", "off", "--max-memory", "300M")
    try:
        with remote_magic.connect(w.token) as client:
            with pytest.raises(ExecutorDied, match="over the 300.0 MB limit"):
                client.run("import numpy as np\nblocks = []\nfor _ in range(200):\n"
                           "    blocks.append(np.ones(2**22))\n")
            assert client.run("fine = True") == {"fine": True}
            # Memory a job's child process uses counts too (before: only the executor's own).
            with pytest.raises(ExecutorDied, match="over the 300.0 MB limit"):
                client.run("import subprocess, sys\nsubprocess.run([sys.executable, '-c', "
                           "'import time; block = bytearray(600_000_000); time.sleep(60)'])")
            assert client.run("fine = True") == {"fine": True}
    finally:
        w.stop()


def test_processes_a_job_started_end_with_its_executor(client: remote_magic.Client, tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    with pytest.raises(ExecutorDied, match="exited with status 3"):
        client.run("import os, subprocess\nchild = subprocess.Popen(['sleep', '300'])\n"
                   "open(path, 'w').write(str(child.pid))\nos._exit(3)", {"path": str(pid_file)})
    pid = int(pid_file.read_text())

    def ended() -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_for(ended, 10, f"the job's child process {pid} to end with its executor")  # before: it ran on
    assert client.run("fine = True") == {"fine": True}


def test_handshakes_without_the_hubs_public_key_never_count_towards_a_block(tmp_path: Path) -> None:
    from remote_magic.hub.authenticator import MAX_FAILED_HANDSHAKES

    w = start_worker(tmp_path, "--listen", "127.0.0.1:0", "--gpu", "off")
    context = zmq.Context()
    try:
        address = Token.decode(w.token).address
        for _ in range(MAX_FAILED_HANDSHAKES + 5):  # a port scanner: it has no token, so no hub key
            sock = context.socket(zmq.DEALER)
            sock.linger = 0
            sock.curve_serverkey = zmq.curve_keypair()[0]
            sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
            monitor = sock.get_monitor_socket()
            sock.connect(address)
            wait_for(lambda: monitor.poll(0) and recv_monitor_message(monitor)["event"]
                     == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 5, "the handshake to fail")
            sock.disable_monitor()
            monitor.close()
            sock.close()
        with remote_magic.connect(w.token, timeout=5) as client:
            assert client.run("still = 'open'") == {"still": "open"}
        assert "refused a CURVE handshake" not in w.log() and "blocking" not in w.log()
    finally:
        context.destroy(linger=0)
        w.stop()


def test_an_address_with_many_failed_handshakes_is_blocked(tmp_path: Path) -> None:
    from remote_magic.hub.authenticator import MAX_FAILED_HANDSHAKES

    w = start_worker(tmp_path, "--listen", "127.0.0.1:0", "--gpu", "off")
    try:
        real = Token.decode(w.token)
        for _ in range(MAX_FAILED_HANDSHAKES):
            stranger = Token(real.role, real.address, real.server_public, *zmq.curve_keypair())
            with pytest.raises(remote_magic.ConnectionFailed, match="refused these credentials"):
                remote_magic.connect(stranger.encode(), timeout=5)
        # 127.0.0.1 is now blocked for a while: even the real token is refused there.
        with pytest.raises(remote_magic.ConnectionFailed, match="refused"):
            remote_magic.connect(w.token, timeout=5)
        assert "blocking 127.0.0.1" in w.log() and w.process.poll() is None
    finally:
        w.stop()


def test_after_a_rotation_a_stale_worker_is_told_the_worker_command(fleet) -> None:
    hub, joiner = fleet
    subprocess.run(["remote-worker", "token", "--rotate"], capture_output=True, text=True, check=True,
                   env={**os.environ, "REMOTE_MAGIC_HOME": str(hub.home)})
    wait_for(lambda: "rotated" in joiner.log(), 15, "the joined worker to hear of the rotation")
    line = next(line for line in joiner.log().splitlines() if "rotated" in line)
    assert "`remote-worker token --worker` on the hub's machine" in line  # before: `remote-worker token`
    assert "reconnecting" not in line
