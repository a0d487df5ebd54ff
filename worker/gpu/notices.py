"""One-line notices to the user, written to ``sys.stderr`` when they happen.

The executor streams the worker's stderr into the notebook cell, so a notice appears under the
cell that caused it. Each line starts with ``remote-magic: ``. Notices are output meant for the
user (what ran where, what was converted), not logging; they are logged at DEBUG as well.
"""

from __future__ import annotations

import logging
import sys

log = logging.getLogger(__name__)

PREFIX = "remote-magic: "


class Notices:
    """Writes notices to the current ``sys.stderr``, some of them only once per key."""

    def __init__(self) -> None:
        self._shown: set[str] = set()

    def say(self, text: str) -> None:
        """Write ``text`` as one notice line now."""
        log.debug("notice: %s", text)
        stream = sys.stderr  # looked up each time: the executor swaps it per job
        stream.write(f"{PREFIX}{text}\n")
        stream.flush()

    def once(self, key: str, text: str) -> bool:
        """Write ``text`` unless a notice with ``key`` was already written; True if written."""
        if key in self._shown:
            return False
        self._shown.add(key)
        self.say(text)
        return True
