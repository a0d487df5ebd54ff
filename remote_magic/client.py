"""The client API: connect to a hub, run code on a worker, get the results back.

>>> with remote_magic.connect(token) as client:
...     client.run("c = a @ b", {"a": a, "b": b})["c"]

The magics are built on this; scripts and tests use it directly.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import queue
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence, overload

import zmq

from . import errors, fleet_jobs, progress, split_gather, transfer
from .dask_engine import DaskClient, is_dask_address
from .errors import ConnectionFailed, JobError, RemoteMagicError
from .results import FileChanges, JobResult, finish, show_display, write_stream
from .split_gather import SplitResult
from .transfer import Transfer
from .wire import displays, identity, serialization
from .wire.connection import Connection, dial
from .wire.failures import error_from_header, error_header
from .wire.frame_cache import SentDigests
from .wire.handles import RemoteValue
from .wire.lifecycle import JobState, Lifecycle
from .wire.module_state import NAME as MODULE_STATE
from .wire.protocol import (
    DEFAULT_MAX_MESSAGE_BYTES,
    MAX_HEADER_BYTES,
    Message,
    MessageType as T,
    Role,
    encode,
    encode_header,
    session_id,
)
from .wire.requirements import placement_header
from .wire.sizes import human_size
from .wire.tokens import Token
from .wire.versions import describe_differences, local_versions

log = logging.getLogger(__name__)

OnStream = Callable[[Mapping[str, Any]], None]
OnWorkerOutput = Callable[[str, Mapping[str, Any]], None]
"""A callback for output of a job run on several workers: the worker's name, then the STREAM or DISPLAY header."""

DEFAULT_CONNECT_TIMEOUT_S = 10.0
CANCEL_WAIT_S = 5.0
"""After Ctrl-C, how long ``run`` waits for the worker to confirm the job stopped."""


@dataclass
class _Job:
    id: str
    events: "queue.SimpleQueue[Message]" = field(default_factory=queue.SimpleQueue)
    future: "Future[Any] | None" = None
    worker: str = ""
    inputs: dict[str, Any] = field(default_factory=dict)  # a cell's, for what comes back to refer to
    update_inputs: bool = True  # inputs changed in place on the worker are updated in place here too
    shared: list[Any] = field(default_factory=list)  # objects inside the inputs, numbered as the worker numbers them
    notes: list[str] = field(default_factory=list)  # where sending the inputs differs from a local run, in words
    transfers: progress.TransferState = field(default_factory=progress.TransferState)
    whole: "tuple[dict[str, Any], list[Any]] | None" = None  # its SUBMIT with every frame, for a hub that lost some
    ticket: int | None = None  # its SUBMIT's (or ATTACH's) place in the connection's queue (Connection.send)
    lifecycle: Lifecycle = field(init=False)

    def __post_init__(self) -> None:
        self.lifecycle = Lifecycle(self.id, "client")


