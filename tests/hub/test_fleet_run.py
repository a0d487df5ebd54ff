"""Jobs on several workers: run on all (labelled output, {worker: value}, failures listed), map in
chunks, scatter/gather, and retries when a worker is lost. Real hub, real joined worker processes."""

from __future__ import annotations

import os
import signal
import textwrap
import threading
from pathlib import Path
from typing import Iterator

import psutil
import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

import remote_magic
from remote_magic import FleetError, RemoteError, RemoteValue, WorkerLost
from support import WorkerProcess, connected_shell, join_worker, run, start_worker, wait_for

NAMES = ["home", "joiner", "third"]


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[WorkerProcess]]:
    """A hub with worker 'home', and workers 'joiner' and 'third' that joined it (shared: nothing here breaks them)."""
    tmp = tmp_path_factory.mktemp("three")
    hub = start_worker(tmp / "home", "--listen", "127.0.0.1:0", "--gpu", "off", "--name", "home",
                       "--heartbeat-interval", "0.2", "--outage-grace", "1")
    others = [join_worker(hub, tmp / name, name) for name in NAMES[1:]]
    yield [hub, *others]
    for worker in [*others, hub]:
        worker.stop()


@pytest.fixture
def fleet_client(three: list[WorkerProcess]) -> Iterator[remote_magic.Client]:
    with remote_magic.connect(three[0].token) as client:
        wait_for(lambda: sorted(w["name"] for w in client.workers()) == sorted(NAMES), 30, "three workers")
        yield client


def test_a_cell_runs_on_every_worker_at_once_with_labelled_output(fleet_client: remote_magic.Client,
                                                                  tmp_path: Path) -> None:
    (tmp_path / "meet").mkdir()
    # Each waits until all three started: they finish only if they run at the same time.
    code = textwrap.dedent("""
        import os, socket, time
        open(os.path.join(folder, str(os.getpid())), 'w').close()
        deadline = time.monotonic() + 20
        while len(os.listdir(folder)) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        seen = len(os.listdir(folder))
        print('pid', os.getpid())
        seen * 10
    """)
    with capture_output() as out:
        results = fleet_client.execute_all(code, {"folder": str(tmp_path / "meet")})
    assert sorted(results) == sorted(NAMES)
    assert {name: result.values["seen"] for name, result in results.items()} == dict.fromkeys(NAMES, 3)
    assert {name: result.value for name, result in results.items()} == dict.fromkeys(NAMES, 30)
    for name, result in results.items():
        assert result.worker == name
        assert f"[stdout:{name}]\npid " in out.stdout


# Each worker process has its own REMOTE_MAGIC_HOME (tests/support.py), under a folder named after it.
WHERE = "import os\nwhere = os.environ['REMOTE_MAGIC_HOME']\n"


def test_one_worker_failing_cancels_nothing_and_the_error_says_which(fleet_client: remote_magic.Client) -> None:
    with pytest.raises(FleetError) as caught:
        fleet_client.execute_all(WHERE + "x = 1 / 0 if 'joiner' in where else len(where)", workers=NAMES)
    error = caught.value
    assert sorted(error.failures) == ["joiner"]
    assert isinstance(error.failures["joiner"], ZeroDivisionError)
    assert "failed on 1 of 3 workers: 'joiner': ZeroDivisionError: division by zero" in str(error)
    assert "The others' results came back ('home', 'third')" in str(error)
    assert sorted(error.results) == ["home", "third"]
    for name, result in error.results.items():
        assert f"/{name}/" in result.values["where"] and result.values["x"] == len(result.values["where"])


def test_a_subset_of_workers(fleet_client: remote_magic.Client) -> None:
    results = fleet_client.execute_all(WHERE + "x = where", workers=["third", "home"])
    assert sorted(results) == ["home", "third"]
    assert all(f"/{name}/" in result.values["x"] for name, result in results.items())


