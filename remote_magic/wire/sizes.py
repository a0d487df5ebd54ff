"""Byte counts as people write and read them: ``parse_size("512M")``, ``human_size(12_300_000)``."""

from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'512M', '2GiB', '1.5g', '1000000' -> bytes (K, M, G, T are powers of 1024). ValueError for
    anything else, saying what a size looks like."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a size like 512M or 2G")
    number, unit = match.groups()
    return int(float(number) * 1024 ** " kmgt".index(unit.lower() or " "))


def human_size(size: int) -> str:
    """A byte count as people read it (and as tqdm's bars show it): 812 B, 12.3 MB."""
    value = float(size)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000:
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"