class Client:
    """A connection to a hub, from a notebook or a script. Use ``connect()`` to make one."""

    def __init__(self, token: Token | str, *, timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
                 name: str | None = None, send_timeout: float | None = None, max_transfer: int | None = None) -> None:
        self.token = token if isinstance(token, Token) else Token.decode(token)
        if self.token.role is not Role.CLIENT:
            raise errors.TokenError("this is a worker token (rmw1.…): it joins a fleet with "
                                    "`REMOTE_MAGIC_JOIN_TOKEN=TOKEN remote-worker --join`. "
                                    "A notebook needs the client token (rmc1.…).")
        self.send_timeout = send_timeout
        self.max_transfer = max_transfer  # bytes this client may send and receive in all (None: no bound)
        self._jobs: dict[str, _Job] = {}
        self._requests: dict[str, Future[dict[str, Any]]] = {}
        self.hub_cache: dict[str, int] = {}  # from the last workers(): {"bytes", "max_bytes"}
        self._lock = threading.Lock()
        self._context = zmq.Context()
        self._versions = local_versions()
        hello = {"role": Role.CLIENT.value, "name": name or platform.node(), "versions": self._versions}
        try:
            sock, welcome = dial(self._context, self.token, hello, timeout)
        except BaseException:
            self._context.term()
            raise
        self.max_message_bytes = int(welcome.header.get("max_message_bytes") or DEFAULT_MAX_MESSAGE_BYTES)
        self._hub_holds = SentDigests(int(welcome.header.get("cache_bytes") or 0))
        # The hub names this client's session on each worker after its routing id, which reconnects keep.
        self.session = session_id(sock.getsockopt(zmq.ROUTING_ID))  # type: ignore[arg-type]
        self._ran_on: set[str] = set()  # workers where this client's jobs started: where it has a session
        self._fleet: list[dict[str, Any]] = list(welcome.header.get("workers", []))
        # Version differences with the workers at connect, in words: %offload_connect shows them.
        self.version_notes = [note for worker in self._fleet for note in self.differences_with(worker)]
        for note in self.version_notes:
            log.info("%s", note)
        self._connection = Connection(self._context, sock, welcome, hello, self._on_message, self._on_lost,
                                      on_progress=self._on_progress, on_reconnect=self._resume)
        self._connection.start()
        log.info("connected to %s", self.token.redacted())

    # -- public API ------------------------------------------------------------------------

    @property
    def bytes_sent(self) -> int:
        """Bytes this client has sent to the hub, as they crossed (compressed, held values as digests)."""
        return self._connection.sent_bytes

    @property
    def bytes_received(self) -> int:
        """Bytes this client has received from the hub, as they crossed."""
        return self._connection.received_bytes

    def run(self, code: str, inputs: Mapping[str, Any] | None = None, outputs: Iterable[str] | None = None,
            *, worker: str | None = None, timeout: float | None = None,
            gpu: bool | list[str] | None = None, require: Iterable[str] | str | None = None,
            prefer: str | None = None) -> dict[str, Any]:
        """Run ``code`` on a worker with ``inputs`` as its globals; return its outputs.

        Returns ``{name: value}`` for the names in ``outputs``, or, when ``outputs`` is None, for
        every name the code binds (star imports and ``globals()`` included) and every input it
        changes in place (``L.sort()``). Remote stdout/stderr stream to the local ones while it
        runs. A remote exception raises ``RemoteError`` with the remote traceback; Ctrl-C stops
        the remote job and re-raises KeyboardInterrupt. ``gpu`` runs numpy array work on the
        worker's GPU: True for every built-in kernel, or a list of kernel names. ``require`` places
        the job on a worker that has what it needs (``["gpu", "memory>=16GB"]``: see docs/fleet.md),
        ``prefer="fastest"`` on the fastest idle one; NoMatchingWorker when no worker could.
        """
        result = self.execute(code, inputs, outputs, worker=worker, timeout=timeout, gpu=gpu, require=require,
                              prefer=prefer)
        if result.kept_on_worker:  # not silently: name what didn't come back
            log.warning("not returned, left on the worker: %s",
                        ", ".join(handle.describe() for handle in result.kept_on_worker.values()))
        return result.values

    def execute(self, code: str, inputs: Mapping[str, Any] | None = None, outputs: Iterable[str] | None = None,
                *, worker: str | None = None, timeout: float | None = None, gpu: bool | list[str] | None = None,
                kernels: Mapping[str, str] | None = None,
                on_stream: Callable[[Mapping[str, Any]], None] = write_stream,
                on_display: Callable[[Mapping[str, Any]], None] = show_display,
                on_module_error: Callable[[str, Any, Exception], None] | None = None,
                figure_formats: Iterable[str] = ("png",), text_format: Mapping[str, Any] | None = None,
                on_files: Callable[[FileChanges], None] | None = None,
                retries: int = 0, on_retry: Callable[[str], None] | None = None,
                require: Iterable[str] | str | None = None, prefer: str | None = None,
                keep: Iterable[str] | None = None, module_state: Mapping[str, Any] | None = None) -> JobResult:
        """Like ``run``, but returns a JobResult with the last expression's value and GPU stats.

        ``kernels`` maps names to custom WGSL sources that the cell may call as ``gpu.NAME``.
        Matplotlib figures come back as images in ``figure_formats`` (png, retina, jpeg, svg, pdf).
        ``text_format``: how the notebook shows values as text (IPython's PlainTextFormatter settings
        ``pprint``, ``float_precision``, ``max_width``, ``max_seq_length``; ``%precision``, ``%pprint``),
        for the worker to render the value alike.
        ``on_files`` is called with the files the code wrote or removed in the worker's working
        directory, when there are any, also when the code then raised.

        ``retries``: when the worker running the code is lost (WorkerLost), run it again, up to this
        many times, on whichever worker is free (the one named by ``worker``, if it rejoined); the code
        may then have run partly on the lost worker. Each retry is logged and told to ``on_retry``.
        No other error is retried; without retries nothing ever runs twice. ``require`` and ``prefer``:
        as ``run``; a malformed requirement raises RequirementError before anything is sent.

        ``keep``: names whose values stay on the worker when the code binds them: the result's
        ``kept_on_worker`` holds a handle for each (later code there uses it in place; ``gather`` brings
        values back).

        ``module_state``: this process's global random generators, numpy print options, rcParams and
        pandas display options (``wire.module_state.capture()``), for the code to run with; what it
        changes of them comes back in ``JobResult.module_state`` (also in a RemoteError's ``partial``),
        for this process to take.
        """
        header = {**_code_header(code, outputs, gpu, kernels, figure_formats, text_format),
                  **placement_header(require, prefer)}
        if keep:
            header["keep"] = list(keep)
        attempts = fleet_jobs.Attempts(retries, "the code", on_retry)
        while True:
            job = self._submit_code(header, inputs, worker, timeout, module_state=module_state)
            msg = self._wait(job, on_stream, on_display)
            try:
                return self._code_result(job, msg, on_module_error, on_files)
            except JobError as error:
                if not attempts.retry(job.worker, error):
                    raise attempts.final(job.worker, error) from None

    def execute_all(self, code: str, inputs: Mapping[str, Any] | None = None, outputs: Iterable[str] | None = None,
                    *, workers: Iterable[str] | None = None, timeout: float | None = None,
                    gpu: bool | list[str] | None = None, kernels: Mapping[str, str] | None = None,
                    on_stream: OnWorkerOutput | None = None, on_display: OnWorkerOutput | None = None,
                    on_module_error: Callable[[str, Any, Exception], None] | None = None,
                    figure_formats: Iterable[str] = ("png",), text_format: Mapping[str, Any] | None = None,
                    inputs_for: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, JobResult]:
        """Run ``code`` on several workers at once, each in this client's session there; ``{worker: JobResult}``.

        ``workers``: their names (default: every worker connected now). Each gets the same ``inputs``,
        and, with ``inputs_for`` ({worker: {name: value}}), its own values on top of them (``split`` sends
        each worker its piece this way); inputs the code changes in place come back per worker, as new
        objects (the notebook's stay as they were). Output is labelled by worker: ``on_stream`` and
        ``on_display`` get the worker's name and the output; by default each part is written under a line
        such as ``[stdout:box]``.
        One worker failing cancels nothing: when any fails, FleetError says which and why, with
        ``failures`` ({worker: error}) and ``results`` (the others' JobResults). Never retried.
        """
        names = list(dict.fromkeys(workers)) if workers is not None else [w["name"] for w in self.workers()]
        if not names:
            raise errors.NoSuchWorker("no worker is connected to the hub: start one (`remote-worker --join`), "
                                      "then run this again")
        labelled = fleet_jobs.LabelledOutput(write_stream, show_display)
        stream, display = on_stream or labelled.stream, on_display or labelled.display
        header = _code_header(code, outputs, gpu, kernels, figure_formats, text_format)
        events: queue.SimpleQueue[Message] = queue.SimpleQueue()
        waits: dict[str, tuple[_Job, OnStream, OnStream]] = {}
        targets: dict[str, str] = {}
        try:
            for name in names:
                own = (inputs_for or {}).get(name)
                job = self._submit_code(header, {**(inputs or {}), **own} if own else inputs, name, timeout, events,
                                        update_inputs=False)  # each worker's change comes back as its own object
                targets[job.id] = name
                waits[job.id] = (job, _for_worker(stream, name), _for_worker(display, name))
        except BaseException:
            for job_id in targets:  # what was sent already stops: the call raises, nobody waits for it
                if self._end(job_id, errors.JobCancelled("the other workers' jobs could not be sent")):
                    self._cancel(job_id)
            raise
        ended = self._wait_all(waits)
        return fleet_jobs.each_result(
            ((targets[job_id], functools.partial(self._code_result, job, ended[job_id], on_module_error, None))
             for job_id, (job, _, _) in waits.items()), names)

    def split(self, code: str, inputs: Mapping[str, Any] | None = None, outputs: Iterable[str] | None = None, *,
              split: Iterable[str] | str, gather: Iterable[str] | str = (), workers: Iterable[str] | None = None,
              timeout: float | None = None, gpu: bool | list[str] | None = None,
              kernels: Mapping[str, str] | None = None, on_stream: OnWorkerOutput | None = None,
              on_display: OnWorkerOutput | None = None,
              on_module_error: Callable[[str, Any, Exception], None] | None = None,
              figure_formats: Iterable[str] = ("png",),
              text_format: Mapping[str, Any] | None = None) -> SplitResult:
        """Run ``code`` on pieces of the ``split`` inputs, one piece per worker at once; concatenate ``gather``.

        Each input named in ``split`` (numpy arrays, lists, tuples, pandas DataFrames and Series, all of one
        length) is cut along axis 0 into contiguous pieces, one per worker of ``workers`` (default: every
        worker connected now), in that order, sized in proportion to each worker's measured ``speed``
        (equal pieces when one has none). An input shorter than the workers runs on fewer of them (the
        fastest; ``SplitResult.notes`` says so). The other inputs go whole to every worker. Each name in
        ``gather`` is concatenated over the pieces in order (``np.concatenate``, list or tuple concatenation,
        ``pd.concat``) into ``SplitResult.gathered``; ``SplitResult.results`` has each worker's JobResult.

        Raises SplitError (nothing ran) when an input can't be split as asked, GatherError (with
        ``results``) when a gathered name's values can't be concatenated, and FleetError as ``execute_all``
        when a piece failed: then nothing is gathered. The other arguments are ``execute_all``'s.
        """
        return split_gather.run(self, code, inputs, split, gather, workers, outputs, timeout=timeout, gpu=gpu,
                                kernels=kernels, on_stream=on_stream, on_display=on_display,
                                on_module_error=on_module_error, figure_formats=figure_formats,
                                text_format=text_format)

    def _submit_code(self, header: dict[str, Any], inputs: Mapping[str, Any] | None, worker: str | None,
                     timeout: float | None, events: "queue.SimpleQueue[Message] | None" = None,
                     update_inputs: bool = True, module_state: Mapping[str, Any] | None = None) -> _Job:
        """Send a cell's job (``header`` from ``_code_header``, copied: each attempt is a job of its own).
        ``update_inputs``: what the cell changes in the inputs is changed in place here too."""
        # Names sharing one object, and arrays viewing another's memory, go as references to it.
        sent, refs = identity.references(dict(inputs or {}))
        if module_state is not None:  # beside the inputs, not one of them (nothing inside it is numbered)
            sent[MODULE_STATE] = dict(module_state)
        header = {**header, "refs": refs} if refs else dict(header)
        walked = identity.shared_objects(inputs or {}) if update_inputs else None
        if walked is not None and walked[0]:  # the worker refers to objects inside the inputs by these numbers
            header["shared"] = walked[1]
        job = self._submit(header, sent, worker, timeout, events=events)
        job.inputs, job.update_inputs = dict(inputs or {}), update_inputs
        job.shared = walked[0] if walked is not None else []
        job.notes = [f"`{name}` went to the worker as a copy, not a view of `{ref['copy']}`: a view that is a "
                     f"{ref.get('kind')} can't cross as a view, so while the cell ran, writing through it didn't "
                     f"change `{ref['copy']}` there" for name, ref in refs.items() if "copy" in ref]
        return job

    def _code_result(self, job: _Job, msg: Message, on_module_error: Callable[[str, Any, Exception], None] | None,
                     on_files: Callable[[FileChanges], None] | None) -> JobResult:
        files = FileChanges.from_header(msg.header.get("files"), str(msg.header.get("worker", job.worker)))
        if files is not None and on_files is not None:
            on_files(files)
        result = self._finish(job, msg, on_module_error)
        result.files = files
        return result

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
        return self._submit_call(fn, args, kwargs, worker=next(iter(holders), None),
                                 placement=placement_header(require, prefer))[1]

    def map(self, fn: Callable[[Any], Any], iterable: Iterable[Any], *, chunksize: int | None = None,
            retries: int = 0, workers: Iterable[str] | None = None, timeout: float | None = None,
            require: Iterable[str] | str | None = None, prefer: str | None = None) -> list[Any]:
        """``[fn(item) for item in iterable]``, run on the workers; the results in input order.

        Blocks until every item is done, as ``multiprocessing.Pool.map``. Items go in chunks of
        ``chunksize``, one job each (default: about four chunks per worker); chunks wait at the hub
        and each worker takes the next as it finishes one, so every worker stays busy. ``workers``:
        only these (default: any). ``timeout``: seconds one chunk may run. When ``fn`` raises, the
        RemoteError names the item, and the chunks not yet done are cancelled. ``retries``: a chunk
        whose worker is lost runs again elsewhere, up to this many times (see ``execute``). ``require``
        and ``prefer``: as ``run``.
        """
        return fleet_jobs.map_chunks(self, fn, iterable, chunksize=chunksize, retries=retries, workers=workers,
                                     timeout=timeout, placement=placement_header(require, prefer))

    def scatter(self, data: Iterable[Any], workers: Iterable[str] | None = None) -> list[RemoteValue]:
        """Put each value of ``data`` on a worker and return a handle to each, in order.

        The values are spread over ``workers`` (default: every worker connected now) in turn, and
        stay in this client's session there. Pass a handle to ``submit`` (the call runs where the
        value is), to ``execute``, or read it in an offloaded cell; ``gather`` brings values back.
        """
        return fleet_jobs.scatter(self, data, workers)

    def gather(self, handles: Iterable[RemoteValue]) -> list[Any]:
        """The values behind ``handles`` (from ``scatter``, or a cell's values kept on a worker), in order.

        One job per worker that holds some. A value that can't be pickled raises OutputError naming it.
        """
        return fleet_jobs.gather(self, handles)

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
        over 1 MB or a second. Raises FileTransferError saying what was wrong.
        """
        return transfer.get(self._file_job, remote_path, local_path, worker=worker, overwrite=overwrite,
                            progress=progress, chunk_bytes=self._chunk_bytes())

    def put_file(self, local_path: str | os.PathLike[str], remote_path: str | None = None, *,
                 worker: str | None = None, overwrite: bool = False, progress: bool | None = None) -> Transfer:
        """Copy a file or a folder (with everything in it) from this machine to a worker.

        ``remote_path`` defaults to the same relative path in the worker's working directory
        (for an absolute ``local_path``, or one with ``..``, its last part). Otherwise as
        ``get_file``.
        """
        return transfer.put(self._file_job, local_path, remote_path, worker=worker, overwrite=overwrite,
                            progress=progress, chunk_bytes=self._chunk_bytes())

    def reset(self, worker: str | None = None) -> list[str]:
        """End this client's session on a worker, so its next job there starts in a fresh interpreter.

        A session holds what earlier jobs left in the worker's process: imports, module globals,
        random seeds, print options, the working directory. ``worker``: the worker's name; None resets
        every worker this client has run a job on. Returns the names of the workers that had a
        session to end. Waits, as a job does, while the worker runs another notebook's job.
        """
        names = [worker] if worker is not None else sorted(self._ran_on)
        reset = []
        for name in names:
            msg = self._wait(self._submit({"kind": "reset"}, {}, name, None), write_stream, show_display)
            if msg.type is T.ERROR:
                error = error_from_header(msg.header)
                if worker is not None or not isinstance(error, errors.NoSuchWorker):
                    raise error
                # else that worker left, and its sessions with it
            with self._lock:
                self._ran_on.discard(name)
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
        listing = self._ask(T.WORKERS, "list its workers", timeout)
        cache = listing.get("cache")
        self.hub_cache = {str(k): v for k, v in (cache if isinstance(cache, dict) else {}).items()
                          if isinstance(v, int)}
        self._fleet = [self._with_sessions(worker) for worker in listing.get("workers", [])]
        return self._fleet

    def jobs(self, timeout: float = DEFAULT_CONNECT_TIMEOUT_S) -> list[dict[str, Any]]:
        """Jobs that outlived the notebook that submitted them (its runtime restarted, its link dropped past the
        heartbeat bound), submitted with this client's token, that wait to be collected with ``attach``:
        ``job``, ``state`` (``running``, or how it ended: ``done``, ``failed``, ...), ``worker``, ``summary``
        (its code's first line), ``detached_s``, ``ended_s``, ``output_bytes`` kept, ``output_dropped``."""
        return list(self._ask(T.JOBS, "list the jobs that wait", timeout).get("jobs", []))

    def attach(self, job_id: str, *, on_stream: OnStream = write_stream, on_display: OnStream = show_display,
               on_module_error: Callable[[str, Any, Exception], None] | None = None) -> JobResult:
        """Collect a job another client with this token submitted (see ``jobs``): its output, shown again in
        order, and then what it still prints while it runs; its JobResult, or its error raised (a
        RemoteError with what the code changed before it raised). NoSuchJob when none waits by that id."""
        job = _Job(str(job_id))
        with self._lock:
            if job.id in self._jobs:
                raise errors.InputError(f"job {job.id!r} is this client's own: wait for it as usual")
            self._jobs[job.id] = job
        try:
            job.ticket = self._connection.send(T.ATTACH, {"job": job.id}, timeout=self.send_timeout)
        except RemoteMagicError as exc:
            self._end(job.id, exc)
            raise
        return self._code_result(job, self._wait(job, on_stream, on_display), on_module_error, None)

    def _ask(self, msg_type: T, what: str, timeout: float) -> dict[str, Any]:
        """Send a request to the hub and wait for its answer's header."""
        request = uuid.uuid4().hex
        future: Future[dict[str, Any]] = Future()
        with self._lock:
            self._requests[request] = future
        try:
            self._connection.send(msg_type, {"request": request})
            return future.result(timeout)
        except TimeoutError:
            raise ConnectionFailed(f"the hub did not {what} within {timeout:g} s") from None
        finally:
            with self._lock:
                self._requests.pop(request, None)

    def close(self) -> None:
        """Disconnect: jobs still running are cancelled by the hub, and their futures end with JobCancelled."""
        self._connection.close()
        self._fail_every_job(errors.JobCancelled("the client was closed before the job finished"))
        self._context.term()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- jobs ------------------------------------------------------------------------------

    def _submit_call(self, fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any], *,
                     worker: str | None = None, timeout: float | None = None, keep: Sequence[str] | None = None,
                     placement: Mapping[str, Any] | None = None) -> "tuple[_Job, Future[Any]]":
        """Call ``fn`` on a worker; its job, and a Future of its return value. With ``keep``, the call
        returns a sequence, whose values stay on the worker: the future holds ``{name: RemoteValue}``."""
        future: Future[Any] = Future()
        header: dict[str, Any] = {"kind": "call", **(placement or {})}
        if keep is not None:
            header["keep"] = list(keep)
        job = self._submit(header, {"fn": fn, "args": tuple(args), "kwargs": dict(kwargs)}, worker, timeout, future)
        future.add_done_callback(lambda f: self._cancel(job.id) if f.cancelled() else None)
        return job, future

    def _submit(self, header: dict[str, Any], values: dict[str, Any], worker: str | None,
                timeout: float | None, future: "Future[Any] | None" = None, frames: Sequence[Any] = (),
                events: "queue.SimpleQueue[Message] | None" = None) -> _Job:
        # Any worker may take the job: pandas objects travel portably unless every worker has our pandas.
        ours = self._versions.get("pandas")
        packed = serialization.pack(values, errors.InputError, portable_pandas=not self._fleet or any(
            (w.get("versions") or {}).get("pandas") != ours for w in self._fleet), one_memo=True)
        self._check_size(packed)
        job = _Job(uuid.uuid4().hex, future=future) if events is None else _Job(uuid.uuid4().hex, events, future)
        header.update(packed.header(), job=job.id, versions=self._versions)
        if worker is not None:
            header["worker"] = worker
        if timeout is not None:
            header["timeout"] = float(timeout)
        code = str(header.get("code", ""))
        # The hub would refuse a header over its limit: say why here. Encoding the header twice is
        # only worth it for a source that could reach the limit (at most 12 bytes a character in JSON).
        if len(code) * 12 + 65536 > MAX_HEADER_BYTES and len(encode_header(header)) > MAX_HEADER_BYTES:
            size = len(code.encode()) / 2**20
            raise errors.InputError(
                f"the cell's source is {size:.1f} MiB, over the {MAX_HEADER_BYTES / 2**20:.0f} MiB a job's header "
                "may hold: keep large data in variables (they travel as frames), not in the source")
        whole = [*packed.frames, *frames]
        sent = whole if header.get("kind") == "file" else self._hub_holds.mark(whole, header)
        if self.max_transfer is not None:
            header["max_result_bytes"] = self._budget_left(serialization.nbytes(sent))
        if "cached" in header:
            job.whole = ({**{k: v for k, v in header.items() if k != "cached"},
                          "digests": {**header["cached"], **header.get("digests", {})}}, whole)
        with self._lock:
            self._jobs[job.id] = job
        try:
            job.ticket = self._connection.send(T.SUBMIT, header, sent, timeout=self.send_timeout)
        except RemoteMagicError as exc:  # nothing was sent
            self._end(job.id, exc)
            raise
        with self._lock:
            if job.lifecycle.state is JobState.QUEUED:  # its answer may be here already
                job.lifecycle.move(JobState.SENT)
        return job

    def _wait(self, job: _Job, on_stream: OnStream = write_stream, on_display: OnStream = show_display,
              bars: bool = True) -> Message:
        """The job's RESULT or ERROR, showing its output meanwhile; Ctrl-C stops it on the worker too."""
        return self._wait_all({job.id: (job, on_stream, on_display)}, bars)[job.id]

    def _wait_all(self, waits: Mapping[str, tuple[_Job, OnStream, OnStream]], bars: bool = True
                  ) -> dict[str, Message]:
        """Each job's RESULT or ERROR, by job id, showing each one's output with its callbacks meanwhile,
        and progress bars for its large messages (unless ``bars`` is False). The jobs share one events
        queue. Ctrl-C stops them on their workers too."""
        events = next(iter(waits.values()))[0].events
        ended: dict[str, Message] = {}
        jobs = [job for job, _, _ in waits.values()] if bars else []
        try:
            with progress.Bars() as shown:
                while len(ended) < len(waits):
                    meanwhile = lambda: shown.update((job.transfers, job.worker) for job in jobs)  # noqa: E731
                    self._take(waits, self._next_event(events, meanwhile), ended)
            return ended
        except KeyboardInterrupt:
            self._interrupt(waits, ended)
            raise
        finally:
            for job_id in waits:  # one that hadn't ended: stop it there too
                if job_id not in ended and self._end(job_id, errors.JobCancelled("stopped in the notebook")):
                    self._cancel(job_id)

    @staticmethod
    def _take(waits: Mapping[str, tuple[_Job, OnStream, OnStream]], msg: Message, ended: dict[str, Message]) -> None:
        """Show one event of a job being waited for, or note its ending in ``ended``."""
        found = waits.get(str(msg.header.get("job")))
        if found is None or msg.header.get("job") in ended:
            return
        job, on_stream, on_display = found
        if msg.type is T.STREAM:
            on_stream(msg.header)
        elif msg.type is T.DISPLAY:
            on_display(msg.header)
        elif msg.type is T.STARTED:
            job.worker = str(msg.header.get("worker", ""))
        elif msg.type in (T.RESULT, T.ERROR):
            ended[job.id] = msg

    def _file_job(self, op: dict[str, Any], frames: Sequence[Any], worker: str | None) -> transfer.Reply:
        """Run one step of a copy (worker/files.py) as a job: its result header, frames and worker."""
        job = self._submit({"kind": "file", "op": op}, {}, worker, None, frames=frames)
        msg = self._wait(job, bars=False)  # the copy shows one bar for all its steps
        if msg.type is T.ERROR:
            raise error_from_header(msg.header)
        return transfer.Reply(dict(msg.header.get("file") or {}), msg.buffers, job.worker)

    def _chunk_bytes(self) -> int:
        """How much of a file one job carries: CHUNK_BYTES, or less under a hub with a small message limit."""
        return max(1, min(transfer.CHUNK_BYTES, self.max_message_bytes - 4096))

    def _budget_left(self, size: int) -> int:
        """What ``max_transfer`` leaves for the results once ``size`` more bytes are sent; OverBudget when
        those bytes alone would pass it."""
        assert self.max_transfer is not None
        left = self.max_transfer - self.bytes_sent - self.bytes_received
        if size > left:
            raise errors.OverBudget(
                f"this job would send {human_size(size)}, more than the {human_size(max(0, left))} left of this "
                f"notebook's transfer budget ({human_size(self.max_transfer)}: max_transfer, %offload_connect "
                "--max-transfer), so nothing was sent. Raise the budget, or send less: values the hub holds "
                "already (sent before, or results) cross as their digest")
        return left - size

    def _check_size(self, packed: serialization.Packed) -> None:
        """Refuse here what the hub's socket would drop without a word."""
        over = serialization.frame_over(packed.names, packed.counts, packed.frames, self.max_message_bytes)
        if over is not None:
            name, largest = over
            raise errors.InputError(
                f"`{name}` needs a {largest / 2**20:.1f} MiB frame, over the hub's "
                f"{self.max_message_bytes / 2**20:.1f} MiB limit: split it, or start remote-worker "
                "with a larger --max-message-size", name)

    def _with_sessions(self, worker: dict[str, Any]) -> dict[str, Any]:
        sessions = (worker.get("stats") or {}).get("sessions")
        sessions = {str(k): v for k, v in sessions.items() if isinstance(v, int)} if isinstance(sessions, dict) else {}
        return {**worker, "sessions": len(sessions), "sessions_memory_bytes": sum(sessions.values()),
                "session_memory_bytes": sessions.get(self.session)}

    @staticmethod
    def _next_event(events: "queue.SimpleQueue[Message]", meanwhile: Callable[[], None] = lambda: None) -> Message:
        """The next event, calling ``meanwhile`` every quarter second until it comes."""
        while True:
            meanwhile()
            try:
                return events.get(timeout=0.25)  # a finite wait keeps Ctrl-C responsive everywhere
            except queue.Empty:
                continue

    def _finish(self, job: _Job, msg: Message, on_module_error: Callable[[str, Any, Exception], None] | None
                ) -> JobResult:
        try:
            result = finish(msg, str(msg.header.get("worker", job.worker)), job.inputs, job.update_inputs,
                            on_module_error, job.shared)
        except errors.RemoteError as error:
            if error.partial is not None:
                error.partial.notes[:0] = job.notes
            raise
        result.notes[:0] = job.notes
        return result

    def _cancel(self, job_id: str) -> None:
        try:
            self._connection.send(T.CANCEL, {"job": job_id})
        except ConnectionFailed:
            pass  # closed: the hub cancels our jobs when we go

    def _interrupt(self, waits: Mapping[str, tuple[_Job, OnStream, OnStream]], ended: dict[str, Message]) -> None:
        """Ctrl-C: a job still being sent stops at once (the rest of its inputs stay here); the workers are
        asked to stop the others, and this waits briefly for them to confirm."""
        for job_id in waits:
            if job_id in ended:
                continue
            if self._abort_upload(job_id):
                stopped = errors.JobCancelled("stopped in the notebook while its inputs were sent: it did not run")
                self._end(job_id, stopped)
                ended[job_id] = Message(T.ERROR, error_header(stopped, job_id))
            self._cancel(job_id)  # in case the hub had it whole already
        events = next(iter(waits.values()))[0].events
        deadline = time.monotonic() + CANCEL_WAIT_S
        try:
            while len(ended) < len(waits):
                self._take(waits, events.get(timeout=max(0.0, deadline - time.monotonic())), ended)
        except (queue.Empty, KeyboardInterrupt):
            log.warning("the worker did not confirm the interrupt; it stops the job on its own")

    def _abort_upload(self, job_id: str) -> bool:
        """Send no more of the job's inputs; True when they hadn't all left."""
        try:
            return self._connection.abort(job_id)
        except (ConnectionFailed, TimeoutError):
            return False

    # -- callbacks from the I/O thread -----------------------------------------------------

    def _on_message(self, msg: Message) -> None:
        if msg.type in (T.WORKERS, T.JOBS):
            with self._lock:
                future = self._requests.get(str(msg.header.get("request")))
            if future is not None and not future.done():
                future.set_result(msg.header)
            return
        if msg.type is T.DISPLAY and msg.buffers:  # a large one's parts came as frames
            msg = Message(T.DISPLAY, displays.unframe(msg.header, msg.buffers))
        job_id = msg.header.get("job")
        if msg.type is T.ERROR and isinstance(msg.header.get("missing"), list) and self._send_whole(str(job_id), msg):
            return
        if msg.type is T.RESULT:
            self._hub_holds.remember(msg.buffers)
        ends = msg.type in (T.RESULT, T.ERROR)
        with self._lock:  # one owner per ending: whoever takes the job out of the table
            job = (self._jobs.pop if ends else self._jobs.get)(job_id, None) if isinstance(job_id, str) else None
            if job is not None and job.lifecycle.state is JobState.QUEUED:
                job.lifecycle.move(JobState.SENT)  # the hub answered before send() returned: it has the job
            if job is not None and ends:
                job.lifecycle.end(msg.header if msg.type is T.ERROR else None)
            elif job is not None and msg.type is T.STARTED:
                job.lifecycle.move(JobState.RUNNING)
                job.worker = str(msg.header.get("worker", ""))
                self._ran_on.add(job.worker)
        if job is None:
            if msg.type is T.ERROR:
                log.warning("the hub says: %s", msg.header.get("message"))
            return
        self._deliver(job, msg)

    def _resume(self) -> None:
        """On the I/O thread, after the connection broke and came back: name the jobs this client waits for,
        so the hub fails any it has no record of (wire/link.py). Only those whose SUBMIT is on the link
        already: one that follows this message is not yet the hub's to know."""
        taken = self._connection.taken
        with self._lock:
            waiting = [job.id for job in self._jobs.values() if job.ticket is not None and job.ticket <= taken]
        self._connection.send_now(encode(T.RESUME, {"jobs": waiting}))

    def _send_whole(self, job_id: str, msg: Message) -> bool:
        """The hub no longer holds values a job sent as digests: send the job again, whole."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None or job.whole is None:
                return False
            whole, job.whole = job.whole, None  # once: a hub that loses them again fails the job
        self._hub_holds.forget([str(key) for key in msg.header["missing"]])
        log.info("the hub no longer holds %d of the values job %s refers to; sending them again",
                 len(msg.header["missing"]), job_id)
        self._connection.send_now(encode(T.SUBMIT, *whole))
        return True

    def _deliver(self, job: _Job, msg: Message) -> None:
        if job.future is None:
            job.events.put(msg)
        else:
            self._settle_future(job, msg)

    def _settle_future(self, job: _Job, msg: Message) -> None:
        assert job.future is not None
        if msg.type is T.STREAM:
            write_stream(msg.header)
        elif msg.type is T.DISPLAY:
            show_display(msg.header)
        elif msg.type in (T.RESULT, T.ERROR):
            if job.future.done():
                return
            try:
                result = self._finish(job, msg, None)  # a scatter's values stayed there: their handles
                job.future.set_result(result.kept_on_worker or result.values.get("result"))
            except RemoteMagicError as exc:
                job.future.set_exception(exc)

    def _on_progress(self, about: Mapping[str, Any], done: int, total: int) -> None:
        job = self._jobs.get(str(about.get("job")))
        if job is not None:
            job.transfers.note(progress.direction(about), done, total)

    def _on_lost(self, reason: str) -> None:
        self._fail_every_job(ConnectionFailed(
            f"{reason}, so this notebook stopped waiting for the job. Unless the hub itself stopped, the job goes "
            "on there: once the hub answers again, `%offload_jobs` (Client.jobs()) lists it and "
            "`%offload_attach JOB` (Client.attach(job)) collects its output and result; if it isn't listed, run it "
            "again. This connection keeps trying"))

    def _fail_every_job(self, error: RemoteMagicError) -> None:
        """End every job still waiting here (its future, or the run() waiting on it) with ``error``."""
        with self._lock:
            job_ids = list(self._jobs)
        for job_id in job_ids:
            self._end(job_id, error)

    def _end(self, job_id: str, error: RemoteMagicError) -> bool:
        """End a job here with ``error`` unless it ended already (then False); its future or run() gets it."""
        with self._lock:
            job = self._jobs.pop(job_id, None)
            if job is None:
                return False
            job.lifecycle.end(error)
        self._deliver(job, Message(T.ERROR, error_header(error, job.id)))
        return True

    def differences_with(self, worker: Mapping[str, Any]) -> list[str]:
        """Versions that differ between this notebook and a worker (from ``workers()``), in words."""
        return describe_differences(self._versions, worker.get("versions") or {},
                                         f"worker {worker.get('name')!r}")


def _code_header(code: str, outputs: Iterable[str] | None, gpu: bool | list[str] | None,
                 kernels: Mapping[str, str] | None, figure_formats: Iterable[str],
                 text_format: Mapping[str, Any] | None) -> dict[str, Any]:
    """What a cell's SUBMIT says, before the inputs are packed."""
    header: dict[str, Any] = {"kind": "code", "code": code, "figure_formats": list(figure_formats),
                              "outputs": None if outputs is None else list(outputs)}
    if text_format:
        header["text_format"] = dict(text_format)
    if gpu:
        header["gpu"] = True if gpu is True else list(gpu)
    if kernels:
        header["kernels"] = dict(kernels)
    return header


