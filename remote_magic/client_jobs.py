"""The jobs of one hub ``Client``, on its connection: the table of those waiting for an answer, what the
connection's I/O thread does with each message about them, and the waiting for them.

``Client`` (``client.py``) is the user's API: it submits and waits through ``ClientJobs``. The connection's
I/O thread (``wire.connection.Connection``) calls the ``_on_*`` callbacks here: a message about a job goes
to its events queue, or settles its Future (a ``submit``), and a job ends once, whoever ends it first (its
RESULT or ERROR, a lost link, Ctrl-C, ``close``): that one takes it out of the table.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Sequence

import zmq

from . import errors, progress
from .errors import ConnectionFailed, RemoteMagicError
from .job_request import JobRequest, OnModuleError, OnStream, submit_message
from .results import FileChanges, JobResult, finish, show_display, write_stream
from .wire import displays, serialization
from .wire.connection import Connection
from .wire.failures import error_header, is_error
from .wire.frame_cache import SentDigests
from .wire.lifecycle import JobState, Lifecycle
from .wire.protocol import (
    DEFAULT_MAX_MESSAGE_BYTES,
    MAX_HEADER_BYTES,
    Message,
    MessageType as T,
    encode,
    encode_header,
)
from .wire.sizes import human_size

log = logging.getLogger(__name__)

CANCEL_WAIT_S = 5.0
"""After Ctrl-C, how long a wait gives the workers to confirm the jobs stopped."""


@dataclass
class ClientJob:
    """A job the hub ``Client`` waits for: where its messages go, and what its result refers to (the hub's
    own record of it is ``hub.records.JobRecord``)."""

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
    received: int = 0  # how many of the messages the hub journals for it came here (hub/detached.py)
    forgotten: Literal["", "waiting", "collected"] = ""  # the hub forgot this client while the job waited:
    # waiting for the hub to welcome it back, or collected again since (_on_forgotten)
    lifecycle: Lifecycle = field(init=False)

    def __post_init__(self) -> None:
        self.lifecycle = Lifecycle(self.id, "client")


_JOURNALED = (T.STARTED, T.STREAM, T.DISPLAY)
"""The messages about a job that the hub keeps in its journal, besides its end (hub/detached.py)."""

Waits = Mapping[str, "tuple[ClientJob, OnStream, OnStream]"]
"""The jobs one wait is for, by id, each with its output's callbacks (stream, display)."""


