"""Progress bars for the jobs a notebook waits on: bytes, rate and ETA of each large message each way,
and how long the job has run.

The connection's I/O thread notes how far each large message has got (``TransferState``); the
thread that waits on the jobs draws the bars from that, so they appear where the cell's output is.
A bar shows once its message or job has taken over ``DELAY_S`` (a quick one never shows) and is
cleared when it is done. A job's elapsed time shows in a notebook or a terminal, not in output that
is captured or piped, where a bar redrawn every second would be noise.

In a Jupyter kernel a bar is one display of the running cell (``CellBar``: tqdm's text, redrawn in
place by its display id), and a bar that is cleared leaves the cell: the notebook layer clears the cell
and shows its other outputs again (``take_out_with``), so a saved notebook keeps what a local run of
the cell keeps, and no widget. ``tqdm.auto`` is never imported here: what a notebook's own
``from tqdm.auto import tqdm`` gives (and warns) is what it would be without remote-magic.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from tqdm.std import tqdm as text_tqdm

DELAY_S = 1.0

if TYPE_CHECKING:
    _Tqdm = text_tqdm[Any]
else:
    _Tqdm = text_tqdm


class TransferState:
    """How far a job's large messages have got, each way; written by the I/O thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done: dict[str, tuple[int, int]] = {}  # direction -> (bytes across, bytes in all)
        self.since = time.monotonic()  # when its job was submitted

    def note(self, direction: str, done: int, total: int) -> None:
        with self._lock:
            self._done[direction] = (done, total)

    def snapshot(self) -> dict[str, tuple[int, int]]:
        with self._lock:
            return dict(self._done)


LABELS = {"up": "sending to the worker", "down": "receiving from the worker", "job": "running on"}
"""How each bar starts."""


def direction(about: Mapping[str, Any]) -> str:
    """Which way a message goes, from what a progress report says it is: a job goes up, the rest down."""
    return "up" if about.get("type") == "submit" else "down"


TakeOut = Callable[[str], None]
"""Takes the display with this id out of the running cell's output."""

_take_out: TakeOut | None = None


def take_out_with(take_out: TakeOut | None) -> None:
    """How a closed ``CellBar`` leaves the cell: the notebook layer (``notebook/cell_outputs.py``, set up by
    ``%load_ext remote_magic``) takes it out; without one (None: the client API in a notebook that didn't
    load the extension), it is blanked, and the saved notebook keeps an empty output where it was."""
    global _take_out
    _take_out = take_out


def in_a_kernel() -> bool:
    """Does this run in a Jupyter kernel (a notebook, Colab), where output goes to a cell?"""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


class CellBar(_Tqdm):
    """tqdm's bar as one display in the running cell, redrawn in place (its text: bytes, rate and time left,
    as in a terminal) and taken out of the cell when closed with ``leave=False`` (kept, as it last read,
    otherwise)."""

    monitor_interval = 0  # tqdm's monitor thread would redraw it from a thread whose output has no cell
    _display_id: str | None = None
    _shown: str | None = None

    def display(self, msg: str | None = None, pos: int | None = None) -> None:
        text = self.__str__() if msg is None else msg
        if text == self._shown:
            return
        from IPython.display import publish_display_data

        update = self._display_id is not None
        self._display_id = self._display_id or f"remote-magic-bar-{uuid.uuid4().hex}"
        publish_display_data({"text/plain": text}, transient={"display_id": self._display_id},  # type: ignore[no-untyped-call]
                             update=update)
        self._shown = text

    def close(self) -> None:
        if self.disable:
            return
        shown = self._display_id
        self.sp = None  # so tqdm's close only forgets the bar; this one draws nothing on a stream
        super().close()
        if shown is None:
            return
        if self.leave:
            self._shown = None
            self.display()
        elif _take_out is not None:
            _take_out(shown)
        else:
            from IPython.display import publish_display_data

            publish_display_data({"text/plain": ""}, transient={"display_id": shown}, update=True)  # type: ignore[no-untyped-call]

    def clear(self, nolock: bool = False) -> None:
        """Nothing to clear on a stream: the bar's display is redrawn whole."""


def tqdm_class() -> Any:
    """tqdm's bar for where this runs: ``CellBar`` in a Jupyter kernel, text elsewhere."""
    return CellBar if in_a_kernel() else text_tqdm


def _shows_elapsed() -> bool:
    """Is there someone watching a redrawn bar: a notebook or a terminal?"""
    if in_a_kernel():
        return True
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced by something that isn't a file, or closed
        return False


_crossing: dict[tuple[int, str], tuple[str, str, int, int]] = {}
_crossing_lock = threading.Lock()


def crossing() -> list[tuple[str, str, int, int]]:
    """The large messages of the jobs this process waits for that are crossing now: each one's worker
    ("" while it goes to the hub), its direction (``up``, ``down``), bytes across and bytes in all."""
    with _crossing_lock:
        return list(_crossing.values())


class Bars:
    """The bars of the jobs being waited for; use as a context manager."""

    def __init__(self) -> None:
        self._bars: dict[tuple[int, str], text_tqdm[Any]] = {}
        self._elapsed: bool | None = None  # decided when a job first runs long: most never do

    def update(self, jobs: Iterable[tuple[TransferState, str]]) -> None:
        """Draw each job's transfers and (``_elapsed``) how long it has run, given its state and its
        worker's name ("" until it started); clear the bars of transfers that are across."""
        for state, worker in jobs:
            for way, (done, total) in state.snapshot().items():
                with _crossing_lock:
                    if done < total:
                        _crossing[(id(state), way)] = (worker, way, done, total)
                    else:
                        _crossing.pop((id(state), way), None)
                bar = self._bar(state, way, done < total, total=total, unit="B", unit_scale=True)
                if bar is not None and not bar.disable:
                    bar.update(done - bar.n)
                    if done >= total:
                        bar.close()
            if worker and time.monotonic() - state.since > DELAY_S and self._shows_elapsed():
                bar = self._bar(state, "job", True, bar_format=f"{LABELS['job']} {worker!r}: {{elapsed}}")
                if bar is not None:
                    bar.start_t = time.time() - (time.monotonic() - state.since)  # the job's time, not the bar's
                    bar.refresh()

    def _shows_elapsed(self) -> bool:
        if self._elapsed is None:
            self._elapsed = _shows_elapsed()
        return self._elapsed

    def _bar(self, state: TransferState, way: str, start: bool, **options: Any) -> "text_tqdm[Any] | None":
        key = (id(state), way)
        if key not in self._bars and start:
            self._bars[key] = tqdm_class()(desc=LABELS[way], delay=0 if way == "job" else DELAY_S, leave=False,
                                      **options)
        return self._bars.get(key)

    def __enter__(self) -> "Bars":
        return self

    def __exit__(self, *exc: object) -> None:
        for (state, way), bar in self._bars.items():
            with _crossing_lock:
                _crossing.pop((state, way), None)
            bar.close()
