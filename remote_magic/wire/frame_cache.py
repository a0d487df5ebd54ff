"""Content-addressed frames: a large buffer the hub holds already crosses the link as its digest.

A notebook sends the same array to cell after cell, and sends back what a cell returned; over a slow
link every such byte counts (and on ngrok's free plan, is counted). So the hub keeps, per client, the
large frames that client sent and that came back to it (``FrameCache``, least recently used first
out, bounded in bytes), and the client (``SentDigests``) sends a frame the hub holds as its digest
only. A digest the hub no longer holds is asked for again (an ERROR carrying ``missing``), never an
error for the user: the client sends the job again with every frame.

Digests are xxh3-128 (``xxhash``): it hashes at memory speed, so digesting a frame costs a small
fraction of sending it even on loopback, and 128 bits make an accidental collision negligible. It is
not cryptographic, and needs not be: each client's frames are kept apart, so a client could only
confuse its own jobs.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Mapping, Sequence

import xxhash

CACHED_OVER = 1 << 20
"""Frames at least this large are digested and cached; smaller ones always travel."""

DEFAULT_CACHE_BYTES = 1 << 30
"""How much the hub keeps per client by default (remote-worker --cache-size)."""


def digest(frame: Any) -> str:
    """The frame's xxh3-128 digest, as hex."""
    view = frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
    return xxhash.xxh3_128_hexdigest(view.cast("B") if view.format != "B" or view.ndim != 1 else view)


def _size(frame: Any) -> int:
    return len(frame.buffer) if hasattr(frame, "buffer") else memoryview(frame).nbytes


class FrameCache:
    """One client's large frames at the hub, by digest, the least recently used dropped first."""

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._frames: OrderedDict[str, Any] = OrderedDict()

    def __len__(self) -> int:
        return len(self._frames)

    def put(self, key: str, frame: Any) -> None:
        size = _size(frame)
        if size > self.max_bytes or key in self._frames:
            return
        self._frames[key] = frame
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, dropped = self._frames.popitem(last=False)
            self.bytes -= _size(dropped)

    def remember(self, frames: Sequence[Any]) -> None:
        """Keep the large ones of ``frames`` (a result going to the client)."""
        for frame in frames:
            if _size(frame) >= CACHED_OVER:
                self.put(digest(frame), frame)

    def fill(self, header: Mapping[str, Any], frames: Sequence[Any]) -> tuple[list[Any], list[str]]:
        """A SUBMIT's frames with each one it sent as a digest (``cached``: {index: digest}) put back,
        and those it sent whole (``digests``) kept; and the digests this cache doesn't hold."""
        filled = list(frames)
        missing = []
        for index, key in _entries(header.get("cached")):
            frame = self._frames.get(key)
            if frame is None or index >= len(filled):
                missing.append(key)
            else:
                self._frames.move_to_end(key)
                filled[index] = frame
        for index, key in _entries(header.get("digests")):
            if index < len(filled):
                self.put(key, filled[index])
        return filled, missing


def frame_digests(header: Mapping[str, Any], frames: int) -> dict[str, str]:
    """{frame index: digest} of every large frame of a SUBMIT once the hub has put back those it sent as
    digests (``cached``) beside those it sent whole (``digests``); ``frames``: how many it has."""
    return {str(index): key for index, key in [*_entries(header.get("digests")), *_entries(header.get("cached"))]
            if index < frames}


def _entries(table: Any) -> list[tuple[int, str]]:
    if not isinstance(table, dict):
        return []
    return [(int(index), str(key)) for index, key in table.items() if str(index).isdigit() and isinstance(key, str)]


class SentDigests:
    """At the client: the digests of large frames the hub holds for it, as far as the client knows
    (what it sent, and what came back), bounded as the hub's cache is."""

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._sizes: OrderedDict[str, int] = OrderedDict()
        self._bytes = 0

    def add(self, key: str, size: int) -> None:
        if key in self._sizes or size > self.max_bytes:
            return
        self._sizes[key] = size
        self._bytes += size
        while self._bytes > self.max_bytes:
            self._bytes -= self._sizes.popitem(last=False)[1]

    def forget(self, keys: Sequence[str]) -> None:
        for key in keys:
            self._bytes -= self._sizes.pop(key, 0)

    def mark(self, frames: Sequence[Any], header: dict[str, Any]) -> list[Any]:
        """``frames`` as they go: a large one the hub holds replaced by an empty frame (``cached`` in
        ``header`` says which), the others whole with their digests (``digests``) for the hub to keep."""
        out, cached, digests = list(frames), {}, {}
        for index, frame in enumerate(frames):
            size = _size(frame)
            if size < CACHED_OVER:
                continue
            key = digest(frame)
            if key in self._sizes:
                self._sizes.move_to_end(key)
                cached[str(index)], out[index] = key, b""
            else:
                digests[str(index)] = key
                self.add(key, size)
        if cached:
            header["cached"] = cached
        if digests:
            header["digests"] = digests
        return out

    def remember(self, frames: Sequence[Any]) -> None:
        """The large frames of a result: the hub kept them on their way here."""
        for frame in frames:
            size = _size(frame)
            if size >= CACHED_OVER:
                self.add(digest(frame), size)
