"""The client API against a real remote-worker: results, streams, errors, interrupts, crashes."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest

import remote_magic
from remote_magic import (
    ConnectionFailed,
    ExecutorDied,
    GpuError,
    InputError,
    JobCancelled,
    JobTimeout,
    NoSuchWorker,
    OutputError,
    RemoteError,
    TokenError,
)
from remote_magic.errors import Busy, NotConnected, WorkerLost
from support import WorkerProcess, free_port, start_worker, wait_for


def test_run_returns_assigned_names_and_arrays(client: remote_magic.Client) -> None:
    a = np.random.default_rng(0).standard_normal((64, 32))
    b = np.random.default_rng(1).standard_normal((32, 16))
    out = client.run("import numpy as np\nc = a @ b\nn = c.shape[0]\nnothing = None", {"a": a, "b": b})
    assert set(out) == {"np", "c", "n", "nothing"} and out["nothing"] is None
    np.testing.assert_allclose(out["c"], a @ b)
    assert out["n"] == 64
    assert out["c"].flags.writeable  # arrays from out-of-band frames can be changed in place


def test_run_returns_only_requested_outputs(client: remote_magic.Client) -> None:
    assert client.run("x = 1\ny = x + 1", outputs=["y"]) == {"y": 2}
    with pytest.raises(OutputError, match="did not assign z"):
        client.run("x = 1", outputs=["z"])


def test_stdout_streams_while_the_job_runs(client: remote_magic.Client, tmp_path: Path) -> None:
    """The job prints, then waits for a file that the test creates only after seeing the text."""
    release = tmp_path / "release"
    seen = threading.Event()
    texts: list[str] = []

    def on_stream(header: dict) -> None:
        texts.append(header["text"])
        if "waiting" in header["text"]:
            seen.set()
            release.touch()

    code = (
        "import os, sys, time\n"
        "print('waiting'); sys.stderr.write('on stderr\\n')\n"
        "deadline = time.monotonic() + 20\n"
        "while not os.path.exists(path) and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        "released = os.path.exists(path)\n"
    )
    result = client.execute(code, {"path": str(release)}, ["released"], on_stream=on_stream)
    assert seen.is_set()
    assert result.values == {"released": True}  # only true if the text arrived before the job ended
    assert "on stderr\n" in "".join(texts)


def test_remote_exception_raises_with_remote_traceback(client: remote_magic.Client) -> None:
    with pytest.raises(RemoteError) as info:
        client.run("def f(x):\n    return x['missing']\nf({})")
    err = info.value
    assert err.remote_type == "KeyError"
    assert isinstance(err, KeyError) and str(err) == str(KeyError("missing")) == "'missing'"  # as locally
    assert "line 2, in f" in err.remote_traceback
    assert "return x['missing']" in err.remote_traceback
    assert "executor.py" not in err.remote_traceback  # only the user's frames


def test_submit_returns_a_future(client: remote_magic.Client) -> None:
    def scale(x: np.ndarray, factor: float = 1.0) -> np.ndarray:
        return x * factor

    future = client.submit(scale, np.arange(5.0), factor=3.0)
    np.testing.assert_array_equal(future.result(timeout=30), np.arange(5.0) * 3.0)
    failing = client.submit(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError, match="^division by zero$"):
        failing.result(timeout=30)


def test_workers_lists_the_worker(client: remote_magic.Client) -> None:
    [info] = [w for w in client.workers() if w["name"] == "shared"]
    assert info["hostname"] and info["platform"] and info["python"]
    assert info["cpu_count"] >= 1 and info["memory_bytes"] > 2**20
    assert info["state"] in ("idle", "busy")
    assert info["versions"]["protocol"] == "RM3"
    before = info["jobs_done"]
    client.run("pass")
    [after] = [w for w in client.workers() if w["name"] == "shared"]
    assert after["jobs_done"] == before + 1


def test_input_that_cannot_be_pickled_names_the_variable(client: remote_magic.Client) -> None:
    with pytest.raises(InputError, match="`lock`") as info:
        client.run("x = 1", {"lock": threading.Lock()})
    assert info.value.name == "lock"
    assert client.run("x = 1") == {"x": 1}


FLUSHED_LINES = 20_000


def test_many_flushed_lines_travel_together_in_order_and_each_stream_keeps_its_place(
        client: remote_magic.Client) -> None:
    """Before: each flushed line was a message of its own, 20,000 lines 20,000 messages (issue 34)."""
    streams: list[tuple[str, str]] = []
    code = ("import sys\n"
            "for i in range(n):\n"
            "    print(f'line {i}', flush=True)\n"
            "sys.stderr.write('between\\n'); sys.stderr.flush()\n"
            "print('after', flush=True)\n")
    received = client.bytes_received
    client.execute(code, {"n": FLUSHED_LINES}, [], on_stream=lambda h: streams.append((h["name"], h["text"])))
    received = client.bytes_received - received
    text = "".join(f"line {i}\n" for i in range(FLUSHED_LINES))
    assert streams[-2:] == [("stderr", "between\n"), ("stdout", "after\n")]  # the order the job wrote in
    assert "".join(t for _, t in streams[:-2]) == text and {n for n, _ in streams[:-2]} == {"stdout"}
    assert len(streams) < FLUSHED_LINES / 20, len(streams)
    assert received <= 1.5 * len(text), f"{received} bytes crossed for {len(text)} bytes of text"


def test_output_that_cannot_come_back_names_the_variable(client: remote_magic.Client, caplog) -> None:
    with pytest.raises(OutputError, match="`gen`") as info:  # asked for by name: it must come, or fail
        client.run("gen = (i for i in range(3))\nok = 1", outputs=["gen", "ok"])
    assert info.value.name == "gen"
    # Every name the code binds: the rest still comes, and what stayed on the worker is named.
    assert client.run("gen = (i for i in range(3))\nok = 1") == {"ok": 1}
    assert "left on the worker: `gen` (generator: a generator, which can't be pickled" in caplog.text


def test_timeout_stops_the_job(client: remote_magic.Client) -> None:
    started = time.monotonic()
    with pytest.raises(JobTimeout, match="1 s timeout"):
        client.run("import time\ntime.sleep(60)", timeout=1)
    assert time.monotonic() - started < 10
    assert client.run("y = 2") == {"y": 2}


def test_unknown_worker_is_refused_with_the_known_names(client: remote_magic.Client) -> None:
    with pytest.raises(NoSuchWorker, match="'nope'.*shared"):
        client.run("pass", worker="nope")


def test_ctrl_c_stops_the_remote_job_quickly(client: remote_magic.Client) -> None:
    """A real SIGINT to this process while run() waits: the remote sleep(60) stops."""
    interrupted_at: list[float] = []

    def on_stream(header: dict) -> None:
        if "sleeping" in header["text"]:
            interrupted_at.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        client.execute("import time\nprint('sleeping', flush=True)\ntime.sleep(60)", on_stream=on_stream)
    assert interrupted_at and time.monotonic() - interrupted_at[0] < 2.0
    assert client.run("after = 'ok'") == {"after": "ok"}


def _kill_when_pid_printed(sig: int):
    def on_stream(header: dict) -> None:
        for word in header["text"].split():
            if word.startswith("pid="):
                os.kill(int(word[4:]), sig)
    return on_stream


def test_sigkill_of_the_executor_fails_the_job_and_the_next_job_runs(client: remote_magic.Client) -> None:
    started = time.monotonic()
    with pytest.raises(ExecutorDied, match="SIGKILL") as info:
        client.execute("import os, time\nprint(f'pid={os.getpid()}', flush=True)\ntime.sleep(60)",
                       on_stream=_kill_when_pid_printed(signal.SIGKILL))
    assert time.monotonic() - started < 5
    assert "fresh process" in str(info.value)
    assert client.run("import os\npid = os.getpid()")["pid"] > 0


@pytest.mark.parametrize("code, reason", [
    ("import ctypes\nctypes.string_at(0)", "SIGSEGV"),
    ("import os\nos._exit(3)", "exited with status 3"),
])
def test_crashing_user_code_kills_only_the_executor(client: remote_magic.Client, code: str, reason: str) -> None:
    with pytest.raises(ExecutorDied, match=reason):
        client.run(code)
    assert client.run("v = 41 + 1") == {"v": 42}


def test_connect_to_nothing_fails_within_its_timeout(worker) -> None:
    token = remote_magic.wire.tokens.Token.decode(worker.token).with_address("tcp://127.0.0.1:9")
    started = time.monotonic()
    with pytest.raises(ConnectionFailed, match="nothing answered at tcp://127.0.0.1:9 within 1 s"):
        remote_magic.connect(token.encode(), timeout=1)
    assert time.monotonic() - started < 3


def test_wrong_credentials_are_refused(worker) -> None:
    import zmq

    real = remote_magic.wire.tokens.Token.decode(worker.token)
    stranger = remote_magic.wire.tokens.Token(real.role, real.address, real.server_public, *zmq.curve_keypair())
    with pytest.raises(ConnectionFailed, match="refused these credentials"):
        remote_magic.connect(stranger.encode(), timeout=5)
    wrong_server = remote_magic.wire.tokens.Token(real.role, real.address, zmq.curve_keypair()[0], real.public,
                                                  real.secret)
    with pytest.raises(ConnectionFailed, match="doesn't match that hub"):
        remote_magic.connect(wrong_server.encode(), timeout=2)


@pytest.mark.parametrize("text, message", [
    ("", "no token"),
    ("hello", "not a remote-magic token"),
    ("rmc1.abc", "truncated"),
    ("rmc1.!!!!", "damaged"),
])
def test_malformed_tokens_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(TokenError, match=message):
        remote_magic.connect(text, timeout=1)


def test_an_interrupted_import_gets_a_fresh_executor(client: remote_magic.Client, tmp_path: Path) -> None:
    """An extension module whose import was cut short can't be imported again in that process."""
    (tmp_path / "slow_to_import.py").write_text("import time\nprint('importing', flush=True)\ntime.sleep(60)\n")
    before = client.run("import os\npid = os.getpid()")["pid"]

    def interrupt_while_importing(header: dict) -> None:
        if "importing" in header["text"]:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        client.execute(f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\nimport slow_to_import",
                       on_stream=interrupt_while_importing)
    after = client.run("import os, numpy\npid = os.getpid()")["pid"]
    assert after != before


