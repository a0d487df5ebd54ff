"""What a cell did to the files in its working directory, found from file events, or by scanning it.

Files a cell writes stay on the worker; the notebook says so in one line (``%offload_get`` copies
them). :class:`WorkingDirectory` finds them. Where the OS has file events (Linux's inotify), the folder
a cell starts in is scanned once and watched from then on (:class:`FolderWatch`, kept from cell to
cell while cells start there): after a cell, only the files the events name are looked at, so a
cell's cost doesn't grow with the folder. Elsewhere, or when the folder can't be watched (its
watches would pass fs.inotify.max_user_watches), the folder is scanned before and after each cell.
Either way what is looked at is bounded so that a cell started in a huge folder (a home directory,
a dataset) stays fast: at most MAX_ENTRIES entries, and never inside hidden folders or caches.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import stat
from dataclasses import dataclass
from typing import Any, Callable

from . import inotify

log = logging.getLogger(__name__)

MAX_ENTRIES = 20_000
"""How many directory entries one scan looks at, at most; past it, changes go unseen."""

MAX_LISTED = 100
"""How many changed paths of each kind travel in a result header; the counts say how many more."""

SKIPPED_DIRS = frozenset({"__pycache__", "node_modules", "site-packages"})
"""Folders never scanned, besides hidden ones (.git, .venv, .ipynb_checkpoints)."""


@dataclass
class Snapshot:
    """Every regular file under ``root`` (relative path, with '/') with its size and mtime_ns."""

    root: str
    files: dict[str, tuple[int, int]]
    listed: set[str]  # the folders read to the end ("" is root): a file missing from one of them is gone
    complete: bool = True  # False when the scan stopped at its limit


def scan(root: str, limit: int = MAX_ENTRIES, start: str = "",
         on_folder: Callable[[str], None] | None = None) -> Snapshot:
    """The files under ``root`` (or only under its subfolder ``start``), breadth-first, looking at no
    more than ``limit`` entries; ``on_folder`` is called with each folder before it is read.

    Never raises OSError: a folder that can't be read, or a file removed while scanning, is left out.
    """
    snapshot = Snapshot(root, {}, set())
    files = snapshot.files
    pending = collections.deque([start])
    seen = 0
    while pending:
        relative = pending.popleft()
        if on_folder is not None:
            on_folder(relative)
        try:
            with os.scandir(os.path.join(root, relative) if relative else root) as entries:
                for entry in entries:
                    seen += 1
                    if seen > limit:
                        snapshot.complete = False
                        return snapshot
                    path = f"{relative}/{entry.name}" if relative else entry.name
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            if not entry.name.startswith(".") and entry.name not in SKIPPED_DIRS:
                                pending.append(path)
                        elif entry.is_file(follow_symlinks=False):
                            stat = entry.stat(follow_symlinks=False)
                            files[path] = (stat.st_size, stat.st_mtime_ns)
                    except OSError:
                        continue
        except OSError:
            continue
        snapshot.listed.add(relative)
    return snapshot


def changes(before: Snapshot, after: Snapshot) -> dict[str, Any] | None:
    """What a result header carries about the files that changed between two scans, or None.

    ``written``: [[path, size], ...] created or changed, ``deleted``: [path, ...], each at most
    MAX_LISTED long, sorted; ``written_count``/``deleted_count`` say how many in all; ``complete``
    is false when a scan stopped early (then changes past its limit went unseen).
    """
    # Past a scan's limit, a file missing from it may just be unseen: only folders read to the end count.
    written = [(path, size) for path, (size, mtime) in after.files.items()
               if before.files.get(path) != (size, mtime) and _seen(before, path)]
    deleted = [path for path in before.files if path not in after.files and _seen(after, path)]
    return _header(before.root, written, deleted, before.complete and after.complete)


def _header(root: str, written: list[tuple[str, int]], deleted: list[str], complete: bool) -> dict[str, Any] | None:
    if not written and not deleted:
        return None
    written.sort()
    deleted.sort()
    return {"root": root, "written": [[path, size] for path, size in written[:MAX_LISTED]],
            "written_count": len(written), "deleted": deleted[:MAX_LISTED], "deleted_count": len(deleted),
            "complete": complete}


def _seen(snapshot: Snapshot, path: str) -> bool:
    """Would ``snapshot`` have seen ``path`` if it had been there?"""
    return snapshot.complete or path in snapshot.files or path.rpartition("/")[0] in snapshot.listed


class CannotWatch(Exception):
    """A folder can't be watched for file events (no inotify here, or its watches would pass the user's
    limit): it is scanned instead."""


class FolderWatch:
    """The files under ``root`` as the last look left them, and what changed since.

    Watching (``watching``): one inotify watch on each folder the first scan read (hidden folders and
    caches are neither read nor watched), and a look reads the events queued since the last and looks
    only at the files they name. Otherwise a look scans the folder again and compares.
    """

    def __init__(self, root: str, try_watching: bool = True) -> None:
        """Scan ``root`` once, watching each folder before reading it (so nothing written meanwhile is
        missed) when ``try_watching``; where that fails, the log says why."""
        self.root = root
        self._inotify: inotify.Inotify | None = None
        self._folders: dict[int, str] = {}  # watch descriptor -> relative folder
        self._dirty: set[str] = set()  # files the events named since the last look
        self._gone: set[str] = set()  # folders removed or moved away since the last look
        self._rescan = False  # events were lost (the kernel's queue overflowed, the root moved)
        self._snapshot = self._watch_afresh() if try_watching else scan(root)

    @property
    def watching(self) -> bool:
        return self._inotify is not None

    def changes(self) -> dict[str, Any] | None:
        """What changed since the last look (as :func:`changes` says it)."""
        if self._inotify is None:
            before, self._snapshot = self._snapshot, scan(self.root)
            return changes(before, self._snapshot)
        before = self._snapshot
        try:
            self._drain()
        except CannotWatch as exc:  # a folder made since can't be watched
            self._stop_watching(exc)
            return changes(before, self._snapshot)
        if self._rescan:  # events were lost: compare with a new scan, watching afresh
            self._snapshot = self._watch_afresh()
            return changes(before, self._snapshot)
        self._forget_gone()
        known, written, deleted = self._snapshot.files, [], []
        for path in self._dirty:
            now, was = _file_state(os.path.join(self.root, path)), known.get(path)
            if now == was:
                continue  # touched and put back, or created and removed
            if now is None:
                del known[path]
                deleted.append(path)
            elif was is not None or _seen(self._snapshot, path):
                known[path] = now
                written.append((path, now[0]))
        self._dirty.clear()
        return _header(self.root, written, deleted, self._snapshot.complete)

    def close(self) -> None:
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None

    def _watch_afresh(self) -> Snapshot:
        """A scan of the folder, watching each folder it reads from now on; a plain scan where it can't."""
        self.close()
        self._folders, self._dirty, self._gone, self._rescan = {}, set(), set(), False
        try:
            try:
                self._inotify = inotify.Inotify()
            except OSError as exc:
                hint = ": raise fs.inotify.max_user_instances (sysctl) to have it watched" \
                    if exc.errno == errno.EMFILE else ""
                raise CannotWatch(f"no file events ({exc.strerror}){hint}") from exc
            return scan(self.root, on_folder=self._watch)
        except CannotWatch as exc:
            self._stop_watching(exc)
            return self._snapshot
        except BaseException:
            self.close()
            raise

    def _stop_watching(self, why: CannotWatch) -> None:
        """Watching can't go on: the folder as a scan finds it; it is scanned from now on."""
        log.warning("remote-worker scans %s before and after each cell for the files it writes, which costs "
                    "time in a large folder: %s", self.root, why)
        self.close()
        self._snapshot = scan(self.root)

    def _watch(self, relative: str) -> None:
        if self._inotify is None:
            return
        folder = os.path.join(self.root, relative) if relative else self.root
        try:
            self._folders[self._inotify.add_watch(folder)] = relative
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.ENOMEM):
                raise CannotWatch(f"it has more folders than the user's inotify watches left ({exc.strerror} "
                                  f"after {len(self._folders):,}): raise fs.inotify.max_user_watches (sysctl) "
                                  "to have it watched") from exc
            if not relative:
                raise CannotWatch(f"it can't be watched ({exc.strerror})") from exc
            # A subfolder removed or unreadable since it was listed: the scan leaves it out too.

    def _drain(self) -> None:
        """Take every event queued: the kernel queues one as the change is made, so this is all of them."""
        while self._inotify is not None and (events := self._inotify.read()):
            for event in events:
                self._take(event)

    def _take(self, event: inotify.Event) -> None:
        if event.mask & inotify.IN_Q_OVERFLOW:
            self._rescan = True
            return
        folder = self._folders.get(event.wd)
        if event.mask & inotify.IN_IGNORED:  # the watch is gone (its folder was removed, or we removed it)
            self._folders.pop(event.wd, None)
            return
        if folder is None:
            return
        if event.mask & (inotify.IN_DELETE_SELF | inotify.IN_MOVE_SELF):
            self._rescan = self._rescan or not folder  # a subfolder's own parent says it went
            return
        path = f"{folder}/{event.name}" if folder else event.name
        if not event.mask & inotify.IN_ISDIR:
            self._dirty.add(path)
        elif event.mask & (inotify.IN_CREATE | inotify.IN_MOVED_TO):
            self._new_folder(path, event.name)
        elif event.mask & inotify.IN_MOVED_FROM:
            self._moved_away(path)
        elif event.mask & inotify.IN_DELETE:
            self._gone.add(path)  # its watch went with it (IN_IGNORED), and its files' own events came first

    def _new_folder(self, path: str, name: str) -> None:
        """A folder made or moved in: watched, and every file in it looked at."""
        if name.startswith(".") or name in SKIPPED_DIRS:
            return
        self._forget_gone()  # first: a folder removed and made again is read afresh
        found = scan(self.root, start=path, on_folder=self._watch)
        self._dirty.update(found.files)
        self._snapshot.listed |= found.listed
        self._snapshot.complete = self._snapshot.complete and found.complete

    def _moved_away(self, path: str) -> None:
        """A folder moved elsewhere: its watches (and its subfolders') stop, or they would go on reporting."""
        prefix = f"{path}/"
        for wd, folder in list(self._folders.items()):
            if folder == path or folder.startswith(prefix):
                del self._folders[wd]
                if self._inotify is not None:
                    self._inotify.remove_watch(wd)
        self._gone.add(path)

    def _forget_gone(self) -> None:
        """The folders removed or moved away since the last call: every file known in them is looked at
        (one pass over what is known, however many folders went)."""
        gone, self._gone = self._gone, set()
        if gone:
            self._dirty.update(path for path in self._snapshot.files if _inside(path, gone))
            self._snapshot.listed = {folder for folder in self._snapshot.listed
                                     if folder not in gone and not _inside(folder, gone)}


