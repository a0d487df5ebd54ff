"""Running one job: a cell's code, or a file operation, in a session's namespace, and what it sends back.

:class:`JobRunner` checks a SUBMIT, loads its inputs, runs the cell (as a notebook would: its last
expression is its value, top-level ``await`` works, ``display()`` and figures stream), finds what
the cell changed, and sends RESULT or ERROR. The executor process (``executor.py``) and a Dask
worker (``dask_task.py``) each run jobs through one.
"""

from __future__ import annotations

import asyncio
import builtins
import inspect
import linecache
import logging
import sys
import threading
import time
import traceback
import types
from contextlib import contextmanager
from types import CodeType
from typing import Any, Iterator

from remote_magic.errors import (
    FileTransferError,
    GpuError,
    InputError,
    JobCancelled,
    OutputError,
    ProtocolError,
    RemoteError,
    SerializationError,
)
from remote_magic.wire import definitions, identity, module_state, schema, serialization
from remote_magic.wire.cellcode import split_last_expression
from remote_magic.wire.failures import error_header
from remote_magic.wire.handles import CELL_VALUE, RemoteValue, summarize
from remote_magic.wire.imported_names import notebook_imports
from remote_magic.wire.protocol import Message, MessageType as T
from remote_magic.wire.sizes import human_size
from remote_magic.wire.versions import local_versions

from . import files, workdir
from .cell_calls import CALL_RESULT, wrap_calls
from .outputs import JobOutputs
from .tracking import CellChanges, cell_changes, fingerprints, is_dunder

log = logging.getLogger(__name__)

MATPLOTLIB_BACKEND = "module://remote_magic.worker.figures"  # plt.show() as in a notebook
_KEPT_SOURCES = 64  # cell sources kept in linecache for tracebacks


