"""Offloaded cells on a Dask distributed cluster: ``remote_magic.connect("dask://HOST:PORT")`` and
``%offload_connect dask://HOST:PORT``.

``DaskClient`` has the part of ``Client``'s API that needs no session on a worker (``run``, ``execute``,
``execute_all``, ``split``, ``map``, ``workers``, ``close``). Dask schedules: each job is one Dask task
(``distributed.Client.submit``), pinned to a worker only when asked (``worker=``, ``execute_all``,
``split``'s pieces). The task carries what a hub would forward (the same SUBMIT header and frames), and
runs it with the executor's own machinery on the Dask worker (``remote_magic.worker.dask_task``); its
RESULT or ERROR comes back as the task's value and is read here as any worker's (``results.finish``).
What the job prints and shows streams while it runs, as Dask events on this client's topic.

``distributed`` is imported when a client is made, never by ``import remote_magic``.
"""

from __future__ import annotations

import logging
import queue
import time
import uuid
from typing import Any, Callable, Iterable, Mapping, TypeAlias

from . import fleet_jobs, split_gather
from .errors import (
    ConnectionFailed,
    DaskError,
    FleetError,
    InputError,
    JobCancelled,
    JobError,
    JobTimeout,
    NoSuchWorker,
    RemoteMagicError,
    WorkerLost,
)
from .results import FileChanges, JobResult, finish, show_display, write_stream
from .split_gather import SplitResult
from .wire import identity, serialization
from .wire.protocol import Message, MessageType as T
from .wire.versions import local_versions

log = logging.getLogger(__name__)

SCHEME = "dask://"
DASK_INSTALL = 'pip install "remote-magic[dask]"'
EVENTS_WAIT_S = 10.0
"""After a task ended, how long its last printed text and displays may take to arrive (they go
through the scheduler, the result straight from the worker's future)."""

SCATTER_BYTES = 1 << 20
"""Frames this large go to the worker with ``scatter`` before the task, as Dask advises for large data,
rather than inside the task through the scheduler."""

OnStream = Callable[[Mapping[str, Any]], None]
OnWorkerOutput = Callable[[str, Mapping[str, Any]], None]
Events: TypeAlias = "queue.SimpleQueue[tuple[str, str, Any]]"
"""(kind, job id, payload): an ``event`` (a STREAM or DISPLAY header) or ``done`` (the task ended)."""


def is_dask_address(address: object) -> bool:
    """Is this what ``connect`` takes for a Dask scheduler (``dask://HOST:PORT``)?"""
    return isinstance(address, str) and address.startswith(SCHEME)


def _run_on_dask(header: dict[str, Any], frames: list[Any], topic: str) -> tuple[str, dict[str, Any], list[Any]]:
    """The task: on a Dask worker, run the job as a remote-worker's executor would."""
    from remote_magic.worker.dask_task import runner

    kind, ended, buffers = runner().run(header, frames, topic)
    return kind, ended, [_as_array(buffer) for buffer in buffers]


class _Job:
    """One job: its Dask future, the inputs its result refers to, and its output's callbacks."""

    def __init__(self, job_id: str, future: Any, inputs: Mapping[str, Any], worker: str,
                 on_stream: OnStream, on_display: OnStream, update_inputs: bool = True) -> None:
        self.id, self.future, self.inputs, self.worker = job_id, future, dict(inputs), worker
        self.on_stream, self.on_display, self.update_inputs = on_stream, on_display, update_inputs
        self.shown = 0       # events shown so far (their ``seq`` runs 1, 2, ...)
        self.early: dict[int, dict[str, Any]] = {}  # events that arrived before one sent earlier
        self.ended: Message | None = None
        self.events = 0      # how many the job sent, once it ended


