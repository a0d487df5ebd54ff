"""What a finished job sent back, as the notebook holds it: a cell's values with what the worker said
about them (handles, references, objects changed in place), and the files it wrote; and how a job's
output is shown by default.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from . import errors
from .wire import identity, module_state, serialization
from .wire.displays import clear_output_here, clears
from .wire.failures import error_from_header
from .wire.handles import CELL_VALUE, RemoteValue, kept_description
from .wire.in_place import update_in_place
from .wire.protocol import Message, MessageType

log = logging.getLogger(__name__)


@dataclass
class FileChanges:
    """Files a cell created, changed or deleted on the worker, under the working directory it started in."""

    folder: str
    """The worker's working directory when the cell started; the paths below are relative to it."""
    written: dict[str, int]
    """Files created or changed, with their sizes in bytes (the first hundred, by path)."""
    deleted: list[str]
    """Files removed (the first hundred, by path)."""
    written_count: int = 0
    """How many files were created or changed in all."""
    deleted_count: int = 0
    """How many files were removed in all."""
    complete: bool = True
    """False when the folder was too large to look at all of it: changes deep inside may be missing."""
    worker: str = ""

    @classmethod
    def from_header(cls, files: Any, worker: str) -> "FileChanges | None":
        """What a RESULT or ERROR header's ``files`` says, or None when it says nothing."""
        if not isinstance(files, dict):
            return None
        try:
            written = {str(path): int(size) for path, size in files.get("written") or []}
            deleted = [str(path) for path in files.get("deleted") or []]
            return cls(str(files.get("root", "")), written, deleted, int(files.get("written_count") or len(written)),
                       int(files.get("deleted_count") or len(deleted)), bool(files.get("complete", True)), worker)
        except (TypeError, ValueError) as exc:  # a worker's bug must not cost the cell its result
            log.warning("the worker's list of files the code wrote is malformed (%s); left out", exc)
            return None


@dataclass
class JobResult:
    """Everything a finished job sent back."""

    values: dict[str, Any]
    worker: str = ""
    has_value: bool = False
    value: Any = None      # the code's last expression, when it ends with one
    stats: dict[str, Any] = field(default_factory=dict)
    kept_on_worker: dict[str, RemoteValue] = field(default_factory=dict)
    """Values the code assigned that stayed on the worker (they can't be pickled, or are matplotlib
    objects: figures come as images), as handles that later jobs on that worker may read in place."""
    value_display: dict[str, Any] | None = None
    """The value as the notebook shows it (``data``, ``metadata``), rendered in the worker's session."""
    deleted: list[str] = field(default_factory=list)
    """Names the code deleted (``del x``): gone from its namespace, as they would be locally."""
    files: FileChanges | None = None
    """Files the code wrote or removed in the worker's working directory (they stay there); None if none."""
    in_place: list[str] = field(default_factory=list)
    """Inputs the code changed in place (``L.sort()``): updated in place here too where the type allows
    (lists, dicts, sets, arrays of the same shape, pandas DataFrames and Series, random Generators and
    RandomStates, notebook classes' instances)."""
    notes: list[str] = field(default_factory=list)
    """Where the result differs from a local run, in words (a view that could only come back as a copy)."""
    module_state: dict[str, Any] = field(default_factory=dict)
    """What the code changed of the module state it was given to share (``Client.execute(module_state=)``)."""


