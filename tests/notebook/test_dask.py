"""Offloaded cells on a Dask cluster: a real Dask scheduler and 2 worker processes (distributed.LocalCluster,
on 127.0.0.1 only, no dashboard), reached with ``remote_magic.connect("dask://...")`` and with
``%offload_connect dask://...`` in a real IPython shell."""

from __future__ import annotations

import base64
import os
import threading
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
from dask_cluster import dask_address as dask_address_of, local_cluster
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import remote_magic
from remote_magic import DaskError, FleetError, RemoteError
from remote_magic.dask_client import DaskClient
from support import connected_shell, run, wait_for


@pytest.fixture(scope="module")
def dask_address() -> Iterator[str]:
    """A Dask scheduler with 2 worker processes; ``dask://HOST:PORT``."""
    cluster = local_cluster(2)
    try:
        yield dask_address_of(cluster)
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def dask_client(dask_address: str) -> Iterator[DaskClient]:
    client = remote_magic.connect(dask_address)
    assert isinstance(client, DaskClient)
    with client:
        client.dask.wait_for_workers(2, timeout=60)
        yield client


@pytest.fixture(autouse=True)
def both_workers_up(dask_client: DaskClient) -> None:
    """Each test starts with both workers: on a loaded machine one may miss its heartbeats and be restarted."""
    dask_client.dask.wait_for_workers(2, timeout=60)


@pytest.fixture
def dask_shell(dask_address: str, dask_client: DaskClient) -> Iterator[InteractiveShell]:
    with connected_shell(dask_address) as (shell, printed):
        assert f"Connected to {dask_address} — Dask workers: 0, 1" in printed
        yield shell


def _worker_pids(client: DaskClient) -> set[int]:
    return set(client.dask.run(os.getpid).values())


def test_a_cell_runs_on_a_dask_worker_and_what_it_changed_comes_back(dask_shell: InteractiveShell,
                                                                     dask_client: DaskClient) -> None:
    ns = dask_shell.user_ns
    ns.update(L=[3, 1, 2], a=np.arange(5.0), gone=1, big=np.zeros(300_000))  # big: 2.4 MB, scattered first
    ns["same"], array, big = ns["L"], ns["a"], ns["big"]
    result, out = run(dask_shell, "%%offload\nimport os\nL.sort()\na *= 2\ntotal = float(a.sum())\ndel gone\n"
                                  "big[:3] = 7\npid = os.getpid()\nprint('on dask', pid)\ntotal + 1")
    assert result.success, result.error_in_exec
    assert ns["L"] == [1, 2, 3] and ns["same"] is ns["L"]  # changed in place, identity kept
    assert ns["a"] is array and array.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert ns["big"] is big and big[:4].tolist() == [7.0, 7.0, 7.0, 0.0] and big.sum() == 21.0
    assert ns["total"] == 20.0 and result.result == 21.0
    assert "gone" not in ns
    assert ns["pid"] in _worker_pids(dask_client) and ns["pid"] != os.getpid()
    assert f"on dask {ns['pid']}" in out.stdout


def test_stdout_streams_while_the_cell_runs(dask_client: DaskClient, tmp_path: Path) -> None:
    flag = tmp_path / "go"
    seen: list[str] = []
    outcome: dict[str, Any] = {}
    # The cell waits for a file the test makes only once it has seen the cell's first line.
    # Without streaming the line would arrive with the result, after the cell's 60 s: the 20 s wait fails first.
    code = ("import os, time\nprint('waiting for the flag', flush=True)\ndeadline = time.monotonic() + 60\n"
            "while not os.path.exists(flag) and time.monotonic() < deadline:\n    time.sleep(0.01)\n"
            "saw = os.path.exists(flag)\nprint('after the flag')")

    def cell() -> None:
        outcome["result"] = dask_client.execute(code, {"flag": str(flag)},
                                                on_stream=lambda header: seen.append(str(header["text"])))

    thread = threading.Thread(target=cell)
    thread.start()
    wait_for(lambda: "waiting for the flag" in "".join(seen), 20, "the cell's first line")
    assert "after the flag" not in "".join(seen)
    flag.touch()
    thread.join(60)
    assert outcome["result"].values["saw"] is True
    assert "".join(seen) == "waiting for the flag\nafter the flag\n"


