"""Large values over a slow link: they cross at the link's pace with a progress bar, heartbeats keep
flowing beside them, what compresses well crosses compressed, and what the hub holds already crosses
as its digest.

The worker runs in one network namespace and the notebook in another, joined by a veth pair whose two
ends are capped at 16 Mbit/s (a token bucket each way). A value that takes longer to cross than the
heartbeat bound (5 s) used to cost the connection: the hub took the silent peer for gone.
"""

from __future__ import annotations

import json
import re
import select
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
from netns import Link, linked_namespaces

from support import start_worker, worker_token

RATE_MBIT = 16
SECONDS_OF_LINK = 7  # each way: past the 5 s heartbeat bound

NOTEBOOK = r'''
import json, logging, sys, time
import numpy as np
import remote_magic

logging.basicConfig(level=logging.WARNING)
token, size = sys.argv[1], int(sys.argv[2])
report = {}
x = np.random.default_rng(0).random(size // 8)
with remote_magic.connect(token) as client:
    start = time.monotonic()
    out = client.run("y = x[::-1] * 2\nsize = x.nbytes", {"x": x}, outputs=["y", "size"], timeout=300)
    y = out["y"]
    report["random"] = {"seconds": time.monotonic() - start, "same": bool(np.array_equal(y, x[::-1] * 2)),
                        "size": out["size"]}
    print(json.dumps({"mark": "zeros"}), flush=True)
    sys.stdin.readline()  # the test has read the link's counters
    zeros = np.zeros(3 * size // 8)
    out = client.run("total = float(z.sum())\nlength = len(z)", {"z": zeros}, outputs=["total", "length"], timeout=300)
    report["zeros"] = out
    print(json.dumps({"mark": "again"}), flush=True)
    sys.stdin.readline()
    again = client.run("first = float(x[0])\nlast = float(y[-1])", {"x": x, "y": y}, outputs=["first", "last"])
    report["again"] = again == {"first": float(x[0]), "last": float(y[-1])}
print(json.dumps(report), flush=True)
'''


@pytest.fixture
def slow_link() -> Iterator[Link]:
    with linked_namespaces("slow-link tests", rate_mbit=RATE_MBIT) as link:
        yield link


