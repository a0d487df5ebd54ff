"""The seam between the notebook API and the engines that run its jobs.

``Engine`` is what ``%%offload`` (``execute``), ``--all`` (``execute_all``), ``--split`` (``split``) and
``map`` need of a backend. Two implement it, and ``engines.connect`` opens the one the address's scheme names
(``engines.ENGINES``)::

    Engine ─┬─ client.Client           a remote-worker hub: sessions, files, placement, retries
            └─ dask_client.DaskClient  a Dask scheduler: Dask places the jobs

Both inherit the public calls from here, so their signatures and the work they share are written once:
the arguments become a ``JobRequest`` (as httpx's ``client.get(...)`` builds a ``Request``), ``execute_all``
labels each worker's output, ``split`` plans the pieces and gathers them, ``map`` becomes a ``MapRequest``.
A ``JobRequest`` becomes its SUBMIT in one place for every engine (``job_request.py``); an engine differs
only in how a finished SUBMIT travels, as httpx's transports do. An engine supplies three hooks, each taking requests:

- ``run_job(request)``: one job, to its JobResult or its error;
- ``run_each(requests)``: one job per request at once, each on its request's worker;
- ``run_map(request)``: ``map``'s chunks (``fleet_jobs.chunks`` sizes them).

What else differs between engines is said by the engine, never asked of it: what it is connected to
(``address``) and what its workers are called (``workers_called``), the bytes over its own link
(``traffic``, None without one) and that link's bounds (``limit_link``), and, for what needs a
remote-worker's session (``submit``, ``scatter``, ``gather``, ``pull``, files, ``reset``, jobs that outlive
their notebook), an EngineError that says what to do instead.
"""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, NamedTuple, Protocol, Sequence, TypeVar

from . import fleet_jobs, split_gather
from .errors import EngineError, FleetError
from .job_request import JobRequest, MapRequest, OnModuleError, OnStream, OnWorkerOutput
from .results import FileChanges, JobResult, show_display, write_stream
from .split_gather import SplitResult

if TYPE_CHECKING:
    from concurrent.futures import Future

    from .file_copy import Transfer
    from .wire.handles import RemoteValue
    from .wire.tokens import Token

log = logging.getLogger(__name__)

DEFAULT_CONNECT_TIMEOUT_S = 10.0

HUB_SCHEME = "tcp"
"""A token's scheme: it carries its hub's tcp:// address inside."""


@dataclass(frozen=True)
class Address:
    """What ``connect`` was given, read once: its scheme, and the rest."""

    scheme: str
    """``tcp`` for a token, ``dask`` for ``dask://HOST:PORT``."""
    location: "str | Token"
    """After the scheme: a Dask scheduler's ``HOST:PORT``; for a token, the token itself."""
    text: str
    """For messages: as written, but a token never (it holds credentials)."""


@dataclass(frozen=True, kw_only=True)
class ConnectOptions:
    """``connect``'s options, as each engine's ``open`` takes them; an engine with no link of its own (Dask
    moves the data itself) has none of it to bound and ignores ``send_timeout`` and ``max_transfer``."""

    timeout: float = DEFAULT_CONNECT_TIMEOUT_S
    name: str | None = None
    send_timeout: float | None = None
    max_transfer: int | None = None


def parse(address: "str | Token") -> Address:
    """``address`` read: ``dask://HOST:PORT`` is scheme ``dask``, location ``HOST:PORT``; a token (no scheme) is
    scheme ``tcp``, location the token."""
    if isinstance(address, str) and "://" in address:
        scheme, location = address.split("://", 1)
        return Address(scheme.lower(), location, address)
    return Address(HUB_SCHEME, address, address.redacted() if not isinstance(address, str) else "a token")


_Self = TypeVar("_Self", bound="Engine")

class LinkTraffic(NamedTuple):
    """The bytes over an engine's own link so far, as they crossed, and the most it may carry in all."""

    sent: int
    received: int
    budget: int | None
    """``max_transfer``: None for no bound."""


