"""A job run as a Dask task (``%offload_connect dask://...``): the executor's own job machinery, in a
Dask worker process.

The notebook side (``remote_magic.dask_client``) sends the SUBMIT header and frames a hub would forward;
``run`` gives them to a ``JobRunner`` here, so a cell's inputs, what it changed (tracking), its figures
and its exception are handled exactly as in a ``remote-worker`` executor. What the job prints and shows
goes out while it runs as Dask events on the client's topic (``Worker.log_event``); its RESULT or ERROR
is the task's return value.

A Dask worker keeps no session per notebook: one runner per worker process serves every client, one job
at a time (a job's output is captured process-wide, through ``sys.stdout``), with no GPU runtime and no
look at the files a cell writes.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from typing import Any

from remote_magic.wire.protocol import Message, MessageType as T

from .job_runner import MATPLOTLIB_BACKEND, JobRunner
from .outputs import flush_periodically, install_display

NO_GPU_ON_DASK = ("a Dask worker has no remote-magic GPU runtime (WGSL kernels run on a remote-worker): "
                  "connect to a remote-worker with %offload_connect TOKEN for GPU cells")

Ended = tuple[str, dict[str, Any], list[Any]]
"""What a task returns: the job's last message as (type, header, frames)."""


class DaskRunner(JobRunner):
    """The jobs of one Dask worker process, one at a time, reporting through that worker's events."""

    displays_in_frames = False  # Dask's events carry a header only: a display too large for one is left out, said so

    def __init__(self) -> None:
        super().__init__(None, NO_GPU_ON_DASK)
        self._lock = threading.Lock()       # one job at a time: its output is captured process-wide
        self._events_lock = threading.Lock()  # the stream flusher sends from its own thread
        self._worker: Any = None
        self._topic = ""
        self._events = 0
        self._ended: Ended | None = None

    def send(self, msg_type: T, header: dict[str, Any], buffers: list[Any] | tuple[Any, ...] = ()) -> None:
        if msg_type in (T.RESULT, T.ERROR):
            self._ended = (msg_type.value, header, list(buffers))
            return
        with self._events_lock:
            self._events += 1
            event = {**header, "type": msg_type.value, "seq": self._events}
            self._worker.log_event(self._topic, event)  # thread-safe: from another thread it goes via the loop

    def run(self, header: dict[str, Any], frames: list[Any], topic: str) -> Ended:
        """Run one job; its RESULT or ERROR with ``events`` (how many STREAM and DISPLAY events it sent
        first, so the notebook knows when it has them all) and the worker's name."""
        from distributed import get_worker

        worker = get_worker()
        with self._lock:
            self._worker, self._topic, self._events, self._ended = worker, topic, 0, None
            self.run_job(Message(T.SUBMIT, header, [_writable(frame) for frame in frames]))
            ended = self._ended
            with self._events_lock:
                count = self._events
        if ended is None:  # run_job always sends an ending; this is a bug, said as one
            raise RuntimeError("remote-magic: the job ended without a result")
        kind, result, buffers = ended
        return kind, {**result, "events": count, "worker": str(worker.name)}, buffers

    def _starting_files(self) -> None:
        """No look at the working directory: the notebook can't copy files from a Dask worker anyway."""
        return None


def _writable(frame: Any) -> Any:
    """A frame arrays can be rebuilt on and changed in place (a cell may): read-only bytes are copied."""
    view = memoryview(frame)
    return bytearray(view) if view.readonly else view


_runner: DaskRunner | None = None
_runner_lock = threading.Lock()


def runner() -> DaskRunner:
    """This process's runner, made (with display() and plt.show() routed through it) on first use."""
    global _runner
    with _runner_lock:
        if _runner is None:
            _use_figure_backend()
            made = DaskRunner()
            install_display(lambda: made._outputs)
            flush_periodically(lambda: made._outputs)
            _runner = made
        return _runner


def _use_figure_backend() -> None:
    """plt.show() in a cell shows its figures in the notebook, as on a remote-worker's executor."""
    warnings.filterwarnings("ignore", message=".*non-interactive.*cannot be shown")
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        os.environ["MPLBACKEND"] = MATPLOTLIB_BACKEND
    else:
        pyplot.switch_backend(MATPLOTLIB_BACKEND)
