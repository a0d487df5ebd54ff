"""Progress (issue 11, item 3): a job that runs over a second shows how long it has run, where someone
watches (a terminal; a Jupyter cell), and the bar is cleared when it ends; output that is captured gets
none. In a Jupyter kernel the bars leave nothing in the saved notebook (issue 32): no widget, no bar's
text, the cell's outputs as a local run leaves them. Transfer bars over a slow link:
tests/end_to_end/test_slow_link.py."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest

from remote_magic.wire.tokens import Token
from support import WorkerProcess, hub_port, notebook_client, saved_outputs

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


SLOW_CELL = """import time
from IPython.display import display
print("before")
shown = display("a display", display_id=True)
time.sleep(1.8)
shown.update("updated")
print("after")
"""

UPLOAD_RATE = 1_000_000
"""Bytes per second from the notebook to the hub through ``SlowLink``: a 2 MiB value takes about 2 s."""

PAYLOAD = "import numpy as np\npayload = np.random.default_rng(0).random(2**18)  # 2 MiB that don't compress"

SLOW_UPLOAD = """print("before")
total = float(payload.sum())
print("after")
"""


class SlowLink:
    """A TCP forwarder on 127.0.0.1 to a hub that carries at most ``rate`` bytes/s from the notebook to the hub,
    as a slow uplink does (the other way at full speed)."""

    def __init__(self, target_port: int, rate: float) -> None:
        self._target, self._rate = target_port, rate
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, name="slow link", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                notebook, _ = self._server.accept()
            except OSError:  # closed
                return
            hub = socket.create_connection(("127.0.0.1", self._target))
            self._sockets += [notebook, hub]
            threading.Thread(target=self._carry, args=(notebook, hub, self._rate), daemon=True).start()
            threading.Thread(target=self._carry, args=(hub, notebook, None), daemon=True).start()

    @staticmethod
    def _carry(source: socket.socket, target: socket.socket, rate: float | None) -> None:
        try:
            while data := source.recv(16384):
                target.sendall(data)
                if rate:
                    time.sleep(len(data) / rate)  # the link's pace
        except OSError:  # either end closed
            pass
        finally:
            for end in (source, target):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._server.close()
        for end in self._sockets:
            end.close()

REDRAWS = """import time
from IPython.display import clear_output
for i in range(4):
    clear_output(wait=True)
    print(f"frame {i}")
    time.sleep(0.5)
"""

OWN_TQDM = """import sys
print("tqdm.auto" in sys.modules)
from tqdm.auto import tqdm
print(tqdm.__module__, tqdm.__name__)
"""


def _saved(cell: Any) -> list[tuple[str, str]]:
    """A cell's outputs as a Jupyter front end saves them: each one's type and text or mime bundle."""
    return [(output["output_type"] + ":" + output.get("name", ""),
             output.get("text") or repr(sorted(output.get("data", {}).items()))) for output in saved_outputs(cell)]


def test_bars_in_a_jupyter_cell_show_while_it_runs_and_leave_nothing_in_the_saved_notebook(
        worker: WorkerProcess, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """With ipywidgets installed (as in Colab) too: a job over a second, and a 2 MiB value crossing a slow
    uplink for about 2 s, each show a bar while they last, and the saved cell is the local run's (before:
    tqdm's widget stayed, as "HBox(...)" text in exports). And remote-magic leaves tqdm.auto to the
    notebook: imported after a long offloaded cell, it is the notebook's class, as without remote-magic."""
    link = SlowLink(hub_port(worker), UPLOAD_RATE)
    monkeypatch.setenv("REMOTE_MAGIC_TOKEN", Token.decode(worker.token).with_address(f"tcp://127.0.0.1:{link.port}")
                       .encode())
    sources = ["%load_ext remote_magic\n%offload_connect", SLOW_CELL, "%%offload\n" + SLOW_CELL,
               PAYLOAD, SLOW_UPLOAD, "%%offload\n" + SLOW_UPLOAD, OWN_TQDM, REDRAWS, "%%offload\n" + REDRAWS]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in sources])
    client = notebook_client(nb, tmp_path)
    drawn: dict[int, list[str]] = {}  # per cell, the text of every display or update the kernel sent
    process = client.process_message

    def watch(msg: dict[str, Any], cell: Any, cell_index: int) -> Any:
        if msg["msg_type"] in ("display_data", "update_display_data"):
            drawn.setdefault(cell_index, []).append(msg["content"]["data"].get("text/plain", ""))
        return process(msg, cell, cell_index)

    client.process_message = watch  # type: ignore[method-assign]
    try:
        client.execute()
    finally:
        link.close()
    connect, local, offloaded, _, sum_here, sum_offloaded, own_tqdm, redraws, offloaded_redraws = nb.cells
    assert "Connected to tcp://127.0.0.1" in "".join(o.get("text", "") for o in connect.outputs)
    assert any("running on 'shared': 00:01" in text for text in drawn[2]), drawn[2]
    assert any(text.startswith("sending to the worker:") and "/2.10M [" in text for text in drawn[5]), drawn[5]
    assert _saved(local) == [("stream:stdout", "before\n"),
                             ("display_data:", "[('text/plain', \"'updated'\")]"), ("stream:stdout", "after\n")]
    assert _saved(offloaded) == _saved(local)
    assert _saved(sum_here) == [("stream:stdout", "before\nafter\n")]
    assert _saved(sum_offloaded) == _saved(sum_here)
    assert _saved(own_tqdm) == [("stream:stdout", "False\ntqdm.auto tqdm\n")]
    # A redraw loop's clear_output(wait=True) clears the bar with the frame before: its last frame stays alone.
    assert _saved(redraws) == [("stream:stdout", "frame 3\n")]
    assert _saved(offloaded_redraws) == _saved(redraws)