def _for_worker(callback: OnWorkerOutput, worker: str) -> OnStream:
    return lambda header: callback(worker, header)


@overload
def connect(token: Token, *, timeout: float = DEFAULT_CONNECT_TIMEOUT_S, name: str | None = None,
            send_timeout: float | None = None, max_transfer: int | None = None) -> Client: ...


@overload
def connect(token: str | None = None, *, timeout: float = DEFAULT_CONNECT_TIMEOUT_S, name: str | None = None,
            send_timeout: float | None = None, max_transfer: int | None = None) -> "Client | DaskClient": ...


def connect(token: str | Token | None = None, *, timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
            name: str | None = None, send_timeout: float | None = None,
            max_transfer: int | None = None) -> "Client | DaskClient":
    """Connect to the hub a token points at (default: $REMOTE_MAGIC_TOKEN), or to a Dask scheduler.

    ``dask://HOST:PORT`` connects to that Dask scheduler instead and returns a DaskClient: the same
    ``run``, ``execute``, ``execute_all``, ``split`` and ``map``, with Dask placing the jobs (docs/fleet.md).

    Raises ConnectionFailed within ``timeout`` seconds with what to check when the hub can't
    be reached or refuses the token. The Client is a context manager.

    Jobs are never dropped: when more are submitted than the link to the hub carries, ``submit``
    and ``run`` wait for room; with ``send_timeout`` they wait at most that long, then raise Busy.

    ``max_transfer`` bounds the bytes this client sends and receives in all (a tunnel's monthly cap):
    a job that would send more than is left raises OverBudget before anything is sent, and results that
    would pass it stay on the worker as handles, saying so (``bytes_sent``, ``bytes_received``).
    """
    token = token or os.environ.get("REMOTE_MAGIC_TOKEN")
    if is_dask_address(token):
        assert isinstance(token, str)  # is_dask_address says so
        return DaskClient(token, timeout=timeout, name=name)
    if not token:
        raise errors.TokenError("no token: pass the line remote-worker printed, or set REMOTE_MAGIC_TOKEN")
    return Client(token, timeout=timeout, name=name, send_timeout=send_timeout, max_transfer=max_transfer)
