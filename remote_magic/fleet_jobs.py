"""Jobs on several workers, in the notebook: labelled output, retries, map in chunks, scatter and gather.

The engines keep the job machinery (submit, wait, finish); this module decides which jobs to send and
puts what comes back together. ``map_chunks``, ``scatter`` and ``gather`` send call jobs through
``Calls``, the one method they need of a hub client's job table (``client_jobs.ClientJobs``). The helpers
``run_chunk`` and ``values_there`` run on the worker (they travel by reference: the worker has the same
remote-magic).
"""

from __future__ import annotations

import logging
import math
import reprlib
import traceback
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Protocol, Sequence

from .errors import FleetError, InputError, JobError, NoSuchWorker, RemoteError, RemoteMagicError, WorkerLost
from .wire.displays import clears
from .wire.failures import error_from_header
from .wire.handles import RemoteValue

if TYPE_CHECKING:
    from .results import JobResult

log = logging.getLogger(__name__)

CHUNKS_PER_WORKER = 4
"""``map``'s default chunk size makes about this many chunks per worker, as ``multiprocessing.Pool.map``
does: few enough that a job's round trip is paid rarely, enough that a slow chunk doesn't hold the end."""

IN_FLIGHT_PER_WORKER = 2
"""With ``map(..., workers=[...])``: chunks sent to each named worker at once, so it has the next one
waiting at the hub when it finishes one."""

_ITEM_REPR = reprlib.Repr()
_ITEM_REPR.maxstring = _ITEM_REPR.maxother = 60


class CallJob(Protocol):
    """A call job as ``Calls.submit_call`` gives it back."""

    @property
    def worker(self) -> str:
        """The worker running it, once it started ("" before)."""
        ...


class Calls(Protocol):
    """What ``map_chunks``, ``scatter`` and ``gather`` need of an engine: call jobs."""

    def submit_call(self, fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any], *,
                    worker: str | None = None, timeout: float | None = None, keep: Sequence[str] | None = None,
                    placement: Mapping[str, Any] | None = None) -> "tuple[CallJob, Future[Any]]":
        """Call ``fn`` on a worker (the one named, or any that matches ``placement``): its job, and a Future
        of its return value. With ``keep``, the call returns a sequence whose values stay on the worker: the
        future holds ``{name: RemoteValue}``. Cancelling the future cancels the job."""
        ...


# -- retries -------------------------------------------------------------------------------------------

class Attempts:
    """The attempts of one job that may run again when its worker is lost (``retries``)."""

    def __init__(self, retries: int, what: str, on_retry: Callable[[str], None] | None = None) -> None:
        if retries < 0:
            raise ValueError(f"retries must be 0 or more, not {retries}")
        self.retries = retries
        self.what = what
        self.on_retry = on_retry
        self.failed: list[tuple[str, JobError]] = []

    def retry(self, worker: str, error: JobError) -> bool:
        """Note a failed attempt; True when it is to run again: its worker was lost and retries remain.

        Only WorkerLost is retried: the code, not the worker, caused any other error (an exception,
        an executor it killed, a timeout), and would cause it again.
        """
        if not isinstance(error, WorkerLost) or len(self.failed) >= self.retries:
            return False
        self.failed.append((worker, error))
        note = (f"{self.what} was lost with worker {worker!r} (attempt {len(self.failed)} of {self.retries + 1}): "
                "running it again on another worker")
        log.warning("%s", note)
        if self.on_retry is not None:
            self.on_retry(note)
        return True

    def final(self, worker: str, error: JobError) -> JobError:
        """``error``, the last attempt's, listing every attempt when there were several (``error.attempts``)."""
        if not self.failed:
            return error
        every = [*self.failed, (worker, error)]
        listed = "; ".join(f"{n}. on worker {name!r}: {_said(e).split(';')[0]}"
                           for n, (name, e) in enumerate(every, 1))
        error.args = (f"{error} [{self.what} ran {len(every)} times: {listed}]",)
        error.attempts = tuple(every)
        return error


# -- run on several workers ------------------------------------------------------------------------

class LabelledOutput:
    """Output of jobs running on several workers at once, each part under a line naming its worker, as
    ipyparallel's ``%%px`` does: ``[stdout:box]``, ``[stderr:box]``, ``[output:box]`` (a display)."""

    def __init__(self, write: Callable[[Mapping[str, Any]], None], show: Callable[[Mapping[str, Any]], None]) -> None:
        self._write = write
        self._show = show
        self._last: tuple[str, str] | None = None  # (worker, stream) of the text written last
        self._line_open = False                    # it didn't end its line

    def stream(self, worker: str, header: Mapping[str, Any]) -> None:
        """Write a STREAM's text, after a label line when it comes from another worker or stream."""
        name = "stderr" if header.get("name") == "stderr" else "stdout"
        text = str(header.get("text", ""))
        if not text:
            return
        if self._last != (worker, name):
            self._end_line()
            self._write({"name": name, "text": f"[{name}:{worker}]\n"})
            self._last = (worker, name)
        self._write({"name": name, "text": text})
        self._line_open = not text.endswith("\n")

    def display(self, worker: str, header: Mapping[str, Any]) -> None:
        """Show a display under a label line ``[output:WORKER]``. A clear_output() on one of several
        workers clears nothing: it would clear the others' output too."""
        if clears(header):
            return
        self._end_line()
        self._write({"name": "stdout", "text": f"[output:{worker}]\n"})
        self._last = None
        self._show(header)

    def _end_line(self) -> None:
        if self._line_open and self._last is not None:
            self._write({"name": self._last[1], "text": "\n"})
        self._line_open = False


