"""Offloaded cells on a Dask distributed cluster: ``remote_magic.connect("dask://HOST:PORT")`` and
``%offload_connect dask://HOST:PORT``.

``DaskClient`` is an ``Engine`` (``engine.py``): the part of ``Client``'s API that needs no session on a
worker (``run``, ``execute``, ``execute_all``, ``split``, ``map``, ``workers``, ``close``). Dask schedules: each
job is one Dask task
(``dask_jobs.py``), pinned to a worker only when asked (``worker=``, ``execute_all``, ``split``'s pieces),
run on the Dask worker with the executor's own machinery; its RESULT or ERROR is read here as any
worker's (``results.finish``), and what it prints and shows streams while it runs.

``distributed`` is imported when a client is made, never by ``import remote_magic``.
"""

from __future__ import annotations

import functools
import logging
import queue
from typing import Any, Callable, Sequence

from . import fleet_jobs
from .dask_jobs import DaskJob, DaskJobs
from .engine import DEFAULT_CONNECT_TIMEOUT_S, Address, ConnectOptions, Engine, parse
from .errors import ConnectionFailed, DaskError, NoSuchWorker
from .job_request import JobRequest, MapRequest, OnModuleError, OnStream
from .results import JobResult, finish
from .wire.install import install_command
from .wire.versions import local_versions

log = logging.getLogger(__name__)

SCHEME = "dask"


