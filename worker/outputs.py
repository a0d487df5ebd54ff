"""What a running job shows: stdout/stderr text, display() calls and matplotlib figures.

Everything is turned into STREAM and DISPLAY messages for the job's notebook, sent through a
callback the executor provides.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import importlib
import io
import logging
import sys
import threading
import time
import types
import uuid
from typing import Any, Callable, Mapping, Protocol, Sequence

from traitlets import TraitError

from remote_magic.wire.displays import (
    CLEAR_OUTPUT,
    FRAMED,
    TEXT_FORMAT,
    frame_parts,
    pickle_display_handles_portably,
)
from remote_magic.wire.protocol import MAX_HEADER_BYTES, MessageType as T, encode_header
from remote_magic.wire.sizes import human_size

log = logging.getLogger(__name__)


class Send(Protocol):
    """How output leaves: ``send(type, header)``, with frames after the header for a large DISPLAY."""

    def __call__(self, msg_type: T, header: dict[str, Any], buffers: list[Any] | tuple[Any, ...] = ..., /) -> None:
        ...

STREAM_FLUSH_INTERVAL_S = 0.05
"""Text printed by a job reaches the notebook within about this long."""

STREAM_FLUSH_BYTES = 64 * 1024

MAX_DISPLAY_BYTES = MAX_HEADER_BYTES - 4096
"""The largest display output that travels: it rides in a message header (a little room for the rest)."""

FIGURE_FORMATS = ("png", "retina", "png2x", "jpeg", "jpg", "svg", "pdf")
"""Formats a notebook may ask figures in (IPython's InlineBackend.figure_formats)."""


class ForwardedStream(io.TextIOBase):
    """A stand-in for sys.stdout/sys.stderr that batches text into STREAM messages of the job running now.

    One of each for the life of the process (``_STREAMS``), as a notebook's kernel has one: whatever kept
    it (``logging.basicConfig(stream=sys.stdout)`` in one cell, a handler on ``sys.stderr``) writes into
    the cell that runs later, not into the one that ended.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._job = ""
        self._send: Send | None = None
        self._parts: list[str] = []
        self._size = 0
        self._lock = threading.Lock()

    def retarget(self, job: str, send: Send) -> None:
        """From now on the text is ``job``'s; what was written before goes to the job it was written in."""
        self.flush()
        with self._lock:
            self._job, self._send = job, send

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        with self._lock:
            self._parts.append(text)
            self._size += len(text)
            full = self._size >= STREAM_FLUSH_BYTES
        if full:
            self.flush()
        return len(text)

    def flush(self) -> None:
        with self._lock:
            text, self._parts, self._size = "".join(self._parts), [], 0
            job, send = self._job, self._send
        if send is None:
            return
        # One large write goes in pieces: a message's header (which carries the text) has a size limit.
        for start in range(0, len(text), STREAM_FLUSH_BYTES):
            send(T.STREAM, {"job": job, "name": self.name, "text": text[start:start + STREAM_FLUSH_BYTES]})


_STREAMS = {name: ForwardedStream(name) for name in ("stdout", "stderr")}


class JobOutputs:
    """Redirects a job's streams and display() for as long as the job runs (a context manager)."""

    def __init__(self, job: str, send: Send, figure_formats: Sequence[str] = ("png",), framed: bool = True,
                 text_format: Mapping[str, Any] | None = None) -> None:
        self.job = job
        _use_text_format(text_format or {})
        self._send = send
        self._framed = framed  # a display too large for a header may send its largest parts as frames
        self.figure_formats = [f for f in figure_formats if f in FIGURE_FORMATS] or ["png"]
        self.stdout, self.stderr = _STREAMS["stdout"], _STREAMS["stderr"]
        self.stdout.retarget(job, send)
        self.stderr.retarget(job, send)
        self._flush_lock = threading.Lock()

    def __enter__(self) -> "JobOutputs":
        self._saved = sys.stdout, sys.stderr, builtins.input
        sys.stdout, sys.stderr = self.stdout, self.stderr
        builtins.input = _no_input
        return self

    def __exit__(self, *exc: object) -> None:
        self.flush()
        sys.stdout, sys.stderr, builtins.input = self._saved

    def flush(self) -> None:
        # One flush at a time, so text a periodic flush took is sent before a later flush returns.
        with self._flush_lock:
            self.stdout.flush()
            self.stderr.flush()

    def display(self, *objs: Any, raw: bool = False, metadata: dict[str, Any] | None = None,
                include: Any = None, exclude: Any = None, after_cell: bool = False,
                display_id: str | bool | None = None, update: bool = False, **kwargs: Any) -> Any:
        """IPython's display(), sending each object's mime bundle to the notebook (``after_cell``:
        shown once the cell's value is, as the inline backend shows a cell's figures). With ``display_id``
        (True: a new one) the output can be replaced later, as in the notebook: it returns IPython's
        ``DisplayHandle``, whose ``update()`` (here, or in the notebook once it came back) replaces it."""
        self.flush()  # keep text printed before display() above it
        if display_id is True:
            display_id = uuid.uuid4().hex
        shown: dict[str, Any] = {"display_id": display_id, "update": True} if update else (
            {"display_id": display_id} if display_id else {})
        for obj in objs:
            if raw:
                data, md = dict(obj), dict(metadata or {})
            else:
                data, md = self.bundle(obj, include=include, exclude=exclude)
                md = {**md, **(metadata or {})}
            header, frames = self._display_message(data, md)
            if header is not None:
                header = {**header, **shown, **({"after_cell": True} if after_cell else {})}
                self._send(T.DISPLAY, header, frames)
        if display_id and not update:
            from IPython.display import DisplayHandle

            return DisplayHandle(display_id)  # type: ignore[no-untyped-call]
        return None

    def clear_output(self, wait: bool = False) -> None:
        """IPython's clear_output(): the notebook clears the cell's output (with ``wait``, when the next
        output comes), after the text printed before it, as in a kernel."""
        self.flush()
        self._send(T.DISPLAY, {"job": self.job, CLEAR_OUTPUT: True, "wait": bool(wait)})

    def bundle(self, obj: Any, include: Any = None, exclude: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """The mime bundle and metadata IPython would show for ``obj``, rendered here: with this
        session's print options, pandas options and figure formats."""
        _render_figures_as(self.figure_formats)
        data, metadata = _formatter().format(obj, include=include, exclude=exclude)
        return data, metadata

    def value_header(self, value: Any) -> dict[str, Any] | None:
        """The cell's value as the notebook shows it (``data`` and ``metadata``); None when it doesn't
        render cleanly here (a ``_repr_html_`` that looks up notebook names by string, say) or is too
        large to travel in a header: the notebook then renders the value itself."""
        saved, sys.stderr = sys.stderr, io.StringIO()  # where IPython's formatters report their errors
        try:
            bundle = self.bundle(value)
            failed = sys.stderr.getvalue()
        finally:
            sys.stderr = saved
        if failed:
            return None
        header = self._display_header(*bundle, say_if_left_out=False)
        return None if header is None else {"data": header["data"], "metadata": header["metadata"]}

    def _display_message(self, data: dict[str, Any],
                         metadata: dict[str, Any]) -> tuple[dict[str, Any] | None, list[bytes]]:
        """A DISPLAY's header and frames: its largest parts go as frames when the header can't hold them."""
        header = self._display_header(data, metadata, say_if_left_out=not self._framed)
        if header is not None or not self._framed:
            return header, []
        left, framed, frames = frame_parts(data, MAX_DISPLAY_BYTES // 2)
        header = self._display_header(left, metadata)
        return (None, []) if header is None else ({**header, FRAMED: framed}, frames)

    def _display_header(self, data: dict[str, Any], metadata: dict[str, Any],
                        say_if_left_out: bool = True) -> dict[str, Any] | None:
        clean = {k: base64.b64encode(v).decode() if isinstance(v, bytes) else v for k, v in data.items()}
        header = {"job": self.job, "data": clean, "metadata": metadata or {}}
        size = len(encode_header(header))
        if size > MAX_DISPLAY_BYTES:
            if not say_if_left_out:
                return None
            # not silently: say what was left out, where the output would be
            kinds = ", ".join(sorted(clean))
            self.stderr.write(f"[remote-magic: a display output ({kinds}) of {human_size(size)} was left out: "
                              f"one output may be at most {human_size(MAX_DISPLAY_BYTES)}. Save it to a file "
                              "or make it smaller]\n")
            self.stderr.flush()
            return None
        return header

    def show_figures_at_end(self) -> None:
        """The cell ends: show its figures as the notebook's inline backend would (its ``flush_figures``).
        That is every open figure, after the cell's value, where the cell (or a cell since the last time)
        made a figure with interactive mode on; with it off (``plt.ioff()``), nothing, and the figures stay
        open for a later ``plt.show()``."""
        global _figure_made_interactively
        try:
            if _figure_made_interactively:
                self.show_figures(after_cell=True)
        finally:
            _figure_made_interactively = False

    def show_figures(self, after_cell: bool = False) -> None:
        """Send every open matplotlib figure as an image, then close them (as the inline backend does,
        on plt.show() and, see ``show_figures_at_end``, at the end of a cell).

        Figures travel rendered, in the notebook's figure formats, never as pickled objects: the
        two sides' matplotlib versions differ as a rule.
        """
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return
        try:
            self.display(*(plt.figure(number) for number in plt.get_fignums()), after_cell=after_cell)
        finally:
            plt.close("all")


def _no_input(prompt: object = "") -> str:
    """A job's input(): nobody can answer it on the worker. An EOFError, as input() raises with no input to
    read, so code that handles that goes on; its message says what to do."""
    raise EOFError(f"input({str(prompt)!r}) asks the notebook's user, and an offloaded cell runs on the worker, "
                   "where nobody can answer: ask in a local cell and use the answer's variable in this one")


_current: Callable[[], JobOutputs | None] = lambda: None  # noqa: E731  (the running job's, once installed)


def show_open_figures() -> None:
    """plt.show() in a job: each open figure appears now, in order with the job's other output."""
    outputs = _current()
    if outputs is not None:
        outputs.show_figures()


_figure_made_interactively = False
"""Was a figure made with interactive mode on since the figures were last shown at a cell's end? (The
inline backend's ``show._draw_called``.)"""


def figure_made() -> None:
    """pyplot made a figure (``plt.figure()``, ``plt.subplots()``, a first ``plt.plot()``): with interactive
    mode on, the cell shows the open figures at its end, as the notebook's inline backend does."""
    global _figure_made_interactively
    import matplotlib

    if matplotlib.is_interactive():
        _figure_made_interactively = True


def flush_periodically(current: Callable[[], JobOutputs | None]) -> None:
    """Start the thread that sends the running job's buffered text every STREAM_FLUSH_INTERVAL_S."""

    def run() -> None:
        while True:
            time.sleep(STREAM_FLUSH_INTERVAL_S)  # a flush period, not synchronisation
            outputs = current()
            if outputs is not None:
                outputs.flush()

    threading.Thread(target=run, name="stream-flusher", daemon=True).start()


_FORMATTER: Any = None
_FIGURE_FORMATS: list[str] = []


def _render_figures_as(formats: list[str]) -> None:
    """Have display() render matplotlib figures in these formats, once matplotlib is in use."""
    if "matplotlib.figure" not in sys.modules or formats == _FIGURE_FORMATS:
        return
    from IPython.core.pylabtools import select_figure_formats

    # It needs only the shell's display formatter: the executor has no shell, only its formatter.
    shell = types.SimpleNamespace(display_formatter=_formatter())
    select_figure_formats(shell, set(formats))  # type: ignore[no-untyped-call]  # IPython has no hints
    _FIGURE_FORMATS[:] = formats


_TEXT_FORMAT: dict[str, Any] = {}  # the notebook's text formatter settings, as last applied here


def _use_text_format(settings: Mapping[str, Any]) -> None:
    """Show values as the notebook's IPython does: its ``%pprint`` and ``%precision`` (which, as there, also
    sets numpy's print precision). Only what the notebook changed since is applied, so a cell's own
    ``np.set_printoptions`` holds until the notebook's ``%precision`` changes again, as locally."""
    plain = _formatter().formatters["text/plain"]
    for name, value in settings.items():
        if name in TEXT_FORMAT and _TEXT_FORMAT.get(name, getattr(plain, name)) != value:
            try:
                setattr(plain, name, value)
            except (TraitError, ValueError) as exc:  # a value this IPython doesn't take: shown its own way
                log.info("the notebook's %s=%r doesn't apply here: %s", name, value, exc)
            _TEXT_FORMAT[name] = value


def _formatter() -> Any:
    global _FORMATTER
    if _FORMATTER is None:
        from IPython.core.formatters import DisplayFormatter

        _FORMATTER = DisplayFormatter()
    return _FORMATTER


def install_display(current: Callable[[], JobOutputs | None]) -> None:
    """Make display() (builtin and IPython.display's), clear_output() and plt.show() publish through the
    running job."""
    global _current
    _current = current

    def display(*objs: Any, **kwargs: Any) -> Any:
        outputs = current()
        if outputs is None:
            print(*objs)
            return None
        return outputs.display(*objs, **kwargs)

    def clear_output(wait: bool = False) -> None:
        outputs = current()
        if outputs is not None:
            outputs.clear_output(wait)

    pickle_display_handles_portably()
    # It pickles as the notebook's own display() (`from IPython.display import display` in a cell binds it).
    display.__module__, display.__qualname__ = "IPython.display", "display"
    clear_output.__module__, clear_output.__qualname__ = "IPython.display", "clear_output"
    builtins.display = display  # type: ignore[attr-defined]
    import IPython.core.display
    import IPython.display

    # IPython 8 defines display() and clear_output() in core.display_functions, 7.x in core.display: patch
    # where they live.
    modules = [IPython.display, IPython.core.display]
    with contextlib.suppress(ImportError):
        modules.append(importlib.import_module("IPython.core.display_functions"))
    for module in modules:
        setattr(module, "display", display)
        setattr(module, "clear_output", clear_output)
    _formatter()
