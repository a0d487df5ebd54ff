"""One job as the notebook asks for it, and the one place it becomes the SUBMIT every engine sends.

``Engine``'s public calls (``engine.py``) turn their arguments into a ``JobRequest`` (a ``map`` into a
``MapRequest``), as httpx's ``client.get(...)`` builds a ``Request``. ``JobRequest.submit`` makes the cell's
SUBMIT before its values are packed (a ``CellSubmit``: references between the inputs, the objects inside them
numbered, the module state beside them), and ``submit_message`` packs the values and finishes the header;
the engines (``client_jobs.py``, ``dask_jobs.py``) only send what these make, each its own way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .errors import InputError
from .results import FileChanges, show_display, write_stream
from .wire import identity, serialization
from .wire.module_state import NAME as MODULE_STATE
from .wire.requirements import placement_header

OnStream = Callable[[Mapping[str, Any]], None]
"""A callback for a job's STREAM or DISPLAY header."""
OnWorkerOutput = Callable[[str, Mapping[str, Any]], None]
"""A callback for output of a job run on several workers: the worker's name, then the STREAM or DISPLAY header."""
OnModuleError = Callable[[str, Any, Exception], None]
"""Called when a value can't be loaded here because its module can't be imported: its name, the reference, why."""


@dataclass(frozen=True, kw_only=True)
class JobRequest:
    """One code job, as ``Engine.execute`` takes it: what to run, with what, where, and how to show it."""

    code: str
    inputs: Mapping[str, Any] = field(default_factory=dict)
    outputs: tuple[str, ...] | None = None  # None: every name the code binds
    worker: str | None = None
    timeout: float | None = None
    gpu: bool | tuple[str, ...] | None = None
    gpu_kernels: Mapping[str, str] | None = None
    """Users' GPU kernels (``%%offload_kernel``): WGSL by name, for the code to call as ``gpu.NAME``."""
    on_stream: OnStream = write_stream
    on_display: OnStream = show_display
    on_module_error: OnModuleError | None = None
    figure_formats: tuple[str, ...] = ("png",)
    text_format: Mapping[str, Any] | None = None
    on_files: Callable[[FileChanges], None] | None = None
    retries: int = 0
    on_retry: Callable[[str], None] | None = None
    require: tuple[str, ...] | str | None = None
    prefer: str | None = None
    keep: tuple[str, ...] = ()
    module_state: Mapping[str, Any] | None = None
    update_inputs: bool = True
    """Inputs the code changes in place are changed in place here too; False for jobs on several workers,
    where each worker's change comes back as an object of its own."""

    def header(self) -> dict[str, Any]:
        """What the job's SUBMIT says before its inputs are packed. RequirementError for a malformed
        ``require`` or ``prefer``, before anything is sent."""
        header: dict[str, Any] = {"kind": "code", "code": self.code, "figure_formats": list(self.figure_formats),
                                  "outputs": None if self.outputs is None else list(self.outputs),
                                  **placement_header(self.require, self.prefer)}
        if self.text_format:
            header["text_format"] = dict(self.text_format)
        if self.gpu:
            header["gpu"] = list(self.gpu) if isinstance(self.gpu, tuple) else True
        if self.gpu_kernels:
            header["kernels"] = dict(self.gpu_kernels)  # the protocol's name for them
        if self.keep:
            header["keep"] = list(self.keep)
        return header

    def submit(self) -> "CellSubmit":
        """The job's SUBMIT before its values are packed, as every engine sends it: names sharing one object,
        and arrays viewing another's memory, go as references to it (``refs``); the objects inside the inputs
        the worker may refer back to are numbered (``shared``); the module state goes beside the inputs."""
        values, refs = identity.references(dict(self.inputs))
        if self.module_state is not None:  # beside the inputs, not one of them (nothing inside it is numbered)
            values[MODULE_STATE] = dict(self.module_state)
        header = self.header()
        if refs:
            header["refs"] = refs
        walked = identity.shared_objects(self.inputs) if self.update_inputs else None
        if walked is not None and walked[0]:  # the worker refers to objects inside the inputs by these numbers
            header["shared"] = walked[1]
        notes = [f"`{name}` went to the worker as a copy, not a view of `{ref['copy']}`: a view that is a "
                 f"{ref.get('kind')} can't cross as a view, so while the cell ran, writing through it didn't "
                 f"change `{ref['copy']}` there" for name, ref in refs.items() if "copy" in ref]
        return CellSubmit(header, values, walked[0] if walked is not None else [], notes)


@dataclass(frozen=True)
class CellSubmit:
    """A cell's SUBMIT, the same for every engine: what :meth:`JobRequest.submit` makes."""

    header: dict[str, Any]
    values: dict[str, Any]
    """What is packed, by name (references resolved to the names they refer to)."""
    shared: list[Any]
    """The objects inside the inputs, in the order the worker numbers them: its result refers to them."""
    notes: list[str]
    """Where the job's inputs went otherwise than they are here (a view that could only cross as a copy)."""


def submit_message(header: dict[str, Any], values: Mapping[str, Any], *, job_id: str, versions: Mapping[str, str],
                   portable_pandas: bool) -> serialization.Packed:
    """Finish a job's SUBMIT, as every engine sends it: ``values`` packed with one memo (an object several of
    them hold arrives as one), and ``header`` updated in place to describe the frames, with the job's id and
    this side's versions. InputError names a value that can't be pickled. ``portable_pandas``: pandas
    objects in a form any pandas release loads (the workers' pandas differs, or is unknown)."""
    packed = serialization.pack(values, InputError, portable_pandas=portable_pandas, one_memo=True)
    header.update(packed.header(), job=job_id, versions=dict(versions))
    return packed


@dataclass(frozen=True, kw_only=True)
class MapRequest:
    """``Engine.map``'s arguments: ``fn`` over ``items`` in chunks."""

    fn: Callable[[Any], Any]
    items: tuple[Any, ...]
    chunksize: int | None = None  # None: about fleet_jobs.CHUNKS_PER_WORKER chunks per worker
    retries: int = 0
    workers: tuple[str, ...] | None = None  # without repeats; None: any
    timeout: float | None = None
    require: tuple[str, ...] | str | None = None
    prefer: str | None = None