def test_gpu_on_a_worker_with_the_gpu_off_says_how_to_turn_it_on(client: remote_magic.Client) -> None:
    with pytest.raises(GpuError, match=r"gpu\.matmul: this worker runs with --gpu off.*--gpu auto or on"):
        client.run("y = gpu.matmul(a, a)", {"a": np.eye(2)})
    assert client.run("y = repr(gpu)")["y"].startswith("<gpu: this worker runs with --gpu off")


def test_matplotlib_objects_a_script_assigns_are_named_as_left_on_the_worker(
        client: remote_magic.Client, caplog: pytest.LogCaptureFixture) -> None:
    shown: list[dict] = []
    result = client.execute("import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
                            "fig, ax = plt.subplots()\nsize = list(fig.get_size_inches())", on_display=shown.append)
    assert {name: (handle.kind, handle.worker) for name, handle in result.kept_on_worker.items()} == {
        "fig": ("Figure", result.worker), "ax": ("Axes", result.worker)} and result.values == {
        "matplotlib": result.values["matplotlib"], "plt": result.values["plt"], "size": [6.4, 4.8]}
    assert shown == []  # as in a Jupyter kernel, where matplotlib.use('Agg') leaves the inline backend: no figure
    with caplog.at_level("WARNING", logger="remote_magic.client"):
        client.run("import matplotlib.pyplot as plt\nfig = plt.figure()")
    assert "left on the worker: `fig` (Figure: it holds a matplotlib Figure" in caplog.text