def read_result(msg: Message, worker: str, inputs: Mapping[str, Any], update_inputs: bool,
                on_module_error: Callable[[str, Any, Exception], None] | None,
                shared: Sequence[Any] = ()) -> JobResult:
    """The JobResult a RESULT (or a failed cell's ERROR) carries. ``inputs``: the job's, which its
    references name; ``update_inputs``: update the ones it changed in place, in place; ``shared``: the
    objects inside the inputs that the worker refers to by number (``identity.shared_objects``)."""
    values = serialization.unpack(msg.header, msg.buffers, errors.OutputError, on_module_error,
                                  sides=("in the notebook", "on the worker"), numbered=shared)
    kept = msg.header.get("kept_on_worker")
    handles = kept_description(kept if isinstance(kept, dict) else {}, worker)
    shared_state = values.pop(module_state.NAME, None)
    not_updated = _patch(shared, values)
    in_place = [str(name) for name in msg.header.get("in_place") or [] if name in values]
    for name in in_place:  # so every other reference to the object here sees the change, as locally
        if update_inputs and name in inputs and update_in_place(inputs[name], values[name]):
            values[name] = inputs[name]
    refs = msg.header.get("refs")
    values, copies = identity.resolve(values, refs if isinstance(refs, dict) else {}, {**inputs, **handles}, shared)
    has_value = CELL_VALUE in values or CELL_VALUE in handles
    value = values.pop(CELL_VALUE, handles.pop(CELL_VALUE, None))
    deleted = msg.header.get("deleted")
    shown = msg.header.get("value_display")
    notes = copies + not_updated
    return JobResult(values, worker, has_value, value, msg.header.get("stats") or {}, handles,
                     shown if isinstance(shown, dict) else None,
                     [str(name) for name in deleted] if isinstance(deleted, list) else [],
                     in_place=in_place, notes=notes,
                     module_state=shared_state if isinstance(shared_state, dict) else {})


def _patch(shared: Sequence[Any], values: dict[str, Any]) -> list[str]:
    """Update in place the objects inside the inputs that the cell changed (the values named
    ``identity.PATCH_PREFIX + number``, taken out of ``values``); in words, any that couldn't be."""
    failed = []
    for name in [name for name in values if name.startswith(identity.PATCH_PREFIX)]:
        new = values.pop(name)
        old = shared[int(name[len(identity.PATCH_PREFIX):])]
        if not update_in_place(old, new):
            failed.append(f"a {type(old).__name__} inside the cell's inputs was changed on the worker in a way "
                          f"it can't be here ({type(new).__name__}{_shape(new)}): where the notebook holds it, it "
                          "keeps its old value")
    return failed


def _shape(value: Any) -> str:
    shape = getattr(value, "shape", None)
    return f" of shape {tuple(shape)}" if isinstance(shape, tuple) else ""


def finish(msg: Message, worker: str, inputs: Mapping[str, Any], update_inputs: bool,
           on_module_error: Callable[[str, Any, Exception], None] | None, shared: Sequence[Any] = (),
           notes: Sequence[str] = ()) -> JobResult:
    """A finished job's JobResult, or, for an ERROR, its exception raised (one from a cell's run carries what the
    cell changed before it raised, as ``partial``). Arguments as ``read_result``; ``notes``
    (``CellSubmit.notes``) go first in the result's, before those on what couldn't change in place here."""
    def noted(result: JobResult) -> JobResult:
        result.notes[:0] = [*notes, *identity.past_limits(result.in_place, inputs)]
        return result

    if msg.type is MessageType.ERROR:
        partial = noted(read_result(msg, worker, inputs, update_inputs, on_module_error, shared)) if (
            "names" in msg.header) else None
        error = error_from_header(msg.header, partial.values if partial is not None else None)
        error.partial = partial
        raise error
    return noted(read_result(msg, worker, inputs, update_inputs, on_module_error, shared))


def write_stream(header: Mapping[str, Any]) -> None:
    """Write a STREAM's text to this process's stdout or stderr."""
    stream = sys.stderr if header.get("name") == "stderr" else sys.stdout
    stream.write(str(header.get("text", "")))
    stream.flush()


def display_options(header: Mapping[str, Any]) -> dict[str, Any]:
    """``publish_display_data``'s options for a DISPLAY that names its display id: the output it makes
    (or, with ``update``, replaces) can be replaced later by that id, as a local ``display_id`` does."""
    display_id = header.get("display_id")
    if not isinstance(display_id, str):
        return {}
    return {"transient": {"display_id": display_id}, **({"update": True} if header.get("update") else {})}


def show_display(header: Mapping[str, Any]) -> None:
    """Show a DISPLAY in IPython, or its text where there is none; a clear clears IPython's output."""
    data, metadata = header.get("data") or {}, header.get("metadata") or {}
    try:
        from IPython import get_ipython
        from IPython.display import publish_display_data
    except ImportError:
        get_ipython = None
    in_ipython = get_ipython is not None and get_ipython() is not None
    if clears(header):
        if in_ipython:
            clear_output_here(header)
    elif in_ipython:
        publish_display_data(data, metadata, **display_options(header))  # type: ignore[no-untyped-call]
    else:
        print(data.get("text/plain", "<rich output>"))
