"""What both sides of a file copy agree on: how a folder is listed, the digest, temporary names."""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from ..errors import FileTransferError

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


def checked_listing(tree: Any, source: str) -> tuple[list[tuple[str, int]], list[str]]:
    """The files ([relative path, size]) and folders of a listing the other side sent for ``source``,
    each checked with ``relative_parts``; FileTransferError for anything else."""
    try:
        files = [(str(path), int(size)) for path, size in tree["files"] if isinstance(path, str)
                 and isinstance(size, int) and size >= 0]
        folders = [folder for folder in tree["dirs"] if isinstance(folder, str)]
        complete = len(files) == len(tree["files"]) and len(folders) == len(tree["dirs"])
    except (KeyError, TypeError, ValueError):
        complete = False
    if not complete:
        raise FileTransferError(f"the worker sent a malformed listing of {source} (not a list of files with "
                                "their sizes and of folders): nothing was copied", source)
    for relative in [*folders, *(path for path, _ in files)]:
        relative_parts(relative, source)
    return files, folders


def relative_parts(relative: str, source: str) -> list[str]:
    """The parts of a path the other side listed inside ``source``; FileTransferError naming it when it is
    absolute, climbs out (``..``), or has empty or ``.`` parts: a copy writes only inside its destination."""
    on_windows = os.name == "nt"  # there a backslash separates, and a drive makes a path absolute
    parts = re.split(r"[\\/]", relative) if on_windows else relative.split("/")
    if (relative.startswith("/") or "\0" in relative or any(part in ("", ".", "..") for part in parts)
            or (on_windows and (PureWindowsPath(relative).drive or PureWindowsPath(relative).root))):
        raise FileTransferError(
            f"the worker listed {relative!r} in {source}, a path that is absolute or leaves the folder: refused, "
            "nothing is written outside the destination you named. A worker you trust never sends this: check "
            "that worker's machine", relative)
    return parts


def inside(root: Path, relative: str, source: str) -> Path:
    """``root``/``relative`` (a path listed in ``source``), refused with a FileTransferError if it is not
    inside ``root`` once links are followed: a link already in the destination never leads a write out."""
    path = root.joinpath(*relative_parts(relative, source))
    real_root = os.path.realpath(root)
    if os.path.commonpath([real_root, os.path.realpath(path)]) != real_root:
        raise FileTransferError(f"{relative!r} from {source} would be written to {os.path.realpath(path)}, outside "
                                f"{root} (through a symbolic link): refused", relative)
    return path


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