def test_map_gives_the_local_results_in_order_in_chunks(fleet_client: remote_magic.Client) -> None:
    def _square(x: int) -> int:  # defined here, so it travels by value: the workers can't import tests
        return x * x

    items = list(range(100))
    assert fleet_client.map(_square, items) == [x * x for x in items]
    assert fleet_client.map(_square, items, chunksize=7) == [x * x for x in items]
    assert fleet_client.map(lambda s: s.upper(), iter("abc"), chunksize=1) == ["A", "B", "C"]
    assert fleet_client.map(_square, []) == []
    # Each chunk is one job: with chunks of 25 the workers run 4 jobs in all.
    before = sum(w["jobs_done"] for w in fleet_client.workers())
    pids = fleet_client.map(lambda _: os.getpid(), range(100), chunksize=25)
    assert sum(w["jobs_done"] for w in fleet_client.workers()) - before == 4
    assert all(len(set(pids[i:i + 25])) == 1 for i in range(0, 100, 25))
    assert fleet_client.map(_square, range(10), workers=["joiner"]) == [x * x for x in range(10)]


def test_map_raises_naming_the_item(fleet_client: remote_magic.Client) -> None:
    def _fails_on_13(x: int) -> int:
        if x == 13:
            raise KeyError(f"no {x}")
        return x

    with pytest.raises(RemoteError, match=r"map: item 13 \(13\): KeyError") as caught:
        fleet_client.map(_fails_on_13, range(40), chunksize=5)
    assert isinstance(caught.value, KeyError)
    assert "item 13" in caught.value.remote_traceback and "_fails_on_13" in caught.value.remote_traceback


def test_scatter_keeps_values_on_the_workers_and_gather_brings_them_back(fleet_client: remote_magic.Client) -> None:
    data = [{"n": i} for i in range(5)]
    handles = fleet_client.scatter(data)
    assert all(isinstance(h, RemoteValue) for h in handles)
    assert [h.worker for h in handles] == [NAMES[i % 3] for i in range(5)]  # in turn
    # On the worker, a call that receives a handle gets the object there, in place.
    assert fleet_client.submit(lambda d: d.setdefault("seen", True) and d["n"], handles[1]).result(30) == 1
    assert fleet_client.gather(handles) == [{"n": 0}, {"n": 1, "seen": True}, *data[2:]]
    result = fleet_client.execute("m = d['n'] * 2", {"d": handles[4]}, worker=handles[4].worker)
    assert result.values == {"m": 8}
    only = fleet_client.scatter([1, 2], workers=["third"])
    assert [h.worker for h in only] == ["third", "third"] and fleet_client.gather(only) == [1, 2]


@pytest.fixture
def fresh_fleet(tmp_path: Path) -> Iterator[dict[str, WorkerProcess]]:
    """A hub 'home' that runs no jobs' victim, and two joined workers that may be killed."""
    hub = start_worker(tmp_path / "hub", "--listen", "127.0.0.1:0", "--gpu", "off", "--name", "home",
                       "--heartbeat-interval", "0.2", "--outage-grace", "1")
    workers = {"home": hub, **{name: join_worker(hub, tmp_path / name, name) for name in ("one", "two")}}
    yield workers
    for worker in workers.values():
        worker.stop()


RAN = "import os, time\nopen(os.path.join(folder, f'ran-{os.getpid()}'), 'w').close()\ntime.sleep(3)\nok = 1"
"""A cell that leaves a file named after its executor's pid, then runs long enough to be killed."""


def _kill_the_runner(workers: dict[str, WorkerProcess], folder: Path) -> str:
    """Once a worker runs RAN (its file is there), SIGKILL that worker process; its name."""
    ran = wait_for(lambda: list(folder.glob("ran-*")), 30, "the cell to start")
    pid = int(ran[0].name.split("-")[1])  # type: ignore[index]
    name = next(name for name, worker in workers.items()
                if pid in [child.pid for child in psutil.Process(worker.process.pid).children(recursive=True)])
    assert name != "home", "the cell ran on the hub's own worker, which was meant to be busy"
    workers[name].process.send_signal(signal.SIGKILL)
    return name


def _busy_home(client: remote_magic.Client) -> threading.Thread:
    """Keep 'home' (the hub's worker, not to be killed) busy for a while, so cells start on the others."""
    thread = threading.Thread(target=client.run, args=("import time\ntime.sleep(2)",), kwargs={"worker": "home"},
                              daemon=True)
    thread.start()
    wait_for(lambda: any(w["name"] == "home" and w["state"] == "busy" for w in client.workers()), 10,
             "'home' to be busy")
    return thread