def test_a_figure_is_shown_in_the_notebook(dask_shell: InteractiveShell) -> None:
    result, out = run(dask_shell, "%%offload\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()\n"
                                  "done = True")
    assert result.success, result.error_in_exec
    pngs = [o.data["image/png"] for o in out.outputs if "image/png" in o.data]
    assert len(pngs) == 1 and base64.b64decode(pngs[0]).startswith(b"\x89PNG")
    assert dask_shell.user_ns["done"] is True


def test_an_exception_arrives_as_its_type_with_the_traceback_and_partial_changes(
        dask_shell: InteractiveShell) -> None:
    dask_shell.user_ns["d"] = {}
    result, _ = run(dask_shell, "%%offload\nbefore = 5\nd['k'] = 1\nraise KeyError('missing on dask')\nafter = 6")
    error = result.error_in_exec
    assert isinstance(error, KeyError) and isinstance(error, RemoteError)
    assert "raise KeyError('missing on dask')" in error.remote_traceback
    assert dask_shell.user_ns["before"] == 5 and dask_shell.user_ns["d"] == {"k": 1}  # as after a local run
    assert "after" not in dask_shell.user_ns


def test_all_runs_on_every_dask_worker_with_labelled_output(dask_shell: InteractiveShell,
                                                            dask_client: DaskClient) -> None:
    result, out = run(dask_shell, "%%offload --all\nimport os\npid = os.getpid()\nprint('pid', pid)\npid")
    assert result.success, result.error_in_exec
    pids = dask_shell.user_ns["pid"]
    assert sorted(pids) == ["0", "1"] and set(pids.values()) == _worker_pids(dask_client)
    assert result.result == pids
    for name, pid in pids.items():
        assert f"[stdout:{name}]\npid {pid}\n" in out.stdout


def test_one_dask_worker_failing_is_listed_and_the_other_comes_back(dask_client: DaskClient) -> None:
    with pytest.raises(FleetError) as caught:
        dask_client.execute_all("x = 1 / 0 if w == '1' else 7", {"w": "?"}, inputs_for={"1": {"w": "1"}})
    assert sorted(caught.value.failures) == ["1"] and isinstance(caught.value.failures["1"], ZeroDivisionError)
    assert caught.value.results["0"].values["x"] == 7


def test_split_and_gather_concatenate_in_order(dask_shell: InteractiveShell) -> None:
    X = np.arange(22.0).reshape(11, 2)
    dask_shell.user_ns.update(X=X, w=np.array([1.0, 10.0]))
    result, _ = run(dask_shell, "%%offload --split X --gather Y\nY = X * w\nrows = len(X)")
    assert result.success, result.error_in_exec
    np.testing.assert_array_equal(dask_shell.user_ns["Y"], X * np.array([1.0, 10.0]))
    assert dask_shell.user_ns["rows"] == {"0": 6, "1": 5}


def test_map_keeps_input_order_and_names_a_failing_item(dask_client: DaskClient) -> None:
    def cube(x: int) -> int:  # defined here: it travels by value
        return x ** 3

    assert dask_client.map(cube, range(50), chunksize=3) == [x ** 3 for x in range(50)]
    assert dask_client.map(cube, range(50)) == [x ** 3 for x in range(50)]
    assert dask_client.map(str.upper, iter("abc"), chunksize=1) == ["A", "B", "C"]
    address = {w["name"]: w["address"] for w in dask_client.workers()}["1"]
    pid_of_1 = dask_client.dask.run(os.getpid, workers=[address])[address]
    assert dask_client.map(lambda _: os.getpid(), range(6), chunksize=1, workers=["1"]) == [pid_of_1] * 6
    assert dask_client.run("import os\npid = os.getpid()", worker="1") == {"os": os, "pid": pid_of_1}

    def fails_on_13(x: int) -> int:
        if x == 13:
            raise ValueError(f"bad {x}")
        return x

    with pytest.raises(RemoteError, match=r"map: item 13 \(13\): ValueError") as caught:
        dask_client.map(fails_on_13, range(40), chunksize=5)
    assert isinstance(caught.value, ValueError) and "fails_on_13" in caught.value.remote_traceback