class ClientJobs:
    """The jobs of one ``Client`` on its connection to the hub: submitted, followed, waited for.

    ``send_timeout``, ``max_transfer`` and ``portable_pandas`` are the client's settings, read at each
    submit; ``ran_on`` names the workers where a job started (where the client has a session).
    """

    def __init__(self, context: zmq.Context[Any], sock: zmq.Socket[Any], welcome: Message, hello: dict[str, Any],
                 versions: dict[str, str], *, send_timeout: float | None, max_transfer: int | None) -> None:
        self.send_timeout = send_timeout
        self.max_transfer = max_transfer  # bytes sent and received in all (None: no bound)
        self.portable_pandas = True  # pandas objects travel portably unless every worker has our pandas
        self.max_message_bytes = int(welcome.header.get("max_message_bytes") or DEFAULT_MAX_MESSAGE_BYTES)
        self.ran_on: set[str] = set()
        self._versions = versions
        self._hub_holds = SentDigests(int(welcome.header.get("cache_bytes") or 0))
        self._jobs: dict[str, ClientJob] = {}
        self._requests: dict[str, Future[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self.connection = Connection(context, sock, welcome, hello, self._on_message, self._on_lost,
                                     on_progress=self._on_progress, on_reconnect=self._resume,
                                     on_outage=self._on_outage, on_forgotten=self._on_forgotten)

    def __len__(self) -> int:
        """How many jobs wait for their end."""
        with self._lock:
            return len(self._jobs)

    def close(self) -> None:
        """Close the connection; the jobs still waiting end with JobCancelled (the hub cancels them)."""
        self.connection.close()
        self._fail_every_job(lambda job_id: errors.JobCancelled("the client was closed before the job finished"))

    # -- submitting --------------------------------------------------------------------------

    def submit_code(self, request: JobRequest, events: "queue.SimpleQueue[Message] | None" = None) -> ClientJob:
        """Send a cell's job (each attempt is a job of its own); its messages go to ``events`` when given
        (the jobs of one ``execute_all`` share a queue)."""
        cell = request.submit()
        job = self.submit(cell.header, cell.values, request.worker, request.timeout, events=events)
        job.inputs, job.update_inputs = dict(request.inputs), request.update_inputs
        job.shared, job.notes = cell.shared, cell.notes
        return job

    def submit_call(self, fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any], *,
                    worker: str | None = None, timeout: float | None = None, keep: Sequence[str] | None = None,
                    placement: Mapping[str, Any] | None = None) -> "tuple[ClientJob, Future[Any]]":
        """Call ``fn`` on a worker; its job, and a Future of its return value. With ``keep``, the call
        returns a sequence, whose values stay on the worker: the future holds ``{name: RemoteValue}``.
        Cancelling the future cancels the job (``fleet_jobs.Calls``)."""
        future: Future[Any] = Future()
        header: dict[str, Any] = {"kind": "call", **(placement or {})}
        if keep is not None:
            header["keep"] = list(keep)
        job = self.submit(header, {"fn": fn, "args": tuple(args), "kwargs": dict(kwargs)}, worker, timeout, future)
        future.add_done_callback(lambda f: self.cancel(job.id) if f.cancelled() else None)
        return job, future

    def submit(self, header: dict[str, Any], values: dict[str, Any], worker: str | None, timeout: float | None,
               future: "Future[Any] | None" = None, frames: Sequence[Any] = (),
               events: "queue.SimpleQueue[Message] | None" = None) -> ClientJob:
        """Finish the job's SUBMIT (``job_request.submit_message``: ``header`` is updated in place) and send it, with
        ``frames`` after the values' own: through the link, the hub keeping large frames it holds already."""
        job_id = uuid.uuid4().hex
        job = ClientJob(job_id, future=future) if events is None else ClientJob(job_id, events, future)
        packed = submit_message(header, values, job_id=job.id, versions=self._versions,
                                portable_pandas=self.portable_pandas)
        self._check_size(packed)
        if worker is not None:
            header["worker"] = worker
        if timeout is not None:
            header["timeout"] = float(timeout)
        code = str(header.get("code", ""))
        # The hub would refuse a header over its limit: say why here. Encoding the header twice is
        # only worth it for a source that could reach the limit (at most 12 bytes a character in JSON).
        if len(code) * 12 + 65536 > MAX_HEADER_BYTES and len(encode_header(header)) > MAX_HEADER_BYTES:
            raise errors.InputError(
                f"the cell's source is {human_size(len(code.encode()))}, over the {human_size(MAX_HEADER_BYTES)} a "
                "job's header may hold: keep large data in variables (they travel as frames), not in the source")
        whole = [*packed.frames, *frames]
        sent = whole if header.get("kind") == "file" else self._hub_holds.mark(whole, header)
        if self.max_transfer is not None:
            header["max_result_bytes"] = self._budget_left(self.max_transfer, serialization.nbytes(sent))
        if "cached" in header:
            job.whole = ({**{k: v for k, v in header.items() if k != "cached"},
                          "digests": {**header["cached"], **header.get("digests", {})}}, whole)
        with self._lock:
            self._jobs[job.id] = job
        try:
            job.ticket = self.connection.send(T.SUBMIT, header, sent, timeout=self.send_timeout)
        except RemoteMagicError as exc:  # nothing was sent
            self.end(job.id, exc)
            raise
        with self._lock:
            if job.lifecycle.state is JobState.QUEUED:  # its answer may be here already
                job.lifecycle.move(JobState.SENT)
        return job

    def attach(self, job_id: str) -> ClientJob:
        """Follow a job another client with this token submitted (``Client.attach``)."""
        job = ClientJob(job_id)
        with self._lock:
            if job.id in self._jobs:
                raise errors.InputError(f"job {job.id!r} is this client's own: wait for it as usual")
            self._jobs[job.id] = job
        try:
            job.ticket = self.connection.send(T.ATTACH, {"job": job.id}, timeout=self.send_timeout)
        except RemoteMagicError as exc:
            self.end(job.id, exc)
            raise
        return job

    def ask(self, msg_type: T, what: str, timeout: float) -> dict[str, Any]:
        """Send a request to the hub (WORKERS, JOBS) and wait for its answer's header."""
        request = uuid.uuid4().hex
        future: Future[dict[str, Any]] = Future()
        with self._lock:
            self._requests[request] = future
        try:
            self.connection.send(msg_type, {"request": request})
            return future.result(timeout)
        except TimeoutError:
            raise ConnectionFailed(f"the hub did not {what} within {timeout:g} s") from None
        finally:
            with self._lock:
                self._requests.pop(request, None)

    def forget_session(self, worker: str) -> None:
        """The client's session on ``worker`` ended (``reset``)."""
        with self._lock:
            self.ran_on.discard(worker)

    def _budget_left(self, budget: int, size: int) -> int:
        """What ``budget`` leaves for the results once ``size`` more bytes are sent; OverBudget when
        those bytes alone would pass it."""
        left = budget - self.connection.sent_bytes - self.connection.received_bytes
        if size > left:
            raise errors.OverBudget(
                f"this job would send {human_size(size)}, more than the {human_size(max(0, left))} left of this "
                f"notebook's transfer budget ({human_size(budget)}: max_transfer, %offload_connect "
                "--max-transfer), so nothing was sent. Raise the budget, or send less: values the hub holds "
                "already (sent before, or results) cross as their digest")
        return left - size

    def _check_size(self, packed: serialization.Packed) -> None:
        """Refuse here what the hub's socket would drop without a word."""
        over = serialization.frame_over(packed.names, packed.counts, packed.frames, self.max_message_bytes)
        if over is not None:
            name, largest = over
            raise errors.InputError(
                f"`{name}` needs a {human_size(largest)} frame, over the hub's {human_size(self.max_message_bytes)} "
                "limit: split it, or start remote-worker with a larger --max-message-size", name)

    # -- waiting -----------------------------------------------------------------------------

    def wait(self, job: ClientJob, on_stream: OnStream = write_stream, on_display: OnStream = show_display,
             bars: bool = True) -> Message:
        """The job's RESULT or ERROR, showing its output meanwhile; Ctrl-C stops it on the worker too."""
        return self.wait_all({job.id: (job, on_stream, on_display)}, bars)[job.id]

    def wait_all(self, waits: Waits, bars: bool = True) -> dict[str, Message]:
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
                    _take(waits, _next_event(events, meanwhile), ended)
            return ended
        except KeyboardInterrupt:
            running = {job_id: job.worker for job_id, (job, _, _) in waits.items() if job_id not in ended}
            self._interrupt(waits, ended)
            raise errors.JobInterrupted(running) from None
        finally:
            for job_id in waits:  # one that hadn't ended: stop it there too
                if job_id not in ended and self.end(job_id, errors.JobCancelled("stopped in the notebook")):
                    self.cancel(job_id)

    def result(self, job: ClientJob, msg: Message, on_module_error: OnModuleError | None,
               on_files: Callable[[FileChanges], None] | None) -> JobResult:
        """A cell's JobResult from its ending, or its error raised; ``on_files`` gets the files it wrote."""
        files = FileChanges.from_header(msg.header.get("files"), str(msg.header.get("worker", job.worker)))
        if files is not None and on_files is not None:
            on_files(files)
        result = self._finish(job, msg, on_module_error)
        result.files = files
        return result

    def end(self, job_id: str, error: RemoteMagicError) -> bool:
        """End a job here with ``error`` unless it ended already (then False); its future or wait gets it."""
        with self._lock:
            job = self._jobs.pop(job_id, None)
            if job is None:
                return False
            job.lifecycle.end(error)
        self._deliver(job, Message(T.ERROR, error_header(error, job.id)))
        return True

    def cancel(self, job_id: str) -> None:
        """Ask the hub to stop a job."""
        try:
            self.connection.send(T.CANCEL, {"job": job_id})
        except ConnectionFailed:
            pass  # closed: the hub cancels our jobs when we go

    def _finish(self, job: ClientJob, msg: Message, on_module_error: OnModuleError | None) -> JobResult:
        return finish(msg, str(msg.header.get("worker", job.worker)), job.inputs, job.update_inputs,
                      on_module_error, job.shared, job.notes)

    def _interrupt(self, waits: Waits, ended: dict[str, Message]) -> None:
        """Ctrl-C: a job still being sent stops at once (the rest of its inputs stay here), and so does one whose
        result is coming down (the hub sends no more of it); the workers are asked to stop the others, and this
        waits briefly for them to confirm."""
        for job_id, (job, _, _) in waits.items():
            if job_id in ended:
                continue
            stopped = None
            if self._abort_upload(job_id):
                stopped = errors.JobCancelled("stopped in the notebook while its inputs were sent: it did not run")
            self.cancel(job_id)  # in case the hub had it whole already; for one coming down, the hub stops sending
            if stopped is None and _coming_down(job):  # the hub's answer would wait behind what is in flight
                stopped = errors.JobCancelled("stopped in the notebook while its result came down")
            if stopped is not None:
                self.end(job_id, stopped)
                ended[job_id] = Message(T.ERROR, error_header(stopped, job_id))
        events = next(iter(waits.values()))[0].events
        deadline = time.monotonic() + CANCEL_WAIT_S
        try:
            while len(ended) < len(waits):
                _take(waits, events.get(timeout=max(0.0, deadline - time.monotonic())), ended)
        except (queue.Empty, KeyboardInterrupt):
            log.warning("the worker did not confirm the interrupt; it stops the job on its own")

    def _abort_upload(self, job_id: str) -> bool:
        """Send no more of the job's inputs; True when they hadn't all left."""
        try:
            return self.connection.abort(job_id)
        except (ConnectionFailed, TimeoutError):
            return False

    # -- callbacks from the I/O thread -------------------------------------------------------

    def _on_message(self, msg: Message) -> None:
        if msg.type in (T.WORKERS, T.JOBS):
            with self._lock:
                future = self._requests.get(str(msg.header.get("request")))
            if future is not None and not future.done():
                future.set_result(msg.header)
            return
        if msg.type is T.WELCOME:
            self._collect_forgotten()
            return
        if msg.type is T.DISPLAY and msg.buffers:  # a large one's parts came as frames
            msg = Message(T.DISPLAY, displays.unframe(msg.header, msg.buffers))
        job_id = msg.header.get("job")
        if msg.type is T.ERROR and isinstance(msg.header.get("missing"), list) and self._send_whole(str(job_id), msg):
            return
        if msg.type is T.ERROR and is_error(msg.header, errors.NotConnected) and self._collecting_again(job_id):
            return  # refused by a hub that forgot us: whether it has the job, its answer to ATTACH says
        if msg.type is T.RESULT:
            self._hub_holds.remember(msg.buffers)
        ends = msg.type in (T.RESULT, T.ERROR)
        with self._lock:  # one owner per ending: whoever takes the job out of the table
            job = (self._jobs.pop if ends else self._jobs.get)(job_id, None) if isinstance(job_id, str) else None
            if job is not None and job.lifecycle.state is JobState.QUEUED:
                job.lifecycle.move(JobState.SENT)  # the hub answered before send() returned: it has the job
            if job is not None and ends:
                if job.forgotten == "collected" and is_error(msg.header, errors.NoSuchJob):
                    msg = Message(T.ERROR, error_header(ConnectionFailed(
                        "the hub forgot this connection (it restarted, or timed it out) and this job no longer "
                        "waits there: it never reached the hub, the hub restarted (then its result is lost), or "
                        "another notebook with this token collected it. Run it again"), job.id))
                job.lifecycle.end(msg.header if msg.type is T.ERROR else None)
            elif job is not None and msg.type in _JOURNALED and msg.header.get("journaled", True) is not False:
                job.received += 1
            if job is not None and msg.type is T.STARTED:
                job.lifecycle.move(JobState.RUNNING)
                job.worker = str(msg.header.get("worker", ""))
                self.ran_on.add(job.worker)
        if job is None:
            if msg.type is T.ERROR:
                log.warning("the hub says: %s", msg.header.get("message"))
            return
        self._deliver(job, msg)

    def _resume(self) -> None:
        """On the I/O thread, after the connection broke and came back: name the jobs this client waits for,
        so the hub fails any it has no record of (wire/link.py). Only those whose SUBMIT is on the link
        already: one that follows this message is not yet the hub's to know."""
        taken = self.connection.taken
        with self._lock:
            waiting = [job.id for job in self._jobs.values() if job.ticket is not None and job.ticket <= taken]
        self.connection.send_now(encode(T.RESUME, {"jobs": waiting}))

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
        self.connection.send_now(encode(T.SUBMIT, *whole))
        return True

    def _deliver(self, job: ClientJob, msg: Message) -> None:
        if job.future is None:
            job.events.put(msg)
        else:
            self._settle_future(job, msg)

    def _settle_future(self, job: ClientJob, msg: Message) -> None:
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

    def _on_outage(self, notice: str) -> None:
        """The link went down, or came back: each waiting job's cell says so beside its output, once."""
        log.info("%s", notice)  # not a warning: logging's last resort would print it a second time
        with self._lock:
            waiting = list(self._jobs.values())
        for job in waiting:
            self._deliver(job, Message(T.STREAM, {"job": job.id, "name": "stderr",
                                                  "text": f"remote-magic: {notice}\n"}))

    def _on_lost(self, reason: str) -> None:
        if self.connection.hub_stopped:  # its jobs ended with it
            self._fail_every_job(lambda job_id: ConnectionFailed(
                f"{reason}, and the job with it: start remote-worker again, then run the cell again"))
        else:
            self._fail_every_job(lambda job_id: ConnectionFailed(
                f"{reason}: stopped waiting; the job goes on there if the hub still runs: %offload_attach {job_id} "
                "(Client.attach) collects it once the hub answers, else run the cell again"))

    def _on_forgotten(self, reason: str) -> None:
        """The hub answers but no longer knows this client (it timed it out while this machine slept, say, or
        it restarted): each waiting job is collected again once the hub welcomes the client back, from where
        its messages stopped coming here; one the hub has no record of then fails, saying so."""
        with self._lock:
            waiting = list(self._jobs.values())
            for job in waiting:
                job.forgotten = "waiting"
        for job in waiting:
            self._deliver(job, Message(T.STREAM, {"job": job.id, "name": "stderr", "text": (
                f"remote-magic: {reason}: collecting this job again once it welcomes this notebook back\n")}))

    def _collecting_again(self, job_id: Any) -> bool:
        with self._lock:
            job = self._jobs.get(job_id) if isinstance(job_id, str) else None
            return job is not None and job.forgotten == "waiting"

    def _collect_forgotten(self) -> None:
        """On the I/O thread, at the hub's WELCOME: collect again the jobs it forgot with this client."""
        with self._lock:
            jobs = [job for job in self._jobs.values() if job.forgotten == "waiting"]
            for job in jobs:
                job.forgotten = "collected"
        for job in jobs:
            log.info("collecting job %s again (%d of its messages came here before)", job.id, job.received)
            self.connection.send_now(encode(T.ATTACH, {"job": job.id, "received": job.received}))

    def _fail_every_job(self, error: Callable[[str], RemoteMagicError]) -> None:
        """End every job still waiting here (its future, or the wait on it) with its ``error(job id)``."""
        with self._lock:
            job_ids = list(self._jobs)
        for job_id in job_ids:
            self.end(job_id, error(job_id))


def _coming_down(job: ClientJob) -> bool:
    """Is part of the job's result (or another of its large messages) on its way here, and not all of it?"""
    done, total = job.transfers.snapshot().get("down", (0, 0))
    return 0 < done < total


def _next_event(events: "queue.SimpleQueue[Message]", meanwhile: Callable[[], None] = lambda: None) -> Message:
    """The next event, calling ``meanwhile`` every quarter second until it comes."""
    while True:
        meanwhile()
        try:
            return events.get(timeout=0.25)  # a finite wait keeps Ctrl-C responsive everywhere
        except queue.Empty:
            continue


def _take(waits: Waits, msg: Message, ended: dict[str, Message]) -> None:
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
