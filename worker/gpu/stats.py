"""Counters of what ran on the GPU, and GPU time from timestamp queries.

:class:`Stats` counts kernel dispatches, bytes moved (uploads, readbacks, and inputs found already
on the GPU, see ``resident.py``) and operations computed with numpy.
:class:`GpuTimer` measures GPU time: with the ``timestamp-query`` feature each compute pass
writes begin/end timestamps, resolved in batches (one small readback per batch, not per
kernel); without it, the wall time from a submit to the next wait is counted instead. A pass given a label
(a kernel's name) has its time added to that label's too (:attr:`GpuTimer.seconds`).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import wgpu

from .mapping import READ_AFTER_COPY

log = logging.getLogger(__name__)

QUERY_PAIRS = 256
"""Compute passes timed before the timestamps are resolved and read back."""


@dataclass
class Stats:
    """Counters since some point in time; JSON-able through :meth:`as_dict`."""

    kernels: Counter[str] = field(default_factory=Counter)
    numpy: Counter[str] = field(default_factory=Counter)
    gpu_time_s: float = 0.0
    bytes_uploaded: int = 0
    bytes_downloaded: int = 0
    uploads: int = 0
    readbacks: int = 0
    resident_hits: int = 0
    """Inputs found already on the GPU (kept from an earlier cell), so not uploaded."""
    bytes_resident: int = 0
    """Bytes of those inputs: what the hits saved uploading."""

    def as_dict(self) -> dict[str, Any]:
        """``{"kernels": {name: dispatches}, "gpu_time_s", "bytes_uploaded", "bytes_downloaded", "uploads",
        "readbacks", "resident_hits", "bytes_resident", "numpy": {op: count}}``."""
        return {"kernels": dict(self.kernels), "gpu_time_s": self.gpu_time_s,
                "bytes_uploaded": self.bytes_uploaded, "bytes_downloaded": self.bytes_downloaded,
                "uploads": self.uploads, "readbacks": self.readbacks, "resident_hits": self.resident_hits,
                "bytes_resident": self.bytes_resident, "numpy": dict(self.numpy)}

    def take(self) -> "Stats":
        """A copy of the counters, resetting these to zero (in place: others hold this object)."""
        taken = Stats()
        taken.add(self)
        self.kernels.clear()
        self.numpy.clear()
        self.gpu_time_s = 0.0
        self.bytes_uploaded = self.bytes_downloaded = 0
        self.uploads = self.readbacks = self.resident_hits = self.bytes_resident = 0
        return taken

    def add(self, other: "Stats") -> None:
        """Add ``other``'s counts to these."""
        self.kernels.update(other.kernels)
        self.numpy.update(other.numpy)
        self.gpu_time_s += other.gpu_time_s
        self.bytes_uploaded += other.bytes_uploaded
        self.bytes_downloaded += other.bytes_downloaded
        self.uploads += other.uploads
        self.readbacks += other.readbacks
        self.resident_hits += other.resident_hits
        self.bytes_resident += other.bytes_resident


class GpuTimer:
    """Measures GPU time of compute passes; adds it to a :class:`Stats` when flushed."""

    def __init__(self, device: Any, timestamps: bool, stats: Stats) -> None:
        self._device = device
        self._stats = stats
        self._used = 0
        self._labels: list[str | None] = []
        self._wall_start: float | None = None
        self.timestamps = timestamps
        self.seconds: Counter[str] = Counter()
        """GPU seconds of the labelled passes, by label (as flushed)."""
        self.passes: Counter[str] = Counter()
        """Passes timed, by label."""
        if timestamps:
            self._queries = device.create_query_set(type=wgpu.QueryType.timestamp, count=2 * QUERY_PAIRS)
            nbytes = 16 * QUERY_PAIRS
            self._resolved = device.create_buffer(size=nbytes, usage=wgpu.BufferUsage.QUERY_RESOLVE
                                                  | wgpu.BufferUsage.COPY_SRC)
            self._staging = device.create_buffer(size=nbytes, usage=wgpu.BufferUsage.COPY_DST
                                                 | wgpu.BufferUsage.MAP_READ)

    @property
    def full(self) -> bool:
        """True when every query pair is used: the next pass flushes them first."""
        return self.timestamps and self._used == QUERY_PAIRS

    def pass_writes(self, label: str | None = None) -> dict[str, Any] | None:
        """The ``timestamp_writes`` for the next compute pass, or None without timestamps; its time is added to
        ``label``'s too."""
        if not self.timestamps:
            if self._wall_start is None:
                self._wall_start = time.perf_counter()
            return None
        if self._used == QUERY_PAIRS:
            self.flush()
        index = 2 * self._used
        self._used += 1
        self._labels.append(label)
        if label is not None:
            self.passes[label] += 1
        return {"query_set": self._queries, "beginning_of_pass_write_index": index,
                "end_of_pass_write_index": index + 1}

    def flush(self) -> None:
        """Resolve pending timestamps (waits for the GPU) and add their time to the stats."""
        if not self.timestamps:
            if self._wall_start is not None:
                self._stats.gpu_time_s += time.perf_counter() - self._wall_start
                self._wall_start = None
            return
        if self._used == 0:
            return
        count = 2 * self._used
        encoder = self._device.create_command_encoder()
        encoder.resolve_query_set(self._queries, 0, count, self._resolved, 0)
        encoder.copy_buffer_to_buffer(self._resolved, 0, self._staging, 0, 8 * count)
        self._device.queue.submit([encoder.finish()])
        self._used = 0
        labels, self._labels = self._labels, []
        self._staging.map_sync(READ_AFTER_COPY, 0, 8 * count)  # slow: waits for the GPU
        try:
            ticks = np.frombuffer(self._staging.read_mapped(0, 8 * count, copy=False), np.uint64).copy()
        finally:
            self._staging.unmap()
        begin, end = ticks[0::2].astype(np.int64), ticks[1::2].astype(np.int64)
        spans = np.clip(end - begin, 0, None)  # a driver may reset the counter between passes
        self._stats.gpu_time_s += float(spans.sum()) * 1e-9
        for label, span in zip(labels, spans.tolist()):
            if label is not None:
                self.seconds[label] += span * 1e-9

    def note_wait(self) -> None:
        """The GPU just went idle (a readback or wait): close the wall-time span if timing by wall."""
        if not self.timestamps:
            self.flush()