def test_close_ends_pending_futures_with_job_cancelled(tmp_path: Path) -> None:
    # A worker of its own: the job runs on, detached, after the client closes, and would hold up the next test's.
    hub = start_worker(tmp_path, "--listen", "127.0.0.1:0", "--gpu", "off")
    try:
        client = remote_magic.connect(hub.token, timeout=10)
        future = client.submit(time.sleep, 30)
        started = time.monotonic()
        client.close()
        assert time.monotonic() - started < 1
        with pytest.raises(JobCancelled, match="the client was closed before the job finished"):
            future.result(timeout=1)  # before: pending forever
    finally:
        hub.stop()


def test_a_job_sent_to_a_restarted_hub_ends_instead_of_waiting(tmp_path: Path) -> None:
    port = free_port()
    home = tmp_path / "home"
    first = start_worker(tmp_path / "first", "--listen", f"127.0.0.1:{port}", "--gpu", "off",
                         "--heartbeat-interval", "5", home=home)
    with remote_magic.connect(first.token, timeout=10) as client:
        assert client.run("x = 1") == {"x": 1}
        first.process.kill()
        first.process.wait()
        second = start_worker(tmp_path / "second", "--listen", f"127.0.0.1:{port}", "--gpu", "off",
                              "--heartbeat-interval", "5", home=home)
        try:
            outcome: list[object] = []
            runner = threading.Thread(target=lambda: outcome.append(_result_or_error(client, "y = 2")),
                                      daemon=True)
            runner.start()
            runner.join(15)
            assert outcome, "the job sent to the restarted hub never ended"  # before: it waited forever
            assert outcome[0] == {"y": 2} or isinstance(outcome[0], (NotConnected, ConnectionFailed)), outcome
            if isinstance(outcome[0], NotConnected):  # the hub's answer to the job
                assert "has no record of this job" in str(outcome[0]) and "Run it again" in str(outcome[0])
            if isinstance(outcome[0], ConnectionFailed):  # the hub's answer to another message came first
                assert str(outcome[0]).startswith("the hub forgot this connection") and "run it again" in str(
                    outcome[0])
            wait_for(lambda: _result_or_error(client, "z = 3") == {"z": 3}, 15, "the client to be known again")
        finally:
            second.stop()


