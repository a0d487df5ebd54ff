"""Large frames between the supervisor and an executor through files in shared memory, not the socket.

A 64 MB array through the executors' local socket is copied by the kernel into the socket and out of it
again, in pieces of the socket's buffer, into memory ZeroMQ allocates wherever it likes (rarely where
numpy's loops compute as on the notebook's array, so it was copied once more on loading). Instead the
sender writes each frame of at least ``SHARED_OVER`` bytes once into a file in a shared-memory folder,
each at a page boundary, and sends the message with those frames left empty, behind ``MARK`` and a
description of where they are (``pack``). The receiver maps the file copy-on-write (a cell that changes
its input in place changes its own pages only) and hands the message on with views of the mapping in
place of the empty frames (``unpack``): numpy arrays are unpickled over the mapping itself, and keep it
mapped as long as any of them is referenced.

A job's file belongs to the supervisor's ``FramePool``: the executor says which files it no longer maps
(``Released``, told after each job, ``note``), and the pool writes the next job's frames into one of those:
its pages exist already, so writing them is a plain copy (a new file's pages are allocated and cleared
first, which takes several times as long). A result's file, the other way, is the supervisor's to remove
once it has mapped it.

A large input the notebook sends again unchanged is not written again: the executor keeps the last job's
large inputs mapped (``held_frames.HeldFrames``) and says which, by the hub's digest, in its note after
that job; the pool sends such a frame empty, named by its digest (``held``), and waits for that note
before it hands the executor another job.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import threading
import weakref
from collections import deque
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

if TYPE_CHECKING:
    from .held_frames import HeldFrames

log = logging.getLogger(__name__)

SHARED_OVER = 1 << 20
"""Frames at least this large go through shared memory; smaller ones through the socket."""

MARK = b"remote-magic/shared-frames/1"
"""The first frame of a message whose large frames are in a shared file (a message's own first frame is
the protocol version, never this)."""

PAGE_BYTES = mmap.ALLOCATIONGRANULARITY
"""Each frame starts at a multiple of this in the file, so its view starts on a page."""

FREE_FILES_KEPT = 2
FREE_BYTES_KEPT = 512 << 20
"""How many files (and bytes of them) a pool keeps for reuse once the executor let go of them; the others
are removed, so an executor's idle session holds no more shared memory than this."""

_numbers = count(1)


def shared_memory_root() -> Path | None:
    """Where files live in memory (Linux's /dev/shm), or None where there is no such folder."""
    root = Path("/dev/shm")
    return root if root.is_dir() and os.access(root, os.W_OK | os.X_OK) else None