class Engine(Protocol):
    """What runs offloaded work: ``run``, ``execute``, ``execute_all``, ``split``, ``map``, ``workers``, ``close``.

    An engine subclasses this for the public calls and implements ``run_job``, ``run_each``, ``run_map``
    and ``workers``. It is a context manager (``close`` on exit).
    """

    address: str
    """What this engine is connected to, as people write it: ``tcp://HOST:PORT``, ``dask://HOST:PORT``."""
    workers_called: str = "workers"
    """What this engine's workers are called, in words ("workers", "Dask workers")."""
    version_notes: list[str]
    """Version differences with the workers at connect, in words."""
    hub_cache: dict[str, int]
    """How many bytes of this client's large values the hub keeps (``bytes``, ``max_bytes``; empty without a hub)."""

    # -- what an engine implements ---------------------------------------------------------

    @classmethod
    def open(cls: type[_Self], address: "Address", options: "ConnectOptions") -> _Self:
        """Connect to ``address`` (``engines.connect`` read its scheme, which names this engine)."""
        ...

    def run_job(self, request: JobRequest) -> JobResult:
        """Run one job to its end: its JobResult, or its error raised (a RemoteError carries ``partial``)."""
        ...

    def run_each(self, requests: Sequence[JobRequest]) -> list[Callable[[], JobResult]]:
        """Run one job per request at once, each on its request's worker, and wait for all; for each, in order,
        a call that reads its JobResult or raises its error. NoSuchWorker, with what to do, when there
        are no requests (no worker to run on)."""
        ...

    def run_map(self, request: MapRequest) -> list[Any]:
        """``fn`` over the items, in chunks, on the workers: the results in input order."""
        ...

    def workers(self, timeout: float = ...) -> list[dict[str, Any]]:
        """The workers: one dict each, with at least ``name`` and ``state``."""
        ...

    def close(self) -> None:
        """Disconnect; jobs still running are cancelled."""
        ...

    # -- what differs between engines, with what an engine without a hub's link and sessions does ------

    def traffic(self) -> LinkTraffic | None:
        """Bytes over this engine's own link so far, and its budget; None when it has no link of its own (Dask
        moves the data between its own workers and scheduler)."""
        return None

    def limit_link(self, *, max_transfer: int | None = None, outage_grace: float | None = None) -> None:
        """Bound this engine's link: the bytes it may send and receive in all (``max_transfer``), how long a
        waiting job rides out a link that went down (``outage_grace``). EngineError when it has none."""
        if max_transfer is not None or outage_grace is not None:
            raise EngineError("--max-transfer and --outage-grace bound the link to a remote-worker hub; "
                              f"{self.address} is reached without one")

    def jobs(self, timeout: float = DEFAULT_CONNECT_TIMEOUT_S) -> list[dict[str, Any]]:
        """Jobs that outlived the notebook that submitted them and wait to be collected (``attach``)."""
        raise self._needs_a_hub("%offload_jobs / jobs")

    def attach(self, job_id: str, *, on_stream: OnStream = write_stream, on_display: OnStream = show_display,
               on_module_error: OnModuleError | None = None) -> JobResult:
        """Collect a job that outlived the notebook that submitted it (see ``jobs``)."""
        raise self._needs_a_hub("%offload_attach / attach")

    def submit(self, fn: Callable[..., Any], *args: Any, require: Iterable[str] | str | None = None,
               prefer: str | None = None, **kwargs: Any) -> "Future[Any]":
        """Call ``fn(*args, **kwargs)`` on a worker; a Future holds its return value."""
        raise self._needs_a_hub("submit")

    def scatter(self, data: Iterable[Any], workers: Iterable[str] | None = None) -> "list[RemoteValue]":
        """Put each value of ``data`` on a worker, in its session there; a handle to each, in order."""
        raise self._needs_a_hub("scatter")

    def gather(self, handles: "Iterable[RemoteValue]") -> list[Any]:
        """The values behind ``handles``, in order."""
        raise self._needs_a_hub("gather")

    def pull(self, handle: "RemoteValue", *, timeout: float | None = None) -> Any:
        """The value behind one handle, brought here."""
        raise self._needs_a_hub("%offload_pull / pull")

    def get_file(self, remote_path: str, local_path: str | os.PathLike[str] | None = None, *,
                 worker: str | None = None, overwrite: bool = False, progress: bool | None = None) -> "Transfer":
        """Copy a file or a folder from a worker's working directory to this machine."""
        raise self._needs_a_hub("%offload_get / get_file")

    def put_file(self, local_path: str | os.PathLike[str], remote_path: str | None = None, *,
                 worker: str | None = None, overwrite: bool = False, progress: bool | None = None) -> "Transfer":
        """Copy a file or a folder from this machine to a worker's working directory."""
        raise self._needs_a_hub("%offload_put / put_file")

    def reset(self, worker: str | None = None) -> list[str]:
        """End this client's session on a worker (None: on every worker it ran a job on)."""
        raise self._needs_a_hub("%offload_reset / reset")

    def _needs_a_hub(self, what: str) -> EngineError:
        return EngineError(f"{what} needs a remote-worker hub (sessions on its workers, their working directories, "
                           f"jobs it keeps); {self.address} has none: connect with the token remote-worker printed")

    # -- the public calls, the same on every engine ----------------------------------------

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
        the job on a worker that has what it needs (``["gpu", "memory>=16GB", "zone==lab"]``: all must hold),
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
                gpu_kernels: Mapping[str, str] | None = None, on_stream: OnStream = write_stream,
                on_display: OnStream = show_display, on_module_error: OnModuleError | None = None,
                figure_formats: Iterable[str] = ("png",), text_format: Mapping[str, Any] | None = None,
                on_files: Callable[[FileChanges], None] | None = None,
                retries: int = 0, on_retry: Callable[[str], None] | None = None,
                require: Iterable[str] | str | None = None, prefer: str | None = None,
                keep: Iterable[str] | None = None, module_state: Mapping[str, Any] | None = None,
                kernels: Mapping[str, str] | None = None) -> JobResult:
        """Like ``run``, but returns a JobResult with the last expression's value and GPU stats.

        ``gpu_kernels`` maps names to custom WGSL sources that the cell may call as ``gpu.NAME`` (``kernels``,
        their former name, is still taken, with a DeprecationWarning).
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

        On a Dask cluster, ``timeout`` stops the waiting (JobTimeout; Dask can't stop a task that started),
        ``gpu``, ``gpu_kernels``, ``retries``, ``require``, ``prefer`` and ``keep`` raise DaskError, and files the
        code writes stay on the Dask worker, unlisted.
        """
        return self.run_job(JobRequest(
            code=code, inputs=dict(inputs or {}), outputs=None if outputs is None else tuple(outputs), worker=worker,
            timeout=timeout, gpu=_kernel_names(gpu), gpu_kernels=_gpu_kernels(gpu_kernels, kernels),
            on_stream=on_stream, on_display=on_display,
            on_module_error=on_module_error, figure_formats=tuple(figure_formats), text_format=text_format,
            on_files=on_files, retries=retries, on_retry=on_retry, require=_requirements(require), prefer=prefer,
            keep=tuple(keep or ()), module_state=module_state))

    def execute_all(self, code: str, inputs: Mapping[str, Any] | None = None, outputs: Iterable[str] | None = None,
                    *, workers: Iterable[str] | None = None, timeout: float | None = None,
                    gpu: bool | list[str] | None = None, gpu_kernels: Mapping[str, str] | None = None,
                    on_stream: OnWorkerOutput | None = None, on_display: OnWorkerOutput | None = None,
                    on_module_error: OnModuleError | None = None,
                    figure_formats: Iterable[str] = ("png",), text_format: Mapping[str, Any] | None = None,
                    inputs_for: Mapping[str, Mapping[str, Any]] | None = None,
                    kernels: Mapping[str, str] | None = None) -> dict[str, JobResult]:
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
        names = worker_names(self, workers)
        labelled = fleet_jobs.LabelledOutput(write_stream, show_display)
        stream, display = on_stream or labelled.stream, on_display or labelled.display
        common = JobRequest(code=code, outputs=None if outputs is None else tuple(outputs), timeout=timeout,
                            gpu=_kernel_names(gpu), gpu_kernels=_gpu_kernels(gpu_kernels, kernels),
                            on_module_error=on_module_error,
                            figure_formats=tuple(figure_formats), text_format=text_format, update_inputs=False)
        requests = [replace(common, worker=name, inputs={**(inputs or {}), **(inputs_for or {}).get(name, {})},
                            on_stream=_for_worker(stream, name), on_display=_for_worker(display, name))
                    for name in names]
        return fleet_jobs.each_result(zip(names, self.run_each(requests)), names)

    def split(self, code: str, inputs: Mapping[str, Any] | None = None, outputs: Iterable[str] | None = None, *,
              split: Iterable[str] | str, gather: Iterable[str] | str = (), workers: Iterable[str] | None = None,
              timeout: float | None = None, gpu: bool | list[str] | None = None,
              gpu_kernels: Mapping[str, str] | None = None, on_stream: OnWorkerOutput | None = None,
              on_display: OnWorkerOutput | None = None, on_module_error: OnModuleError | None = None,
              figure_formats: Iterable[str] = ("png",), text_format: Mapping[str, Any] | None = None,
              kernels: Mapping[str, str] | None = None) -> SplitResult:
        """Run ``code`` on pieces of the ``split`` inputs, one piece per worker at once; concatenate ``gather``.

        Each input named in ``split`` (numpy arrays, lists, tuples, pandas DataFrames and Series, all of one
        length) is cut along axis 0 into contiguous pieces, one per worker of ``workers`` (default: every
        worker connected now), in that order, sized in proportion to each worker's measured ``speed``
        (equal pieces when one has none, as on a Dask cluster). An input shorter than the workers runs on
        fewer of them (the fastest; ``SplitResult.notes`` says so). The other inputs go whole to every
        worker. Each name in ``gather`` is concatenated over the pieces in order (``np.concatenate``, list or
        tuple concatenation, ``pd.concat``) into ``SplitResult.gathered``; ``SplitResult.results`` has each
        worker's JobResult.

        Raises SplitError (nothing ran) when an input can't be split as asked, GatherError (with
        ``results``) when a gathered name's values can't be concatenated, and FleetError as ``execute_all``
        when a piece failed: then nothing is gathered. The other arguments are ``execute_all``'s.
        """
        split_names, gather_names = split_gather.names(split), split_gather.names(gather)
        given = dict(inputs or {})
        plan = split_gather.plan(given, split_names, split_gather.chosen(self.workers(), workers))
        for note in plan.notes:
            log.info("split: %s", note)
        common = {name: value for name, value in given.items() if name not in split_names}
        wanted = None if outputs is None else list(dict.fromkeys([*outputs, *gather_names]))
        try:
            results = self.execute_all(
                code, common, wanted, workers=list(plan.pieces), inputs_for=plan.inputs_for, timeout=timeout, gpu=gpu,
                gpu_kernels=_gpu_kernels(gpu_kernels, kernels), on_stream=on_stream, on_display=on_display,
                on_module_error=on_module_error,
                figure_formats=figure_formats, text_format=text_format)
        except FleetError as error:
            split_gather.say_nothing_gathered(error, gather_names)
            raise
        return split_gather.gathered(plan, results, gather_names)

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
        and ``prefer``: as ``run``. On a Dask cluster the chunks are Dask tasks, all handed to its
        scheduler at once, and ``retries``, ``require`` and ``prefer`` raise DaskError.
        """
        return self.run_map(MapRequest(
            fn=fn, items=tuple(iterable), chunksize=chunksize, retries=retries,
            workers=None if workers is None else tuple(dict.fromkeys(workers)), timeout=timeout,
            require=_requirements(require), prefer=prefer))

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def worker_names(engine: Engine, workers: Iterable[str] | None) -> list[str]:
    """The workers named, without repeats, in order; None: every worker ``engine`` lists now."""
    return list(dict.fromkeys(workers)) if workers is not None else [str(w["name"]) for w in engine.workers()]


def _for_worker(callback: OnWorkerOutput, worker: str) -> OnStream:
    return lambda header: callback(worker, header)


def _kernel_names(gpu: bool | Iterable[str] | None) -> bool | tuple[str, ...] | None:
    return gpu if gpu is None or isinstance(gpu, bool) else tuple(gpu)


def _gpu_kernels(gpu_kernels: Mapping[str, str] | None,
                 kernels: Mapping[str, str] | None) -> Mapping[str, str] | None:
    """``gpu_kernels``, with those passed by their former name, ``kernels`` (a word that also names Jupyter's)."""
    if kernels is None:
        return gpu_kernels
    warnings.warn("kernels= is now gpu_kernels= (users' GPU kernels, as %%offload_kernel defines them)",
                  DeprecationWarning, stacklevel=3)
    return {**kernels, **(gpu_kernels or {})}


def _requirements(require: Iterable[str] | str | None) -> tuple[str, ...] | str | None:
    return require if require is None or isinstance(require, str) else tuple(require)
