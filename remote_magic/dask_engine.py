"""Offloaded cells on a Dask distributed cluster: ``remote_magic.connect("dask://HOST:PORT")`` and
``%offload_connect dask://HOST:PORT``.

``DaskClient`` has the part of ``Client``'s API that needs no session on a worker (``run``, ``execute``,
``execute_all``, ``split``, ``map``, ``workers``, ``close``). Dask schedules: each job is one Dask task
(``dask_jobs.py``), pinned to a worker only when asked (``worker=``, ``execute_all``, ``split``'s pieces),
run on the Dask worker with the executor's own machinery; its RESULT or ERROR is read here as any
worker's (``results.finish``), and what it prints and shows streams while it runs.

``distributed`` is imported when a client is made, never by ``import remote_magic``.
"""

from __future__ import annotations

import functools
import logging
import queue
from typing import Any, Callable, Iterable, Mapping

from . import fleet_jobs, split_gather
from .dask_jobs import DASK_INSTALL, DaskJobs, Events, Job, OnStream
from .errors import (
    ConnectionFailed,
    DaskError,
    NoSuchWorker,
)
from .results import FileChanges, JobResult, finish, show_display, write_stream
from .split_gather import SplitResult
from .wire.versions import local_versions

log = logging.getLogger(__name__)

SCHEME = "dask://"

OnWorkerOutput = Callable[[str, Mapping[str, Any]], None]


