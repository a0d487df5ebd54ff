"""Progress bars for the jobs a notebook waits on: bytes, rate and ETA of each large message each way,
and how long the job has run.

The connection's I/O thread notes how far each large message has got (``TransferState``); the
thread that waits on the jobs draws the bars from that, so they appear where the cell's output is.
A bar shows once its message or job has taken over ``DELAY_S`` (a quick one never shows) and is
cleared when it is done. A job's elapsed time shows in a notebook (tqdm's widget) or a terminal,
not in output that is captured or piped, where a bar redrawn every second would be noise.
"""

from __future__ import annotations

import sys
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any, Iterable, Mapping

if TYPE_CHECKING:
    from tqdm import tqdm

DELAY_S = 1.0


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
"""How each bar starts: a notebook's conformance test knows them by that."""


def direction(about: Mapping[str, Any]) -> str:
    """Which way a message goes, from what a progress report says it is: a job goes up, the rest down."""
    return "up" if about.get("type") == "submit" else "down"


def tqdm_class() -> Any:
    """tqdm's bar for where this runs: the notebook's widget in Jupyter, text elsewhere (and in a Jupyter
    without ipywidgets, where tqdm would otherwise warn on the cell's stderr)."""
    from tqdm import TqdmWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TqdmWarning)
        from tqdm.auto import tqdm
    return tqdm


def _shows_elapsed() -> bool:
    """Is there someone watching a redrawn bar: a notebook (tqdm's widget) or a terminal?"""
    if any(kind.__module__ == "tqdm.notebook" for kind in tqdm_class().__mro__):
        return True
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced by something that isn't a file, or closed
        return False


class Bars:
    """The bars of the jobs being waited for; use as a context manager."""

    def __init__(self) -> None:
        self._bars: dict[tuple[int, str], tqdm[Any]] = {}
        self._elapsed: bool | None = None  # decided when a job first runs long: most never do

    def update(self, jobs: Iterable[tuple[TransferState, str]]) -> None:
        """Draw each job's transfers and (``_elapsed``) how long it has run, given its state and its
        worker's name ("" until it started); clear the bars of transfers that are across."""
        for state, worker in jobs:
            for way, (done, total) in state.snapshot().items():
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

    def _bar(self, state: TransferState, way: str, start: bool, **options: Any) -> "tqdm[Any] | None":
        key = (id(state), way)
        if key not in self._bars and start:
            self._bars[key] = tqdm_class()(desc=LABELS[way], delay=0 if way == "job" else DELAY_S, leave=False,
                                      **options)
        return self._bars.get(key)

    def __enter__(self) -> "Bars":
        return self

    def __exit__(self, *exc: object) -> None:
        for bar in self._bars.values():
            bar.close()
