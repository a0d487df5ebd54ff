"""What both sides of a file copy agree on: how a folder is listed, the digest, temporary names."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import PurePosixPath
from typing import Any

TEMP_MARK = ".rmpart-"
"""In the name of every temporary file or folder a copy writes into (``.NAME.rmpart-RANDOM``)."""

DIGEST = "sha256"
"""How each copied file is checked at the end, on the side that receives it."""


def listing(root: str | os.PathLike[str]) -> tuple[list[list[Any]], list[str]]:
    """Every regular file under ``root`` as [relative path with '/', size], and every folder, sorted.

    Links to folders are not followed (they may loop); links to files are copied as files. A
    folder that can't be read raises its OSError.
    """
    files: list[list[Any]] = []
    folders: list[str] = []
    for folder, subfolders, names in os.walk(root, onerror=_raise):
        subfolders.sort()
        relative = os.path.relpath(folder, root)
        prefix = "" if relative == "." else relative.replace(os.sep, "/") + "/"
        folders.extend(prefix + name for name in subfolders if not os.path.islink(os.path.join(folder, name)))
        for name in sorted(names):
            try:
                info = os.stat(os.path.join(folder, name))
            except FileNotFoundError:  # a broken link, or removed meanwhile
                continue
            if stat.S_ISREG(info.st_mode):
                files.append([prefix + name, info.st_size])
    return files, folders


def _raise(exc: OSError) -> None:
    raise exc


def default_destination(path: str) -> str:
    """Where a copy of ``path`` goes on the other side when no destination is given: the same
    relative path, or, for an absolute path or one that climbs (``..``, ``~``), its last part."""
    parts = PurePosixPath(path.replace("\\", "/"))
    if parts.is_absolute() or path.startswith("~") or ".." in parts.parts:
        return parts.name
    return str(parts)


def explain(exc: OSError, path: object, side: str, permission_advice: str) -> str:
    """An OSError in words a notebook user acts on: which path, on which ``side`` ("here", "on the
    worker"), what is wrong and what to do."""
    where = exc.filename or path
    if exc.errno == errno.ENOENT:
        return (f"{where} does not exist {side} (relative paths start in {os.getcwd()}): check the name")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"permission denied for {where} {side}: {permission_advice}"
    if exc.errno == errno.EISDIR:
        return f"{where} {side} is a folder where a file was expected: name a file"
    if exc.errno == errno.ENOTDIR:
        return f"a part of {where} {side} is a file where a folder was expected: check the path"
    if exc.errno == errno.ENOSPC:
        return f"the disk {side} is full writing {where}: free some space, then copy again"
    return f"{where} {side}: {exc.strerror or exc}"
