"""Progress bars for the large messages of the jobs a notebook waits on: bytes, rate and ETA.

The connection's I/O thread notes how far each large message has got (``TransferState``); the
thread that waits on the jobs draws the bars from that, so they appear where the cell's output is.
A bar shows once its message has taken over ``DELAY_S`` (a quick one never shows) and is cleared
when the message is across.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Iterable, Mapping

if TYPE_CHECKING:
    from tqdm import tqdm

DELAY_S = 1.0


class TransferState:
    """How far a job's large messages have got, each way; written by the I/O thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done: dict[str, tuple[int, int]] = {}  # direction -> (bytes across, bytes in all)

    def note(self, direction: str, done: int, total: int) -> None:
        with self._lock:
            self._done[direction] = (done, total)

    def snapshot(self) -> dict[str, tuple[int, int]]:
        with self._lock:
            return dict(self._done)


_LABELS = {"up": "sending to the worker", "down": "receiving from the worker"}


def direction(about: Mapping[str, Any]) -> str:
    """Which way a message goes, from what a progress report says it is: a job goes up, the rest down."""
    return "up" if about.get("type") == "submit" else "down"


class Bars:
    """The bars of the transfers of the jobs being waited for; use as a context manager."""

    def __init__(self) -> None:
        self._bars: dict[tuple[int, str], tqdm[Any]] = {}

    def update(self, states: Iterable[TransferState]) -> None:
        """Draw each transfer's progress; clear the bars of transfers that are across."""
        for state in states:
            for way, (done, total) in state.snapshot().items():
                key = (id(state), way)
                bar = self._bars.get(key)
                if bar is None and done < total:
                    from tqdm.auto import tqdm  # the notebook's widget in Jupyter, text elsewhere

                    bar = self._bars[key] = tqdm(total=total, desc=_LABELS[way], unit="B", unit_scale=True,
                                                 delay=DELAY_S, leave=False)
                if bar is not None and not bar.disable:
                    bar.update(done - bar.n)
                    if done >= total:
                        bar.close()

    def __enter__(self) -> "Bars":
        return self

    def __exit__(self, *exc: object) -> None:
        for bar in self._bars.values():
            bar.close()
