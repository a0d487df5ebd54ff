"""Warnings that a peer can provoke, logged at a bounded rate so no peer can flood the log."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Hashable


@dataclass
class _Window:
    started: float
    logged: int = 0
    held_back: int = 0


class WarningThrottle:
    """Logs at most ``burst`` warnings per key in each ``window`` seconds, then counts the rest.

    The first warning logged for that key in a later window says how many were held back: a
    peer that keeps sending garbage shows up as a few lines a minute, not one line a message.
    """

    def __init__(self, logger: logging.Logger, *, burst: int = 5, window_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._logger = logger
        self._burst = burst
        self._window_s = window_s
        self._clock = clock
        self._windows: dict[Hashable, _Window] = {}

    def warning(self, key: Hashable, message: str, *args: object) -> None:
        """Log ``message % args`` for ``key``, unless ``key`` used up its burst in this window."""
        now = self._clock()
        window = self._windows.get(key)
        if window is None or now - window.started >= self._window_s:
            held_back = window.held_back if window is not None else 0
            window = self._windows[key] = _Window(started=now)
            if held_back:
                message += " (%d similar warnings were held back in the last %g s)"
                args = (*args, held_back, self._window_s)
        if window.logged >= self._burst:
            window.held_back += 1
            return
        window.logged += 1
        self._logger.warning(message, *args)
