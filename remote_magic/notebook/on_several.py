"""%%offload --all and --workers A,B: which workers, labelled output, and names that come back as {worker: value}."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from IPython.core.error import UsageError

from ..client import JobResult
from ..fleet_jobs import LabelledOutput


@dataclass(frozen=True)
class Several:
    """The workers a cell runs on at once: these names, or (None) every worker connected."""

    workers: list[str] | None


def chosen_workers(every: bool, names: str | None, worker: str | None, retries: int,
                   placed: bool = False) -> Several | None:
    """What --all / --workers ask for (None: one worker, as usual); a contradiction (with --worker,
    --retries, or ``placed``: --require/--prefer) is a UsageError."""
    if retries < 0:
        raise UsageError(f"--retries takes 0 or more, not {retries}")
    if not every and names is None:
        return None
    if every and names is not None:
        raise UsageError("--all runs on every worker and --workers on the ones named: use one of them")
    if worker is not None:
        raise UsageError("--worker runs the cell on one worker, --all and --workers on several: use one of them")
    if placed:
        raise UsageError("--require and --prefer pick one worker for the cell; --all and --workers run it on "
                         "several: name them with --workers (%offload_workers shows what each has)")
    if retries:
        raise UsageError("--retries runs a cell again on another worker; with --all or --workers each copy belongs "
                         "to its worker: run the cell again on the ones that failed (--workers NAME)")
    if names is None:
        return Several(None)
    listed = [name.strip() for name in names.split(",") if name.strip()]
    if not listed:
        raise UsageError("--workers needs names, e.g. --workers box,laptop (%offload_workers lists them)")
    return Several(listed)


class Labels(LabelledOutput):
    """A cell's output on several workers in the notebook: text to stdout/stderr, displays as the cell's."""

    def __init__(self, show: Callable[[Mapping[str, Any]], None]) -> None:
        super().__init__(_write, show)


def _write(header: Mapping[str, Any]) -> None:
    stream = sys.stderr if header.get("name") == "stderr" else sys.stdout
    stream.write(str(header.get("text", "")))
    stream.flush()


def apply(namespace: dict[str, Any], results: Mapping[str, JobResult], notice: Callable[[str], None]) -> None:
    """Bring what the cell did on each worker into the namespace: each name it assigned, as
    ``{worker: value}`` over the workers that assigned it; a name every worker deleted, deleted."""
    merged: dict[str, dict[str, Any]] = {}
    for worker, result in results.items():
        for name, value in {**result.values, **result.kept_on_worker}.items():
            merged.setdefault(name, {})[worker] = value
        if result.kept_on_worker:
            kept = ", ".join(handle.describe() for handle in result.kept_on_worker.values())
            notice(f"{kept} stayed on worker {worker!r}: the notebook holds a handle")
        for note in result.notes:
            notice(f"on worker {worker!r}: {note}")
    namespace.update(merged)
    if results:
        deleted = set.intersection(*(set(result.deleted) for result in results.values()))
        for name in deleted - set(merged):
            namespace.pop(name, None)