class DaskClient(Engine):
    """Offloaded cells on a Dask cluster. Use ``remote_magic.connect("dask://HOST:PORT")`` to make one.

    ``run``, ``execute``, ``execute_all``, ``split`` and ``map`` are the ``Engine``'s, with the same results and
    errors as a ``Client``'s. What needs a remote-worker raises DaskError saying why: ``gpu``, ``gpu_kernels``,
    ``retries``, ``require``, ``prefer`` and ``keep``; ``submit``, ``scatter``, ``gather``, ``pull``,
    ``get_file``, ``put_file`` and ``reset``. A ``timeout`` stops the waiting (Dask can't stop a task that
    started); files the code writes stay on the Dask worker, unlisted; ``split``'s pieces are equal (Dask
    workers report no measured speed).
    """

    workers_called = "Dask workers"

    def __init__(self, address: str | Address, *, timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
                 name: str | None = None) -> None:
        try:
            import distributed
        except ImportError:
            raise DaskError(f"connecting to a Dask cluster needs distributed: {install_command('dask')}") from None
        read = parse(address) if isinstance(address, str) else address
        if read.scheme != SCHEME or not isinstance(read.location, str) or not read.location:
            raise DaskError(f"{read.text!r} is not a Dask scheduler's address: write dask://HOST:PORT")
        self.address = read.text
        self.hub_cache: dict[str, int] = {}  # no hub keeps values here (Client.hub_cache)
        self.version_notes: list[str] = []
        self._versions = local_versions()
        scheduler = read.location
        make: Any = distributed.Client  # distributed has no type hints
        try:
            self._dask: Any = make(scheduler if "://" in scheduler else f"tcp://{scheduler}", timeout=timeout,
                                   set_as_default=False, name=name)
        except (OSError, TimeoutError) as exc:
            raise ConnectionFailed(f"no Dask scheduler answered at {self.address} within {timeout:g} s ({exc}): "
                                   "check that it runs (dask scheduler, or distributed.LocalCluster) and its "
                                   "address") from None
        self._jobs = DaskJobs(self._dask, self.address, local_versions())
        log.info("connected to the Dask scheduler at %s", scheduler)

    @classmethod
    def open(cls, address: Address, options: ConnectOptions) -> "DaskClient":
        """``connect("dask://HOST:PORT")``. Dask moves the data between its own workers and scheduler: there is
        no link here to bound (``send_timeout``, ``max_transfer``) or to wait on."""
        return cls(address, timeout=options.timeout, name=options.name)

    @property
    def dask(self) -> Any:
        """The ``distributed.Client`` underneath, for what Dask does itself (``submit``, ``scatter``, ...)."""
        return self._dask

    # -- the Engine's hooks ------------------------------------------------------------------

    def run_job(self, request: JobRequest) -> JobResult:
        """``execute``: one Dask task, on the worker named (else where Dask puts it)."""
        _refuse(gpu=request.gpu or request.gpu_kernels, retries=request.retries, require=request.require,
                prefer=request.prefer, keep=request.keep)
        addresses = None if request.worker is None else self._addresses([request.worker])
        job = self._jobs.submit(request, addresses, queue.SimpleQueue())
        ended = self._jobs.wait({job.id: job}, request.timeout)[job.id]
        return finish(ended, job.worker, job.inputs, job.update_inputs, request.on_module_error, job.shared,
                      job.notes)

    def run_each(self, requests: Sequence[JobRequest]) -> list[Callable[[], JobResult]]:
        """``execute_all``: one task pinned to each request's worker, all handed to Dask at once."""
        if not requests:
            raise NoSuchWorker(f"the Dask cluster at {self.address} has no workers: start some, then run this again")
        _refuse(gpu=any(request.gpu or request.gpu_kernels for request in requests))
        addresses = self._addresses([request.worker or "" for request in requests])
        events: queue.SimpleQueue[Any] = queue.SimpleQueue()
        jobs: dict[str, DaskJob] = {}
        try:
            for request, address in zip(requests, addresses):
                job = self._jobs.submit(request, [address], events)
                jobs[job.id] = job
        except BaseException:
            self._jobs.forget(jobs.values())
            raise
        ended = self._jobs.wait(jobs, requests[0].timeout)  # the jobs of one call share its timeout
        return [functools.partial(finish, ended[job.id], job.worker, job.inputs, False, request.on_module_error)
                for job, request in zip(jobs.values(), requests)]

    def run_map(self, request: MapRequest) -> list[Any]:
        """``map``: the chunks as Dask tasks, all handed to Dask's scheduler at once (Dask itself runs a task
        again when its worker dies: no ``retries``)."""
        _refuse(retries=request.retries, require=request.require, prefer=request.prefer)
        chunked = fleet_jobs.chunks(request.items, request.chunksize, request.workers, self.workers)
        if not chunked:
            return []
        addresses = None if request.workers is None else self._addresses(list(request.workers))
        calls = [{"fn": fleet_jobs.run_chunk, "args": (request.fn, start, items), "kwargs": {}}
                 for start, items in chunked]
        submitted = self._jobs.submit_calls(calls, addresses, queue.SimpleQueue())
        jobs = {job.id: job for job in submitted}
        first = {job.id: start for job, (start, _) in zip(submitted, chunked)}
        results: list[Any] = [None] * len(request.items)

        def place(job: DaskJob) -> None:  # as each chunk ends: a failure raises at once, cancelling the rest
            assert job.ended is not None
            outcome: list[Any] | fleet_jobs.ItemFailed = finish(job.ended, job.worker, {}, False, None).values["result"]
            if isinstance(outcome, fleet_jobs.ItemFailed):
                raise outcome.error()
            results[first[job.id]:first[job.id] + len(outcome)] = outcome

        self._jobs.wait(jobs, request.timeout, on_end=place)
        return results

    # -- the rest of the API -------------------------------------------------------------------

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

    def limit_link(self, *, max_transfer: int | None = None, outage_grace: float | None = None) -> None:
        """Not on a Dask connection: it has no link of its own to bound."""
        if max_transfer is not None or outage_grace is not None:
            raise DaskError("--max-transfer and --outage-grace are about a remote-worker hub's link; on Dask, "
                            "data moves between the Dask workers and the scheduler")

    def jobs(self, timeout: float = DEFAULT_CONNECT_TIMEOUT_S) -> list[dict[str, Any]]:
        """Not on a Dask connection: no job outlives its notebook there."""
        raise DaskError("%offload_jobs lists a remote-worker hub's jobs; on Dask, use the Dask dashboard")

    def attach(self, job_id: str, *, on_stream: OnStream | None = None, on_display: OnStream | None = None,
               on_module_error: OnModuleError | None = None) -> JobResult:
        """Not on a Dask connection (see ``jobs``)."""
        raise DaskError("%offload_attach collects a remote-worker hub's jobs; a Dask connection has none")

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
