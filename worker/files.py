"""The worker's side of copying files: the operations of a "file" job, one small step each.

The notebook moves a file or folder as a series of jobs (``remote_magic/file_copy.py``), each one
operation named in the job's header::

    stat     PATH                      what PATH is: a file (size) or a folder (its files and folders)
    read     PATH OFFSET LENGTH        bytes of a file, in the result's one frame; the last read of a
                                       file asks for the whole file's digest too
    prepare  PATH KIND                 a temporary file or folder beside PATH to write into
    write    TEMP FILE OFFSET          the job's frame at OFFSET of a file in TEMP; the last write of
                                       a file carries its size and digest, checked here
    commit   TEMP PATH                 rename TEMP to PATH: a half-copied file never has PATH's name
    abort    TEMP                      remove TEMP after a failed or interrupted copy

Relative paths start in the executor's working directory. Any failure is a FileTransferError
whose message names the path and what to do.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import stat
from typing import Any, Callable, Sequence

from remote_magic.errors import FileTransferError
from remote_magic.wire.filetree import DIGEST, TEMP_MARK, explain, listing

_READ_BLOCK = 1 << 20

MAX_READ_BYTES = 1 << 30
"""The most one read returns: the notebook asks for CHUNK_BYTES; anything far larger is a mistake."""

Result = tuple[dict[str, Any], list[Any]]


def handle(op: dict[str, Any], frames: Sequence[Any]) -> Result:
    """Run one operation; its result header and frames."""
    name = op.get("op")
    handler = _OPERATIONS.get(str(name))
    if handler is None:
        raise FileTransferError(f"the worker knows no file operation {name!r}: install the same remote-magic "
                                "version on the notebook and the worker")
    try:
        return handler(op, frames)
    except OSError as exc:
        raise FileTransferError(explain(exc, "a path", "on the worker",
                                        "the user that runs remote-worker can't use it"), exc.filename) from None


def _stat(op: dict[str, Any], frames: Sequence[Any]) -> Result:
    path = _resolve(op["path"])
    info = os.stat(path)
    if stat.S_ISREG(info.st_mode):
        return {"path": path, "kind": "file", "size": info.st_size}, []
    if not stat.S_ISDIR(info.st_mode):
        raise FileTransferError(f"{path} on the worker is not a regular file or folder: only those can be copied",
                                path)
    files, folders = listing(path)
    total = sum(size for _, size in files)
    return ({"path": path, "kind": "dir", "size": total, "count": len(files)},
            [json.dumps({"files": files, "dirs": folders}).encode()])


def _read(op: dict[str, Any], frames: Sequence[Any]) -> Result:
    path, offset, length, expected = str(op["path"]), int(op["offset"]), int(op["length"]), int(op["size"])
    if not 0 <= length <= MAX_READ_BYTES:
        raise FileTransferError(f"a read of {length:,} bytes from {path} is not between 0 and {MAX_READ_BYTES:,}", path)
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size != expected:
            raise FileTransferError(f"{path} changed on the worker while it was being copied ({expected:,} bytes, "
                                    f"now {size:,}): copy it again once nothing writes it", path)
        data = os.pread(file.fileno(), length, offset)
        header: dict[str, Any] = {"size": size}
        if op.get("digest"):
            header["digest"] = _digest(file.fileno())
    return header, [data]


def _prepare(op: dict[str, Any], frames: Sequence[Any]) -> Result:
    path, kind = _resolve(op["path"]), str(op["kind"])
    if os.path.lexists(path) and not op.get("overwrite"):
        raise FileTransferError(_exists(path), path)
    parent, name = os.path.split(path)
    if not name:
        raise FileTransferError(f"{path!r} names no file on the worker: give a path that ends in a name", path)
    os.makedirs(parent, exist_ok=True)
    temp = os.path.join(parent, f".{name}{TEMP_MARK}{secrets.token_hex(4)}")
    if kind == "dir":
        os.mkdir(temp)
        for folder in json.loads(bytes(_buffer(frames[0]))).get("dirs", []) if frames else []:
            os.makedirs(_member(temp, folder), exist_ok=True)
    return {"path": path, "temp": temp}, []


def _write(op: dict[str, Any], frames: Sequence[Any]) -> Result:
    target = _member(_temporary(op["temp"]), str(op.get("file", "")))
    offset = int(op["offset"])
    data = _buffer(frames[0]) if frames else memoryview(b"")
    fd = os.open(target, os.O_RDWR | os.O_CREAT | (os.O_TRUNC if offset == 0 else 0), 0o666)
    try:
        written = 0
        while written < len(data):
            written += os.pwrite(fd, data[written:], offset + written)
        if "digest" in op:
            _check(fd, int(op["size"]), str(op["digest"]), str(op.get("name") or target))
    finally:
        os.close(fd)
    return {}, []


def _check(fd: int, size: int, digest: str, shown: str) -> None:
    arrived = os.fstat(fd).st_size
    if arrived != size:
        raise FileTransferError(f"{shown} arrived on the worker with {arrived:,} of its {size:,} bytes: copy it again",
                                shown)
    if _digest(fd) != digest:
        raise FileTransferError(f"{shown} arrived on the worker with different contents than were sent "
                                f"({DIGEST} differs): copy it again", shown)


def _commit(op: dict[str, Any], frames: Sequence[Any]) -> Result:
    temp, path = _temporary(op["temp"]), str(op["path"])
    if os.path.lexists(path):
        if not op.get("overwrite"):
            raise FileTransferError(_exists(path), path)
        if os.path.isdir(path) and not os.path.islink(path):
            aside = f"{temp}.old"
            os.rename(path, aside)
            os.rename(temp, path)
            shutil.rmtree(aside, ignore_errors=True)
            return {}, []
        if os.path.isdir(temp):
            os.remove(path)  # a folder can't be renamed over a file
    os.replace(temp, path)
    return {}, []


def _abort(op: dict[str, Any], frames: Sequence[Any]) -> Result:
    temp = _temporary(op["temp"])
    if os.path.isdir(temp) and not os.path.islink(temp):
        shutil.rmtree(temp, ignore_errors=True)
    elif os.path.lexists(temp):
        os.remove(temp)
    return {}, []


_OPERATIONS: dict[str, Callable[[dict[str, Any], Sequence[Any]], Result]] = {
    "stat": _stat, "read": _read, "prepare": _prepare, "write": _write, "commit": _commit, "abort": _abort,
}


def _resolve(path: Any) -> str:
    if not isinstance(path, str) or not path:
        raise FileTransferError("a file operation needs a path: give the file's or folder's name on the worker")
    return os.path.abspath(os.path.expanduser(path))


def _temporary(path: Any) -> str:
    """A temporary path ``prepare`` made; nothing else may be written into or removed this way."""
    if not isinstance(path, str) or not os.path.isabs(path) or TEMP_MARK not in os.path.basename(path):
        raise FileTransferError(f"{path!r} is not a copy's temporary file on the worker")
    return path


def _member(root: str, relative: str) -> str:
    """``relative`` inside ``root``; a path that would leave it is refused."""
    if not relative:
        return root
    parts = relative.split("/")
    if relative.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise FileTransferError(f"{relative!r} is not a plain relative path inside the folder being copied")
    return os.path.join(root, *parts)


def _buffer(frame: Any) -> memoryview:
    return memoryview(getattr(frame, "buffer", frame))


def _digest(fd: int) -> str:
    digest = hashlib.new(DIGEST)
    offset = 0
    while block := os.pread(fd, _READ_BLOCK, offset):
        digest.update(block)
        offset += len(block)
    return digest.hexdigest()


def _exists(path: str) -> str:
    what = "a folder" if os.path.isdir(path) else "a file"
    return (f"{path} already exists on the worker ({what}): pass --force (overwrite=True) to replace it, "
            "or name another destination")