class WorkingDirectory:
    """What each cell changed under the folder it started in (the ``files`` of its RESULT or ERROR).

    A cell's changes are those made while it ran: what changed between two cells (a file another program
    wrote, a copy, a thread an earlier cell left running) is looked at when the next starts, and left out.
    A file another program writes in the folder while the cell runs is taken for the cell's: file events
    don't say which process made them. The folder is watched from the first cell that starts there until
    one starts elsewhere.
    """

    def __init__(self) -> None:
        self._watch: FolderWatch | None = None
        self._unwatchable: set[str] = set()  # folders that couldn't be watched (the log said why, once)
        self._running = False  # a cell started, in the watched folder

    def cell_starts(self) -> None:
        """Note where a cell starts, and how the folder is before it runs."""
        try:
            root = os.getcwd()
        except OSError:  # the working directory was removed: nothing to compare
            self._running = False
            return
        watch = self._watch
        if watch is None or watch.root != root:
            if watch is not None:
                watch.close()
            watch = self._watch = FolderWatch(root, try_watching=root not in self._unwatchable)
            if not watch.watching:
                self._unwatchable.add(root)
        else:
            watch.changes()  # since the last look: not this cell's
        self._running = True

    def cell_ended(self) -> dict[str, Any] | None:
        """What the cell that started last changed, as a header's ``files`` says it (None: nothing, or it
        started nowhere)."""
        running, self._running = self._running, False
        return self._watch.changes() if running and self._watch is not None else None

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
            self._watch = None


def _inside(path: str, folders: set[str]) -> bool:
    """Is ``path`` (relative, '/'-separated) inside one of ``folders``?"""
    while "/" in path:
        path = path.rpartition("/")[0]
        if path in folders:
            return True
    return False


def _file_state(path: str) -> tuple[int, int] | None:
    """A regular file's (size, mtime_ns), as a scan records it; None when it isn't one (gone, a folder, a link)."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return (info.st_size, info.st_mtime_ns) if stat.S_ISREG(info.st_mode) else None