def each_result(reads: Iterable[tuple[str, Callable[[], "JobResult"]]], workers: Sequence[str]
                ) -> dict[str, "JobResult"]:
    """{worker: its JobResult}, reading each with its callable; FleetError, with the others' results,
    naming every worker whose read raised."""
    results: dict[str, JobResult] = {}
    failures: dict[str, RemoteMagicError] = {}
    for worker, read in reads:
        try:
            results[worker] = read()
        except RemoteMagicError as error:
            failures[worker] = error
    if failures:
        raise FleetError(describe_failures(failures, workers), failures, results)
    return results


def describe_failures(failures: Mapping[str, RemoteMagicError], workers: Sequence[str]) -> str:
    """FleetError's message: which workers failed, each with why, and that the others' results came back."""
    why = "; ".join(f"{worker!r}: {_said(error)}" for worker, error in failures.items())
    done = [worker for worker in workers if worker not in failures]
    others = (f" The others' results came back ({', '.join(repr(w) for w in done)})." if done else "")
    return f"failed on {len(failures)} of {len(workers)} workers: {why}.{others}"


def _said(error: RemoteMagicError) -> str:
    """An error in a list: its type and message (a RemoteError not known here names its remote type itself)."""
    return str(error) if isinstance(error, RemoteError) and error.shows_type else f"{type(error).__name__}: {error}"


# -- map -----------------------------------------------------------------------------------------------

@dataclass
class ItemFailed:
    """What a chunk returns when ``fn`` raised on one of its items (built on the worker)."""

    index: int
    item: str
    remote_type: str
    remote_message: str
    remote_traceback: str

    def error(self) -> RemoteError:
        """The RemoteError, naming the item (also an instance of the worker's exception type when it exists here)."""
        error = error_from_header({"error": "RemoteError", "remote_type": self.remote_type,
                                   "remote_message": self.remote_message, "remote_traceback": self.remote_traceback})
        assert isinstance(error, RemoteError)  # the header above says so
        where = f"map: item {self.index} ({self.item})"
        error.args = (f"{where}: {_said(error)}",)
        error.remote_traceback = f"{error.remote_traceback.rstrip()}\n({where} raised this)\n"
        return error


def run_chunk(fn: Callable[[Any], Any], start: int, items: Sequence[Any]) -> list[Any] | ItemFailed:
    """On the worker: ``fn`` over one chunk; at the first item it raises on, what it raised."""
    results = []
    for offset, item in enumerate(items):
        try:
            results.append(fn(item))
        except Exception as exc:  # the notebook raises it, naming the item
            kind = type(exc)
            name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
            below = exc.__traceback__.tb_next if exc.__traceback__ is not None else None  # from fn down
            text = "".join(traceback.format_exception(kind, exc, below))
            return ItemFailed(start + offset, _ITEM_REPR.repr(item), name, str(exc), text)
    return results


def default_chunksize(items: int, workers: int) -> int:
    """``map``'s chunk size when none is given: about CHUNKS_PER_WORKER chunks per worker."""
    return max(1, math.ceil(items / (CHUNKS_PER_WORKER * max(1, workers))))


def chunks(items: Sequence[Any], chunksize: int | None, workers: Sequence[str] | None,
           list_workers: Callable[[], Sequence[Any]]) -> list[tuple[int, list[Any]]]:
    """``map``'s chunks, each ``(index of its first item, its items)``: of ``chunksize`` items, or (None) of
    ``default_chunksize`` for the ``workers`` named (None: as many as ``list_workers`` lists); ValueError
    for a size under 1."""
    if not items:
        return []
    if chunksize is None:
        chunksize = default_chunksize(len(items), len(workers) if workers is not None else len(list_workers()))
    elif chunksize < 1:
        raise ValueError(f"chunksize must be 1 or more, not {chunksize}")
    return [(start, list(items[start:start + chunksize])) for start in range(0, len(items), chunksize)]


@dataclass
class _Chunk:
    start: int
    items: list[Any]
    attempts: Attempts
    worker: str | None = None  # the named worker it was sent to (``workers=``)
    job: CallJob | None = field(default=None, repr=False)  # its latest attempt (its ``worker`` ran it)


