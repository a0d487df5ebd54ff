"""An exception's traceback across the wire.

Pickle leaves an exception's ``__traceback__`` out (frames can't be pickled), so one a cell caught and
kept (``except ValueError as e: err = e``) arrived with None there, and ``traceback.print_exception(err)``
showed no frames. The sender lists its frames (file, function, line); the receiver makes real traceback
objects at those places, as tblib does, so formatting one shows where it was raised. Its cause and
context travel with it too.
"""

from __future__ import annotations

import sys
import types
from typing import Any

FRAMES_LIMIT = 100
"""The innermost frames of a traceback that travel (a deep recursion's are many alike)."""

Frames = list[tuple[str, str, int]]
"""A traceback, outermost frame first: each frame's file, function and line."""


def reduce(obj: Any) -> tuple[Any, tuple[Any, ...]] | None:
    """A pickle reduction of an exception that carries a traceback, or None for anything else (and for an
    exception whose own reduction is more than its type, arguments and attributes)."""
    if not isinstance(obj, BaseException) or obj.__traceback__ is None:
        return None
    reduced = obj.__reduce__()
    if not (isinstance(reduced, tuple) and len(reduced) in (2, 3) and (len(reduced) == 2 or reduced[2] is None
                                                                        or isinstance(reduced[2], dict))):
        return None
    frames: Frames = []
    tb: types.TracebackType | None = obj.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame.f_code.co_filename, tb.tb_frame.f_code.co_name, tb.tb_lineno))
        tb = tb.tb_next
    return rebuild, (reduced, frames[-FRAMES_LIMIT:], obj.__cause__, obj.__context__, obj.__suppress_context__)


def rebuild(reduced: tuple[Any, ...], frames: Frames, cause: BaseException | None, context: BaseException | None,
            suppress_context: bool) -> BaseException:
    """The exception ``reduce`` sent, with a traceback through the places it listed."""
    make, arguments, *state = reduced
    exc: BaseException = make(*arguments)
    if state and state[0]:
        vars(exc).update(state[0])
    exc.__cause__, exc.__context__, exc.__suppress_context__ = cause, context, suppress_context
    return exc.with_traceback(_traceback(frames))


class _Placeholder(Exception):
    pass


def _traceback(frames: Frames) -> types.TracebackType | None:
    """Traceback objects whose frames stand at ``frames``' places: each is a line of code compiled at that
    file and line, under that function's name, that raised."""
    made: types.TracebackType | None = None
    for filename, name, line in reversed(frames):
        code = compile("\n" * (max(line, 1) - 1) + "raise _Placeholder", filename, "exec").replace(co_name=name)
        try:
            exec(code, {"_Placeholder": _Placeholder, "__builtins__": {}})
        except _Placeholder:
            here = sys.exc_info()[2]
            frame = here.tb_next if here is not None else None  # past this function's own frame: the code's
            if frame is not None:
                made = types.TracebackType(made, frame.tb_frame, frame.tb_lasti, frame.tb_lineno)
    return made
