"""The executor's side of a large input sent again: its last job's large inputs, kept mapped.

A notebook sends the same array to cell after cell. The hub holds its bytes, so it crosses the link as
a digest; and the executor that mapped it for the last job (``shared_frames``) keeps that mapping
after the job, so the supervisor needn't write it into a shared file again, nor the executor fault
its pages in again: the next job's message names it by digest, and gets a view of the same pages.

Only what can't have changed is held:

- a mapping nothing outside this class refers to once the job's objects are gone (the cell kept no
  part of its inputs in the session), so no other object ever shares memory with a later job's input;
- of its frames, those whose pages are still the file's. The mapping is copy-on-write: a page the cell
  wrote became this process's own, and ``/proc/self/pagemap`` tells which (``Pages``); where it can't be
  read, a frame is held when its bytes still hash to the hub's digest. The supervisor never writes a
  file the executor maps, so the file's pages are what the hub sent under that digest.

A job whose message has large frames lets go of the held mappings it doesn't use (so at most one job's
inputs stay mapped); a job without them leaves them held. After each job with large frames, the
executor tells the supervisor what it holds now (``settle``; ``shared_frames.note``).
"""

from __future__ import annotations

import mmap
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from remote_magic.wire.frame_cache import CACHED_OVER, digest

PAGEMAP = "/proc/self/pagemap"


class Pages:
    """Which pages of this process's private file mappings are still the file's, from ``PAGEMAP`` (Linux):
    one 64-bit entry per page; bit 63 set: present, 62: swapped out, 61: a page of the file (or shared). A
    page the process wrote is present and not the file's, or swapped out; one never read is absent."""

    def __init__(self) -> None:
        try:
            self._fd: int | None = os.open(PAGEMAP, os.O_RDONLY)
        except OSError:  # not Linux, or a sandbox without it: callers compare bytes instead
            self._fd = None

    def unchanged(self, address: int, length: int) -> bool | None:
        """Are the pages from ``address`` on, ``length`` bytes of them, still the mapped file's? None when
        this can't tell."""
        if self._fd is None:
            return None
        first, last = address // mmap.PAGESIZE, (address + max(length, 1) - 1) // mmap.PAGESIZE
        try:
            raw = os.pread(self._fd, (last - first + 1) * 8, first * 8)
        except OSError:
            return None
        if len(raw) != (last - first + 1) * 8:
            return None
        flags = np.frombuffer(raw, np.uint64) >> np.uint64(61)  # present, swapped, file: 4, 2, 1
        return not bool(np.any((flags & np.uint64(2)) | ((flags & np.uint64(5)) == np.uint64(4))))


def _address(buffer: Any) -> int:
    return int(np.frombuffer(buffer, np.uint8).ctypes.data)


@dataclass(eq=False)
class _Mapped:
    """One file's mapping in this process."""

    name: str
    mapping: mmap.mmap
    address: int
    intact: dict[str, tuple[int, int]] = field(default_factory=dict)
    """digest -> (offset, length): its frames known to be unchanged."""


@dataclass
class _Lent:
    """A frame the running job has a view of."""

    mapped: _Mapped
    offset: int
    length: int
    digest: str | None


class HeldFrames:
    """The mappings kept between jobs, and the frames the running job was given."""

    def __init__(self) -> None:
        self._held: dict[str, _Mapped] = {}  # by file name
        self._pages = Pages()
        self._lent: list[_Lent] = []
        self._due = False  # the running job's message had large frames: say what is held after it
        self.missing: list[str] = []
        """Digests the running job's message named that aren't held here (a bug): the job must not run."""

    def expect(self) -> None:
        """The running job's message has large frames: ``settle`` says what is held after it, whatever happens."""
        self._due = True

    def lend(self, name: str, mapping: mmap.mmap, placed: Mapping[str, Any], digests: Mapping[str, Any]) -> None:
        """The running job's frames in a file written for it: ``placed`` {index: [offset, length]}, and
        ``digests`` {index: digest} of those the hub named."""
        mapped = _Mapped(name, mapping, _address(mapping))
        for index, (offset, length) in placed.items():
            key = digests.get(index)
            self._lent.append(_Lent(mapped, int(offset), int(length), key if isinstance(key, str) else None))

    def take(self, key: str, besides: str | None = None) -> memoryview | bytes:
        """A view of the held frame with digest ``key``, for the running job (not from the file named
        ``besides``, which was just written over); empty, and listed in ``missing``, when there is none."""
        for mapped in self._held.values():
            where = mapped.intact.get(key)
            if where is not None and mapped.name != besides:
                offset, length = where
                self._lent.append(_Lent(mapped, offset, length, key))
                return memoryview(mapped.mapping)[offset:offset + length]
        self.missing.append(key)
        return b""

    def stand_in(self, buffer: memoryview) -> bytes | None:
        """For the running job's fingerprints (``tracking.StandIn``): when ``buffer`` lies in a frame the job
        was given, and its pages there are still the file's, a token naming those pages; else None. The
        same token before and after the cell: the cell didn't write them."""
        if buffer.nbytes < CACHED_OVER or not self._lent:  # (no smaller frame comes in a shared file)
            return None
        address = _address(buffer)
        for frame in self._lent:
            start = frame.mapped.address + frame.offset
            if start <= address and address + buffer.nbytes <= start + frame.length:
                if not self._pages.unchanged(address, buffer.nbytes):
                    return None
                return f"\0pages of {frame.mapped.name} from {address - frame.mapped.address}+{buffer.nbytes}".encode()
        return None

    def drop_unused(self) -> None:
        """Let go of the held mappings the running job doesn't use (once its own file is mapped)."""
        used = {id(lent.mapped) for lent in self._lent}
        self._held = {name: mapped for name, mapped in self._held.items() if id(mapped) in used}

    def settle(self) -> list[tuple[str, str]] | None:
        """Once the job's objects are gone: keep its mappings that nothing else refers to, with their frames
        that are unchanged. What is held now, as (digest, file name) pairs; None when the job had no large
        frames (what is held didn't change)."""
        if not self._due:
            return None
        lent, self._lent, self._due, self.missing = self._lent, [], False, []
        for mapped in {id(frame.mapped): frame.mapped for frame in lent}.values():
            if self._held.get(mapped.name) is mapped:
                del self._held[mapped.name]
            # Referred to by this dataclass and the call's argument only: no array, view or other object
            # over it is left (each holds a reference to the mapping, through its buffer).
            if sys.getrefcount(mapped.mapping) > 2:
                continue
            # Each frame checked again, those the job wasn't given too: it had the pages of the mapping.
            claimed = {**mapped.intact, **{frame.digest: (frame.offset, frame.length) for frame in lent
                                           if frame.mapped is mapped and frame.digest is not None}}
            mapped.intact = {key: where for key, where in claimed.items() if self._unchanged(mapped, key, *where)}
            if mapped.intact:
                self._held[mapped.name] = mapped
        return [(key, mapped.name) for mapped in self._held.values() for key in mapped.intact]

    def _unchanged(self, mapped: _Mapped, key: str, offset: int, length: int) -> bool:
        """Are a frame's bytes what the file holds under ``key``?"""
        unchanged = self._pages.unchanged(mapped.address + offset, length)
        if unchanged is not None:
            return unchanged
        with memoryview(mapped.mapping) as whole:
            return digest(whole[offset:offset + length]) == key
