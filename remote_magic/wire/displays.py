"""How output is shown, on the wire: a display output too large for a message's header (a big
figure's PNG) travels with its largest parts as frames after the header, as the values of a result
do, and the receiver puts them back; the notebook's text formatter settings travel with each cell."""

from __future__ import annotations

import base64
import copyreg
from typing import Any, Mapping, Sequence

TEXT_FORMAT = ("pprint", "float_precision", "max_width", "max_seq_length")
"""What of IPython's text formatter decides how a value reads (``%pprint``, ``%precision``): a cell's
``text_format`` says how the notebook has them, and the worker renders the cell's value alike."""

CLEAR_OUTPUT = "clear_output"
"""The DISPLAY header key that makes it a clear: ``IPython.display.clear_output`` ran in the cell, and the
notebook clears the cell's output (with ``"wait": true``, when the next output comes), as locally."""


def clears(header: Mapping[str, Any]) -> bool:
    """Whether this DISPLAY clears the cell's output rather than adding to it."""
    return header.get(CLEAR_OUTPUT) is True


def clear_output_here(header: Mapping[str, Any]) -> None:
    """Clear the cell's output in this process's IPython, as the cell's ``clear_output(wait=...)`` asked."""
    from IPython.display import clear_output

    clear_output(wait=header.get("wait") is True)  # type: ignore[no-untyped-call]


FRAMED = "framed"
"""The header key listing the parts that travel as frames: ``[[mime type, "base64" | "text"], ...]``."""


def frame_parts(data: dict[str, Any], fits: int) -> tuple[dict[str, Any], list[list[str]], list[bytes]]:
    """``data`` (a mime bundle, binary parts as bytes) less its largest parts, moved to frames until
    what is left is at most ``fits`` bytes; those parts, in frame order; and the frames."""
    left, framed, frames = dict(data), [], []
    for mime in sorted(data, key=lambda m: -len(data[m]) if isinstance(data[m], (bytes, str)) else 0):
        if sum(len(v) for v in left.values() if isinstance(v, (bytes, str))) <= fits:
            break
        value = left[mime]
        if isinstance(value, bytes):
            framed.append([mime, "base64"])
            frames.append(value)
        elif isinstance(value, str):
            framed.append([mime, "text"])
            frames.append(value.encode())
        else:
            continue
        del left[mime]
    return left, framed, frames


def unframe(header: dict[str, Any], frames: Sequence[Any]) -> dict[str, Any]:
    """The DISPLAY header with its framed parts put back (binary ones base64-encoded, as IPython
    wants them); unchanged when nothing was framed."""
    framed = header.get(FRAMED)
    if not isinstance(framed, list) or len(framed) != len(frames):
        return header
    data = dict(header.get("data") or {})
    for (mime, kind), frame in zip(framed, frames):
        raw = bytes(frame.buffer if hasattr(frame, "buffer") else frame)
        data[str(mime)] = base64.b64encode(raw).decode() if kind == "base64" else raw.decode(errors="replace")
    return {key: value for key, value in header.items() if key != FRAMED} | {"data": data}


def display_handle(display_id: str) -> Any:
    """IPython's ``DisplayHandle`` for ``display_id``: what a handle that crossed loads as. IPython 7 keeps
    the class in ``IPython.core.display``, 8 and later in ``IPython.core.display_functions``; pickled by
    its class, a handle made by one wouldn't load under the other."""
    from IPython.display import DisplayHandle

    return DisplayHandle(display_id)  # type: ignore[no-untyped-call]


def pickle_display_handles_portably() -> None:
    """Make this process pickle IPython's display handles as ``display_handle(id)``, whichever IPython
    either side runs (a ``display(x, display_id=True)`` that comes back, or goes to the worker)."""
    try:
        from IPython.display import DisplayHandle
    except ImportError:
        return
    copyreg.pickle(DisplayHandle, lambda handle: (display_handle, (handle.display_id,)))