def map_chunks(calls: Calls, fn: Callable[[Any], Any], chunked: Sequence[tuple[int, list[Any]]], *, retries: int,
               workers: Sequence[str] | None, timeout: float | None,
               placement: Mapping[str, Any] | None = None) -> list[Any]:
    """A hub client's ``map``: the chunks (from ``chunks``) as call jobs, every worker kept busy (only
    ``workers``, when named), the results in input order."""
    waiting = deque(_Chunk(start, items, Attempts(retries, f"map items {start}-{start + len(items) - 1}"))
                    for start, items in chunked)
    load = dict.fromkeys(workers, 0) if workers is not None else None  # named workers: chunks sent to each
    results: list[Any] = [None] * sum(len(chunk.items) for chunk in waiting)
    running: dict[Future[Any], _Chunk] = {}
    try:
        while waiting or running:
            while waiting and (load is None or (load and min(load.values()) < IN_FLIGHT_PER_WORKER)):
                chunk = waiting.popleft()
                chunk.worker = None if load is None else min(load, key=load.__getitem__)
                chunk.job, future = calls.submit_call(run_chunk, (fn, chunk.start, chunk.items), {},
                                                      worker=chunk.worker, timeout=timeout, placement=placement)
                running[future] = chunk
                if load is not None and chunk.worker is not None:
                    load[chunk.worker] += 1
            if not running:  # every named worker left
                raise NoSuchWorker("none of the workers map was given is connected any more: "
                                   f"{', '.join(workers or [])}")
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                chunk = running.pop(future)
                if load is not None and chunk.worker in load:
                    load[chunk.worker] -= 1
                _settle(chunk, future, results, waiting, load)
    finally:
        for future in running:
            future.cancel()
    return results


def _settle(chunk: _Chunk, future: "Future[Any]", results: list[Any], waiting: "deque[_Chunk]",
            load: dict[str, int] | None) -> None:
    """Put a finished chunk's results in place, send it again, or raise its error."""
    try:
        outcome = future.result()
    except NoSuchWorker:  # it waited for a named worker that left: it never ran, so send it elsewhere
        if load is None or chunk.worker not in load:
            raise
        del load[chunk.worker]
        if not load:
            raise
        log.info("map: worker %r left before it ran items %d-%d; sending them to another", chunk.worker,
                 chunk.start, chunk.start + len(chunk.items) - 1)
        waiting.appendleft(chunk)
        return
    except JobError as error:
        worker = chunk.job.worker if chunk.job is not None else ""  # set when it started, before its ending arrived
        if chunk.attempts.retry(worker, error):
            if load is not None and chunk.worker in load and isinstance(error, WorkerLost):
                del load[chunk.worker]  # it is gone: the retry goes to another named worker
            waiting.appendleft(chunk)
            return
        raise chunk.attempts.final(worker, error) from None
    if isinstance(outcome, ItemFailed):
        raise outcome.error()
    results[chunk.start:chunk.start + len(outcome)] = outcome


# -- scatter and gather --------------------------------------------------------------------------------

def values_there(*values: Any) -> tuple[Any, ...]:
    """On the worker: its arguments, as they are there (a handle is the value it stands for)."""
    return values


def scatter(calls: Calls, data: Iterable[Any], workers: Sequence[str]) -> list[RemoteValue]:
    """A hub client's ``scatter``: the values spread over ``workers`` in turn, one job per worker; handles in order."""
    given = list(data)
    if not workers:
        raise NoSuchWorker("no worker is connected to scatter to: start one (`remote-worker --join`)")
    share: dict[str, list[int]] = {}
    for index in range(len(given)):
        share.setdefault(workers[index % len(workers)], []).append(index)
    futures = {name: calls.submit_call(values_there, [given[i] for i in indexes], {}, worker=name,
                                       keep=[f"scattered[{i}]" for i in indexes])[1]
               for name, indexes in share.items()}
    handles: dict[str, RemoteValue] = {}
    for future in futures.values():
        handles.update(future.result())
    return [handles[f"scattered[{index}]"] for index in range(len(given))]


def gather(calls: Calls, handles: Iterable[RemoteValue]) -> list[Any]:
    """A hub client's ``gather``: the values behind handles, one job per worker that holds some, in order."""
    wanted = list(handles)
    for handle in wanted:
        if not isinstance(handle, RemoteValue):
            raise InputError(f"gather takes handles (RemoteValue, from scatter), not {type(handle).__name__}")
    held: dict[str, list[int]] = {}
    for index, handle in enumerate(wanted):
        held.setdefault(handle.worker, []).append(index)
    futures = {name: calls.submit_call(values_there, [wanted[i] for i in indexes], {}, worker=name)[1]
               for name, indexes in held.items()}
    brought: list[Any] = [None] * len(wanted)
    for name, future in futures.items():
        for index, value in zip(held[name], future.result(), strict=True):
            brought[index] = value
    return brought
