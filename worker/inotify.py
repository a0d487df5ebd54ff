"""Linux inotify(7), through libc: watches on folders, and their events read without blocking.

The kernel queues an event while the call that changed the file runs, so once a cell (and what it
started) has returned, one non-blocking read gets every event its changes made: no thread, no wait.
``workdir.FolderWatch`` is its only user. Elsewhere (macOS, Windows) ``Inotify()`` raises OSError.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os
import struct
import sys
from dataclasses import dataclass

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_CLOSE_WRITE = 0x8
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x1000000
IN_DONT_FOLLOW = 0x2000000
IN_EXCL_UNLINK = 0x4000000
IN_ISDIR = 0x40000000

FOLDER_EVENTS = (IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
                 | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW | IN_EXCL_UNLINK)
"""What a watch on a folder reports: a file in it created, written, touched, moved or removed; itself gone."""

_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len (of the name, NUL-padded)
_READ_SIZE = 256 * 1024


@dataclass(frozen=True)
class Event:
    """One inotify event: the watch it came from, what happened (IN_* bits), the entry's name in that folder."""

    wd: int
    mask: int
    name: str


class Inotify:
    """One inotify instance (a file descriptor), non-blocking; ``close`` it when done."""

    def __init__(self) -> None:
        if not sys.platform.startswith("linux"):
            raise OSError(errno.ENOSYS, "inotify is Linux's")
        self._libc = _libc()
        fd = self._libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            number = ctypes.get_errno()
            raise OSError(number, f"inotify_init1: {os.strerror(number)}")
        self.fd: int | None = fd

    def add_watch(self, path: str, mask: int = FOLDER_EVENTS) -> int:
        """Watch ``path``; its watch descriptor. OSError as the kernel says: ENOSPC when the user's watches
        (fs.inotify.max_user_watches) are used up, ENOENT/ENOTDIR when it is gone, EACCES..."""
        wd = self._libc.inotify_add_watch(self._fd(), os.fsencode(path), mask)
        if wd < 0:
            number = ctypes.get_errno()
            raise OSError(number, os.strerror(number), path)
        return int(wd)

    def remove_watch(self, wd: int) -> None:
        """Stop a watch (an IN_IGNORED event follows); one the kernel already dropped is ignored."""
        self._libc.inotify_rm_watch(self._fd(), wd)

    def read(self) -> list[Event]:
        """Every event queued so far, without waiting."""
        events: list[Event] = []
        while True:
            try:
                data = os.read(self._fd(), _READ_SIZE)
            except BlockingIOError:
                return events
            offset = 0
            while offset < len(data):
                wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
                offset += _HEADER.size
                name = data[offset:offset + length].rstrip(b"\0")
                offset += length
                events.append(Event(wd, mask, os.fsdecode(name)))

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def _fd(self) -> int:
        if self.fd is None:
            raise OSError(errno.EBADF, "this inotify instance is closed")
        return self.fd


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.inotify_init1.argtypes = [ctypes.c_int]
    libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
    return libc