def test_values_longer_than_the_heartbeat_bound_cross_a_slow_link_and_zeros_cross_compressed(
        slow_link: Link, tmp_path: Path) -> None:
    home, notebook = slow_link.a, slow_link.b
    worker = start_worker(tmp_path, "--listen", f"{slow_link.a_ip}:0", "--gpu", "off", "-v",
                          wrapper=slow_link.run(home))
    size = SECONDS_OF_LINK * RATE_MBIT * 10**6 // 8  # bytes
    script = tmp_path / "notebook.py"
    script.write_text(NOTEBOOK)
    try:
        before = slow_link.sent_bytes(notebook), slow_link.sent_bytes(home)
        process = subprocess.Popen([*slow_link.run(notebook), sys.executable, str(script), worker.token, str(size)],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert process.stdout is not None and process.stdin is not None
        # 7 s each way at the link's pace; a notebook that lost its connection would wait forever.
        assert select.select([process.stdout], [], [], 90)[0], "the first value did not cross within 90 s"
        first = process.stdout.readline()
        after_random = slow_link.sent_bytes(notebook), slow_link.sent_bytes(home)
        assert json.loads(first or "{}") == {"mark": "zeros"}, process.stderr.read() if process.stderr else ""
        process.stdin.write("\n")
        process.stdin.flush()
        assert json.loads(process.stdout.readline() or "{}") == {"mark": "again"}
        after_zeros = slow_link.sent_bytes(notebook)
        process.stdin.write("\n")
        process.stdin.flush()
        out, err = process.communicate(timeout=240)
        after_again = slow_link.sent_bytes(notebook)
        report = json.loads(out.splitlines()[-1])
    finally:
        log = worker.log()
        worker.stop()
    assert report["random"]["same"] and report["random"]["size"] == size
    # Both ways at the link's pace: each took over the heartbeat bound, and nobody was taken for gone.
    assert report["random"]["seconds"] > 2 * 5, report
    assert "left:" not in log.replace("left: disconnected", ""), log
    assert "stopped answering" not in err and "ConnectionFailed" not in err, err
    # Each way, a progress bar of bytes with rate and ETA showed while it took more than a second.
    assert "sending to the worker" in err and "receiving from the worker" in err, err
    assert re.search(r"sending to the worker: +\d+%.*MB/s", err), err
    # Random floats don't compress: they crossed raw, each way.
    up, down = after_random[0] - before[0], after_random[1] - before[1]
    assert up >= size and down >= size, (up, down)
    # Three times as many zeros crossed in a fraction of their size.
    assert report["zeros"] == {"total": 0.0, "length": 3 * size // 8}
    assert after_zeros - after_random[0] < size / 4, after_zeros - after_random[0]
    # x again, and y (which came from the worker): the hub holds both, so only their digests crossed.
    assert report["again"] and after_again - after_zeros < 256 << 10, after_again - after_zeros


INTERRUPTED_NOTEBOOK = r'''
import json, os, signal, sys, threading, time
import numpy as np
import remote_magic

token, direction, marker, size = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
report = {}
with remote_magic.connect(token) as client:
    client.run("pass", outputs=[])
    crossed = (lambda: client.bytes_sent) if direction == "up" else (lambda: client.bytes_received)
    before, pressed = crossed(), []

    def press_ctrl_c_once_the_transfer_is_under_way():
        deadline = time.monotonic() + 60
        while crossed() - before < (2 << 20) and time.monotonic() < deadline:
            time.sleep(0.01)  # polling the counter, bounded by the deadline
        pressed.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=press_ctrl_c_once_the_transfer_is_under_way, daemon=True).start()
    try:
        if direction == "up":
            x = np.random.default_rng(1).random(size // 8)
            client.run("open(MARKER, 'w').write('ran')\ny = 1", {"x": x, "MARKER": marker}, timeout=300)
        else:
            client.run(f"import numpy as np\ny = np.random.default_rng(2).random({size // 8})", outputs=["y"],
                       timeout=300)
        report["raised"] = False
    except KeyboardInterrupt:
        report["raised"] = True
        report["raise_s"] = time.monotonic() - pressed[0]
        report["at_raise"] = crossed()
    start = time.monotonic()
    report["next"] = client.run("z = 2", outputs=["z"])
    report["next_s"] = time.monotonic() - start
    report["after"] = crossed()
print(json.dumps(report), flush=True)
'''


@pytest.mark.parametrize("direction", ["up", "down"])
def test_ctrl_c_during_a_transfer_raises_at_once_stops_it_and_the_next_cell_runs_right_away(
        slow_link: Link, tmp_path: Path, direction: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Up: the job's inputs, which then never run. Down: its result (before: Ctrl-C took 5 s, and the next
    cell waited for the rest of the result to come down)."""
    home, notebook = slow_link.a, slow_link.b
    worker = start_worker(tmp_path, "--listen", f"{slow_link.a_ip}:0", "--gpu", "off", wrapper=slow_link.run(home))
    size = 10 * RATE_MBIT * 10**6 // 8  # 10 s of the link
    marker = tmp_path / "ran"
    script = tmp_path / "interrupted.py"
    script.write_text(INTERRUPTED_NOTEBOOK)
    try:
        done = subprocess.run([*slow_link.run(notebook), sys.executable, str(script), worker.token, direction,
                               str(marker), str(size)], capture_output=True, text=True, timeout=120)
    finally:
        worker.stop()
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    with capsys.disabled():
        print(f"\n  Ctrl-C during a {size / 1e6:g} MB transfer {direction} at {RATE_MBIT} Mbit/s: raised in "
              f"{report.get('raise_s', 0):.2f} s, the next cell took {report.get('next_s', 0):.2f} s, "
              f"{(report.get('after', 0) - report.get('at_raise', 0)) / 1e6:.2f} MB crossed after")
    assert report["raised"] and report["raise_s"] < 1.0, report
    # The next cell waited at most for what was in flight (about a second of the link), not the rest.
    assert report["next"] == {"z": 2} and report["next_s"] < 4.0, report
    assert report["after"] - report["at_raise"] < size / 4, report
    assert not marker.exists()  # the interrupted cell never ran (up), or never wrote it (down)


PASSING_NOTEBOOK = r'''
import json, sys, threading, time
import remote_magic

token, size = sys.argv[1], int(sys.argv[2])
report = {}
with remote_magic.connect(token) as client:
    for worker in ("machine", "near"):
        client.run("pass", outputs=[], worker=worker)
    before = client.bytes_received

    def large():
        client.run(f"import os\ny = os.urandom({size})", outputs=["y"], worker="machine", timeout=300)

    thread = threading.Thread(target=large)
    thread.start()
    deadline = time.monotonic() + 60
    while client.bytes_received - before < (2 << 20) and time.monotonic() < deadline:
        time.sleep(0.01)  # polling the counter, bounded by the deadline
    report["large_left"] = size - (client.bytes_received - before)  # when the small job was sent
    start = time.monotonic()
    report["small"] = client.run("z = 2", outputs=["z"], worker="near")
    report["small_s"] = time.monotonic() - start
    report["large_left_then"] = size - (client.bytes_received - before)
    thread.join(300)
print(json.dumps(report), flush=True)
'''


def test_a_small_job_ends_while_another_jobs_large_result_still_comes_down_the_same_link(
        slow_link: Link, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: the small job's result waited behind every chunk of the large one (85-101 s on a poor link)."""
    home, notebook = slow_link.a, slow_link.b
    hub = start_worker(tmp_path / "hub", "--listen", f"{slow_link.a_ip}:0", "--gpu", "off", "--name", "machine",
                       wrapper=slow_link.run(home))
    near = start_worker(tmp_path / "near", "--join", "--gpu", "off", "--name", "near", token_file=False,
                        env={"REMOTE_MAGIC_JOIN_TOKEN": worker_token(hub)}, wrapper=slow_link.run(home))
    size = 8 * RATE_MBIT * 10**6 // 8  # 8 s of the link
    script = tmp_path / "passing.py"
    script.write_text(PASSING_NOTEBOOK)
    try:
        done = subprocess.run([*slow_link.run(notebook), sys.executable, str(script), hub.token, str(size)],
                              capture_output=True, text=True, timeout=240)
    finally:
        near.stop()
        hub.stop()
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    with capsys.disabled():
        print(f"\n  a small job during a {size / 1e6:g} MB result at {RATE_MBIT} Mbit/s: {report['small_s']:.2f} s, "
              f"{report['large_left_then'] / 1e6:.1f} MB of the large one still to come when it ended")
    assert report["small"] == {"z": 2} and report["large_left"] > size / 2, report
    assert report["large_left_then"] > size / 4, report  # it passed the large result, which came on after it
