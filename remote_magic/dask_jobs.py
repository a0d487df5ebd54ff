"""Jobs as Dask tasks, for ``DaskClient`` (``dask_client.py``): each carries what a hub would forward
to a worker (the SUBMIT header and frames) to ``run_on_dask``, which runs it with the executor's own
machinery on a Dask worker (``remote_magic.worker.dask_task``). What a job prints and shows arrives while
it runs as Dask events on one topic per client (``Worker.log_event``, ``Client.subscribe_topic``); its
RESULT or ERROR is the task's value. Here: sending the SUBMIT ``job_request.py`` makes (its large frames
scattered to the workers first), and waiting for both, in order.
"""

from __future__ import annotations

import logging
import queue
import time
import uuid
from typing import Any, Callable, Iterable, Mapping, TypeAlias

from .errors import (
    ConnectionFailed,
    DaskError,
    JobCancelled,
    JobError,
    JobTimeout,
    RemoteMagicError,
    WorkerLost,
)
from .job_request import JobRequest, OnStream, submit_message
from .results import show_display, write_stream
from .wire.failures import error_header
from .wire.install import install_command
from .wire.protocol import Message, MessageType as T

log = logging.getLogger(__name__)

EVENTS_WAIT_S = 10.0
"""After a task ended, how long its last printed text and displays may take to arrive (they go
through the scheduler, the result straight from the worker)."""

SCATTER_BYTES = 1 << 20
"""Frames this large go to the worker with ``scatter`` before the task, as Dask advises for large data,
rather than inside the task through the scheduler."""

Events: TypeAlias = "queue.SimpleQueue[tuple[str, str, Any]]"
"""(kind, job id, payload): an ``event`` (a STREAM or DISPLAY header) or ``done`` (the task ended)."""


def run_on_dask(header: dict[str, Any], frames: list[Any], topic: str) -> tuple[str, dict[str, Any], list[Any]]:
    """The task: on a Dask worker, run the job as a remote-worker's executor would."""
    from remote_magic.worker.dask_task import runner

    kind, ended, buffers = runner().run(header, frames, topic)
    return kind, ended, [as_array(buffer) for buffer in buffers]


class DaskJob:
    """One job the ``DaskClient`` waits for: its Dask future, the inputs its result refers to, and its output's
    callbacks."""

    def __init__(self, job_id: str, future: Any, inputs: Mapping[str, Any], worker: str,
                 on_stream: OnStream, on_display: OnStream, update_inputs: bool = True) -> None:
        self.id, self.future, self.inputs, self.worker = job_id, future, dict(inputs), worker
        self.on_stream, self.on_display, self.update_inputs = on_stream, on_display, update_inputs
        self.shown = 0       # events shown so far (their ``seq`` runs 1, 2, ...)
        self.early: dict[int, dict[str, Any]] = {}  # events that arrived before one sent earlier
        self.ended: Message | None = None
        self.events = 0      # how many the job sent, once it ended
        self.shared: list[Any] = []  # objects inside the inputs, numbered as the worker numbers them
        self.notes: list[str] = []   # CellSubmit.notes


