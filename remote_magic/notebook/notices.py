"""What the magics tell the user in words: `notice` prints a line on stderr, beside a cell's output, and the
``describe_*`` functions word what happened (files a cell wrote, a copy, GPU stats, a connection, a reset).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..engine import Engine
from ..file_copy import Transfer
from ..results import FileChanges
from ..wire.definitions import INSTALLED
from ..wire.sizes import human_size
from ..wire.versions import distribution_of

NOTICE_FILES = 3
"""How many files a notice about the files a cell wrote names; it counts the rest."""

NOTICE_SIZE_BYTES = 1_000_000
"""Files at least this large are named with their size."""


def notice(text: str) -> None:
    """Say ``text`` on stderr, marked as remote-magic's: where an offloaded cell differs from a local run."""
    print(f"remote-magic: {text}", file=sys.stderr)


def describe_connection(engine: Engine, workers: Sequence[Mapping[str, Any]]) -> str:
    """'Connected to tcp://… — workers: box, laptop' (or '— Dask workers: 0, 1'): what %offload_connect prints."""
    names = ", ".join(w["name"] for w in workers) or "none yet"
    return f"Connected to {engine.address} — {engine.workers_called}: {names}"


def describe_reset(reset: Sequence[str], asked: str | None) -> str:
    """What %offload_reset did: the workers whose session for this notebook ended, or that there was none."""
    if reset:
        names = ", ".join(repr(name) for name in reset)
        return (f"Reset this notebook's session on worker{'s' if len(reset) > 1 else ''} {names}: the next "
                "offloaded cell there starts in a fresh interpreter.")
    if asked:
        return f"Nothing to reset: this notebook has no session on worker {asked!r}."
    return "Nothing to reset: this notebook has no session on any worker."


def describe_jobs(waiting: Sequence[Mapping[str, Any]]) -> str:
    """What %offload_jobs prints: one line per job that waits to be collected, and how to collect one."""
    if not waiting:
        return "No job waits to be collected: jobs whose notebook went away while they ran show here."
    lines = []
    for job in waiting:
        ended = f"{job['state']} {job['ended_s']:.0f} s ago" if job.get("ended_s") is not None else "running"
        where = f"on {job['worker']!r}" if job["worker"] else "before a worker took it"
        lines.append(f"{job['job']}  {ended} {where}, {human_size(job['output_bytes'])} of output: {job['summary']}")
    lines.append("Collect one with %offload_attach JOB: its output is shown again and its values land here.")
    return "\n".join(lines)


def describe_files(files: FileChanges) -> str:
    """One line: which files were written or removed on the worker while the cell ran, and how to copy them here."""
    def listed(names: list[str], count: int) -> str:
        more = count - len(names)
        return ", ".join(names) + (f" and {more} more" if more > 0 else "")

    written = [f"{path} ({human_size(size)})" if size >= NOTICE_SIZE_BYTES else path
               for path, size in list(files.written.items())[:NOTICE_FILES]]
    deleted = files.deleted[:NOTICE_FILES]
    # What changed while the cell ran, not who changed it: file events don't say which process wrote.
    kinds = [("written", written, files.written_count), ("deleted", deleted, files.deleted_count)]
    changes = [(kind, listed(names, count)) for kind, names, count in kinds if count]
    said = "; ".join(f"{kind}: {names}" if n else names for n, (kind, names) in enumerate(changes))
    first_kind = changes[0][0] if changes else "written"
    text = f"files {first_kind} on worker {files.worker!r} while the cell ran: {said or 'none seen'}"
    if files.written:
        first = next(iter(files.written))
        text += f" — they are there, not here: %offload_get {shlex.quote(first)} copies one here"
    if not files.complete:
        text += f" (its folder {files.folder} is too large to look through: some changes may be missing)"
    return text


def describe_copy(copied: Transfer) -> str:
    """'data (4 files, 21.0 MB)': what %offload_get or %offload_put copied."""
    what = f"{copied.files:,} file{'s' if copied.files != 1 else ''}, " if copied.files != 1 else ""
    return f"{os.path.basename(copied.source)} ({what}{human_size(copied.bytes)})"


def describe_stats(worker: str, stats: Mapping[str, Any]) -> str:
    """What ``%%offload --stats`` says of a cell: the GPU kernels and numpy functions it ran, GPU time, bytes moved."""
    def counts(key: str) -> str:
        return ", ".join(f"{name}×{count}" for name, count in (stats.get(key) or {}).items()) or "none"

    return (f"ran on {worker}: GPU kernels {counts('kernels')}; with numpy {counts('numpy')}; "
            f"GPU time {stats.get('gpu_time_s', 0.0) * 1e3:.2f} ms; "
            f"uploaded {human_size(stats.get('bytes_uploaded', 0))}, "
            f"read back {human_size(stats.get('bytes_downloaded', 0))}, "
            f"already on the GPU {stats.get('resident_hits', 0)} (not uploaded: "
            f"{human_size(stats.get('bytes_resident', 0))})")


_NO_MODULE = re.compile(r"No module named '([\w.]+)'")
_NO_FILE = re.compile(r"'([^']+)'$|^(\S+) not found")  # OSError's "...: 'data.csv'"; numpy's "data.csv not found."


def say_if_a_local_file(remote_type: str, message: str) -> None:
    """When a cell couldn't find a file on the worker that is here, beside the notebook (a relative path:
    an offloaded cell's is the worker's working directory), say so, and how to copy it there."""
    if remote_type != "FileNotFoundError":
        return
    found = _NO_FILE.search(message.strip())
    path = Path(next(group for group in found.groups() if group)) if found else None
    if path is None or path.is_absolute() or not path.exists():
        return
    notice(f"`{path}` is a {'folder' if path.is_dir() else 'file'} here, next to the notebook, and not in the "
           f"worker's working directory, where an offloaded cell's relative paths lead: `%offload_put {path}` "
           "copies it there")


def say_if_a_local_module(error: str) -> bool:
    """When the worker lacks a module that is a file or folder beside the notebook (not an installed
    package), say so, and how to copy it there; whether it did."""
    missing = _NO_MODULE.search(error)
    if missing is None:
        return False
    top = missing[1].partition(".")[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    origin = spec.origin if spec is not None else None
    if not origin or origin in ("built-in", "frozen") or origin.startswith(INSTALLED):
        return False
    path = Path(origin).parent if spec is not None and spec.submodule_search_locations else Path(origin)
    try:
        shown = str(path.relative_to(Path.cwd()))
    except ValueError:
        shown = str(path)
    notice(f"`{top}` is {shown} here, next to the notebook, not a package installed on the worker: "
           f"`%offload_put {shown}` copies it into the worker's working directory, where offloaded cells import from")
    return True


def say_if_not_installed_on_the_worker(remote_type: str, message: str, worker: str | None) -> None:
    """When a cell's import failed on the worker for want of a package, say which is missing where, and how
    to install it there: on that machine, or from the notebook through an offloaded cell."""
    missing = _NO_MODULE.search(message)
    if remote_type != "ModuleNotFoundError" or missing is None:
        return
    top = missing[1].partition(".")[0]
    package = distribution_of(top)  # pip's name for it, as this side knows it (sklearn: scikit-learn)
    notice(f"`{top}` is not installed on {f'worker {worker!r}' if worker else 'the worker'}. Install it there "
           f"(`pip install {package}` in the Python environment remote-worker runs in; a running worker finds "
           f"it, no restart), or from here with an offloaded cell: `import subprocess, sys; "
           f"subprocess.check_call([sys.executable, '-m', 'pip', 'install', '{package}'])`")
