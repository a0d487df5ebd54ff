"""Copying files and folders between the notebook and a worker, in chunks, with a progress bar.

Each step is one job of kind "file" on one worker (``worker/files.py`` lists the operations), so
a copy fails, stops on Ctrl-C and reports a lost worker as any job does. The receiving side
writes into a temporary ``.NAME.rmpart-…`` beside the destination and renames it only once every
file's size and digest have been checked: an interrupted copy never leaves a part of a file under
the final name.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from .errors import ConnectionFailed, FileTransferError, RemoteMagicError, WorkerLost
from .progress import tqdm_class
from .wire.filetree import DIGEST, TEMP_MARK, checked_listing, default_destination, explain, inside, listing

log = logging.getLogger(__name__)

CHUNK_BYTES = 8 << 20
"""How much of a file one job carries."""

PROGRESS_MIN_BYTES = 1 << 20
"""Copies at least this large show a progress bar at once; smaller ones only once they take PROGRESS_DELAY_S."""

PROGRESS_DELAY_S = 1.0


@dataclass
class Reply:
    """What one step of a copy sent back: its result header, its frames, and the worker that ran it."""

    header: dict[str, Any]
    frames: list[Any]
    worker: str


RunStep = Callable[[dict[str, Any], Sequence[Any], "str | None"], Reply]
"""Runs one file operation as a job (on the named worker, or any): ``Client._file_job``."""


@dataclass
class Transfer:
    """A finished copy (what ``Client.get_file`` and ``Client.put_file`` return)."""

    source: str
    """What was copied, as an absolute path on its side."""
    destination: str
    """Where it is now, as an absolute path on its side."""
    worker: str
    """The worker it was copied from or to."""
    files: int
    """How many files were copied (1 for a file)."""
    bytes: int
    """How many bytes, in all."""
    seconds: float


def get(run: RunStep, remote_path: str, local_path: str | os.PathLike[str] | None, *, worker: str | None,
        overwrite: bool, progress: bool | None, chunk_bytes: int = CHUNK_BYTES) -> Transfer:
    """Copy ``remote_path`` from a worker to ``local_path`` (see ``Client.get_file``)."""
    started = time.monotonic()
    remote = _path_argument(remote_path, "the path on the worker")
    target = Path(local_path if local_path is not None else _named(default_destination(remote), remote))
    target = target.expanduser().absolute()
    found = run({"op": "stat", "path": remote}, (), worker)
    worker, source = found.worker, str(found.header["path"])  # every later step goes to the worker that has it
    if found.header.get("kind") == "dir":  # a hostile worker's listing must not lead a write out: checked
        try:
            tree = json.loads(bytes(_buffer(found.frames[0])))
        except (IndexError, ValueError):
            tree = None
        files, folders = checked_listing(tree, source)
    else:
        files, folders = [("", int(found.header["size"]))], []
    total = sum(size for _, size in files)
    with _local(target):
        if os.path.lexists(target) and not overwrite:
            raise FileTransferError(_exists_here(target), str(target))
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.parent / f".{target.name}{TEMP_MARK}{secrets.token_hex(4)}"
    try:
        with _local(target):
            if found.header.get("kind") == "dir":
                temp.mkdir()
                for folder in folders:
                    inside(temp, folder, source).mkdir(parents=True, exist_ok=True)
        with _progress(total, target.name, progress) as advance:
            for relative, size in files:
                _get_file(run, worker, f"{source}/{relative}" if relative else source,
                          inside(temp, relative, source) if relative else temp, size, chunk_bytes, advance)
        with _local(target):
            _replace(temp, target, overwrite)
    except BaseException:
        _remove(temp)
        raise
    return Transfer(source, str(target), worker, len(files), total, time.monotonic() - started)


def _get_file(run: RunStep, worker: str, remote: str, local: Path, size: int, chunk_bytes: int,
              advance: Callable[[int], object]) -> None:
    digest = hashlib.new(DIGEST)
    with _local(local), open(local, "wb") as out:
        offset = 0
        while True:
            length = min(chunk_bytes, size - offset)
            last = offset + length >= size
            reply = run({"op": "read", "path": remote, "offset": offset, "length": length, "size": size,
                         "digest": last}, (), worker)
            data = _buffer(reply.frames[0]) if reply.frames else memoryview(b"")
            if len(data) != length:
                raise FileTransferError(f"{remote} changed on the worker while it was being copied: copy it again "
                                        "once nothing writes it", remote)
            out.write(data)
            digest.update(data)
            advance(length)
            offset += length
            if last:
                break
    if reply.header.get("digest") != digest.hexdigest():
        raise FileTransferError(f"{remote} arrived with different contents than the worker has ({DIGEST} differs): "
                                "copy it again", remote)


def put(run: RunStep, local_path: str | os.PathLike[str], remote_path: str | None, *, worker: str | None,
        overwrite: bool, progress: bool | None, chunk_bytes: int = CHUNK_BYTES) -> Transfer:
    """Copy ``local_path`` from here to ``remote_path`` on a worker (see ``Client.put_file``)."""
    started = time.monotonic()
    given = _path_argument(os.fspath(local_path), "the path here")
    source = Path(given).expanduser().absolute()
    remote = (_path_argument(remote_path, "the path on the worker") if remote_path is not None
              else _named(default_destination(given), given))
    with _local(source):
        is_folder = source.is_dir()
        if is_folder:
            tree, folders = listing(source)
            files = [(str(p), int(s)) for p, s in tree]
        elif source.is_file():
            files, folders = [("", source.stat().st_size)], []
        elif source.exists():
            raise FileTransferError(f"{source} is not a regular file or folder: only those can be copied", str(source))
        else:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(source))  # _local explains it
    total = sum(size for _, size in files)
    prepared = run({"op": "prepare", "path": remote, "kind": "dir" if is_folder else "file", "overwrite": overwrite},
                   [json.dumps({"dirs": folders}).encode()] if is_folder else (), worker)
    worker, temp, destination = prepared.worker, str(prepared.header["temp"]), str(prepared.header["path"])
    try:
        with _progress(total, source.name, progress) as advance:
            for relative, size in files:
                _put_file(run, worker, source / relative if relative else source, temp, relative,
                          f"{destination}/{relative}" if relative else destination, size, chunk_bytes, advance)
        run({"op": "commit", "temp": temp, "path": destination, "overwrite": overwrite}, (), worker)
    except BaseException as exc:
        if not isinstance(exc, (ConnectionFailed, WorkerLost)):  # with the worker gone there is no one to ask
            try:
                run({"op": "abort", "temp": temp}, (), worker)
            except (RemoteMagicError, KeyboardInterrupt) as cleanup:
                log.warning("could not remove the partial copy %s on worker %r: %s", temp, worker, cleanup)
        raise
    return Transfer(str(source), destination, worker, len(files), total, time.monotonic() - started)


def _put_file(run: RunStep, worker: str, local: Path, temp: str, relative: str, shown: str, size: int,
              chunk_bytes: int, advance: Callable[[int], object]) -> None:
    digest = hashlib.new(DIGEST)
    with _local(local), open(local, "rb") as file:
        offset = 0
        while True:
            length = min(chunk_bytes, size - offset)
            data = file.read(length)
            if len(data) != length or (offset + length >= size and file.read(1)):
                raise FileTransferError(f"{local} changed while it was being copied: copy it again once nothing "
                                        "writes it", str(local))
            digest.update(data)
            op: dict[str, Any] = {"op": "write", "temp": temp, "file": relative, "offset": offset}
            last = offset + length >= size
            if last:
                op.update(size=size, digest=digest.hexdigest(), name=shown)
            run(op, [data], worker)
            advance(length)
            offset += length
            if last:
                return


@contextlib.contextmanager
def _progress(total: int, label: str, mode: bool | None) -> Iterator[Callable[[int], object]]:
    """A tqdm bar of bytes (rate, ETA) for the copy: at once, after PROGRESS_DELAY_S, or never (False)."""
    if mode is False:
        yield lambda count: None
        return
    delay = 0.0 if mode or total >= PROGRESS_MIN_BYTES else PROGRESS_DELAY_S
    with tqdm_class()(total=total, desc=label, unit="B", unit_scale=True, delay=delay) as bar:
        yield bar.update


@contextlib.contextmanager
def _local(path: Path) -> Iterator[None]:
    """Turn an OSError about a file here into a FileTransferError that says what to do."""
    try:
        yield
    except OSError as exc:
        raise FileTransferError(explain(exc, path, "here", "choose a path you can read and write"),
                                str(exc.filename or path)) from None




def _exists_here(path: Path) -> str:
    what = "a folder" if path.is_dir() else "a file"
    return (f"{path} already exists here ({what}): pass --force (overwrite=True) to replace it, "
            "or name another destination")


def _replace(temp: Path, target: Path, overwrite: bool) -> None:
    """Give the finished copy its name, replacing what is there only with ``overwrite``."""
    if os.path.lexists(target):
        if not overwrite:
            raise FileTransferError(_exists_here(target), str(target))
        if target.is_dir() and not target.is_symlink():
            aside = temp.with_name(temp.name + ".old")
            target.rename(aside)
            temp.rename(target)
            shutil.rmtree(aside, ignore_errors=True)
            return
        if temp.is_dir():
            target.unlink()  # a folder can't be renamed over a file
    os.replace(temp, target)


def _remove(temp: Path) -> None:
    if temp.is_dir() and not temp.is_symlink():
        shutil.rmtree(temp, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()


def _path_argument(path: Any, what: str) -> str:
    if not isinstance(path, str) or not path.strip():
        raise FileTransferError(f"{what} is missing: give a file's or folder's name")
    return path


def _named(destination: str, path: str) -> str:
    if destination in ("", "."):
        raise FileTransferError(f"{path!r} has no name to copy it under: give the destination too", path)
    return destination


def _buffer(frame: Any) -> memoryview:
    return memoryview(getattr(frame, "buffer", frame))
