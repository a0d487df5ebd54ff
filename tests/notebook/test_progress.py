"""Progress (issue 11, item 3): a job that runs over a second shows how long it has run, where someone
watches (a terminal here; a notebook's tqdm widget in Jupyter), and the bar is cleared when it ends;
output that is captured gets none. Transfer bars over a slow link: tests/end_to_end/test_slow_link.py."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time

from support import WorkerProcess

SCRIPT = """
import sys, remote_magic
with remote_magic.connect(sys.argv[1]) as client:
    print("result", client.run("import time\\ntime.sleep(2.5)\\nx = 1")["x"], flush=True)
"""


def _read_all(fd: int, process: subprocess.Popen[bytes], timeout: float) -> bytes:
    out, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([fd], [], [], 0.2)[0]:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the other end closed
                break
            out += chunk
        elif process.poll() is not None:
            break
    return out


def test_a_long_job_shows_its_elapsed_time_in_a_terminal_and_clears_it(worker: WorkerProcess) -> None:
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a new pty is 0 columns wide
    process = subprocess.Popen([sys.executable, "-c", SCRIPT, worker.token], stdin=terminal, stdout=terminal,
                               stderr=terminal)
    os.close(terminal)
    try:
        out = _read_all(controller, process, 60).decode(errors="replace")
    finally:
        os.close(controller)
        process.wait(30)
    assert "running on 'shared': 00:01" in out and "running on 'shared': 00:02" in out, out
    assert out.rstrip().endswith("result 1"), out  # the bar was cleared before the result was printed


def test_captured_output_gets_no_elapsed_bar(worker: WorkerProcess) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT, worker.token], capture_output=True, text=True, timeout=60)
    assert done.stdout == "result 1\n" and "running on" not in done.stderr, done.stderr