class DaskJobs:
    """The jobs of one ``DaskClient``, on its ``distributed.Client``: submitted, followed, read."""

    def __init__(self, dask: Any, address: str, versions: dict[str, str]) -> None:
        self._dask = dask
        self.address = address
        self._versions = versions
        self._topic = f"remote-magic-{uuid.uuid4().hex}"
        self._queues: dict[str, Events] = {}
        dask.subscribe_topic(self._topic, self._on_event)

    def close(self) -> None:
        """Stop receiving this client's events (nothing to stop once Dask's client closed itself: it does when
        its scheduler stays gone)."""
        if self._dask.status in ("running", "connecting", "newly-created"):
            self._dask.unsubscribe_topic(self._topic)

    def submit_calls(self, calls: list[dict[str, Any]], addresses: list[str] | None, events: Events) -> list[DaskJob]:
        """Call jobs (each ``{"fn", "args", "kwargs"}``), handed to Dask in one graph as Dask's own
        ``client.map`` does; Dask's scheduler places each (on ``addresses`` only, when given)."""
        packed = [self._pack({"kind": "call"}, values, addresses) for values in calls]
        futures = self._dask.map(run_on_dask, [full for _, full, _ in packed], [frames for _, _, frames in packed],
                                 [self._topic] * len(packed), key=[f"offload-{job_id}" for job_id, _, _ in packed],
                                 pure=False, workers=addresses, allow_other_workers=False)
        return [self._track(job_id, future, {}, "", events, write_stream, show_display)
                for (job_id, _, _), future in zip(packed, futures)]

    def submit(self, request: JobRequest, addresses: list[str] | None, events: Events) -> DaskJob:
        """Pack a cell's job as a hub would forward it and hand it to Dask as one task; what it sends and
        its end go into ``events``, shared by the jobs of one call. ``addresses``: the Dask workers it may
        run on (None: any), the request's ``worker`` their name."""
        cell = request.submit()
        job_id, full, frames = self._pack(cell.header, cell.values, addresses)
        future = self._dask.submit(run_on_dask, full, frames, self._topic, key=f"offload-{job_id}", pure=False,
                                   workers=addresses, allow_other_workers=False)
        job = self._track(job_id, future, request.inputs, request.worker or "", events, request.on_stream,
                          request.on_display, request.update_inputs)
        job.shared, job.notes = cell.shared, cell.notes
        return job

    def _pack(self, header: dict[str, Any], values: Mapping[str, Any], addresses: list[str] | None
              ) -> tuple[str, dict[str, Any], list[Any]]:
        """A job's id, its SUBMIT header and its frames (large ones scattered to ``addresses`` already)."""
        job_id = uuid.uuid4().hex
        header = dict(header)
        packed = submit_message(header, values, job_id=job_id, versions=self._versions,
                                portable_pandas=True)  # the Dask workers' pandas is unknown
        frames = [as_array(frame) for frame in packed.frames]
        large = [i for i, frame in enumerate(frames) if frame.nbytes >= SCATTER_BYTES]
        if large:  # straight to a worker (the one named), not through the scheduler inside the task
            scattered = self._dask.scatter([frames[i] for i in large], workers=addresses, hash=False)
            for i, future in zip(large, scattered):
                frames[i] = future
        return job_id, header, frames

    def _track(self, job_id: str, future: Any, values: Mapping[str, Any], worker: str, events: Events,
               on_stream: OnStream, on_display: OnStream, update_inputs: bool = True) -> DaskJob:
        """Follow a submitted task: its events and its end go into ``events``."""
        self._queues[job_id] = events
        future.add_done_callback(lambda _: events.put(("done", job_id, None)))
        return DaskJob(job_id, future, values, worker, on_stream, on_display, update_inputs)

    def wait(self, jobs: Mapping[str, DaskJob], timeout: float | None,
             on_end: Callable[[DaskJob], None] | None = None) -> dict[str, Message]:
        """Each job's ending, showing each one's output meanwhile, in the order it was printed. Ctrl-C, or
        ``timeout``, or ``on_end`` (called as each job ends) raising, cancels the tasks not yet done."""
        events = self._queues[next(iter(jobs))]  # the jobs of one call share one queue
        deadline = None if timeout is None else time.monotonic() + timeout
        waiting = set(jobs)
        late: float | None = None  # since when every task ended but some output has yet to arrive
        try:
            while waiting:
                now = time.monotonic()
                if deadline is not None and now > deadline:
                    raise JobTimeout(f"the job ran past its {timeout:g} s timeout; it was cancelled on the Dask "
                                     "cluster (a task that started runs on to its end: Dask can't stop it)")
                if all(jobs[job_id].ended is not None for job_id in waiting):
                    late = late or now
                    if now - late > EVENTS_WAIT_S:  # not silently: the result is shown, the gap is said
                        log.warning("some of the job's output did not arrive within %g s of its end; "
                                    "shown without it", EVENTS_WAIT_S)
                        break
                try:
                    batch = [events.get(timeout=0.5)]  # finite: Ctrl-C stays responsive
                except queue.Empty:
                    continue
                while True:  # and whatever else is here already: the tasks that ended are read together
                    try:
                        batch.append(events.get_nowait())
                    except queue.Empty:
                        break
                for kind, job_id, payload in batch:
                    if kind == "event" and job_id in jobs:
                        self._show(jobs[job_id], payload)
                ended = [jobs[job_id] for kind, job_id, _ in batch if kind == "done" and job_id in jobs]
                self._read_ended(ended)
                for job in ended:
                    if on_end is not None:
                        on_end(job)
                for _, job_id, _ in batch:
                    moved = jobs.get(job_id)
                    if moved is not None and moved.ended is not None and moved.shown >= moved.events:
                        waiting.discard(job_id)
            return {job_id: job.ended for job_id, job in jobs.items() if job.ended is not None}
        except BaseException:
            self.forget(jobs.values())
            raise
        finally:
            for job_id in jobs:
                self._queues.pop(job_id, None)

    def _read_ended(self, ended: list[DaskJob]) -> None:
        """Read finished tasks: their RESULT or ERROR, or the Dask failure that kept each from one. The
        results come from the workers in one ``gather``, not one round trip each."""
        finished = [job for job in ended if job.future.status == "finished"]
        if finished:
            try:
                values = self._dask.gather([job.future for job in finished])
            except Exception:  # one was lost meanwhile: read each on its own, which says which and why
                finished = []
            else:
                for job, (kind, header, buffers) in zip(finished, values):
                    job.worker = str(header.get("worker", job.worker))
                    job.events = int(header.get("events") or 0)
                    job.ended = Message(T(kind), header, list(buffers))
        for job in ended:
            if job.ended is None:
                self._ended(job)

    def _ended(self, job: DaskJob) -> None:
        """Read one finished task."""
        try:
            kind, header, buffers = job.future.result()
        except Exception as exc:
            failure = dask_failure(exc, job.worker)
            if self._dask.status != "running":  # whatever Dask said: it lost its scheduler
                failure = ConnectionFailed(f"the Dask scheduler at {self.address} was lost (Dask's client gave up "
                                           "reconnecting); the job's result is lost: connect again once it runs")
            job.ended, job.events = Message(T.ERROR, error_header(failure, job.id)), 0
            return
        job.worker = str(header.get("worker", job.worker))
        job.events = int(header.get("events") or 0)
        job.ended = Message(T(kind), header, list(buffers))

    def _show(self, job: DaskJob, event: dict[str, Any]) -> None:
        """Show an event in order: one that overtook an earlier one waits for it."""
        job.early[int(event.get("seq") or 0)] = event
        while job.shown + 1 in job.early:
            job.shown += 1
            shown = job.early.pop(job.shown)
            (job.on_stream if shown.get("type") == T.STREAM.value else job.on_display)(shown)

    def _on_event(self, event: tuple[float, Any]) -> None:
        """A job's STREAM or DISPLAY, from the scheduler (Dask's event loop thread)."""
        message = event[1]
        if isinstance(message, dict):
            job_id = str(message.get("job"))
            events = self._queues.get(job_id)
            if events is not None:
                events.put(("event", job_id, message))

    def forget(self, jobs: Iterable[DaskJob]) -> None:
        """Cancel the jobs' tasks not yet done (Dask drops queued ones; a running task runs to its end)."""
        futures = [job.future for job in jobs if not job.future.done()]
        if futures:
            self._dask.cancel(futures)


def as_array(frame: Any) -> Any:
    """A frame as Dask moves large buffers best: a numpy byte array over it (no copy here; out of band
    where Dask's comms allow)."""
    import numpy

    return numpy.frombuffer(frame, dtype=numpy.uint8)


def dask_failure(exc: BaseException, worker: str) -> JobError | RemoteMagicError:
    """What kept a task from a result, in remote-magic's terms."""
    kind = type(exc).__name__
    where = f" on Dask worker {worker!r}" if worker else ""
    if kind == "KilledWorker":
        return WorkerLost(f"the Dask workers running the job died{where} ({exc}): Dask gave up on it; run it again")
    if kind in ("CancelledError", "FutureCancelledError"):
        return JobCancelled(f"the job was cancelled on the Dask cluster{where}: {exc}")
    if isinstance(exc, ImportError) and "remote_magic" in str(exc):
        return DaskError(f"the Dask worker can't import remote-magic ({exc}): install it there too, "
                         f"{install_command('dask')}")
    return DaskError(f"the Dask task failed{where} before the job could run: {kind}: {exc} (the Dask workers need "
                     f"the same remote-magic as this notebook: {install_command('dask')})")
