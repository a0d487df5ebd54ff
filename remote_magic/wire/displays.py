"""How output is shown, on the wire: a display output too large for a message's header (a big
figure's PNG) travels with its largest parts as frames after the header, as the values of a result
do, and the receiver puts them back; the notebook's text formatter settings travel with each cell."""

from __future__ import annotations

import base64
from typing import Any, Sequence

TEXT_FORMAT = ("pprint", "float_precision", "max_width", "max_seq_length")
"""What of IPython's text formatter decides how a value reads (``%pprint``, ``%precision``): a cell's
``text_format`` says how the notebook has them, and the worker renders the cell's value alike."""

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