def _result_or_error(client: remote_magic.Client, code: str) -> object:
    try:
        return client.run(code)
    except remote_magic.RemoteMagicError as exc:
        return exc


def test_outputs_and_errors_over_a_headers_size_travel_or_say_what_was_cut(client: remote_magic.Client) -> None:
    printed: list[str] = []
    result = client.execute("print('x' * 2_000_000)\nafter = 1",
                            on_stream=lambda header: printed.append(header["text"]))
    assert "".join(printed) == "x" * 2_000_000 + "\n" and result.values == {"after": 1}  # before: lost
    with pytest.raises(RemoteError) as info:
        client.run("raise ValueError('e' * 1_200_000)")  # before: the cell hung
    assert "characters cut" in str(info.value) and str(info.value).startswith("eee")
    shown: list[dict[str, object]] = []
    client.execute("display({'text/plain': 'p' * 2_000_000}, raw=True)", on_display=shown.append)
    assert [header["data"] for header in shown] == [{"text/plain": "p" * 2_000_000}]  # its part came as a frame
    with pytest.raises(InputError, match=r"the cell's source is 1\.2 MB, over the 1\.0 MB"):
        client.run("big = '" + "a" * 1_200_000 + "'")  # before: the cell hung
    assert client.run("fine = True") == {"fine": True}


def test_a_burst_of_submits_waits_for_room_and_loses_nothing(client: remote_magic.Client) -> None:
    """Before: the connection dropped what its full queue couldn't take (about half of such a burst)."""
    block = np.ones(50_000)  # 400 KB each: the queue to the hub fills long before the burst ends
    futures = [client.submit(len, block) for _ in range(2500)]
    done, pending = concurrent.futures.wait(futures, timeout=120)
    assert not pending, f"{len(pending)} of {len(futures)} futures never ended"
    assert [f.result() for f in futures] == [50_000] * 2500