def test_what_needs_a_remote_worker_is_refused_naming_the_option(dask_shell: InteractiveShell,
                                                                dask_client: DaskClient) -> None:
    with pytest.raises(UsageError, match="--gpu.*not available on a Dask cluster"):
        dask_shell.run_cell_magic("offload", "--gpu", "x = 1")
    with pytest.raises(UsageError, match="%offload_get.*Dask task may run on any worker"):
        dask_shell.run_line_magic("offload_get", "out.csv")
    with pytest.raises(UsageError, match="--retries.*Dask itself runs a task again"):
        dask_shell.run_cell_magic("offload", "--retries 1", "x = 1")
    with pytest.raises(DaskError, match="keeps no session per notebook"):
        dask_client.reset()
    assert "x" not in dask_shell.user_ns


def test_a_timeout_stops_waiting_and_says_the_task_runs_on(dask_client: DaskClient, tmp_path: Path) -> None:
    flag = tmp_path / "release"
    code = ("import os, time\ndeadline = time.monotonic() + 30\n"
            "while not os.path.exists(flag) and time.monotonic() < deadline:\n    time.sleep(0.01)\n")
    try:
        with pytest.raises(remote_magic.JobTimeout, match="ran past its 0.5 s timeout.*Dask can't stop it"):
            dask_client.execute(code, {"flag": str(flag)}, timeout=0.5)
    finally:
        flag.touch()  # the task that runs on ends now, freeing its worker for the next tests
    assert dask_client.run("x = 1", timeout=30) == {"x": 1}


def test_a_scheduler_that_is_not_there_is_a_connection_failure(tmp_path: Path) -> None:
    import socket

    with socket.socket() as unused:  # a port on 127.0.0.1 that nothing listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with pytest.raises(remote_magic.ConnectionFailed, match=f"no Dask scheduler answered at dask://127.0.0.1:{port}"):
        remote_magic.connect(f"dask://127.0.0.1:{port}", timeout=2)


def test_a_cell_fails_with_connection_failed_once_the_scheduler_is_gone() -> None:
    cluster = local_cluster(1)
    address = dask_address_of(cluster)
    with remote_magic.connect(address, timeout=3) as client:
        assert client.run("x = 6 * 7") == {"x": 42}
        cluster.close()
        with pytest.raises(remote_magic.ConnectionFailed, match=f"the Dask scheduler at {address} was lost"):
            client.run("y = 1")
        # Dask's client closes itself once the scheduler stays gone: closing ours after that says nothing
        # (before: ClosedClientError from leaving the `with`, on a loaded machine where that came first).
        wait_for(lambda: client.dask.status == "closed", 30, "Dask's client to give up on its scheduler")


def test_a_local_seed_decides_what_a_cell_on_dask_draws_and_its_seed_comes_back(dask_shell: InteractiveShell) -> None:
    """The notebook's global random generator is shared with cells on Dask too, both ways."""
    np.random.seed(3)
    expected = np.random.rand(2).tolist()
    np.random.seed(3)
    result, _ = run(dask_shell, "%%offload\nimport numpy as np\ndrawn = np.random.rand(2).tolist()\nnp.random.seed(9)")
    assert result.success, result.error_in_exec
    assert dask_shell.user_ns["drawn"] == expected
    after = np.random.rand(1).tolist()
    np.random.seed(9)
    assert after == np.random.rand(1).tolist()  # the cell's seed holds here after it
