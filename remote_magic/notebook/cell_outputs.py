"""The running cell's outputs as the notebook keeps them, so that one display (a progress bar) can be
taken out of the cell again.

Jupyter can clear a cell's output but not one output of it. So the kernel's streams and display
publisher are watched from the start of each cell: what the cell has shown so far (streams merged as the
notebook merges them, displays updated by their id, clears applied), and taking a display out clears the
cell and shows the rest again. A saved notebook then holds the cell's outputs as a local run leaves
them (nbclient and the Jupyter front ends apply the same clear). Where the record is not whole (the
cell began before watching did, or it printed more than ``MAX_KEPT_CHARS``), the display is blanked
instead.
"""

from __future__ import annotations

import logging
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from .. import progress

log = logging.getLogger(__name__)

MAX_KEPT_CHARS = 16 * 1024 * 1024
"""The most of a cell's output kept to show again: past it, a bar taken out is blanked instead."""


@dataclass
class _Output:
    """A stream's text (``name`` stdout or stderr) or a display (``data``, ``metadata``, its display id)."""

    name: str = ""
    parts: list[str] = field(default_factory=list)  # a stream's writes: joined when shown again, as a cell
    # that prints a million lines would make appending to one string quadratic
    data: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    display_id: str | None = None


def _chars(output: _Output) -> int:
    return sum(map(len, output.parts)) + sum(len(v) for v in output.data.values() if isinstance(v, (str, bytes)))


class CellOutputs:
    """Watches one kernel's display publisher and streams; ``take_out`` removes one display from the cell."""

    def __init__(self, shell: Any) -> None:
        self._shell = shell
        self._pub = shell.display_pub
        self._publish: Callable[..., Any] = self._pub.publish
        self._clear: Callable[..., Any] = self._pub.clear_output
        self._streams: dict[str, Any] = {"stdout": sys.stdout, "stderr": sys.stderr}
        self._writes: dict[str, Callable[[str], Any]] = {}  # each stream's write that ours calls
        self._lock = threading.RLock()  # the cell's thread, and threads that print or update displays
        self._outputs: list[_Output] = []
        self._kept = 0  # characters in _outputs, about
        self._whole = False  # the record holds everything the running cell showed
        self._clear_waits = False  # a clear_output(wait=True) clears at the next output
        self._pub.publish = self._on_publish
        self._pub.clear_output = self._on_clear
        self._watch_streams()
        shell.events.register("pre_run_cell", self._new_cell)

    def close(self) -> None:
        """Stop watching: the publisher and streams are as they were."""
        self._shell.events.unregister("pre_run_cell", self._new_cell)
        for attribute in ("publish", "clear_output"):
            self._pub.__dict__.pop(attribute, None)
        for name, stream in self._streams.items():
            if getattr(stream.write, "__self__", None) is self:
                stream.write = self._writes[name]
        self._outputs = []

    def take_out(self, display_id: str) -> None:
        """Take the display with ``display_id`` out of the running cell: clear the cell and show its other
        outputs again; blank it where the record isn't whole."""
        with self._lock:
            if not self._whole:
                self._publish({"text/plain": ""}, {}, transient={"display_id": display_id}, update=True)
                return
            if not any(output.display_id == display_id for output in self._outputs):
                return  # the cell's own clear_output took it out already
            rest = [output for output in self._outputs if output.display_id != display_id]
            clear_waits = self._clear_waits
            self._clear(False)
            self._outputs, self._kept, self._clear_waits = [], 0, False
            for output in rest:
                if output.name:
                    self._streams[output.name].write("".join(output.parts))
                else:
                    self._on_publish(output.data, output.metadata, **(
                        {"transient": {"display_id": output.display_id}} if output.display_id else {}))
            if clear_waits:
                self._on_clear(True)

    # -- what the cell shows -------------------------------------------------------------------

    def _new_cell(self, *args: Any) -> None:
        self._watch_streams()
        with self._lock:
            self._outputs, self._kept, self._whole, self._clear_waits = [], 0, True, False

    def _on_publish(self, data: Any, metadata: Any = None, *args: Any, **options: Any) -> Any:
        shown = self._publish(data, metadata, *args, **options)
        display_id = (options.get("transient") or {}).get("display_id")
        with self._lock:
            if args or not isinstance(data, dict):
                self._stop_keeping()  # a publisher's signature this doesn't know
            elif options.get("update"):
                for output in self._outputs:
                    if output.display_id == display_id:
                        output.data, output.metadata = dict(data), dict(metadata or {})
            else:
                self._add(_Output(data=dict(data), metadata=dict(metadata or {}), display_id=display_id))
        return shown

    def _on_clear(self, wait: bool = False) -> Any:
        cleared = self._clear(wait)
        with self._lock:
            if wait:
                self._clear_waits = True
            else:
                self._outputs, self._kept = [], 0
        return cleared

    def _watch_streams(self) -> None:
        """Write through ``_write_stdout`` and ``_write_stderr``. Again at each cell: IPython 9 sets each
        stream's ``write`` for the cell (to keep its output in the history) and puts back what was there
        before when the cell ends."""
        for name, stream in self._streams.items():
            ours = getattr(self, f"_write_{name}")
            if stream.write != ours:
                self._writes[name] = stream.write
                stream.write = ours

    def _write_stdout(self, text: str) -> Any:
        return self._write("stdout", text)

    def _write_stderr(self, text: str) -> Any:
        return self._write("stderr", text)

    def _write(self, name: str, text: str) -> Any:
        written = self._writes[name](text)
        if not text or not isinstance(text, str):
            return written
        with self._lock:
            last = self._outputs[-1] if self._outputs else None
            if last is not None and last.name == name and not self._clear_waits:
                last.parts.append(text)
                self._check_size(len(text))
            else:
                self._add(_Output(name=name, parts=[text]))
        return written

    def _add(self, output: _Output) -> None:
        if not self._whole:
            return
        if self._clear_waits:
            self._outputs, self._kept, self._clear_waits = [], 0, False
        self._outputs.append(output)
        self._check_size(_chars(output))

    def _check_size(self, added: int) -> None:
        self._kept += added
        if self._kept > MAX_KEPT_CHARS:
            log.debug("The cell showed over %d characters: a bar taken out of it is blanked", MAX_KEPT_CHARS)
            self._stop_keeping()

    def _stop_keeping(self) -> None:
        """The record can't be whole for the rest of this cell: keep nothing until the next one."""
        self._whole, self._outputs, self._kept = False, [], 0


_watching: CellOutputs | None = None


def watch(shell: Any) -> None:
    """Watch a Jupyter kernel's cells (a terminal IPython has no cells to keep: nothing to do), so a
    progress bar leaves its cell when it closes."""
    global _watching
    if _watching is not None or getattr(shell, "kernel", None) is None:
        return
    _watching = CellOutputs(shell)
    progress.take_out_with(_watching.take_out)


def unwatch() -> None:
    """Stop watching (the extension unloads)."""
    global _watching
    if _watching is not None:
        progress.take_out_with(None)
        _watching.close()
        _watching = None