def is_dask_address(address: object) -> bool:
    """Is this what ``connect`` takes for a Dask scheduler (``dask://HOST:PORT``)?"""
    return isinstance(address, str) and address.startswith(SCHEME)


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
        self.hub_cache: dict[str, int] = {}  # no hub keeps values here (Client.hub_cache)
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
        self._jobs = DaskJobs(self._dask, address, local_versions())
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
                figure_formats: Iterable[str] = ("png",), text_format: Mapping[str, Any] | None = None,
                on_files: Callable[[FileChanges], None] | None = None,
                retries: int = 0, on_retry: Callable[[str], None] | None = None,
                require: Iterable[str] | str | None = None, prefer: str | None = None,
                keep: Iterable[str] | None = None, module_state: Mapping[str, Any] | None = None) -> JobResult:
        """Run ``code`` on a Dask worker (the one named by ``worker``, else where Dask puts it), as
        ``Client.execute``: a JobResult, a RemoteError (with ``partial``) when the code raised, output
        streamed while it runs. ``timeout``: stop waiting after that many seconds (JobTimeout; Dask can't
        stop a task that started). ``gpu``, ``kernels``, ``retries``, ``require``, ``prefer`` and ``keep``
        need a remote-worker: DaskError. Files the code writes stay on the Dask worker, unlisted
        (``on_files`` is never called)."""
        _refuse(gpu=gpu or kernels, retries=retries, require=require, prefer=prefer, keep=keep)
        header = _code_header(code, outputs, figure_formats, text_format)
        addresses = None if worker is None else self._addresses([worker])
        job = self._jobs.submit(header, inputs, worker, addresses, queue.SimpleQueue(), on_stream, on_display,
                                module_state=module_state)
        ended = self._jobs.wait({job.id: job}, timeout)[job.id]
        return finish(ended, job.worker, job.inputs, job.update_inputs, on_module_error)

    def execute_all(self, code: str, inputs: Mapping[str, Any] | None = None, outputs: Iterable[str] | None = None,
                    *, workers: Iterable[str] | None = None, timeout: float | None = None,
                    gpu: bool | list[str] | None = None, kernels: Mapping[str, str] | None = None,
                    on_stream: OnWorkerOutput | None = None, on_display: OnWorkerOutput | None = None,
                    on_module_error: Callable[[str, Any, Exception], None] | None = None,
                    figure_formats: Iterable[str] = ("png",), text_format: Mapping[str, Any] | None = None,
                    inputs_for: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, JobResult]:
        """Run ``code`` on each of ``workers`` (default: every Dask worker) at once; ``{worker: JobResult}``,
        with labelled output and FleetError as ``Client.execute_all``."""
        _refuse(gpu=gpu or kernels)
        names = list(dict.fromkeys(workers)) if workers is not None else [w["name"] for w in self.workers()]
        if not names:
            raise NoSuchWorker(f"the Dask cluster at {self.address} has no workers: start some, then run this again")
        labelled = fleet_jobs.LabelledOutput(write_stream, show_display)
        stream, display = on_stream or labelled.stream, on_display or labelled.display
        header = _code_header(code, outputs, figure_formats, text_format)
        jobs: dict[str, Job] = {}
        asked: dict[str, str] = {}  # job id -> the name it was asked for (results are keyed by it)
        events: Events = queue.SimpleQueue()
        addresses = self._addresses(names)
        try:
            for name, address in zip(names, addresses):
                own = (inputs_for or {}).get(name)
                job = self._jobs.submit(header, {**(inputs or {}), **own} if own else inputs, name, [address], events,
                                   _for_worker(stream, name), _for_worker(display, name), update_inputs=False)
                jobs[job.id], asked[job.id] = job, name
        except BaseException:
            self._jobs.forget(jobs.values())
            raise
        ended = self._jobs.wait(jobs, timeout)
        return fleet_jobs.each_result(
            ((asked[job_id], functools.partial(finish, ended[job_id], job.worker, job.inputs, False, on_module_error))
             for job_id, job in jobs.items()), names)

    def split(self, code: str, inputs: Mapping[str, Any] | None = None, outputs: Iterable[str] | None = None, *,
              split: Iterable[str] | str, gather: Iterable[str] | str = (), workers: Iterable[str] | None = None,
              timeout: float | None = None, gpu: bool | list[str] | None = None,
              kernels: Mapping[str, str] | None = None, on_stream: OnWorkerOutput | None = None,
              on_display: OnWorkerOutput | None = None,
              on_module_error: Callable[[str, Any, Exception], None] | None = None,
              figure_formats: Iterable[str] = ("png",),
              text_format: Mapping[str, Any] | None = None) -> SplitResult:
        """``Client.split`` on the Dask workers: one piece per worker (equal pieces: Dask workers report no
        measured speed), run at once, ``gather`` concatenated in order."""
        return split_gather.run(self, code, inputs, split, gather, workers, outputs, timeout=timeout, gpu=gpu,
                                kernels=kernels, on_stream=on_stream, on_display=on_display,
                                on_module_error=on_module_error, figure_formats=figure_formats,
                                text_format=text_format)

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
        addresses = None if names is None else self._addresses(names)
        starts = range(0, len(items), chunksize)
        calls = [{"fn": fleet_jobs._run_chunk, "args": (fn, start, items[start:start + chunksize]), "kwargs": {}}
                 for start in starts]
        submitted = self._jobs.submit_calls(calls, addresses, queue.SimpleQueue())
        jobs = {job.id: job for job in submitted}
        first = {job.id: start for job, start in zip(submitted, starts)}
        results: list[Any] = [None] * len(items)

        def place(job: Job) -> None:  # as each chunk ends: a failure raises at once, cancelling the rest
            assert job.ended is not None
            outcome: list[Any] | fleet_jobs.ItemFailed = finish(job.ended, job.worker, {}, False, None).values["result"]
            if isinstance(outcome, fleet_jobs.ItemFailed):
                raise outcome.error()
            results[first[job.id]:first[job.id] + len(outcome)] = outcome

        self._jobs.wait(jobs, timeout, on_end=place)
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
            self._jobs.close()
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

    def pull(self, *args: Any, **kwargs: Any) -> Any:
        """Not on a Dask connection: no value stays behind there (see ``scatter``)."""
        raise DaskError("%offload_pull / pull: a Dask worker keeps no remote-magic session, so no value stays there")

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

    def _addresses(self, wanted: list[str]) -> list[str]:
        """The Dask addresses of the workers named (by Dask name or address); NoSuchWorker for one not there."""
        known = {w["name"]: w["address"] for w in self.workers()}
        known.update({address: address for address in list(known.values())})
        unknown = [name for name in wanted if name not in known]
        if unknown:
            raise NoSuchWorker(f"no Dask worker named {', '.join(repr(n) for n in unknown)} (the cluster has: "
                               f"{', '.join(repr(n) for n in known if '://' not in n) or 'none'})")
        return [known[name] for name in wanted]


def _refuse(**options: Any) -> None:
    """DaskError for an option that needs a remote-worker, naming it and why."""
    why = {"gpu": "GPU kernels run on a remote-worker's WGSL runtime; a Dask worker has none",
           "retries": "Dask itself runs a task again when its worker dies (distributed.scheduler.allowed-failures)",
           "require": "Dask places tasks itself: pin one with --worker NAME, or use Dask's worker resources",
           "prefer": "Dask places tasks itself: pin one with --worker NAME",
           "keep": "a Dask worker keeps no remote-magic session for the values to stay in"}
    for name, value in options.items():
        if value:
            raise DaskError(f"{name} (--{name}) is not available on a Dask cluster: {why[name]}")


def _code_header(code: str, outputs: Iterable[str] | None, figure_formats: Iterable[str],
                 text_format: Mapping[str, Any] | None) -> dict[str, Any]:
    return {"kind": "code", "code": code, "figure_formats": list(figure_formats),
            "text_format": dict(text_format or {}), "outputs": None if outputs is None else list(outputs)}


def _for_worker(callback: OnWorkerOutput, worker: str) -> OnStream:
    return lambda header: callback(worker, header)

