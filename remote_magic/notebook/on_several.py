"""%%offload --all, --workers A,B and --split X --gather Y: which workers, which inputs are cut, labelled
output, and running the cell on each at once; `apply_result.apply_results` brings back what they did."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from IPython.core.error import UsageError

from ..engine import Engine
from ..errors import EngineError, FleetError, GatherError, NoSuchWorker, SplitError
from ..fleet_jobs import LabelledOutput
from ..results import JobResult
from ..wire.handles import RemoteValue
from .apply_result import apply_results
from .notices import notice


@dataclass(frozen=True)
class Several:
    """The workers a cell runs on at once: these names, or (None) every worker connected."""

    workers: list[str] | None


def chosen_workers(every: bool, names: str | None, worker: str | None, retries: int,
                   placed: bool = False, split: bool = False) -> Several | None:
    """What --all / --workers ask for (None: one worker, as usual); a contradiction (with --worker,
    --retries, or ``placed``: --require/--prefer) is a UsageError. With ``split`` (--split) and no worker
    named, every worker (unless --workers names some)."""
    if retries < 0:
        raise UsageError(f"--retries takes 0 or more, not {retries}")
    if split and worker is None and not (placed or retries):
        every = every or names is None
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


def run_on_several(client: Engine, cell: str, inputs: dict[str, Any], several: Several,
                   split: Split | None, namespace: dict[str, Any], show: Callable[[Mapping[str, Any]], None],
                   **options: Any) -> dict[str, JobResult]:
    """Run the cell on each worker (or piece) at once, output labelled by worker, and bring what it did
    into ``namespace``: names as {worker: value}, gathered ones concatenated; ``{worker: JobResult}``.

    ``show`` shows a display; ``options`` go to ``execute_all`` or ``split`` as they are. When some
    workers fail, what the others did (and the failed ones did before failing) lands all the same, and
    the error is raised; a mistake in what was asked is a UsageError.
    """
    if any(isinstance(value, RemoteValue) for value in inputs.values()):
        raise UsageError("this cell reads values that live on one worker (handles): it can run only there, "
                         "not on several workers")
    labelled = Labels(show)
    options.update(workers=several.workers, on_stream=labelled.stream, on_display=labelled.display)
    gathered: dict[str, Any] = {}
    try:
        if split is None:
            results = client.execute_all(cell, inputs, **options)
        else:
            outcome = client.split(cell, inputs, split=split.names, gather=split.gather, **options)
            results, gathered = outcome.results, outcome.gathered
            for note in outcome.notes:
                notice(note)
    except (NoSuchWorker, SplitError, EngineError) as exc:
        raise UsageError(str(exc)) from None
    except FleetError as error:  # as locally: what the cells did stays done, on the workers that ran it
        partial = {worker: failed.partial for worker, failed in error.failures.items() if failed.partial is not None}
        apply_results(namespace, {**error.results, **partial},
                      leave=split.gather if split else ())  # nothing gathered: those names stay as they were
        raise
    except GatherError as error:  # every piece ran: what they assigned comes back as with --all
        apply_results(namespace, error.results)
        notice("nothing was gathered: every name the cell assigned is in the notebook as {worker: value}")
        raise
    apply_results(namespace, results, gathered=gathered)
    return results