class JobRunner:
    """Runs jobs one at a time: a cell with what it changed tracked, a call, a file step; what a job
    shows and how it ends go out through ``send``. The executor process is one; a Dask worker
    (``dask_task.DaskRunner``, for ``dask://`` connections) is another, so cells there run by the same rules."""

    displays_in_frames = True
    """Can ``send`` carry a DISPLAY's frames (a display too large for its header)?"""

    runs_as_main = False
    """Is a cell's namespace this process's ``__main__`` while it runs (``main_module``)? So it is in the
    executor, a process of the session's own; not where cells share a process (a Dask worker's threads)."""

    def __init__(self, gpu: Any, no_gpu: str) -> None:
        self._outputs: JobOutputs | None = None
        self._running = False
        self._cells = 0
        self._sources: list[str] = []
        self._kernels: dict[str, str] = {}
        self._kept: dict[str, Any] = {}       # what stayed here, by handle id (RemoteValue.id)
        self._kept_ids: dict[int, str] = {}   # id() of each of those -> its handle id
        self._kept_why: dict[str, str] = {}   # why each stayed, by handle id
        self._unpicklable: set[str] = set()   # the handle ids of those that can't be pickled: never pulled
        self._workdir = workdir.WorkingDirectory()  # what each cell wrote or removed where it started
        self._files_changed: dict[str, Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # for cells that await at the top level
        self._module_state = module_state.Synced()  # as this session and its notebook last agreed on it
        self.gpu, self.no_gpu = gpu, no_gpu

    def send(self, msg_type: T, header: dict[str, Any], buffers: list[Any] | tuple[Any, ...] = ()) -> None:
        """Report a job's output or its end (STREAM, DISPLAY, RESULT, ERROR)."""
        raise NotImplementedError

    def stand_in(self, buffer: memoryview) -> bytes | None:
        """A token for a buffer of the running job's inputs whose bytes this process knows unchanged without
        reading them (``tracking.StandIn``), or None: they are hashed. (The executor knows its shared-memory
        inputs': ``held_frames``.)"""
        return None

    # -- one job ---------------------------------------------------------------------------

    def run_job(self, msg: Message) -> None:
        """Run one job (a SUBMIT as the supervisor forwards it); its end is sent, never raised. A SUBMIT
        whose header breaks the protocol (wire/schema.py) ends with a ProtocolError, and runs nothing."""
        try:
            schema.check(msg)  # the worker's supervisor checked it too; a Dask worker's job comes as it was sent
        except ProtocolError as exc:
            self.send(T.ERROR, error_header(exc, schema.job_of(msg.header)))
            return
        if msg.header.get("kind") == "file":
            self._run_file_job(msg)
            return
        job = str(msg.header["job"])
        started = time.perf_counter()
        self._files_changed = None
        text_format = msg.header.get("text_format")
        outputs = JobOutputs(job, self.send, [str(f) for f in msg.header.get("figure_formats") or ["png"]],
                             framed=self.displays_in_frames,
                             text_format=text_format if isinstance(text_format, dict) else None)
        self._outputs = outputs
        try:
            with outputs:
                try:
                    self._running = True
                    try:
                        changes = self._execute(msg, outputs)
                    finally:
                        self._running = False
                        self._note_file_changes()
                    header, frames = self._pack_changes(msg, changes)
                    # The value as the notebook shows it, rendered in this session (its print options)
                    shown = outputs.value_header(changes.values[CELL_VALUE]) if CELL_VALUE in changes.values else None
                    if shown is not None:
                        header["value_display"] = shown
                finally:
                    outputs.show_figures_at_end()  # a cell that raised shows its figures too, as locally
            self._send_result(job, header, frames, started)
        except _CellFailed as failed:
            self._send_failure(msg, failed)
        except KeyboardInterrupt as exc:
            # A C extension whose import was cut short can never be imported again in this
            # process ("cannot load module more than once"): ask for a fresh executor.
            replace = _interrupted_an_import(exc, self._sources)
            self.send(T.ERROR, self._with_files(error_header(JobCancelled("the job was interrupted"), job,
                                                             replace_executor=replace)))
        except (SerializationError, GpuError) as exc:
            self.send(T.ERROR, self._with_files(error_header(exc, job)))
        except BaseException as exc:  # user code may raise anything, SystemExit included
            self.send(T.ERROR, self._with_files(_remote_error(exc, job, self._sources)))
        finally:
            self._outputs = None

    def _run_file_job(self, msg: Message) -> None:
        """One step of copying a file or folder (worker/files.py): no user code runs, so nothing is tracked."""
        job = str(msg.header["job"])
        op = msg.header.get("op")
        try:
            self._running = True  # a digest of a large file may take a while: Ctrl-C stops it
            try:
                header, frames = files.handle(op if isinstance(op, dict) else {}, msg.buffers)
            finally:
                self._running = False
            self.send(T.RESULT, {"job": job, "file": header}, frames)
        except KeyboardInterrupt:
            self.send(T.ERROR, error_header(JobCancelled("the copy was interrupted"), job))
        except FileTransferError as exc:
            self.send(T.ERROR, error_header(exc, job))
        except (KeyError, TypeError, ValueError, OverflowError) as exc:  # a malformed operation: say so, don't die
            self.send(T.ERROR, error_header(FileTransferError(
                f"the worker could not read a file operation ({type(exc).__name__}: {exc}): install the same "
                "remote-magic version on the notebook and the worker"), job))

    def _starting_files(self) -> None:
        """Note the folder the cell starts in, as it is (DaskRunner doesn't: files there can't be copied)."""
        self._workdir.cell_starts()

    def _note_file_changes(self) -> None:
        """What the running cell wrote or removed under the folder it started in (workdir.py)."""
        self._files_changed = self._workdir.cell_ended()

    def _with_files(self, header: dict[str, Any]) -> dict[str, Any]:
        """A cell that wrote files and then failed still wrote them: its ERROR says so too."""
        if self._files_changed is not None:
            header["files"] = self._files_changed
        return header

    def _execute(self, msg: Message, outputs: JobOutputs) -> CellChanges:
        """Run the job; returns what it changed."""
        header = msg.header
        main = _CellModule("__main__")
        namespace: dict[str, Any] = vars(main)
        namespace.update({"__builtins__": builtins, "display": getattr(builtins, "display", outputs.display),
                          "get_ipython": _no_shell})
        # Notebook functions and classes arrive as source and are compiled here, in the cell's
        # globals: as in the notebook, they see the names the cell binds.
        with definitions.defining_into(namespace):
            inputs = serialization.unpack(header, msg.buffers, InputError,
                                          sides=("on the worker", "in the notebook"))
        shared_state = inputs.pop(module_state.NAME, None)  # the notebook's random seeds, rcParams...
        if isinstance(shared_state, dict):
            self._module_state.take(shared_state, load=True)
        inputs, _ = identity.resolve(inputs, header.get("refs") or {})
        # Numbered before handles become their values: the notebook numbered the handles themselves.
        walked = identity.shared_objects(inputs) if header.get("shared") else None
        shared = walked[0] if walked is not None and walked[1] == header["shared"] else []
        inputs = {name: self._resolve(name, value) for name, value in inputs.items()}
        if header.get("kind") == "call":  # Client.submit: handles among the arguments are their values here
            args = [self._resolve(f"argument {i + 1}", value) for i, value in enumerate(inputs.get("args", ()))]
            kwargs = {key: self._resolve(key, value) for key, value in inputs.get("kwargs", {}).items()}
            result = inputs["fn"](*args, **kwargs)
            names = header.get("keep")
            if isinstance(names, list):  # Client.scatter: the values the call returns stay here, under handles
                return CellChanges(dict(zip((str(name) for name in names), result, strict=True)))
            return CellChanges({"result": result})
        code = str(header.get("code", ""))
        gpu_choice = header.get("gpu")
        if self.gpu is not None:
            self.gpu.before_cell()
            self._register_kernels(header.get("kernels") or {})
        elif gpu_choice:
            raise GpuError(f"{self.no_gpu}, or drop the GPU option")
        self._cells += 1
        filename = f"<offload cell {self._cells}>"
        self._remember_source(filename, code)
        on_gpu = bool(gpu_choice) and self.gpu is not None
        body, last = split_last_expression(code, filename, wrap_calls if on_gpu else None)
        namespace["gpu"] = self.gpu.gpu if self.gpu is not None else _NoGpu(self.no_gpu)
        namespace.update(inputs)
        before = dict(namespace)
        wanted = header.get("outputs")
        # What the worker put in scope (gpu, get_ipython) stays here: the notebook has its own. Held, not
        # their ids: a temporary's id is free for the cell's next object. display() goes back as the
        # notebook's own, when the cell binds it (`from IPython.display import display`).
        provided = [namespace["gpu"], _no_shell]
        held = [value for value in inputs.values() if id(value) in self._kept_ids]  # the notebook has handles
        # The cell's inputs and the globals its notebook functions brought may change in place, through
        # any method call.
        tracked: dict[str, bytes] = {}
        if wanted is None:
            untracked = [*provided, *held, namespace["display"]]
            tracked = fingerprints({name: value for name, value in before.items()
                                    if not is_dunder(name) and not _is_any(value, untracked)}, self.stand_in)
        if on_gpu and self.gpu is not None:  # its arrays (read, and made by its calls) as views computing on the GPU
            namespace.update(self.gpu.to_device(inputs, None if gpu_choice is True else list(gpu_choice or ())))
            namespace[CALL_RESULT] = self.gpu.made_by_the_cell
        self._starting_files()
        threads_before = set(threading.enumerate())
        value = None
        try:
            try:
                with main_module(main if self.runs_as_main else None):
                    self._run(body, namespace)
                    value = self._run(last, namespace) if last is not None else None
            finally:
                if self.gpu is not None:  # (gpu.array(x) makes device arrays in any cell)
                    value = self.gpu.end_cell(namespace, value)
        # As locally, what the cell did before it raised stays done; so too when the GPU failed it midway (tinygrad
        # out of memory, a shader that doesn't compile) or the cell's own use of remote-magic refused a value: such
        # an error is said as it is (see _send_failure).
        except Exception as exc:
            changes = cell_changes(code, wanted, inputs, namespace, before, tracked, provided, complete=False,
                                   stand_in=self.stand_in)
            changes.shared = shared
            self._share_module_state(changes, shared_state)
            raise _CellFailed(exc, changes) from None
        changes = cell_changes(code, wanted, inputs, namespace, before, tracked, provided, complete=True,
                               stand_in=self.stand_in)
        changes.shared = shared
        self._share_module_state(changes, shared_state)
        _say_threads_run_on(set(threading.enumerate()) - threads_before, outputs)
        if value is not None:
            changes.values[CELL_VALUE] = value
        return changes

    def _run(self, code: CodeType, namespace: dict[str, Any]) -> Any:
        """Run compiled cell code; code with a top-level ``await`` runs on this session's event loop,
        one loop for all its cells, as IPython's autoawait runs a kernel's cells on one."""
        result = eval(code, namespace)
        if code.co_flags & inspect.CO_COROUTINE:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
            result = self._loop.run_until_complete(result)
        return result

    def _share_module_state(self, changes: CellChanges, shared_state: Any) -> None:
        """What the cell changed of the module state the notebook shares goes back with its values."""
        if isinstance(shared_state, dict):  # (plain values: they load also where the module isn't loaded)
            changed = self._module_state.changes()
            if changed:
                changes.values[module_state.NAME] = changed

    def _resolve(self, name: str, value: Any) -> Any:
        """An input as the cell sees it: a handle becomes the value it stands for."""
        if not isinstance(value, RemoteValue):
            return value
        if value.id not in self._kept:
            raise InputError(f"`{name}` was a {value.kind} kept in this notebook's session on worker "
                             f"{value.worker!r}, which has restarted since: run the cell that made it again", name)
        return self._kept[value.id]

    def _register_kernels(self, kernels: dict[str, str]) -> None:
        for name, source in kernels.items():
            if self._kernels.get(name) != source:
                self.gpu.register_kernel(name, source)
                self._kernels[name] = source

    def _pack_changes(self, msg: Message, changes: CellChanges) -> tuple[dict[str, Any], list[Any]]:
        """The header fields and frames of what goes back. Names that share an object, or view an
        array, go as references. A cell's matplotlib objects stay here (its figures travel as images),
        and so do values that can't be pickled, unless the caller asked for them by name; the others
        still go."""
        cell = msg.header.get("kind") == "code"  # a call's one result can't stay behind: it fails instead
        notebook = msg.header.get("versions") or {}
        numbered = {id(value): number for number, value in enumerate(changes.shared)}
        # A name bound to an input's object other than its own (`inner = d["k"]`, `moved = rows[1]`) is
        # bound to the notebook's; one that didn't change goes as a reference to its name (no patch).
        unchanged = {id(value) for value in changes.unchanged_inputs.values()}
        inside = {name: numbered[id(value)] for name, value in changes.values.items()
                  if id(value) in numbered and id(value) not in unchanged and changes.inputs.get(name) is not value}
        values = {name: value for name, value in changes.values.items() if name not in inside}
        values, refs = identity.references(values, changes.unchanged_inputs) if cell else (values, {})
        refs.update((name, {"input": number}) for name, number in inside.items())
        if not cell and msg.header.get("keep"):
            return {"kept_on_worker": {name: self._keep(name, value, "scattered there by Client.scatter")
                                       for name, value in values.items()}}, []
        # Named by --keep, or kept here already (the notebook holds a handle): they stay, whatever the cell
        # did, unless the caller asked for them by name (Client.pull).
        keep = set(msg.header.get("keep") or ()) if cell else set()
        every_name = cell and msg.header.get("outputs") is None
        asked = {name: values.pop(name) for name in list(values)
                 if name in keep or (every_name and id(values[name]) in self._kept_ids)}
        why = {name: self._kept_why.get(self._kept_ids.get(id(value), ""), "kept there, as asked (--keep)")
               for name, value in asked.items()}
        budget = msg.header.get("max_result_bytes")  # what is left of the notebook's --max-transfer
        limit = budget if every_name and isinstance(budget, int) else None
        portable_pandas = notebook.get("pandas") != local_versions().get("pandas")
        while True:
            with definitions.defining_into(dict(changes.namespace)):  # (a copy: nothing is bound there)
                # A name the cell imported is what the same import binds there (imported_names.py)
                sent = notebook_imports(values, str(msg.header.get("code", ""))) if cell else values
                packed = serialization.pack(sent, OutputError, _stays_on_worker if cell else None,
                                            portable_pandas=portable_pandas, keep_unpicklable=every_name,
                                            one_memo=True, shared=changes.shared, patch=inside.values())
            over = _largest_over(packed, limit) if limit is not None else None
            if over is None or limit is None:
                break
            asked[over] = values.pop(over)  # it stays here, and the others are packed again without it
            why[over] = (f"over this notebook's transfer budget: the cell's results would take "
                         f"{human_size(serialization.nbytes(packed.frames))} of the {human_size(limit)} left "
                         "(%offload_connect --max-transfer)")
        header = packed.header()
        kept = {**why, **packed.kept}
        values.update(asked)
        fields = {"kept_on_worker": {name: self._keep(name, values[name], why, name not in packed.unpicklable)
                                     for name, why in kept.items()},
                  "refs": refs, "in_place": changes.in_place, "deleted": changes.deleted}
        header.update((key, value) for key, value in fields.items() if value)
        return header, packed.frames

    def _keep(self, name: str, value: Any, why: str, pullable: bool = True) -> dict[str, Any]:
        """Hold a value that stays here; the description its handle is made from (``pull``: False for a value
        that can't be pickled, which no pull can bring to the notebook)."""
        handle = self._kept_ids.get(id(value))
        if handle is None:
            handle = f"{len(self._kept) + 1}:{name}"
            self._kept[handle], self._kept_ids[id(value)], self._kept_why[handle] = value, handle, why
            if not pullable:
                self._unpicklable.add(handle)
        kind = type(value)
        described = {"id": handle, "type": f"{kind.__module__}.{kind.__qualname__}", "why": why,
                     "summary": summarize(value)}
        return described if handle not in self._unpicklable else {**described, "pull": False}

    def _send_failure(self, msg: Message, failed: "_CellFailed") -> None:
        """The cell's exception, with what it changed before raising (so the notebook keeps that, as
        locally); if those values can't be packed, the exception alone."""
        job = str(msg.header["job"])
        error = failed.error
        # (not every remote-magic error: a WorkerLost said as itself would have this job retried)
        header = self._with_files(error_header(error, job) if isinstance(error, (GpuError, SerializationError)) else
                                  _remote_error(error, job, self._sources))
        try:
            changed, frames = self._pack_changes(msg, failed.changes)
        except (SerializationError, GpuError) as exc:  # (a GPU that failed may not give its arrays back)
            log.info("a failed cell's changes stay on the worker: %s", exc)
            self.send(T.ERROR, header)
            return
        # The versions say whether values sent as bytecode load there, as for a result.
        self.send(T.ERROR, {**header, **changed, "versions": local_versions()}, frames)

    def _send_result(self, job: str, header: dict[str, Any], frames: list[Any], started: float) -> None:
        header = {"job": job, **header, "duration_s": time.perf_counter() - started, "versions": local_versions()}
        if self._files_changed is not None:
            header["files"] = self._files_changed
        if self.gpu is not None:
            header["stats"] = self.gpu.take_stats()
        self.send(T.RESULT, header, frames)

    def _remember_source(self, filename: str, code: str) -> None:
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        self._sources.append(filename)
        while len(self._sources) > _KEPT_SOURCES:
            linecache.cache.pop(self._sources.pop(0), None)


class _CellFailed(Exception):
    """User code raised; carries its exception and what the cell had changed by then."""

    def __init__(self, error: Exception, changes: CellChanges) -> None:
        super().__init__(str(error))
        self.error, self.changes = error, changes


def _is_any(value: Any, objects: list[Any]) -> bool:
    return any(value is obj for obj in objects)


class _CellModule(types.ModuleType):
    """A cell's namespace as a module. The notebook's definitions a cell reads through its values (the
    class of an object it was sent, a function inside a list) aren't bound in it, but pickle finds them
    by name in ``__main__``, as in the notebook."""

    def __getattr__(self, name: str) -> Any:
        found = definitions.made_here(name, vars(self))
        if found is None:
            raise AttributeError(f"module '__main__' has no attribute {name!r}")
        return found


@contextmanager
def main_module(module: _CellModule | None) -> Iterator[None]:
    """While a cell runs, its namespace is ``sys.modules["__main__"]``, as a notebook's is the kernel's: what
    pickles the notebook's functions, classes and Enum members by reference (``pickle.dumps``, a
    ``multiprocessing.Pool`` or ``ProcessPoolExecutor`` handing them to its processes, forked from this
    one) finds them there. None: as it is."""
    if module is None:
        yield
        return
    before = sys.modules["__main__"]
    sys.modules["__main__"] = module
    try:
        yield
    finally:
        sys.modules["__main__"] = before


def _no_shell() -> Any:
    """A cell's ``get_ipython()``: a NameError, as in plain Python, saying why (code that asks whether it
    runs in IPython catches it and goes on as outside IPython)."""
    raise NameError("get_ipython() is the notebook's IPython shell, and an offloaded cell runs as plain Python "
                    "on the worker, without one: run the lines that use it in a local cell")


GPU_OFF = "this worker runs with --gpu off, so it has no GPU: restart remote-worker with --gpu auto or on"


class _NoGpu:
    """The cell's `gpu` on a worker without one (--gpu off, or no GPU support): every use says why."""

    def __init__(self, reason: str) -> None:
        self._reason = reason

    def __getattr__(self, name: str) -> Any:
        raise GpuError(f"gpu.{name}: {self._reason}")

    def __repr__(self) -> str:
        return f"<gpu: {self._reason}>"


def _say_threads_run_on(started: set[threading.Thread], outputs: JobOutputs) -> None:
    """A thread a cell started and left running goes on in the worker's session; what it changes from
    now on never reaches the notebook's variables (its ``results.append`` fills the cell's copy): say so."""
    # Plain threads and the notebook's own kinds: a library's own (pyzmq's garbage collector) is its business.
    running = sorted(thread.name for thread in started
                     if thread.is_alive() and type(thread).__module__ in ("threading", "__main__"))
    if running:
        outputs.stderr.write(f"remote-magic: {', '.join(running)}, started by this cell, still "
                             f"run{'s' if len(running) == 1 else ''} on the worker: what changes from now on "
                             "stays in the worker's session, not in the notebook's variables (they hold what the "
                             "cell left when it ended). Join the thread in the cell to keep what it does.\n")


def _stays_on_worker(obj: Any) -> str | None:
    """Why an object the cell made doesn't travel back, though it pickles (None: it does travel)."""
    kind = type(obj)
    library = kind.__module__.partition(".")[0]
    if isinstance(obj, type):
        return None
    if library == "matplotlib":  # its figures come back as images, drawn there
        return (f"it holds a matplotlib {kind.__name__}: a pickled figure loads only under the same matplotlib, and "
                "its pictures come back as images")
    if library == "tinygrad" and kind.__name__ == "Tensor" and str(obj.device).startswith("WEBGPU"):
        return ("it is a tinygrad Tensor on the worker's GPU: it stays there for later offloaded cells "
                "(`.numpy()` in a cell brings its values back)")
    if library == "numpy" and kind.__name__ == "memmap":  # a copy here would cut it from its file
        return "it is a memory-mapped file on the worker: writes through it in offloaded cells reach that file there"
    return None


def _remote_error(exc: BaseException, job: str, cell_files: list[str]) -> dict[str, Any]:
    """An ERROR header for an exception from user code, with the traceback from the cell down."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename not in cell_files:
        tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return error_header(RemoteError(name, _clip(str(exc)), _clip(text)), job)


MAX_ERROR_CHARS = 64 * 1024
"""How much of an exception's message, and of its traceback, travels: a header has a size limit."""


def _clip(text: str) -> str:
    """``text``, or its start and end with a marker saying how much was cut between them."""
    if len(text) <= MAX_ERROR_CHARS:
        return text
    half = MAX_ERROR_CHARS // 2
    return f"{text[:half]}\n[… {len(text) - 2 * half:,} characters cut …]\n{text[-half:]}"


def _interrupted_an_import(exc: BaseException, cell_files: list[str]) -> bool:
    """Did the exception cut through a module's top-level code, i.e. an import in progress?"""
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == "<module>" and code.co_filename not in cell_files:
            return True
        tb = tb.tb_next
    return False


def _largest_over(packed: serialization.Packed, budget: int) -> str | None:
    """The name whose frames are largest, when ``packed`` as a whole is over ``budget`` bytes (never the
    cell's value, which has no name to keep it under); None when it fits."""
    if serialization.nbytes(packed.frames) <= budget:
        return None
    sizes = {name: serialization.nbytes(frames)
             for name, frames in serialization.per_name(packed.names, packed.counts, packed.frames)
             if not is_dunder(name)}  # the cell's value and shared module state have no name to keep them under
    return max(sizes, key=lambda name: sizes[name]) if sizes else None
