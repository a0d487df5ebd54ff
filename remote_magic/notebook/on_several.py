"""%%offload --all, --workers A,B and --split X --gather Y: which workers, which inputs are cut, labelled
output, and names that come back as {worker: value} (or, gathered, concatenated)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, Collection, Mapping

from IPython.core.error import UsageError

from ..fleet_jobs import LabelledOutput
from ..results import JobResult


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


@dataclass(frozen=True)
class Split:
    """What --split and --gather ask for: the inputs to cut along axis 0, and the names to concatenate."""

    names: list[str]
    gather: list[str]


def chosen_split(split: str | None, gather: str | None, inputs: Mapping[str, Any], namespace: Mapping[str, Any],
                 worker: str | None, retries: int, placed: bool = False) -> Split | None:
    """What --split / --gather ask for (None: no split); a mistake (a name the cell doesn't read, --gather
    without --split, --worker, --retries, --require or --prefer with --split) is a UsageError."""
    if split is None:
        if gather is not None:
            raise UsageError("--gather concatenates the pieces of a --split: add --split NAME (the inputs to cut), "
                             "or use --all to get each name as {worker: value}")
        return None
    names = _listed(split)
    if not names:
        raise UsageError("--split needs the names of the inputs to cut, e.g. --split X or --split X,y")
    if worker is not None:
        raise UsageError("--split runs the cell on several workers, --worker on one: name several with --workers A,B")
    if placed or retries:
        raise UsageError("--split gives each worker its own piece, so --retries, --require and --prefer don't "
                         "apply: name the workers with --workers (%offload_workers shows what each has)")
    for name in names:
        if name not in namespace:
            raise UsageError(f"--split {name}: `{name}` is not defined in the notebook")
        if name not in inputs:
            raise UsageError(f"--split {name}: the cell doesn't read `{name}`, so there is nothing to cut; "
                             "split the inputs the cell works on")
    return Split(names, _listed(gather) if gather is not None else [])


def _listed(names: str) -> list[str]:
    return list(dict.fromkeys(name.strip() for name in names.split(",") if name.strip()))


class Labels(LabelledOutput):
    """A cell's output on several workers in the notebook: text to stdout/stderr, displays as the cell's."""

    def __init__(self, show: Callable[[Mapping[str, Any]], None]) -> None:
        super().__init__(_write, show)


def _write(header: Mapping[str, Any]) -> None:
    stream = sys.stderr if header.get("name") == "stderr" else sys.stdout
    stream.write(str(header.get("text", "")))
    stream.flush()


def apply(namespace: dict[str, Any], results: Mapping[str, JobResult], notice: Callable[[str], None],
          leave: Collection[str] = ()) -> None:
    """Bring what the cell did on each worker into the namespace: each name it assigned, as
    ``{worker: value}`` over the workers that assigned it; a name every worker deleted, deleted.
    Names in ``leave`` (gathered, or not to be) are left to the caller."""
    merged: dict[str, dict[str, Any]] = {}
    for worker, result in results.items():
        for name, value in {**result.values, **result.kept_on_worker}.items():
            if name not in leave:
                merged.setdefault(name, {})[worker] = value
        if result.kept_on_worker:
            kept = ", ".join(handle.describe() for handle in result.kept_on_worker.values())
            notice(f"{kept} stayed on worker {worker!r}: the notebook holds a handle")
        for note in result.notes:
            notice(f"on worker {worker!r}: {note}")
    namespace.update(merged)
    if results:
        deleted = set.intersection(*(set(result.deleted) for result in results.values()))
        for name in deleted - set(merged) - set(leave):
            namespace.pop(name, None)
