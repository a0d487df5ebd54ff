"""tinygrad's generated programs for one adapter, kept on the worker's disk between executors."""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
from importlib.metadata import version
from typing import Any

from tinygrad.codegen import to_program_cache

from remote_magic.wire.keys import config_dir

log = logging.getLogger(__name__)

MAX_PROGRAMS = 4096
"""Generated programs kept on disk per adapter (the newest; a few kB each)."""


class ProgramCache:
    """tinygrad's generated programs for this adapter, on the worker's disk, so that a new executor running a
    model an earlier one ran skips tinygrad's code generation (most of a model's first step). They are entries
    of tinygrad's own in-memory cache (``tinygrad.codegen.to_program_cache``), keyed by kernel and renderer:
    loaded into it when the device opens, and what this device added written back by :meth:`save`. ``renderer``:
    the renderer class whose programs these are (the key's second part)."""

    def __init__(self, adapter: str, renderer: type) -> None:
        self._renderer = renderer
        revision = getattr(renderer, "revision", 0)  # (what it renders changed: the saved programs are another's)
        digest = hashlib.sha256(f"{adapter} tinygrad {version('tinygrad')} {revision}".encode()).hexdigest()[:16]
        self.path = config_dir() / "tinygrad-programs" / f"{digest}.pickle"
        self._saved = 0

    def _ours(self) -> dict[tuple[Any, ...], Any]:
        return {key: program for key, program in to_program_cache.items() if key[1] is self._renderer}

    def load(self) -> None:
        """Add the programs saved for this adapter to tinygrad's cache (a missing or unreadable file: none)."""
        try:
            saved = pickle.loads(self.path.read_bytes())  # noqa: S301 - this worker's own file
        except FileNotFoundError:
            return
        except Exception as exc:  # another tinygrad's, or cut short: it is written anew
            log.info("tinygrad's saved programs in %s are unreadable (%s); generating them anew", self.path, exc)
            return
        for key, program in saved.items():
            to_program_cache.setdefault(key, program)
        self._saved = len(self._ours())

    def save(self) -> None:
        """Write this adapter's programs (the newest :data:`MAX_PROGRAMS`) if any were added since the last save."""
        programs = self._ours()
        if len(programs) == self._saved:
            return
        kept = dict(list(programs.items())[-MAX_PROGRAMS:])
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(f"{self.path.name}.{os.getpid()}")
        try:
            partial.write_bytes(pickle.dumps(kept))
            partial.replace(self.path)  # whole, even with another executor saving too
        except OSError as exc:  # a full disk costs the next executor its head start, nothing else
            log.warning("could not save tinygrad's programs to %s: %s", self.path, exc)
            partial.unlink(missing_ok=True)
            return
        self._saved = len(programs)