def test_a_job_whose_worker_is_lost_is_retried_elsewhere_when_allowed(
        fresh_fleet: dict[str, WorkerProcess], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with remote_magic.connect(fresh_fleet["home"].token) as client:
        wait_for(lambda: len(client.workers()) == 3, 30, "three workers")
        home = _busy_home(client)
        notices: list[str] = []
        lost: list[str] = []
        killer = threading.Thread(target=lambda: lost.append(_kill_the_runner(fresh_fleet, tmp_path)), daemon=True)
        killer.start()
        with caplog.at_level("WARNING", logger="remote_magic.fleet_jobs"):
            result = client.execute(RAN, {"folder": str(tmp_path)}, retries=1, on_retry=notices.append)
        killer.join(10)
        home.join(30)
        assert result.values["ok"] == 1 and result.worker != lost[0]
        assert len(list(tmp_path.glob("ran-*"))) == 2  # the lost attempt started, the retry finished
        assert len(notices) == 1 and f"was lost with worker {lost[0]!r} (attempt 1 of 2)" in notices[0]
        assert notices[0] in caplog.text


def test_without_retries_a_lost_job_fails_and_never_runs_twice(
        fresh_fleet: dict[str, WorkerProcess], tmp_path: Path) -> None:
    with remote_magic.connect(fresh_fleet["home"].token) as client:
        wait_for(lambda: len(client.workers()) == 3, 30, "three workers")
        home = _busy_home(client)
        lost: list[str] = []
        killer = threading.Thread(target=lambda: lost.append(_kill_the_runner(fresh_fleet, tmp_path)), daemon=True)
        killer.start()
        with pytest.raises(WorkerLost) as caught:
            client.execute(RAN, {"folder": str(tmp_path)})
        killer.join(10)
        home.join(30)
        assert f"worker {lost[0]!r}" in str(caught.value) and caught.value.attempts == ()
        assert client.run("after = 1") == {"after": 1}  # the fleet serves on
        assert len(list(tmp_path.glob("ran-*"))) == 1  # it ran once, and only once


@pytest.fixture
def fleet_shell(three: list[WorkerProcess]) -> Iterator[InteractiveShell]:
    """A real IPython shell with the extension loaded, connected to the three workers' hub."""
    with connected_shell(three[0].token) as (shell, printed):
        assert all(name in printed for name in NAMES)
        yield shell


def test_offload_all_labels_output_and_names_come_back_per_worker(fleet_shell: InteractiveShell) -> None:
    fleet_shell.user_ns["base"] = 10
    result, out = run(fleet_shell, "%%offload --all\n" + WHERE + "print('hello from', where)\nbase + len(where)")
    assert result.success, result.error_in_exec
    where = fleet_shell.user_ns["where"]
    assert sorted(where) == sorted(NAMES) and all(f"/{name}/" in where[name] for name in NAMES)
    assert result.result == {name: 10 + len(where[name]) for name in NAMES}
    for name in NAMES:
        assert f"[stdout:{name}]\nhello from {where[name]}\n" in out.stdout


def test_offload_on_some_workers_keeps_what_the_others_did_and_says_which_failed(
        fleet_shell: InteractiveShell) -> None:
    result, out = run(fleet_shell, "%%offload --workers home,joiner\n" + WHERE.replace("where", "place")
                      + "done = 1\nfailed = 1 / 0 if 'joiner' in place else 2")
    assert isinstance(result.error_in_exec, FleetError)
    assert "failed on 1 of 2 workers: 'joiner': ZeroDivisionError" in str(result.error_in_exec)
    assert fleet_shell.user_ns["done"] == {"home": 1, "joiner": 1}  # the failed cell's changes stay, as locally
    assert fleet_shell.user_ns["failed"] == {"home": 2}
    assert "third" not in fleet_shell.user_ns["place"]


def test_offload_options_that_contradict_are_usage_errors(fleet_shell: InteractiveShell) -> None:
    for line, why in (("--all --workers home", "use one of them"), ("--all --worker home", "use one of them"),
                      ("--all --retries 1", "each copy belongs to its worker"), ("--retries -1", "0 or more"),
                      ("--all --require cpus>=1", "pick one worker"), ("--workers home --prefer fastest",
                                                                       "pick one worker")):
        result, out = run(fleet_shell, f"%%offload {line}\nx = 1")
        assert not result.success and "x" not in fleet_shell.user_ns, line
        assert why in str(result.error_in_exec), (line, result.error_in_exec)
    result, out = run(fleet_shell, "%%offload --retries 1 --worker third\nx = 3")
    assert result.success and fleet_shell.user_ns["x"] == 3
