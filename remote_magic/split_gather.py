"""Split and gather: inputs cut along axis 0 into one contiguous piece per worker, sized by each worker's
measured speed; the same code run on every piece at once; the named results concatenated in piece order.

``Engine.split`` (``engine.py``) is the entry point; the jobs themselves go through ``execute_all`` (its
``inputs_for``). Nothing here touches an engine: it chooses workers, cuts, sizes and joins values.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from .errors import FleetError, GatherError, NoSuchWorker, SplitError

if TYPE_CHECKING:
    from .results import JobResult

SPLITTABLE = "numpy arrays, lists, tuples, pandas DataFrames and Series"
"""What ``split`` cuts and ``gather`` joins, in words for messages."""


@dataclass
class SplitResult:
    """What ``split`` returns: the gathered values, and what each worker's piece gave."""

    gathered: dict[str, Any]
    """Each name in ``gather``: its pieces' values concatenated in piece order."""
    results: dict[str, "JobResult"]
    """Each worker's JobResult, in piece order (the first piece's worker first)."""
    pieces: dict[str, range]
    """Each worker's rows of the split inputs: ``range(start, stop)`` along axis 0, in order."""
    notes: list[str] = field(default_factory=list)
    """Where the split differs from what was asked, in words (an input shorter than the workers)."""


def piece_sizes(total: int, speeds: Sequence[float | None]) -> list[int]:
    """How many of ``total`` items each worker gets, in proportion to its ``speeds`` (equal shares when
    any speed is missing or not positive). The sizes sum to ``total``; each is at least 1 when ``total``
    is at least the number of workers. Remainders go to the largest fractions, earlier workers first."""
    if not speeds:
        raise ValueError("piece_sizes needs at least one worker")
    if total < 0:
        raise ValueError(f"total must be 0 or more, not {total}")
    known = [float(s) for s in speeds if isinstance(s, (int, float)) and s > 0]
    weights = known if len(known) == len(speeds) else [1.0] * len(speeds)
    whole = sum(weights)
    quotas = [total * weight / whole for weight in weights]
    sizes = [int(quota) for quota in quotas]
    by_fraction = sorted(range(len(sizes)), key=lambda i: (-(quotas[i] - sizes[i]), i))
    for i in by_fraction[:total - sum(sizes)]:
        sizes[i] += 1
    if total >= len(sizes):  # a very slow worker still gets one item rather than none
        for i in range(len(sizes)):
            if sizes[i] == 0:
                largest = max(range(len(sizes)), key=lambda j: (sizes[j], -j))
                sizes[largest] -= 1
                sizes[i] = 1
    return sizes


def length(name: str, value: Any) -> int:
    """How many items ``value`` has along axis 0; SplitError when it isn't something split can cut."""
    numpy, pandas = sys.modules.get("numpy"), sys.modules.get("pandas")
    if isinstance(value, (list, tuple)):
        return len(value)
    if numpy is not None and isinstance(value, numpy.ndarray):
        if value.ndim == 0:
            raise SplitError(f"`{name}` is a 0-d array: it has no axis 0 to split along. Leave it out of the "
                             "split (it then goes whole to every worker)", name)
        return int(value.shape[0])
    if pandas is not None and isinstance(value, (pandas.DataFrame, pandas.Series)):
        return len(value)
    raise SplitError(f"`{name}` is a {type(value).__name__}, which can't be split: --split cuts {SPLITTABLE} "
                     f"along their first axis. Convert it (e.g. list({name})), or leave it out of the split "
                     "(it then goes whole to every worker)", name)


def cut(value: Any, rows: range) -> Any:
    """The rows ``rows`` of ``value`` (one that ``length`` accepted), along axis 0."""
    pandas = sys.modules.get("pandas")
    if pandas is not None and isinstance(value, (pandas.DataFrame, pandas.Series)):
        return value.iloc[rows.start:rows.stop]
    return value[rows.start:rows.stop]


def concatenate(name: str, parts: Sequence[Any]) -> Any:
    """The pieces' values of ``name`` joined along axis 0, in order; GatherError when they can't be."""
    numpy, pandas = sys.modules.get("numpy"), sys.modules.get("pandas")
    kinds = {type(part).__name__ for part in parts}
    if numpy is not None and all(isinstance(part, numpy.ndarray) for part in parts):
        try:
            return numpy.concatenate(parts)
        except ValueError as exc:
            shapes = ", ".join(str(part.shape) for part in parts)
            raise GatherError(f"`{name}`'s pieces can't be concatenated along axis 0 ({exc}; their shapes: {shapes}): "
                              "make the cell assign an array with one row per item of its piece, or leave "
                              f"`{name}` out of --gather to get {{worker: value}}", name) from None
    if all(isinstance(part, list) for part in parts):
        return [item for part in parts for item in part]
    if all(isinstance(part, tuple) for part in parts):
        return tuple(item for part in parts for item in part)
    if pandas is not None and all(isinstance(part, (pandas.DataFrame, pandas.Series)) for part in parts) \
            and len({type(part) for part in parts}) == 1:
        return pandas.concat(parts)
    raise GatherError(f"`{name}` can't be concatenated: the pieces gave {', '.join(sorted(kinds))}, and --gather "
                      f"joins {SPLITTABLE} (all of one kind) along axis 0. Make the cell assign one of those, or "
                      f"leave `{name}` out of --gather to get {{worker: value}}", name)