def _view(frame: Any) -> memoryview:
    view = frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def _up(offset: int) -> int:
    return -(-offset // PAGE_BYTES) * PAGE_BYTES


def _write(path: Path, views: dict[int, memoryview], create: bool) -> dict[str, list[int]]:
    """Write the views into the file at page-aligned offsets (truncated to what they take); where each is."""
    placed: dict[str, list[int]] = {}
    fd = os.open(path, os.O_WRONLY | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
    try:
        offset = 0
        for index, view in views.items():
            placed[str(index)] = [offset, view.nbytes]
            written = 0
            while written < view.nbytes:  # one write call copies at most about 2 GB
                written += os.pwrite(fd, view[written:], offset + written)
            offset = _up(offset + view.nbytes)
        os.ftruncate(fd, offset)
    finally:
        os.close(fd)
    return placed


def pack(frames: Sequence[Any], folder: str, first: int = 0, *, file: Path | None = None,
         released: Iterable[str] = (), digests: Mapping[int, str] | None = None,
         held: Mapping[int, str] | None = None) -> tuple[list[Any], Path | None]:
    """The frames to send in place of ``frames`` (an encoded message), with those from ``first`` on of at
    least ``SHARED_OVER`` bytes written into ``file`` (one of ``folder``'s to reuse), or a new file there;
    and the file written (None when no frame is that large). ``released``: names of files the receiver's
    side may reuse, told with the message. ``held``: frames the receiver holds already, by index: they go
    empty, named by their digest. ``digests``: the digests of the others, by index, so the receiver may
    hold them after the job. ``frames`` go as they are when there is nothing to say, and through the
    socket when the folder can't take them."""
    held = {index: key for index, key in (held or {}).items() if index >= first}
    views = {index: view for index, frame in enumerate(frames)
             if index >= first and index not in held and (view := _view(frame)).nbytes >= SHARED_OVER
             } if hasattr(os, "pwrite") else {}
    released = list(released)
    if not views and not released and not held:
        return list(frames), None
    description: dict[str, Any] = {"released": released}
    if held:
        description["held"] = {str(index): key for index, key in held.items()}
    path = None
    if views:
        # (A random part too: a pid is reused, and a file of a process killed before it removed it may be left.)
        path = file or Path(folder) / f"frames-{os.getpid()}-{next(_numbers)}-{os.urandom(4).hex()}"
        try:
            description["frames"] = _write(path, views, create=file is None)
            description["path"] = str(path)
            if known := {str(index): key for index, key in (digests or {}).items() if index in views}:
                description["digests"] = known
        except OSError as exc:  # the folder is full, say (Docker gives /dev/shm 64 MB)
            _warn_once(f"large frames go through the socket instead of {folder}: {exc}")
            if file is None:
                path.unlink(missing_ok=True)
            path, views = None, {}
    message = [b"" if index in views or index in held else frame for index, frame in enumerate(frames)]
    return [MARK, json.dumps(description).encode(), *message], path


@dataclass
class Note:
    """What a message from the other side says besides its own frames."""

    released: list[str]
    """Files it no longer maps."""
    held: list[tuple[str, str]] | None = None
    """After a job whose message had large frames: the frames the executor holds now, as (digest, file name);
    None when the message doesn't say."""


def unpack(frames: Sequence[Any], folder: str, *, remove: bool, released: "Released | None" = None,
           held: "HeldFrames | None" = None) -> tuple[list[Any], Note]:
    """The message ``pack`` sent, with its large frames as views of the mapped file (``frames`` as they
    are when they don't start with ``MARK``), and what else it says (``Note``). The file must be in
    ``folder``: the other side may run user code, which must not have this side read or remove another
    file. ``remove``: the file is this side's to remove, once mapped; else ``released`` learns when its
    mapping is gone. ``held`` (the executor's): gives the frames the message names by digest, and learns
    this job's others. Raises OSError or ValueError for a message that can't be read."""
    if not frames or _view(frames[0]) != MARK:
        return list(frames), Note([])
    if len(frames) < 2:
        raise ValueError("a message with shared frames needs their description")
    description = json.loads(bytes(_view(frames[1])))
    due = description.get("path") is not None or bool(description.get("held"))
    if held is not None and due:  # first: whatever fails below, the supervisor waits to hear what is held
        held.expect()
    note = Note([str(name) for name in description.get("released", [])], _pairs(description.get("held")))
    message = list(frames[2:])
    path = None
    if description.get("path") is not None:
        path, placed = Path(description["path"]), description["frames"]
        if path.parent != Path(folder) or not path.name.startswith("frames-"):
            raise ValueError(f"shared frames must be in {folder}, not at {path}")
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            # Writable, its writes this process's own. (MAP_POPULATE would map it all with one call, but on a
            # writable private mapping it copies every page.)
            mapping = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
        finally:
            os.close(fd)
            if remove:
                path.unlink(missing_ok=True)
        if released is not None:
            released.watch(mapping, path.name)
        whole = memoryview(mapping)
        for index, (offset, length) in placed.items():
            if not (0 <= offset and offset + length <= size and 0 <= int(index) < len(message)):
                raise ValueError(f"a shared frame at {offset}+{length} is outside its {size}-byte file")
            message[int(index)] = whole[offset:offset + length]
        if held is not None:
            held.lend(path.name, mapping, placed, description.get("digests") or {})
    if held is not None and isinstance(description.get("held"), dict):
        for index, key in description["held"].items():
            if not 0 <= int(index) < len(message):
                raise ValueError(f"a held frame's index {index} is outside the message")
            message[int(index)] = held.take(str(key), besides=path.name if path is not None else None)
    if held is not None and due:
        held.drop_unused()  # (after the job's own file is mapped: Released counts that file's mappings)
    return message, note


def _pairs(held: Any) -> list[tuple[str, str]] | None:
    """A note's ``held`` list, as (digest, file name) pairs; what is malformed in it is left out."""
    if not isinstance(held, list):
        return None
    return [(str(pair[0]), str(pair[1])) for pair in held if isinstance(pair, list) and len(pair) == 2]


_warned = False


def _warn_once(text: str) -> None:
    global _warned
    log.log(logging.DEBUG if _warned else logging.WARNING, "%s", text)
    _warned = True


def note(released: Sequence[str], held: Sequence[tuple[str, str]] | None = None) -> list[bytes]:
    """A message that only says which files were released, and (after a job with large frames) which
    frames the executor holds now (``unpack`` finds no other frame in it)."""
    description: dict[str, Any] = {"released": list(released)}
    if held is not None:
        description["held"] = [list(pair) for pair in held]
    return [MARK, json.dumps(description).encode()]


class Released:
    """The executor's side: the names of the job files it no longer maps (every array over one is gone).
    A file may be mapped more than once (a held one the next job's file is written over): it is released
    once every mapping of it is gone."""

    def __init__(self) -> None:
        self._names: deque[str] = deque()  # appended by finalizers, on whatever thread drops the last view
        self._mapped: dict[str, int] = {}  # name -> how many mappings of it are alive
        self._lock = threading.RLock()  # (a finalizer may run on this thread, inside ``watch``)

    def watch(self, mapping: mmap.mmap, name: str) -> None:
        with self._lock:
            self._mapped[name] = self._mapped.get(name, 0) + 1
        weakref.finalize(mapping, self._unmapped, name)  # runs once the mapping is unmapped

    def _unmapped(self, name: str) -> None:
        with self._lock:
            left = self._mapped.pop(name, 1) - 1
            if left:
                self._mapped[name] = left
            else:
                self._names.append(name)

    def take(self) -> list[str]:
        """The names released since the last call."""
        taken = []
        while self._names:
            taken.append(self._names.popleft())
        return taken


class FramePool:
    """The supervisor's side, one per executor: the files its jobs' large frames go through, and the frames
    the executor holds from its last job (``held_frames``)."""

    def __init__(self, folder: str | None) -> None:
        self.folder = folder  # None: no shared files, every frame goes through the socket
        self._lent: dict[str, Path] = {}  # written for a job; the executor may map them still
        self._free: dict[str, Path] = {}  # the executor let go of them: reused for the next job
        self._held: dict[str, str] = {}  # digest -> file name: the frames the executor said it holds
        self.settled = True
        """Has the executor said what it holds since it was last handed large frames? Until it has, it gets no
        job: the pool wouldn't know which frames it may name by digest (it says so as soon as the job's
        objects are gone, right after its result)."""

    def pack(self, frames: Sequence[Any], first: int, digests: Mapping[int, str] | None = None) -> list[Any]:
        """``frames`` to send (``digests``: the large ones' digests, by index): those the executor holds named
        by their digest, the other large ones written into a free file, or else into a file the executor
        holds that this job doesn't use (taking the job, it lets go of those), or else a new one."""
        if self.folder is None:
            return list(frames)
        held = {index: key for index, key in (digests or {}).items()
                if key in self._held and first <= index < len(frames) and _view(frames[index]).nbytes >= SHARED_OVER}
        used = {self._held[key] for key in held.values()}
        writes = any(index >= first and index not in held and _view(frame).nbytes >= SHARED_OVER
                     for index, frame in enumerate(frames))
        reused = max(self._free.values(), key=_size, default=None) if writes else None
        if reused is not None:
            del self._free[reused.name]
        elif writes:
            reused = max((self._lent[name] for name in set(self._held.values()) - used if name in self._lent),
                         key=_size, default=None)
            if reused is not None:  # whatever comes of it, what the executor holds there is no longer named
                self._held = {key: name for key, name in self._held.items() if name != reused.name}
        sent, path = pack(frames, self.folder, first, file=reused, digests=digests, held=held)
        if reused is not None and path is None and reused.name not in self._lent:
            self._free[reused.name] = reused  # not needed after all
        if path is not None:
            self._lent[path.name] = path
        if path is not None or held:  # the executor keeps what this job uses at most, and says what
            self._held, self.settled = {}, False
        return sent

    def told(self, note: Note) -> bool:
        """What the executor said besides a message: files it let go of, and what it holds. True when it
        hadn't said what it holds since its last job with large frames, and now has."""
        self.released(note.released)
        if note.held is None or self.settled:  # (a second answer for one job is not the executor's)
            return False
        self._held = {key: name for key, name in note.held if name in self._lent}
        self.settled = True
        return True

    def released(self, names: Iterable[str]) -> None:
        """The executor no longer maps these (names not lent are ignored): keep a few for reuse."""
        for name in names:
            if (path := self._lent.pop(name, None)) is not None:
                self._free[name] = path
        kept, kept_bytes = 0, 0
        for name, path in sorted(self._free.items(), key=lambda item: -_size(item[1])):  # the largest first
            size = _size(path)
            if kept < FREE_FILES_KEPT and kept_bytes + size <= FREE_BYTES_KEPT:
                kept, kept_bytes = kept + 1, kept_bytes + size
            else:
                del self._free[name]
                path.unlink(missing_ok=True)

    def close(self) -> None:
        """Remove every file (the executor is gone)."""
        for path in (*self._lent.values(), *self._free.values()):
            path.unlink(missing_ok=True)
        self._lent.clear()
        self._free.clear()
        self._held, self.settled = {}, True


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
