"""tinygrad's generated programs and schedules for one adapter, kept on the worker's disk between executors."""

from __future__ import annotations

import hashlib
import io
import logging
import os
import pickle
from importlib.metadata import version
from typing import Any

from tinygrad import helpers
from tinygrad.codegen import to_program_cache
from tinygrad.schedule import schedule_cache
from tinygrad.uop import Ops
from tinygrad.uop.ops import UOp

from remote_magic.wire.keys import config_dir

log = logging.getLogger(__name__)

MAX_PROGRAMS = 4096
"""Generated programs kept on disk per adapter (the newest; a few kB each)."""
MAX_SCHEDULES = 64
"""Schedules kept on disk per adapter (the newest; from kBs to a few MB each: a model's step is one or two)."""
FORMAT = 2
"""Bumped when what the file holds changes (2: programs and schedules)."""


def settings() -> str:
    """The settings this process's environment gives tinygrad (its ``ContextVar``s set there; the others are the
    release's defaults), which shape the code it generates and its schedules: a file saved under other settings
    is another's. (Their current values would not do: tinygrad changes some for a while, in a ``Context``.)"""
    names = sorted(var.key for var in vars(helpers).values() if isinstance(var, helpers.ContextVar))
    return repr([(name, os.environ[name]) for name in names if name in os.environ])


class _Pickler(pickle.Pickler):
    """Pickles a schedule without the buffers its placeholders may stand for in this process: tinygrad keeps one
    ``BUFFER`` placeholder per slot, and a realized one would pickle its data (megabytes of a model's weights)."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is UOp and obj.op is Ops.BUFFER:
            return UOp, (obj.op, obj.dtype, obj.src, obj.arg, obj.tag, obj.metadata)
        return NotImplemented


def _dumps(value: Any) -> bytes:
    out = io.BytesIO()
    _Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return out.getvalue()


def _picklable(entries: dict[Any, Any]) -> dict[Any, Any]:
    """The entries that pickle."""
    kept = {}
    for key, value in entries.items():
        try:
            _dumps(value)
        except Exception as exc:
            log.debug("tinygrad's %r isn't saved: it doesn't pickle (%s)", key, exc)
            continue
        kept[key] = value
    return kept


class ProgramCache:
    """tinygrad's generated programs and schedules for this adapter, on the worker's disk, so that a new executor
    running a model an earlier one ran skips tinygrad's code generation and scheduling (most of a model's first
    step). They are entries of tinygrad's own in-memory caches: programs (``tinygrad.codegen.to_program_cache``,
    keyed by kernel and renderer) and schedules (``tinygrad.schedule.schedule_cache``, keyed by the graph of
    tensors realized, buffers as parameters). They are loaded into those caches when the device opens, and what
    this process added is written back by :meth:`save`. The file is named by the adapter, the tinygrad release,
    ``renderer``'s ``revision`` and tinygrad's :func:`settings`, so none of those can change under a saved entry.
    ``renderer``: the renderer class whose programs these are (the programs' key's second part)."""

    def __init__(self, adapter: str, renderer: type) -> None:
        self._renderer = renderer
        revision = getattr(renderer, "revision", 0)  # (what it renders changed: the saved programs are another's)
        digest = hashlib.sha256(f"{adapter} tinygrad {version('tinygrad')} {revision} {FORMAT} {settings()}"
                                .encode()).hexdigest()[:16]
        self.path = config_dir() / "tinygrad-programs" / f"{digest}.pickle"
        self._saved = (0, 0)
        self._not_saved: set[Any] = set()

    def keep_unsaved(self, program: Any) -> None:
        """Run ``program`` in this process but save it for no later one: it was compiled by a choice a cell forced
        (``tuned_matmul = 'always'`` or ``'never'``), which a later executor, measuring, must not inherit."""
        self._not_saved.add(program)

    def _ours(self) -> dict[tuple[Any, ...], Any]:
        return {key: program for key, program in to_program_cache.items()
                if key[1] is self._renderer and program not in self._not_saved}

    def _counts(self) -> tuple[int, int]:
        return len(self._ours()), len(schedule_cache)

    def load(self) -> None:
        """Add the programs and schedules saved for this adapter to tinygrad's caches (a missing or unreadable
        file: none)."""
        try:
            saved = pickle.loads(self.path.read_bytes())  # noqa: S301 - this worker's own file
            programs, schedules = saved["programs"], saved["schedules"]
        except FileNotFoundError:
            return
        except Exception as exc:  # another tinygrad's, or cut short: it is written anew
            log.info("tinygrad's saved programs in %s are unreadable (%s); generating them anew", self.path, exc)
            return
        for key, program in programs.items():
            to_program_cache.setdefault(key, program)
        for key, linear in schedules.items():
            schedule_cache.setdefault(key, linear)
        self._saved = self._counts()

    def save(self) -> None:
        """Write this adapter's programs and schedules (the newest :data:`MAX_PROGRAMS` and
        :data:`MAX_SCHEDULES`) if any were added since the last save."""
        counts = self._counts()
        if counts == self._saved:
            return
        kept: dict[str, dict[Any, Any]] = {"programs": dict(list(self._ours().items())[-MAX_PROGRAMS:]),
                                           "schedules": dict(list(schedule_cache.items())[-MAX_SCHEDULES:])}
        try:
            data = _dumps(kept)
        except Exception:  # (a schedule holding what doesn't pickle, such as a cell's function): left out
            data = _dumps({part: _picklable(entries) for part, entries in kept.items()})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(f"{self.path.name}.{os.getpid()}")
        try:
            partial.write_bytes(data)
            partial.replace(self.path)  # whole, even with another executor saving too
        except OSError as exc:  # a full disk costs the next executor its head start, nothing else
            log.warning("could not save tinygrad's programs to %s: %s", self.path, exc)
            partial.unlink(missing_ok=True)
            return
        self._saved = counts