def test_with_a_send_timeout_a_full_link_raises_busy_and_what_was_sent_still_arrives(tmp_path: Path) -> None:
    # Heartbeats every 8 s: neither side takes the other for gone within 40 s, time for a busy machine to fill
    # the link (about 1,200 submits; with both cores busy 3 s took 1,060, at a load average of 12 12 s took 228)
    hub = start_worker(tmp_path, "--listen", "127.0.0.1:0", "--gpu", "off", "--heartbeat-interval", "8")
    try:
        with remote_magic.connect(hub.token, send_timeout=0.5) as client:
            block = bytes(64 * 1024)
            hub.process.send_signal(signal.SIGSTOP)  # the hub reads nothing: the link fills
            futures: list[concurrent.futures.Future[int]] = []
            busy = None
            deadline = time.monotonic() + 35  # within the heartbeat bound
            while busy is None and time.monotonic() < deadline:
                try:
                    futures.append(client.submit(len, block))
                except Busy as exc:
                    busy = exc
            hub.process.send_signal(signal.SIGCONT)
            assert busy is not None, f"all {len(futures)} submits found room"
            assert "the queue to the hub stayed full for 0.5 s" in str(busy) and "not sent" in str(busy)
            done, pending = concurrent.futures.wait(futures, timeout=120)
            assert not pending, f"{len(pending)} of {len(futures)} futures never ended"
            assert [f.result() for f in futures] == [len(block)] * len(futures)
    finally:
        hub.process.send_signal(signal.SIGCONT)
        hub.stop()


def test_a_job_in_flight_when_its_hub_shuts_down_ends_saying_so(tmp_path: Path) -> None:
    hub = start_worker(tmp_path, "--listen", "127.0.0.1:0", "--gpu", "off", "--name", "home")
    try:
        with remote_magic.connect(hub.token) as client:
            future = client.submit(time.sleep, 60)
            wait_for(lambda: client.workers()[0]["state"] == "busy", 10, "the job to start")
            hub.process.send_signal(signal.SIGTERM)
            # Before: "said goodbye", then "the hub stopped answering for 5 s", as if the network had failed.
            with pytest.raises(WorkerLost, match="^worker 'home' on .* shut down while running this job"):
                future.result(timeout=30)
            refused = wait_for(lambda: (lambda said: "the hub shut down, so nothing was sent" in said and said)(
                str(_result_or_error(client, "x = 1"))), 10, "the client to hear that the hub shut down")
            # With what to do next (before: "the hub shut down, so nothing was sent." and no more).
            assert "Start its remote-worker again, then run this again" in str(refused)
    finally:
        hub.stop()


@contextlib.contextmanager
def _hub_to_restart(tmp_path: Path) -> Iterator[tuple[WorkerProcess, Callable[[], WorkerProcess]]]:
    """A worker's hub on a fixed port, and what starts another one there with the same keys (a restart)."""
    port, home, started = free_port(), tmp_path / "home", []

    def start(name: str) -> WorkerProcess:
        started.append(start_worker(tmp_path / name, "--listen", f"127.0.0.1:{port}", "--gpu", "off", home=home))
        return started[-1]

    try:
        yield start("first"), lambda: start("second")
    finally:
        for worker in started:
            worker.stop()


def test_the_first_job_after_a_hub_restarts_on_its_port_runs(tmp_path: Path) -> None:
    with _hub_to_restart(tmp_path) as (first, restart), remote_magic.connect(first.token, timeout=10) as client:
        assert client.run("y = 1") == {"y": 1}
        first.process.send_signal(signal.SIGTERM)  # it says goodbye
        first.process.wait(30)
        wait_for(lambda: "the hub shut down, so nothing was sent" in str(_result_or_error(client, "x = 1")),
                 20, "the client to hear the goodbye")  # the case here: a restart it was told of
        restart()
        # Right after "ready": before, this failed with "the hub shut down, so nothing was sent".
        assert client.run("z = 3") == {"z": 3}


def test_a_job_in_flight_when_its_hub_restarts_ends_with_a_reason(tmp_path: Path) -> None:
    with _hub_to_restart(tmp_path) as (first, restart), remote_magic.connect(first.token, timeout=10) as client:
        future = client.submit(time.sleep, 60)
        wait_for(lambda: client.workers()[0]["state"] == "busy", 10, "the job to start")
        first.process.kill()
        first.process.wait()
        restart()
        # Before: pending forever, the new hub knew nothing of it. The client collects it again once the new hub
        # welcomes it, and that hub has no record of it.
        with pytest.raises(ConnectionFailed, match="the hub forgot this connection .* no longer waits there: .*"
                                                   "the hub restarted .*Run it again"):
            future.result(timeout=20)
        wait_for(lambda: _result_or_error(client, "z = 3") == {"z": 3}, 15, "the client to be known again")
