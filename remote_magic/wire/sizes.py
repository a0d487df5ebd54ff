"""Byte counts as people write and read them, one convention everywhere: decimal units.

``kB``, ``MB``, ``GB``, ``TB`` and the bare ``K``, ``M``, ``G``, ``T`` are powers of 1000, as tqdm's
bars and disk makers count; ``KiB``, ``MiB``, ``GiB``, ``TiB`` are powers of 1024, for whoever means
them. Printed sizes are always decimal, so a size read back parses to what was printed:
``parse_size("1GB") == 10**9`` and ``human_size(10**9) == "1.0 GB"``.
"""

from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])(i?)b?|b?)\s*$", re.IGNORECASE)


def size_in_bytes(text: str) -> float | None:
    """'16GB' -> 16e9, '512MiB' -> 512 * 2**20, '1.5g' -> 1.5e9, '8' -> 8.0; None when ``text`` is
    not a size."""
    match = _SIZE.match(text)
    if match is None:
        return None
    number, unit, binary = match.groups()
    if not unit:
        return float(number)
    scale: int = (1024 if binary else 1000) ** " kmgt".index(unit.lower())
    return float(number) * scale


def parse_size(text: str) -> int:
    """'512M', '2GiB', '1.5g', '1000000' -> bytes; ValueError for anything else, saying what a size
    looks like."""
    size = size_in_bytes(text)
    if size is None:
        raise ValueError(f"{text!r} is not a size like 512MB, 2GB or 2GiB (MB and GB are powers of 1000, "
                         "MiB and GiB powers of 1024)")
    return int(size)


def human_size(size: float) -> str:
    """A byte count as people read it (and as tqdm's bars show it): 812 B, 12.3 MB."""
    value = float(size)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000:
            return f"{int(size)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"
