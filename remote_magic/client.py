"""The client API: connect to a hub, run code on a worker, get the results back.

>>> with remote_magic.connect(token) as client:
...     client.run("c = a @ b", {"a": a, "b": b})["c"]

The magics are built on this; scripts and tests use it directly. ``Client`` is the hub's ``Engine``
(``engine.py``); its jobs, and what the connection's I/O thread does with their messages, are
``client_jobs.ClientJobs``. ``engines.connect`` opens it for a token.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import queue
from concurrent.futures import Future
from typing import Any, Callable, Iterable, Mapping, Sequence

import zmq

from . import errors, file_copy, fleet_jobs
from .client_jobs import ClientJob, ClientJobs
from .engine import DEFAULT_CONNECT_TIMEOUT_S, Address, ConnectOptions, Engine, LinkTraffic, worker_names
from .errors import JobError
from .file_copy import Transfer
from .job_request import JobRequest, MapRequest, OnModuleError, OnStream
from .results import JobResult, show_display, write_stream
from .wire.connection import dial
from .wire.failures import error_from_header
from .wire.handles import RemoteValue
from .wire.protocol import Message, MessageType as T, Role, session_id
from .wire.requirements import placement_header
from .wire.tokens import Token
from .wire.versions import describe_differences, local_versions

log = logging.getLogger(__name__)


class Client(Engine):
    """A connection to a hub, from a notebook or a script. Use ``connect()`` to make one.

    ``run``, ``execute``, ``execute_all``, ``split`` and ``map`` are the ``Engine``'s (``engine.py``);
    the rest needs a remote-worker hub: sessions on the workers, handles, files, jobs that outlive a client.
    """

    def __init__(self, token: Token | str, *, timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
                 name: str | None = None, send_timeout: float | None = None, max_transfer: int | None = None) -> None:
        self.token = token if isinstance(token, Token) else Token.decode(token)
        if self.token.role is not Role.CLIENT:
            raise errors.TokenError("this is a worker token (rmw1.…): it joins a fleet with "
                                    "`REMOTE_MAGIC_JOIN_TOKEN=TOKEN remote-worker --join`. "
                                    "A notebook needs the client token (rmc1.…).")
        self.address = self.token.address
        self.hub_cache: dict[str, int] = {}  # from the last workers(): {"bytes", "max_bytes"}
        self._context = zmq.Context()
        self._versions = local_versions()
        hello = {"role": Role.CLIENT.value, "name": name or platform.node(), "versions": self._versions}
        try:
            sock, welcome = dial(self._context, self.token, hello, timeout)
        except BaseException:
            self._context.term()
            raise
        # The hub names this client's session on each worker after its routing id, which reconnects keep.
        self.session = session_id(sock.getsockopt(zmq.ROUTING_ID))  # type: ignore[arg-type]
        self._jobs = ClientJobs(self._context, sock, welcome, hello, self._versions, send_timeout=send_timeout,
                             max_transfer=max_transfer)
        self._fleet: list[dict[str, Any]] = []
        self._know_fleet(list(welcome.header.get("workers", [])))
        # Version differences with the workers at connect, in words: %offload_connect shows them.
        self.version_notes = [note for worker in self._fleet for note in self.differences_with(worker)]
        for note in self.version_notes:
            log.info("%s", note)
        self._jobs.connection.start()
        log.info("connected to %s", self.token.redacted())

    @classmethod
    def open(cls, address: Address, options: ConnectOptions) -> "Client":
        """``connect`` with a token: a Client of its hub."""
        return cls(address.location, timeout=options.timeout, name=options.name, send_timeout=options.send_timeout,
                   max_transfer=options.max_transfer)

    # -- public API ------------------------------------------------------------------------

    @property
    def bytes_sent(self) -> int:
        """Bytes this client has sent to the hub, as they crossed (compressed, held values as digests)."""
        return self._jobs.connection.sent_bytes

    @property
    def bytes_received(self) -> int:
        """Bytes this client has received from the hub, as they crossed."""
        return self._jobs.connection.received_bytes

    @property
    def max_transfer(self) -> int | None:
        """Bytes this client may send and receive in all (None: no bound); settable."""
        return self._jobs.max_transfer

    @max_transfer.setter
    def max_transfer(self, budget: int | None) -> None:
        self._jobs.max_transfer = budget

    @property
    def send_timeout(self) -> float | None:
        """How long a submit may wait for room on the link before Busy (None: as long as it takes); settable."""
        return self._jobs.send_timeout

    @send_timeout.setter
    def send_timeout(self, seconds: float | None) -> None:
        self._jobs.send_timeout = seconds

    @property
    def outage_grace(self) -> float:
        """How long a waiting job rides out a link that went down before it fails with ConnectionFailed
        (default: the hub's ``--outage-grace``); settable."""
        return self._jobs.connection.outage_grace

    @outage_grace.setter
    def outage_grace(self, seconds: float) -> None:
        self._jobs.connection.outage_grace = float(seconds)

    def traffic(self) -> LinkTraffic:
        """Bytes over the link to the hub so far, as they crossed, and ``max_transfer``."""
        return LinkTraffic(self.bytes_sent, self.bytes_received, self.max_transfer)

    def limit_link(self, *, max_transfer: int | None = None, outage_grace: float | None = None) -> None:
        """Set ``max_transfer`` and ``outage_grace``, those given."""
        if max_transfer is not None:
            self.max_transfer = max_transfer
        if outage_grace is not None:
            self.outage_grace = outage_grace

    @property
    def max_message_bytes(self) -> int:
        """The largest message the hub takes (its --max-message-size)."""
        return self._jobs.max_message_bytes

    def run_job(self, request: JobRequest) -> JobResult:
        """``execute``: the job, run again on another worker when its worker is lost (``retries``)."""
        attempts = fleet_jobs.Attempts(request.retries, "the code", request.on_retry)
        while True:
            job = self._jobs.submit_code(request)
            msg = self._jobs.wait(job, request.on_stream, request.on_display)
            try:
                return self._jobs.result(job, msg, request.on_module_error, request.on_files)
            except JobError as error:
                if not attempts.retry(job.worker, error):
                    raise attempts.final(job.worker, error) from None

    def run_each(self, requests: Sequence[JobRequest]) -> list[Callable[[], JobResult]]:
        """``execute_all``: every job sent, then waited for together; never retried."""
        if not requests:
            raise errors.NoSuchWorker("no worker is connected to the hub: start one (`remote-worker --join`), "
                                      "then run this again")
        events: queue.SimpleQueue[Message] = queue.SimpleQueue()
        sent: list[tuple[ClientJob, JobRequest]] = []
        try:
            for request in requests:
                sent.append((self._jobs.submit_code(request, events), request))
        except BaseException:
            for job, _ in sent:  # what was sent already stops: the call raises, nobody waits for it
                if self._jobs.end(job.id, errors.JobCancelled("the other workers' jobs could not be sent")):
                    self._jobs.cancel(job.id)
            raise
        ended = self._jobs.wait_all({job.id: (job, request.on_stream, request.on_display) for job, request in sent})
        return [functools.partial(self._jobs.result, job, ended[job.id], request.on_module_error, None)
                for job, request in sent]

    def run_map(self, request: MapRequest) -> list[Any]:
        """``map``: the chunks as call jobs, each worker taking the next as it finishes one."""
        placement = placement_header(request.require, request.prefer)
        chunked = fleet_jobs.chunks(request.items, request.chunksize, request.workers, self.workers)
        return fleet_jobs.map_chunks(self._jobs, request.fn, chunked, retries=request.retries,
                                     workers=request.workers, timeout=request.timeout, placement=placement)

    def submit(self, fn: Callable[..., Any], *args: Any, require: Iterable[str] | str | None = None,
               prefer: str | None = None, **kwargs: Any) -> "Future[Any]":
        """Call ``fn(*args, **kwargs)`` on a worker; a Future holds its return value.

        ``fn`` travels with cloudpickle (by value when defined in the notebook). Its output
        streams to the local stdout/stderr. Cancelling the future cancels the remote job.
        An argument that is a handle (``RemoteValue``, from ``scatter``) is its value there, and the
        call runs on the worker that holds it. ``require`` and ``prefer`` place it as in ``run`` (so
        they are not passed on to ``fn``).
        """
        holders = {value.worker for value in (*args, *kwargs.values()) if isinstance(value, RemoteValue)}
        if len(holders) > 1:
            raise errors.InputError(f"the arguments are handles to values on different workers "
                                    f"({', '.join(sorted(holders))}): a call runs on one worker; gather them, "
                                    "or scatter them to the same worker")
        return self._jobs.submit_call(fn, args, kwargs, worker=next(iter(holders), None),
                                      placement=placement_header(require, prefer))[1]

    def scatter(self, data: Iterable[Any], workers: Iterable[str] | None = None) -> list[RemoteValue]:
        """Put each value of ``data`` on a worker and return a handle to each, in order.

        The values are spread over ``workers`` (default: every worker connected now) in turn, and
        stay in this client's session there. Pass a handle to ``submit`` (the call runs where the
        value is), to ``execute``, or read it in an offloaded cell; ``gather`` brings values back.
        """
        return fleet_jobs.scatter(self._jobs, data, worker_names(self, workers))

    def gather(self, handles: Iterable[RemoteValue]) -> list[Any]:
        """The values behind ``handles`` (from ``scatter``, or a cell's values kept on a worker), in order.

        One job per worker that holds some. A value that can't be pickled raises OutputError naming it.
        """
        return fleet_jobs.gather(self._jobs, handles)

    def pull(self, handle: RemoteValue, *, timeout: float | None = None) -> Any:
        """The value behind one handle, brought here, with a progress bar while a large one crosses.

        For handles from ``execute(..., keep=...)``, ``scatter``, or values that couldn't cross; a value
        that can't be pickled raises OutputError naming it (it stays there). ``gather`` brings several.
        """
        if not isinstance(handle, RemoteValue):
            raise errors.InputError(f"pull takes a handle (RemoteValue), not {type(handle).__name__}")
        result = self.execute("", {handle.name: handle}, [handle.name], worker=handle.worker, timeout=timeout)
        return result.values[handle.name]

    def get_file(self, remote_path: str, local_path: str | os.PathLike[str] | None = None, *,
                 worker: str | None = None, overwrite: bool = False, progress: bool | None = None) -> Transfer:
        """Copy a file or a folder (with everything in it) from a worker to this machine.

        ``remote_path`` is relative to the worker's working directory (where cells run), or
        absolute. ``local_path`` defaults to the same relative path here (for an absolute path,
        or one with ``..``, its last part in the current directory). An existing destination is
        refused unless ``overwrite``. Data moves in chunks, each a job on the one worker (the
        first that answers, unless ``worker`` names one), into a temporary file renamed at the
        end, so an interrupted copy leaves nothing under the final name; sizes and digests are
        checked. ``progress``: a progress bar always (True), never (False), or (None) for copies
        of 1 MiB or more, or that take over a second. Raises FileTransferError saying what was wrong.
        """
        return file_copy.get(self._file_job, remote_path, local_path, worker=worker, overwrite=overwrite,
                            progress=progress, chunk_bytes=self._chunk_bytes())

    def put_file(self, local_path: str | os.PathLike[str], remote_path: str | None = None, *,
                 worker: str | None = None, overwrite: bool = False, progress: bool | None = None) -> Transfer:
        """Copy a file or a folder (with everything in it) from this machine to a worker.

        ``remote_path`` defaults to the same relative path in the worker's working directory
        (for an absolute ``local_path``, or one with ``..``, its last part). Otherwise as
        ``get_file``.
        """
        return file_copy.put(self._file_job, local_path, remote_path, worker=worker, overwrite=overwrite,
                            progress=progress, chunk_bytes=self._chunk_bytes())

    def reset(self, worker: str | None = None) -> list[str]:
        """End this client's session on a worker, so its next job there starts in a fresh interpreter.

        A session holds what earlier jobs left in the worker's process: imports, module globals,
        random seeds, print options, the working directory. ``worker``: the worker's name; None resets
        every worker this client has run a job on. Returns the names of the workers that had a
        session to end. Waits, as a job does, while the worker runs another notebook's job.
        """
        names = [worker] if worker is not None else sorted(self._jobs.ran_on)
        reset = []
        for name in names:
            msg = self._jobs.wait(self._jobs.submit({"kind": "reset"}, {}, name, None), write_stream, show_display)
            if msg.type is T.ERROR:
                error = error_from_header(msg.header)
                if worker is not None or not isinstance(error, errors.NoSuchWorker):
                    raise error
                # else that worker left, and its sessions with it
            self._jobs.forget_session(name)
            if msg.header.get("reset"):
                reset.append(name)
        return reset

    def workers(self, timeout: float = DEFAULT_CONNECT_TIMEOUT_S) -> list[dict[str, Any]]:
        """The fleet: one dict per worker (name, host, platform, Python, CPUs, memory, GPU, state, jobs done).

        Placement: ``labels`` (``remote-worker --label``), ``speed`` (what ``prefer="fastest"`` compares),
        ``battery`` ({percent, plugged_in}, or None without one), ``on_battery``, ``min_battery``, and
        ``held`` (why its battery keeps it from taking jobs now, or None). Accounting, as the hub counts
        it: ``jobs_done``, ``busy_s`` (seconds from handing it a job to the job's end, summed), ``gpu_s``
        (GPU time its results report), ``bytes_in`` (jobs sent to it) and ``bytes_out`` (what it sent back).

        Each also has ``sessions`` (how many notebooks' interpreters it keeps), ``sessions_memory_bytes``
        (what they use, resident) and ``session_memory_bytes`` (this client's own session, or None when it
        has none there), as of the worker's last heartbeat.

        It also updates ``hub_cache``: how many bytes of this client's large values the hub keeps
        (``bytes``), and at most (``max_bytes``); a value it keeps crosses again as its digest.
        """
        listing = self._jobs.ask(T.WORKERS, "list its workers", timeout)
        cache = listing.get("cache")
        self.hub_cache = {str(k): v for k, v in (cache if isinstance(cache, dict) else {}).items()
                          if isinstance(v, int)}
        self._know_fleet([self._with_sessions(worker) for worker in listing.get("workers", [])])
        return self._fleet

    def jobs(self, timeout: float = DEFAULT_CONNECT_TIMEOUT_S) -> list[dict[str, Any]]:
        """Jobs that outlived the notebook that submitted them (its runtime restarted, its link dropped past the
        heartbeat bound), submitted with this client's token, that wait to be collected with ``attach``:
        ``job``, ``state`` (``running``, or how it ended: ``done``, ``failed``, ...), ``worker``, ``summary``
        (its code's first line), ``detached_s``, ``ended_s``, ``output_bytes`` kept, ``output_dropped``."""
        return list(self._jobs.ask(T.JOBS, "list the jobs that wait", timeout).get("jobs", []))

    def attach(self, job_id: str, *, on_stream: OnStream = write_stream, on_display: OnStream = show_display,
               on_module_error: OnModuleError | None = None) -> JobResult:
        """Collect a job another client with this token submitted (see ``jobs``): its output, shown again in
        order, and then what it still prints while it runs; its JobResult, or its error raised (a
        RemoteError with what the code changed before it raised). NoSuchJob when none waits by that id."""
        job = self._jobs.attach(str(job_id))
        return self._jobs.result(job, self._jobs.wait(job, on_stream, on_display), on_module_error, None)

    def close(self) -> None:
        """Disconnect: jobs still running are cancelled by the hub, and their futures end with JobCancelled."""
        self._jobs.close()
        self._context.term()

    # -- helpers -----------------------------------------------------------------------------

    def _know_fleet(self, fleet: list[dict[str, Any]]) -> None:
        """Take the workers as the hub listed them. Any may take a job: pandas objects travel portably
        unless every worker has this process's pandas."""
        self._fleet = fleet
        ours = self._versions.get("pandas")
        self._jobs.portable_pandas = not fleet or any((w.get("versions") or {}).get("pandas") != ours for w in fleet)

    def _file_job(self, op: dict[str, Any], frames: Sequence[Any], worker: str | None) -> file_copy.Reply:
        """Run one step of a copy (worker/files.py) as a job: its result header, frames and worker."""
        job = self._jobs.submit({"kind": "file", "op": op}, {}, worker, None, frames=frames)
        msg = self._jobs.wait(job, bars=False)  # the copy shows one bar for all its steps
        if msg.type is T.ERROR:
            raise error_from_header(msg.header)
        return file_copy.Reply(dict(msg.header.get("file") or {}), msg.buffers, job.worker)

    def _chunk_bytes(self) -> int:
        """How much of a file one job carries: CHUNK_BYTES, or less under a hub with a small message limit."""
        return max(1, min(file_copy.CHUNK_BYTES, self.max_message_bytes - 4096))

    def _with_sessions(self, worker: dict[str, Any]) -> dict[str, Any]:
        sessions = (worker.get("stats") or {}).get("sessions")
        sessions = {str(k): v for k, v in sessions.items() if isinstance(v, int)} if isinstance(sessions, dict) else {}
        return {**worker, "sessions": len(sessions), "sessions_memory_bytes": sum(sessions.values()),
                "session_memory_bytes": sessions.get(self.session)}

    def differences_with(self, worker: Mapping[str, Any]) -> list[str]:
        """Versions that differ between this notebook and a worker (from ``workers()``), in words."""
        return describe_differences(self._versions, worker.get("versions") or {},
                                         f"worker {worker.get('name')!r}")

