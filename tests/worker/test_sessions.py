"""A session per notebook on the worker (issue 9, item 1): each connected notebook keeps its own
interpreter state (imports, module globals, RNG state, working directory) between its offloaded
cells, apart from every other notebook's, until it disconnects, resets, or its process dies."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
from IPython.core.interactiveshell import InteractiveShell

import remote_magic
from remote_magic import ExecutorDied
from remote_magic.notebook.tables import WorkersTable
from support import WorkerProcess, run, start_worker, wait_for

SET_STATE = "import json, os, random\nrandom.seed(seed)\nos.chdir(folder)\njson.remote_magic_mark = mark\n"
READ_STATE = ("import json, os, random\ndrawn = random.random()\ncwd = os.getcwd()\n"
              "mark = getattr(json, 'remote_magic_mark', None)\n")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_two_notebooks_on_one_worker_keep_their_own_interpreter_state(worker: WorkerProcess, tmp_path: Path) -> None:
    folders = [tmp_path / "one", tmp_path / "two"]
    with remote_magic.connect(worker.token) as one, remote_magic.connect(worker.token) as two:
        for client, seed, folder, mark in [(one, 1, folders[0], "one"), (two, 2, folders[1], "two")]:
            folder.mkdir()
            client.run(SET_STATE, {"seed": seed, "folder": str(folder), "mark": mark}, outputs=[])
        for client, seed, folder, mark in [(one, 1, folders[0], "one"), (two, 2, folders[1], "two")]:
            state = client.run(READ_STATE, outputs=["drawn", "cwd", "mark"])
            assert state == {"drawn": random.Random(seed).random(), "cwd": str(folder), "mark": mark}
        # And each keeps its own across more cells: the generator goes on from where it was.
        expected = random.Random(1)
        expected.random()
        assert one.run("import random\nnext_draw = random.random()")["next_draw"] == expected.random()


def test_a_notebooks_seed_lasts_to_its_next_cell_whatever_other_notebooks_run(
        ip: InteractiveShell, worker: WorkerProcess) -> None:
    result, _ = run(ip, "%%offload\nimport random\nrandom.seed(3)")
    assert result.success
    with remote_magic.connect(worker.token) as other:  # another notebook on the same worker, in between
        other.run("import random\nrandom.seed(99)", outputs=[])
    result, _ = run(ip, "%%offload\nx = random.random()")
    assert result.success and ip.user_ns["x"] == random.Random(3).random()


def test_offload_reset_gives_the_notebook_a_fresh_interpreter(ip: InteractiveShell) -> None:
    result, _ = run(ip, "%%offload\nimport json, os\njson.remote_magic_mark = 1\nbefore = os.getpid()")
    assert result.success
    result, out = run(ip, "%offload_reset")
    assert result.success
    assert out.stdout.strip() == ("Reset this notebook's session on worker 'shared': the next offloaded cell there "
                                  "starts in a fresh interpreter.")
    result, _ = run(ip, "%%offload\nimport json, os\nmarked = hasattr(json, 'remote_magic_mark')\nafter = os.getpid()")
    assert result.success and ip.user_ns["marked"] is False and ip.user_ns["after"] != ip.user_ns["before"]
    assert ip.user_ns["json"].__name__ == "json"  # the notebook's own names are untouched
    result, out = run(ip, "%offload_reset --worker shared")
    assert out.stdout.strip().startswith("Reset this notebook's session on worker 'shared'")
    result, out = run(ip, "%offload_reset --worker shared")
    assert out.stdout.strip() == "Nothing to reset: this notebook has no session on worker 'shared'."


def test_a_notebook_that_disconnects_has_its_session_process_stopped(worker: WorkerProcess) -> None:
    with remote_magic.connect(worker.token) as client:
        pid = client.run("import os\npid = os.getpid()")["pid"]
        assert psutil.pid_exists(pid)
    wait_for(lambda: _gone(pid), 10, f"the disconnected notebook's executor {pid} to stop")


def test_a_notebook_the_hub_stops_hearing_from_has_its_session_process_stopped(
        worker: WorkerProcess, tmp_path: Path) -> None:
    script = tmp_path / "vanishing_notebook.py"
    script.write_text(textwrap.dedent(f"""
        import remote_magic, time
        client = remote_magic.connect({worker.token!r})
        print(client.run("import os\\npid = os.getpid()")["pid"], flush=True)
        time.sleep(600)
    """))
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(process.stdout.readline())  # type: ignore[union-attr]
        assert psutil.pid_exists(pid)
    finally:
        process.kill()  # no bye: the hub finds it gone at the heartbeat bound
        process.wait()
    wait_for(lambda: _gone(pid), 60, f"the vanished notebook's executor {pid} to stop")


def test_a_crashed_session_fails_its_job_and_the_next_cell_says_its_state_was_reset(worker: WorkerProcess) -> None:
    with remote_magic.connect(worker.token) as client:
        client.run("import json\njson.remote_magic_mark = 1", outputs=[])
        with pytest.raises(ExecutorDied, match="exited with status 3 .*the session's state was reset"):
            client.run("import os\nos._exit(3)")
        said: list[str] = []
        result = client.execute("import json\nmarked = hasattr(json, 'remote_magic_mark')",
                                on_stream=lambda header: said.append(header["text"]))
        assert result.values["marked"] is False
        assert "runs this cell in a fresh interpreter: the previous job's process exited with status 3, so the " \
               "session's state was reset" in "".join(said)
        said.clear()
        client.execute("after = 1", on_stream=lambda header: said.append(header["text"]))
        assert said == []  # told once


def test_workers_show_the_sessions_and_this_notebooks_memory(worker: WorkerProcess) -> None:
    with remote_magic.connect(worker.token) as client:
        client.run("import numpy\nblock = numpy.ones(2**22)", outputs=[])  # 32 MiB held by the session

        def ours() -> dict | None:
            shared = next(w for w in client.workers() if w["name"] == "shared")
            mine = shared["session_memory_bytes"]
            return shared if isinstance(mine, int) and mine > 32 * 2**20 else None

        shared = wait_for(ours, 10, "the worker to report this notebook's session")
        assert isinstance(shared, dict)
        assert shared["sessions"] >= 1 and shared["sessions_memory_bytes"] >= shared["session_memory_bytes"]
        row = repr(WorkersTable([shared]))
        assert "sessions" in row.splitlines()[0] and "; yours " in row


def test_a_session_beyond_max_sessions_replaces_the_least_recently_used_and_says_so(tmp_path: Path) -> None:
    w = start_worker(tmp_path, "--listen", "127.0.0.1:0", "--gpu", "off", "--max-sessions", "1")
    try:
        with remote_magic.connect(w.token) as one, remote_magic.connect(w.token) as two:
            one.run("import json\njson.remote_magic_mark = 1", outputs=[])
            assert two.run("import json\nmarked = hasattr(json, 'remote_magic_mark')")["marked"] is False
            said: list[str] = []
            result = one.execute("import json\nmarked = hasattr(json, 'remote_magic_mark')",
                                 on_stream=lambda header: said.append(header["text"]))
            assert result.values["marked"] is False
            assert "at most 1 sessions (remote-worker --max-sessions)" in "".join(said)
            assert "the session's state was reset" in "".join(said)
    finally:
        w.stop()