class DaskClient:
    """Offloaded cells on a Dask cluster. Use ``remote_magic.connect("dask://HOST:PORT")`` to make one."""

    def __init__(self, address: str, *, timeout: float = 10.0, name: str | None = None) -> None:
        try:
            import distributed
        except ImportError:
            raise DaskError(f"connecting to a Dask cluster needs distributed: {DASK_INSTALL}") from None
        if not is_dask_address(address) or not address[len(SCHEME):]:
            raise DaskError(f"{address!r} is not a Dask scheduler's address: write dask://HOST:PORT")
        self.address = address
        self.version_notes: list[str] = []
        self._versions = local_versions()
        scheduler = address[len(SCHEME):]
        make: Any = distributed.Client  # distributed has no type hints
        try:
            self._dask: Any = make(scheduler if "://" in scheduler else f"tcp://{scheduler}", timeout=timeout,
                                   set_as_default=False, name=name)
        except (OSError, TimeoutError) as exc:
            raise ConnectionFailed(f"no Dask scheduler answered at {address} within {timeout:g} s ({exc}): check that "
                                   "it runs (dask scheduler, or distributed.LocalCluster) and its address") from None
        self._topic = f"remote-magic-{uuid.uuid4().hex}"
        self._queues: dict[str, Events] = {}
        self._dask.subscribe_topic(self._topic, self._on_event)
        log.info("connected to the Dask scheduler at %s", scheduler)

    @property
    def dask(self) -> Any:
        """The ``distributed.Client`` underneath, for what Dask does itself (``submit``, ``scatter``, ...)."""
        return self._dask

    # -- public API ------------------------------------------------------------------------

    def run(self, code: str, inputs: Mapping[str, Any] | None = None, outputs: Iterable[str] | None = None,
            *, worker: str | None = None, timeout: float | None = None) -> dict[str, Any]:
        """Run ``code`` on a Dask worker with ``inputs`` as its globals; its outputs (see ``Client.run``)."""
        return self.execute(code, inputs, outputs, worker=worker, timeout=timeout).values

    def execute(self, code: str, inputs: Mapping[str, Any] | None = None, outputs: Iterable[str] | None = None,
                *, worker: str | None = None, timeout: float | None = None, gpu: bool | list[str] | None = None,
                kernels: Mapping[str, str] | None = None, on_stream: OnStream = write_stream,
                on_display: OnStream = show_display,
                on_module_error: Callable[[str, Any, Exception], None] | None = None,
                figure_formats: Iterable[str] = ("png",), on_files: Callable[[FileChanges], None] | None = None,
                retries: int = 0, on_retry: Callable[[str], None] | None = None,
                require: Iterable[str] | str | None = None, prefer: str | None = None) -> JobResult:
        """Run ``code`` on a Dask worker (the one named by ``worker``, else where Dask puts it), as
        ``Client.execute``: a JobResult, a RemoteError (with ``partial``) when the code raised, output
        streamed while it runs. ``timeout``: stop waiting after that many seconds (JobTimeout; Dask can't
        stop a task that started). ``gpu``, ``kernels``, ``retries``, ``require`` and ``prefer`` need a
        remote-worker: DaskError. Files the code writes stay on the Dask worker, unlisted (``on_files``
        is never called)."""
        _refuse(gpu=gpu or kernels, retries=retries, require=require, prefer=prefer)
        header = _code_header(code, outputs, figure_formats)
        addresses = None if worker is None else self._addresses([worker])
        job = self._submit(header, inputs, worker, addresses, queue.SimpleQueue(), on_stream, on_display)
        ended = self._wait({job.id: job}, timeout)[job.id]
        return finish(ended, job.worker, job.inputs, job.update_inputs, on_module_error)

    def execute_all(self, code: str, inputs: Mapping[str, Any] | None = None, outputs: Iterable[str] | None = None,
                    *, workers: Iterable[str] | None = None, timeout: float | None = None,
                    gpu: bool | list[str] | None = None, kernels: Mapping[str, str] | None = None,
                    on_stream: OnWorkerOutput | None = None, on_display: OnWorkerOutput | None = None,
                    on_module_error: Callable[[str, Any, Exception], None] | None = None,
                    figure_formats: Iterable[str] = ("png",),
                    inputs_for: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, JobResult]:
        """Run ``code`` on each of ``workers`` (default: every Dask worker) at once; ``{worker: JobResult}``,
        with labelled output and FleetError as ``Client.execute_all``."""
        _refuse(gpu=gpu or kernels)
        names = list(dict.fromkeys(workers)) if workers is not None else [w["name"] for w in self.workers()]
        if not names:
            raise NoSuchWorker(f"the Dask cluster at {self.address} has no workers: start some, then run this again")
        labelled = fleet_jobs.LabelledOutput(write_stream, show_display)
        stream, display = on_stream or labelled.stream, on_display or labelled.display
        header = _code_header(code, outputs, figure_formats)
        jobs: dict[str, _Job] = {}
        asked: dict[str, str] = {}  # job id -> the name it was asked for (results are keyed by it)
        events: Events = queue.SimpleQueue()
        addresses = self._addresses(names)
        try:
            for name, address in zip(names, addresses):
                own = (inputs_for or {}).get(name)
                job = self._submit(header, {**(inputs or {}), **own} if own else inputs, name, [address], events,
                                   _for_worker(stream, name), _for_worker(display, name), update_inputs=False)
                jobs[job.id], asked[job.id] = job, name
        except BaseException:
            self._forget(jobs.values())
            raise
        ended = self._wait(jobs, timeout)
        results: dict[str, JobResult] = {}
        failures: dict[str, JobError | RemoteMagicError] = {}
        for job_id, job in jobs.items():
            try:
                results[asked[job_id]] = finish(ended[job_id], job.worker, job.inputs, False, on_module_error)
            except RemoteMagicError as error:
                failures[asked[job_id]] = error
        if failures:
            raise FleetError(fleet_jobs.describe_failures(failures, names), failures, results)
        return results

    def split(self, code: str, inputs: Mapping[str, Any] | None = None, outputs: Iterable[str] | None = None, *,
              split: Iterable[str] | str, gather: Iterable[str] | str = (), workers: Iterable[str] | None = None,
              timeout: float | None = None, gpu: bool | list[str] | None = None,
              kernels: Mapping[str, str] | None = None, on_stream: OnWorkerOutput | None = None,
              on_display: OnWorkerOutput | None = None,
              on_module_error: Callable[[str, Any, Exception], None] | None = None,
              figure_formats: Iterable[str] = ("png",)) -> SplitResult:
        """``Client.split`` on the Dask workers: one piece per worker (equal pieces: Dask workers report no
        measured speed), run at once, ``gather`` concatenated in order."""
        return split_gather.run(self, code, inputs, split, gather, workers, outputs, timeout=timeout, gpu=gpu,
                                kernels=kernels, on_stream=on_stream, on_display=on_display,
                                on_module_error=on_module_error, figure_formats=figure_formats)

    def map(self, fn: Callable[[Any], Any], iterable: Iterable[Any], *, chunksize: int | None = None,
            retries: int = 0, workers: Iterable[str] | None = None, timeout: float | None = None,
            require: Iterable[str] | str | None = None, prefer: str | None = None) -> list[Any]:
        """``[fn(item) for item in iterable]`` on the Dask workers, in input order, as ``Client.map``: chunks
        of ``chunksize`` items (default: about four per worker), one Dask task each, all handed to Dask's
        scheduler at once. When ``fn`` raises, the RemoteError names the item and the other chunks are
        cancelled. ``workers``: Dask may place chunks only on these. ``retries``, ``require`` and ``prefer``
        need a remote-worker's fleet: DaskError (Dask itself runs a task again when its worker dies)."""
        _refuse(retries=retries, require=require, prefer=prefer)
        items = list(iterable)
        if not items:
            return []
        names = list(dict.fromkeys(workers)) if workers is not None else None
        if chunksize is None:
            chunksize = fleet_jobs.default_chunksize(len(items), len(names) if names else len(self.workers()))
        elif chunksize < 1:
            raise ValueError(f"chunksize must be 1 or more, not {chunksize}")
        jobs: dict[str, _Job] = {}
        starts: dict[str, int] = {}
        events: Events = queue.SimpleQueue()
        addresses = None if names is None else self._addresses(names)
        packed = [(start, self._pack({"kind": "call"}, {"fn": fleet_jobs._run_chunk, "kwargs": {},
                                                        "args": (fn, start, items[start:start + chunksize])},
                                     addresses))
                  for start in range(0, len(items), chunksize)]
        # One graph for every chunk, as Dask's own client.map submits; Dask's scheduler places each.
        futures = self._dask.map(_run_on_dask, [full for _, (_, full, _) in packed],
                                 [frames for _, (_, _, frames) in packed], [self._topic] * len(packed),
                                 key=[f"offload-{job_id}" for _, (job_id, _, _) in packed], pure=False,
                                 workers=addresses, allow_other_workers=False)
        for (start, (job_id, _, _)), future in zip(packed, futures):
            jobs[job_id], starts[job_id] = self._track(job_id, future, {}, "", events, write_stream,
                                                       show_display), start
        results: list[Any] = [None] * len(items)

        def place(job: _Job) -> None:  # as each chunk ends: a failure raises at once, cancelling the rest
            assert job.ended is not None
            outcome: list[Any] | fleet_jobs.ItemFailed = finish(job.ended, job.worker, {}, False, None).values["result"]
            if isinstance(outcome, fleet_jobs.ItemFailed):
                raise outcome.error()
            results[starts[job.id]:starts[job.id] + len(outcome)] = outcome

        self._wait(jobs, timeout, on_end=place)
        return results

    def workers(self, timeout: float = 10.0) -> list[dict[str, Any]]:
        """The Dask workers, as ``Client.workers`` lists a fleet: ``name`` (the Dask worker's name),
        ``address``, ``hostname``, ``cpu_count`` (its threads), ``memory_bytes`` (its memory limit), ``state``
        (``busy`` while it runs tasks, as of its last heartbeat) and ``engine`` (``"dask"``)."""
        info = self._dask.scheduler_info(n_workers=-1)
        listed = []
        for address, worker in info.get("workers", {}).items():
            metrics = worker.get("metrics") or {}
            listed.append({"name": str(worker.get("name", address)), "address": address,
                           "hostname": worker.get("host", ""), "cpu_count": worker.get("nthreads"),
                           "memory_bytes": worker.get("memory_limit"),
                           "state": "busy" if metrics.get("executing") else "idle", "engine": "dask"})
        return sorted(listed, key=lambda w: (0, int(w["name"]), "") if w["name"].isdigit() else (1, 0, w["name"]))

    def close(self) -> None:
        """Disconnect from the scheduler; jobs still running there are cancelled (a started task runs to its end)."""
        try:
            self._dask.unsubscribe_topic(self._topic)
        finally:
            self._dask.close()

    def __enter__(self) -> "DaskClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        """Not on a Dask connection: use ``client.dask.submit`` (Dask's own), or ``map``."""
        raise DaskError("submit: on a Dask cluster, call Dask's own client.dask.submit(fn, ...), or use map")

    def scatter(self, *args: Any, **kwargs: Any) -> Any:
        """Not on a Dask connection: values can't stay in a session there (use ``client.dask.scatter``)."""
        raise DaskError("scatter: a Dask worker keeps no remote-magic session for the values to stay in; "
                        "use Dask's own client.dask.scatter")

    def gather(self, *args: Any, **kwargs: Any) -> Any:
        """Not on a Dask connection (see ``scatter``)."""
        raise DaskError("gather: a Dask worker keeps no remote-magic session; use Dask's own client.dask.gather")

    def get_file(self, *args: Any, **kwargs: Any) -> Any:
        """Not on a Dask connection: files stay on the Dask workers."""
        raise DaskError("%offload_get / get_file copies from a remote-worker's working directory; a Dask task may run "
                        "on any worker and keeps no working directory: write results to shared storage, or "
                        "return them from the cell as variables")

    def put_file(self, *args: Any, **kwargs: Any) -> Any:
        """Not on a Dask connection: put the file where every Dask worker reads it."""
        raise DaskError("%offload_put / put_file copies to a remote-worker's working directory; a Dask task may run "
                        "on any worker: put the file on storage every Dask worker reads, or pass its content "
                        "as a variable")

    def reset(self, worker: str | None = None) -> list[str]:
        """Not on a Dask connection: there is no session to reset."""
        raise DaskError("%offload_reset / reset: a Dask worker keeps no session per notebook, so there is nothing "
                        "to reset (each cell gets a fresh namespace; module state stays with the Dask worker's "
                        "process: restart the cluster's workers with client.dask.restart())")

    # -- jobs ------------------------------------------------------------------------------

    def _submit(self, header: dict[str, Any], inputs: Mapping[str, Any] | None, worker: str | None,
                addresses: list[str] | None, events: Events, on_stream: OnStream, on_display: OnStream,
                update_inputs: bool = True) -> _Job:
        """Pack a cell's job as a hub would forward it and hand it to Dask as one task; what it sends and
        its end go into ``events``, shared by the jobs of one call. ``addresses``: the Dask workers it may
        run on (None: any), ``worker`` their name."""
        values = dict(inputs or {})
        sent, refs = identity.references(values)  # names sharing an object, and views, go as references
        job_id, full, frames = self._pack(header, sent, addresses)
        if refs:
            full["refs"] = refs
        future = self._dask.submit(_run_on_dask, full, frames, self._topic, key=f"offload-{job_id}", pure=False,
                                   workers=addresses, allow_other_workers=False)
        return self._track(job_id, future, values, worker or "", events, on_stream, on_display, update_inputs)

    def _pack(self, header: dict[str, Any], values: Mapping[str, Any], addresses: list[str] | None
              ) -> tuple[str, dict[str, Any], list[Any]]:
        """A job's id, its SUBMIT header and its frames (large ones scattered to ``addresses`` already)."""
        packed = serialization.pack(values, InputError, portable_pandas=True)  # the workers' pandas is unknown
        job_id = uuid.uuid4().hex
        frames = [_as_array(frame) for frame in packed.frames]
        large = [i for i, frame in enumerate(frames) if frame.nbytes >= SCATTER_BYTES]
        if large:  # straight to a worker (the one named), not through the scheduler inside the task
            scattered = self._dask.scatter([frames[i] for i in large], workers=addresses, hash=False)
            for i, future in zip(large, scattered):
                frames[i] = future
        return job_id, {**header, **packed.header(), "job": job_id, "versions": self._versions}, frames

    def _track(self, job_id: str, future: Any, values: Mapping[str, Any], worker: str, events: Events,
               on_stream: OnStream, on_display: OnStream, update_inputs: bool = True) -> _Job:
        """Follow a submitted task: its events and its end go into ``events``."""
        self._queues[job_id] = events
        future.add_done_callback(lambda _: events.put(("done", job_id, None)))
        return _Job(job_id, future, values, worker, on_stream, on_display, update_inputs)

    def _addresses(self, wanted: list[str]) -> list[str]:
        """The Dask addresses of the workers named (by Dask name or address); NoSuchWorker for one not there."""
        known = {w["name"]: w["address"] for w in self.workers()}
        known.update({address: address for address in list(known.values())})
        unknown = [name for name in wanted if name not in known]
        if unknown:
            raise NoSuchWorker(f"no Dask worker named {', '.join(repr(n) for n in unknown)} (the cluster has: "
                               f"{', '.join(repr(n) for n in known if '://' not in n) or 'none'})")
        return [known[name] for name in wanted]

    def _wait(self, jobs: Mapping[str, _Job], timeout: float | None,
              on_end: Callable[[_Job], None] | None = None) -> dict[str, Message]:
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
            self._forget(jobs.values())
            raise
        finally:
            for job_id in jobs:
                self._queues.pop(job_id, None)

    def _read_ended(self, ended: list[_Job]) -> None:
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

    def _ended(self, job: _Job) -> None:
        """Read one finished task."""
        try:
            kind, header, buffers = job.future.result()
        except Exception as exc:
            failure = _dask_failure(exc, job.worker)
            if isinstance(failure, JobCancelled) and self._dask.status != "running":
                failure = ConnectionFailed(f"the Dask scheduler at {self.address} was lost (Dask's client gave up "
                                           "reconnecting); the job's result is lost: connect again once it runs")
            job.ended, job.events = Message(T.ERROR, _error_header(failure, job.id)), 0
            return
        job.worker = str(header.get("worker", job.worker))
        job.events = int(header.get("events") or 0)
        job.ended = Message(T(kind), header, list(buffers))

    def _show(self, job: _Job, event: dict[str, Any]) -> None:
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

    def _forget(self, jobs: Iterable[_Job]) -> None:
        """Cancel the jobs' tasks not yet done (Dask drops queued ones; a running task runs to its end)."""
        futures = [job.future for job in jobs if not job.future.done()]
        if futures:
            self._dask.cancel(futures)


def _as_array(frame: Any) -> Any:
    """A frame as Dask moves large buffers best: a numpy byte array over it (no copy here; out of band
    where Dask's comms allow)."""
    import numpy

    return numpy.frombuffer(frame, dtype=numpy.uint8)


def _refuse(**options: Any) -> None:
    """DaskError for an option that needs a remote-worker, naming it and why."""
    why = {"gpu": "GPU kernels run on a remote-worker's WGSL runtime; a Dask worker has none",
           "retries": "Dask itself runs a task again when its worker dies (distributed.scheduler.allowed-failures)",
           "require": "Dask places tasks itself: pin one with --worker NAME, or use Dask's worker resources",
           "prefer": "Dask places tasks itself: pin one with --worker NAME"}
    for name, value in options.items():
        if value:
            raise DaskError(f"{name} (--{name}) is not available on a Dask cluster: {why[name]}")


def _code_header(code: str, outputs: Iterable[str] | None, figure_formats: Iterable[str]) -> dict[str, Any]:
    return {"kind": "code", "code": code, "figure_formats": list(figure_formats),
            "outputs": None if outputs is None else list(outputs)}


def _for_worker(callback: OnWorkerOutput, worker: str) -> OnStream:
    return lambda header: callback(worker, header)


def _dask_failure(exc: BaseException, worker: str) -> JobError | RemoteMagicError:
    """What kept a task from a result, in remote-magic's terms."""
    kind = type(exc).__name__
    where = f" on Dask worker {worker!r}" if worker else ""
    if kind == "KilledWorker":
        return WorkerLost(f"the Dask workers running the job died{where} ({exc}): Dask gave up on it; run it again")
    if kind in ("CancelledError", "FutureCancelledError"):
        return JobCancelled(f"the job was cancelled on the Dask cluster{where}: {exc}")
    if isinstance(exc, ImportError) and "remote_magic" in str(exc):
        return DaskError(f"the Dask worker can't import remote-magic ({exc}): install it there too, {DASK_INSTALL}")
    return DaskError(f"the Dask task failed{where} before the job could run: {kind}: {exc} (the Dask workers need "
                     f"the same remote-magic as this notebook: {DASK_INSTALL})")


def _error_header(error: RemoteMagicError, job: str) -> dict[str, Any]:
    from .wire.failures import error_header

    return error_header(error, job)
