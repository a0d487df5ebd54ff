"""What a cell did to the files in its working directory: a bounded scan before and after it.

Files a cell writes stay on the worker; the notebook says so in one line (``%offload_get`` copies
them). The scan is bounded so that a cell started in a huge folder (a home directory, a dataset)
stays fast: at most MAX_ENTRIES entries, and never inside hidden folders or caches.
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass
from typing import Any

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


def scan(root: str, limit: int = MAX_ENTRIES) -> Snapshot:
    """The files under ``root``, breadth-first, looking at no more than ``limit`` entries.

    Never raises: a folder that can't be read, or a file removed while scanning, is left out.
    """
    snapshot = Snapshot(root, {}, set())
    files = snapshot.files
    pending = collections.deque([""])
    seen = 0
    while pending:
        relative = pending.popleft()
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
    written = sorted((path, size) for path, (size, mtime) in after.files.items()
                     if before.files.get(path) != (size, mtime) and _seen(before, path))
    deleted = sorted(path for path in before.files if path not in after.files and _seen(after, path))
    if not written and not deleted:
        return None
    return {"root": before.root, "written": [[path, size] for path, size in written[:MAX_LISTED]],
            "written_count": len(written), "deleted": deleted[:MAX_LISTED], "deleted_count": len(deleted),
            "complete": before.complete and after.complete}


def _seen(snapshot: Snapshot, path: str) -> bool:
    """Would ``snapshot`` have seen ``path`` if it had been there?"""
    return snapshot.complete or path in snapshot.files or path.rpartition("/")[0] in snapshot.listed