@dataclass
class Plan:
    """Which worker gets which rows, and each worker's inputs."""

    pieces: dict[str, range]
    inputs_for: dict[str, dict[str, Any]]
    notes: list[str]


def plan(inputs: Mapping[str, Any], split: Sequence[str], workers: Sequence[Mapping[str, Any]]) -> Plan:
    """Cut the ``split`` inputs into one contiguous piece per worker (``workers``: as ``Client.workers()``
    gives them, in piece order), sized by their ``speed``. An input shorter than the workers runs on fewer
    of them (the fastest), said in ``notes``."""
    if not split:
        raise SplitError("nothing to split: name the inputs to cut, e.g. split=['X', 'y'] (--split X,y)")
    missing = [name for name in split if name not in inputs]
    if missing:
        raise SplitError(f"{', '.join(f'`{n}`' for n in missing)} is not among the inputs "
                         f"({', '.join(inputs) or 'none'}): split names inputs the code reads", missing[0])
    lengths = {name: length(name, inputs[name]) for name in split}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"`{name}` has {n}" for name, n in lengths.items())
        raise SplitError(f"the inputs to split differ in length along axis 0 ({listed}): they are cut at the same "
                         "rows, so they must be as long as each other. Split only the ones that match, and "
                         "pass the others whole", next(iter(lengths)))
    total = next(iter(lengths.values()))
    chosen, notes = list(workers), []
    if total < len(chosen):
        fastest = sorted(range(len(chosen)), key=lambda i: (-_speed(chosen[i]), i))[:max(total, 1)]
        left_out = [str(w["name"]) for i, w in enumerate(chosen) if i not in fastest]
        chosen = [chosen[i] for i in sorted(fastest)]
        notes.append(f"{' and '.join(f'`{n}`' for n in split)} {'has' if len(split) == 1 else 'have'} "
                     f"{total} item{'s' if total != 1 else ''}, fewer than the {len(workers)} workers: "
                     f"the cell runs on {len(chosen)} ({', '.join(repr(str(w['name'])) for w in chosen)}); "
                     f"{', '.join(repr(n) for n in left_out)} get{'s' if len(left_out) == 1 else ''} no piece")
    sizes = piece_sizes(total, [w.get("speed") for w in chosen])
    pieces: dict[str, range] = {}
    start = 0
    for worker, size in zip(chosen, sizes, strict=True):
        pieces[str(worker["name"])] = range(start, start + size)
        start += size
    inputs_for = {worker: {name: cut(inputs[name], rows) for name in split} for worker, rows in pieces.items()}
    return Plan(pieces, inputs_for, notes)


def _speed(worker: Mapping[str, Any]) -> float:
    speed = worker.get("speed")
    return float(speed) if isinstance(speed, (int, float)) else 0.0


def chosen(fleet: Sequence[Mapping[str, Any]], workers: Iterable[str] | None) -> list[Mapping[str, Any]]:
    """The workers of ``fleet`` (as ``Engine.workers()`` lists them) named in ``workers``, in that order
    (default: all of them); NoSuchWorker for none, or for a name not among them."""
    known = {str(w["name"]): w for w in fleet}
    names = list(dict.fromkeys(workers)) if workers is not None else list(known)
    if not names:
        raise NoSuchWorker("no worker is connected to the hub: start one (`remote-worker --join`), then run this again")
    unknown = [name for name in names if name not in known]
    if unknown:
        raise NoSuchWorker(f"no worker named {', '.join(repr(n) for n in unknown)} is connected (connected: "
                           f"{', '.join(repr(n) for n in known) or 'none'}): name one of those")
    return [known[name] for name in names]


def say_nothing_gathered(error: FleetError, gather: Sequence[str]) -> None:
    """Add to a failed split's FleetError that nothing was gathered (when something was to be)."""
    if gather:
        error.args = (f"{error} Nothing was gathered ({', '.join(gather)}): fix the failure and run it again.",)


def gathered(plan: Plan, results: Mapping[str, "JobResult"], gather: Sequence[str]) -> SplitResult:
    """What a split returns once every piece ran: the pieces' results in piece order, ``gather``'s names
    concatenated."""
    ordered = {worker: results[worker] for worker in plan.pieces}
    joined = {name: _gather(name, ordered, plan.pieces) for name in gather}
    return SplitResult(joined, ordered, plan.pieces, plan.notes)


def _gather(name: str, results: Mapping[str, "JobResult"], pieces: Mapping[str, range]) -> Any:
    """``name``'s value from every piece, concatenated; GatherError (with ``results``) when it can't be."""
    absent = [worker for worker, result in results.items() if name not in result.values]
    if absent:
        kept = [worker for worker in absent if name in results[worker].kept_on_worker]
        why = ("stayed on the worker (it can't be pickled)" if kept else "was not assigned by the cell")
        raise GatherError(f"`{name}` {why} on {', '.join(repr(w) for w in absent)} (rows "
                          f"{', '.join(f'{pieces[w].start}-{pieces[w].stop - 1}' for w in absent)}), so nothing "
                          f"could be gathered: make every piece assign `{name}`, or leave it out of --gather",
                          name, dict(results))
    try:
        return concatenate(name, [result.values[name] for result in results.values()])
    except GatherError as error:
        error.results = dict(results)
        raise


def names(names: Iterable[str] | str) -> list[str]:
    """``"X,y"`` or ``["X", "y"]`` as a list of names, without repeats."""
    listed = names.split(",") if isinstance(names, str) else list(names)
    return list(dict.fromkeys(name.strip() for name in listed if name.strip()))
