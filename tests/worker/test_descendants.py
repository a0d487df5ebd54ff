"""Every process a job starts is the job's: also those started with setsid or double-forked.

Each test runs real `remote-worker` processes on 127.0.0.1; the jobs start real processes (`setsid
sleep`, a shell that backgrounds a child and exits), and the tests look those pids up on this machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import psutil
import pytest

import remote_magic
from remote_magic.worker.descendants import ProcessTree, child_environment
from support import WorkerProcess, start_worker, wait_for

STRAYS = """
import os, subprocess, sys
# One child in a session of its own, and one double-forked: the shell backgrounds it and exits.
alone = subprocess.Popen(['setsid', 'sleep', '600']).pid
orphan = int(subprocess.run(['sh', '-c', 'setsid sleep 600 >/dev/null 2>&1 & echo $!'], capture_output=True,
                            text=True).stdout)
executor = os.getpid()
"""
"""Starts two processes that leave the executor's process group; binds their pids and the executor's."""

HOG = "import time; x = bytes(range(256)) * (1 << 21); time.sleep(600)"
"""512 MiB, resident, then waits."""


def gone(pid: int) -> bool:
    """Ended: no such process, or a zombie whose exit nobody collected yet."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def running(pid: int) -> bool:
    return not gone(pid)


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    """A worker whose jobs may use 300 MiB, with all they start."""
    w = start_worker(tmp_path_factory.mktemp("limited"), "--listen", "127.0.0.1:0", "--gpu", "off",
                     "--max-memory", "300M", "--name", "limited")
    yield w
    w.stop()


def test_strays_stay_below_the_worker_and_die_with_a_crashed_executor(limited: WorkerProcess) -> None:
    with remote_magic.connect(limited.token, timeout=10) as client:
        found = client.run(STRAYS)
        alone, orphan, executor = found["alone"], found["orphan"], found["executor"]
        assert running(alone) and running(orphan)
        assert psutil.Process(alone).ppid() == executor and os.getsid(alone) == alone  # left the executor's group
        assert psutil.Process(orphan).ppid() == limited.process.pid  # adopted by the worker, not by init
        with pytest.raises(remote_magic.ExecutorDied, match="exited with status 3"):
            client.run("import os; os._exit(3)")
        wait_for(lambda: gone(alone) and gone(orphan) and gone(executor), 10, "the crashed job's processes to end")
        assert client.run("x = 6 * 7")["x"] == 42  # the session goes on in a fresh executor


def test_strays_die_with_an_executor_that_ignored_an_interrupt(limited: WorkerProcess, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    stubborn = STRAYS + ("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                         "open(PIDS, 'w').write(f'{alone} {orphan}')\nwhile True: time.sleep(0.1)\n")
    with remote_magic.connect(limited.token, timeout=10) as client:
        with pytest.raises(remote_magic.JobTimeout, match="ignored the interrupt"):
            client.run(stubborn, {"PIDS": str(pids)}, timeout=1)
    alone, orphan = (int(pid) for pid in pids.read_text().split())
    wait_for(lambda: gone(alone) and gone(orphan), 10, "the replaced executor's processes to end")


def test_a_double_forked_setsid_child_counts_against_max_memory(limited: WorkerProcess, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    cell = ("import subprocess, sys, time\n"
            "hog = int(subprocess.run(['sh', '-c', 'setsid \"$0\" -c \"$1\" >/dev/null 2>&1 & echo $!', sys.executable,"
            " HOG], capture_output=True, text=True).stdout)\n"
            "open(PIDS, 'w').write(str(hog))\ntime.sleep(60)\n")
    with remote_magic.connect(limited.token, timeout=10) as client:
        with pytest.raises(remote_magic.ExecutorDied, match=r"over the 300\.0 MB limit \(--max-memory\)"):
            client.run(cell, {"HOG": HOG, "PIDS": str(pids)})
        hog = int(pids.read_text())
        wait_for(lambda: gone(hog), 10, "the process over the limit to end")
        assert client.run("x = 1")["x"] == 1


def test_stopping_the_worker_kills_what_its_jobs_started(tmp_path: Path) -> None:
    w = start_worker(tmp_path / "stopped", "--listen", "127.0.0.1:0", "--gpu", "off")
    try:
        with remote_magic.connect(w.token, timeout=10) as client:
            found = client.run(STRAYS)
    finally:
        w.process.send_signal(signal.SIGTERM)
        w.process.wait(30)
    assert w.process.returncode == 0, w.log()
    wait_for(lambda: gone(found["alone"]) and gone(found["orphan"]), 10, "the idle session's strays to end")
    assert gone(found["executor"])


def test_a_killed_joined_workers_temporary_folder_is_removed_by_the_next_worker(
        worker: WorkerProcess, tmp_path: Path) -> None:
    worker_token = subprocess.run(["remote-worker", "token", "--worker"], capture_output=True, text=True, timeout=60,
                                  env={**os.environ, "REMOTE_MAGIC_HOME": str(worker.home)}).stdout.strip()
    join = {"REMOTE_MAGIC_JOIN_TOKEN": worker_token}

    def folders_of(process: subprocess.Popen[str]) -> list[Path]:
        return list(Path(tempfile.gettempdir()).glob(f"remote-magic-{process.pid}-*"))

    killed = start_worker(tmp_path / "killed", "--join", "--gpu", "off", "--name", "killed", token_file=False,
                          env=join)
    (left,) = folders_of(killed.process)
    killed.process.kill()
    killed.process.wait()
    assert left.exists()  # a SIGKILL cleans nothing up
    second = start_worker(tmp_path / "second", "--join", "--gpu", "off", "--name", "second", token_file=False,
                          env=join)
    try:
        assert not left.exists()
        assert len(folders_of(second.process)) == 1
    finally:
        second.stop()
    assert folders_of(second.process) == []


@pytest.mark.parametrize("children_files", [True, False])
def test_both_ways_of_walking_find_and_kill_the_same_processes(children_files: bool) -> None:
    """By /proc/PID/task/*/children (cheap: the worker's own processes), or by every process's parent
    (the fallback on kernels without those files)."""
    if children_files and not Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists():
        pytest.skip("this kernel has no /proc/PID/task/TID/children")
    tree = ProcessTree(children_files)
    owner = "executor-walked"
    script = "import subprocess, time\nsubprocess.Popen(['setsid', 'sleep', '600'])\ntime.sleep(600)\n"
    root = tree.start(owner, [sys.executable, "-c", script], child_environment(tree.mark(owner)))
    try:
        # Found once the child has its own session: until `setsid` runs, it is a fork of the python above.
        pids = wait_for(lambda: len(found := tree.pids(owner)) == 2 and all(
            _leads_its_session(pid) for pid in found if pid != root.pid) and found, 30, "the process and its child")
        assert isinstance(pids, list) and root.pid in pids
        (child,) = [pid for pid in pids if pid != root.pid]
        assert psutil.Process(child).ppid() == root.pid and os.getsid(child) == child
        assert tree.memory(owner) > 0
        assert tree.kill(owner) == 2
        wait_for(lambda: gone(child), 10, "the child to end")
    finally:
        root.kill()
        root.wait()
        tree.forget(owner)


def _leads_its_session(pid: int) -> bool:
    try:
        return os.getsid(pid) == pid
    except ProcessLookupError:
        return False
