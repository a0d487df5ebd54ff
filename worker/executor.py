"""The executor: the child process where jobs run, supervised by the worker.

User code that crashes, hangs or calls os._exit takes down only this process; the supervisor
reports the job as failed and starts a new one. It holds the GPU device, created once at start,
and runs each job it is handed through its :class:`~.job_runner.JobRunner`.

The supervisor starts it (``executor_processes.EXECUTOR_LAUNCHER``, with ENDPOINT GENERATION); it
dials the supervisor's socket.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
import warnings
from typing import Any

import zmq

from remote_magic.errors import GpuError, RemoteMagicError
from remote_magic.wire import schema
from remote_magic.wire.failures import error_header
from remote_magic.wire.install import install_command
from remote_magic.wire.protocol import MessageType as T, decode, encode

from . import as_in_a_kernel, shared_frames
from .held_frames import HeldFrames
from .job_runner import GPU_OFF, MATPLOTLIB_BACKEND, JobRunner
from .outputs import flush_periodically, install_display

log = logging.getLogger(__name__)

PARENT_CHECK_INTERVAL_S = 0.5


class Executor(JobRunner):
    """Receives jobs from the supervisor and runs them one at a time."""

    runs_as_main = True  # one session's process: its cell is the process's __main__ while it runs

    def __init__(self, endpoint: str, generation: int, gpu_mode: str, adapter: str | None,
                 backend: str | None, gpu_memory: int | None = None, tab: str | None = None) -> None:
        self._context = zmq.Context()
        self._sock = self._context.socket(zmq.DEALER)
        self._sock.linger = 5000  # let the last result leave before exit
        self._sock.routing_id = b"executor-%d" % generation
        self._sock.connect(endpoint)
        self._send_lock = threading.Lock()
        self.frames_folder: str | None = None  # where large frames to and from the supervisor are (shared_frames)
        self._released = shared_frames.Released()  # the jobs' files this process no longer maps
        self._held = HeldFrames()  # the last job's large inputs, kept mapped for the next
        super().__init__(*_create_gpu(gpu_mode, adapter, backend, gpu_memory, tab))

    def send(self, msg_type: T, header: dict[str, Any], buffers: list[Any] | tuple[Any, ...] = ()) -> None:
        frames = encode(msg_type, header, buffers)
        # Only these come back through shared memory: the supervisor decodes them (it forwards the others as they
        # came), and removes their file once it has mapped it.
        if msg_type in (T.RESULT, T.ERROR) and self.frames_folder is not None:
            frames, _ = shared_frames.pack(frames, self.frames_folder, first=3)
        with self._send_lock:
            self._sock.send_multipart(frames, copy=False)

    def stand_in(self, buffer: memoryview) -> bytes | None:
        return self._held.stand_in(buffer)

    def serve(self) -> None:
        install_display(lambda: self._outputs)
        flush_periodically(lambda: self._outputs)
        signal.signal(signal.SIGINT, self._on_sigint)
        self.send(T.HELLO, {"pid": os.getpid(), "gpu": self.gpu.capabilities() if self.gpu else {"active": False}})
        while True:
            self._serve_one(self._sock.recv_multipart(copy=False))
            # Its objects are gone now that its result has left: the files its inputs came in are held for the
            # next job or let go of now, not when that job comes (unmapping a large frame takes a while).
            self._settle()

    def _serve_one(self, frames: list[zmq.Frame]) -> None:
        """Run the job in a message from the supervisor; what it needs of the message is gone on return."""
        try:
            message, _ = shared_frames.unpack(frames, self.frames_folder or "", remove=False,
                                              released=self._released, held=self._held)
            msg = decode(message)
        except Exception as exc:
            log.error("dropped a malformed job: %s", exc)
            return
        if msg.type is not T.SUBMIT:
            return
        if self._held.missing:
            self.send(T.ERROR, error_header(RemoteMagicError(
                "the worker's job process no longer held an input its worker named instead of sending it (a bug "
                "in remote-magic: please report it with the worker's log); run the cell again: the worker sends "
                "the input whole"), schema.job_of(msg.header)))
            return
        try:
            self.run_job(msg)
        except Exception as exc:  # a bug must cost its job, not the session's state: say it, and go on
            log.exception("failed to run a job")
            self.send(T.ERROR, error_header(RemoteMagicError(
                f"the worker failed to run this job ({type(exc).__name__}: {str(exc)[:500]}); the session's "
                "state is kept. This is a bug in remote-magic: please report it with the worker's log"),
                schema.job_of(msg.header)))

    def _settle(self) -> None:
        """Tell the supervisor which job files this process let go of (it writes the next job's frames over
        them) and, after a job with large frames, which of them it holds for the next (held_frames.py)."""
        try:
            held = self._held.settle()
        except Exception:  # a bug: hold nothing rather than leave the supervisor waiting to hear what is held
            log.exception("failed to check the job's large inputs")
            self._held, held = HeldFrames(), []
        if (released := self._released.take()) or held is not None:
            with self._send_lock:
                self._sock.send_multipart(shared_frames.note(released, held))

    def _on_sigint(self, signum: int, frame: Any) -> None:
        # The supervisor interrupts only a running job; a late signal between jobs is ignored.
        if self._running:
            raise KeyboardInterrupt


def _create_gpu(mode: str, adapter: str | None, backend: str | None, gpu_memory: int | None,
                tab: str | None) -> tuple[Any, str]:
    """The GPU runtime (on the browser tab whose bridge listens at ``tab``, if given), or None and why there is none."""
    if mode == "off":
        return None, GPU_OFF
    try:
        from .gpu import GpuRuntime
    except ImportError as exc:
        log.warning("GPU support is unavailable (%s); cells run on the CPU", exc)
        return None, f"GPU support doesn't load on this worker ({exc}): install it with {install_command('worker')}"
    runtime = GpuRuntime.create(mode=mode, adapter=adapter, backend=backend, tab=tab, gpu_memory=gpu_memory)
    runtime.serve_tinygrad()
    return runtime, ""


def _exit_with_parent(parent: int) -> None:
    """Exit once the worker that started this process is gone (this process is handed to another
    parent then). ``parent`` comes from the worker: one killed while this process was still starting
    would be gone before it could be looked up here."""
    while True:
        if os.getppid() != parent:
            os._exit(0)
        time.sleep(PARENT_CHECK_INTERVAL_S)  # a watchdog's period, not synchronisation


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m remote_magic.worker.executor")
    parser.add_argument("endpoint")
    parser.add_argument("generation", type=int)
    parser.add_argument("--gpu", default="auto", choices=["auto", "on", "off"])
    parser.add_argument("--adapter")
    parser.add_argument("--backend")
    parser.add_argument("--gpu-memory", type=int, default=None, help="bytes of arrays kept on the GPU between cells")
    parser.add_argument("--tab", help="the endpoint of the browser tab whose WebGPU is this executor's GPU")
    parser.add_argument("--frames-folder", help="where large frames to and from the worker are (shared_frames.py)")
    parser.add_argument("--parent", type=int, default=None, help="the worker's pid (default: this one's parent)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("REMOTE_MAGIC_LOG_LEVEL", "WARNING"),
                        format="executor: %(levelname)s %(name)s: %(message)s")
    os.environ["MPLBACKEND"] = MATPLOTLIB_BACKEND
    as_in_a_kernel.install()  # pandas shows wide frames as in the notebook
    warnings.filterwarnings("ignore", message=".*non-interactive.*cannot be shown")
    threading.Thread(target=_exit_with_parent, args=(args.parent or os.getppid(),), name="parent-watchdog",
                     daemon=True).start()
    import numpy  # noqa: F401  (most jobs unpickle arrays; an import cut short by Ctrl-C poisons the process)
    try:
        executor = Executor(args.endpoint, args.generation, args.gpu, args.adapter, args.backend, args.gpu_memory,
                            args.tab)
    except GpuError as exc:  # --gpu on without the adapter asked for: say so, without a traceback
        print(f"remote-worker: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
    if args.frames_folder:
        executor.frames_folder = args.frames_folder
    if "" not in sys.path:
        sys.path.insert(0, "")  # cells import from the working directory first, as in a notebook
    executor.serve()


if __name__ == "__main__":
    main()
