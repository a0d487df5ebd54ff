"""Bringing a finished job's result into the notebook's namespace, as if the cell had run here.

What a cell assigned lands in the namespace, what it deleted goes, values that stayed on the worker land
as handles; and where that differs from a local run (a handle instead of a value, an object changed in
place that came back as a new one, a note the client made) a notice says so. `apply_result` is one
worker's result (``%%offload``, ``%offload_attach``); `apply_results` merges several workers' into
``{worker: value}`` (``%%offload --all``, ``--workers``, ``--split``).
"""

from __future__ import annotations

import sys
from typing import Any, Collection, Mapping

from ..results import JobResult
from ..wire import in_place
from ..wire.handles import NOTHING_LOST
from .notices import notice


def apply_result(result: JobResult, namespace: dict[str, Any], inputs: Mapping[str, Any]) -> None:
    """Bring what a cell changed into the notebook's namespace, and say where that differs from a local
    run: what stayed on the worker, and objects changed in place that came back as new ones.

    ``inputs`` are the values the cell was sent, to tell which names sharing one of them here still hold
    the old object.
    """
    replaced = {name: inputs[name] for name in result.in_place
                if name in inputs and result.values.get(name) is not inputs[name]}
    _tell_finalized_here(result, namespace)
    namespace.update(result.values)
    namespace.update(result.kept_on_worker)
    for name in result.deleted:
        namespace.pop(name, None)
    told = [handle for handle in result.kept_on_worker.values() if handle.why not in NOTHING_LOST]
    if told:
        kept = ", ".join(handle.describe() for handle in told)
        notice(f"{kept} stayed on worker {result.worker!r}: the notebook holds a handle, and offloaded cells "
               "use the value there in place")
    for name, old in replaced.items():
        others = [f"`{other}`" for other, value in namespace.items()
                  if (value is old or _views(value, old)) and other != name and not other.startswith("_")]
        if others:
            numpy = sys.modules.get("numpy")
            why = ("an array whose shape, dtype or memory changed" if numpy is not None and
                   isinstance(old, numpy.ndarray) else f"a {type(old).__name__}")
            notice(f"`{name}` was changed in place on the worker and came back as a new object ({why} can't be "
                   f"updated in place here): {', '.join(others)}, which shared it here, still hold the old value; "
                   f"bind them again (`{others[0].strip('`')} = {name}`) where they should follow it")
    for old, container, where in in_place.copies_made():
        holders = [f"`{other}`" for other, value in namespace.items() if value is old and not other.startswith("_")]
        named = next((other for other, value in namespace.items() if value is container
                      and not other.startswith("_")), None)
        if holders and named is not None:
            notice(f"{', '.join(holders)} no longer {'hold' if len(holders) > 1 else 'holds'} the object "
                   f"`{named}{where}` holds: the cell changed "
                   f"`{named}` on the worker, and its {type(old).__name__} came back as a copy (a "
                   f"{type(old).__name__} can't be updated in place here); bind them again "
                   f"(`{holders[0].strip('`')} = {named}{where}`) where they should follow it")
    for note in result.notes:
        notice(note)


def _tell_finalized_here(result: JobResult, namespace: Mapping[str, Any]) -> None:
    """Before the names a cell deleted or rebound let go of their objects here: where that was a notebook object's
    last name and its class has a ``__del__``, say that it runs now (locally: where the cell's ``del`` ran)."""
    dropped = {name for name in (*result.deleted, *result.values)
               if name in namespace and result.values.get(name) is not namespace[name]}
    going = [name for name in sorted(dropped) if getattr(type(namespace[name]), "__module__", None) == "__main__"
             and hasattr(type(namespace[name]), "__del__")
             and not any(value is namespace[name] for other, value in namespace.items() if other not in dropped)]
    if going:
        names = ", ".join(f"`{name}`" for name in going)
        notice(f"{names} let go of {'an object whose class has' if len(going) == 1 else 'objects whose classes have'} "
               "a `__del__`: it runs here now, after the cell's output (locally it runs where the cell's `del` or "
               "assignment ran); where its place matters, call the cleanup yourself (a `with` block, `close()`)")


def apply_results(namespace: dict[str, Any], results: Mapping[str, JobResult],
                  gathered: Mapping[str, Any] | None = None, leave: Collection[str] = ()) -> None:
    """Bring what the cell did on each worker into the namespace: each name it assigned, as
    ``{worker: value}`` over the workers that assigned it; a name every worker deleted, deleted.

    Names in ``gathered`` (``--gather``) land as their concatenated value; names in ``leave`` (to be
    gathered, from a run that failed) stay as they were.
    """
    gathered = gathered or {}
    untouched = {*leave, *gathered}
    merged: dict[str, dict[str, Any]] = {}
    for worker, result in results.items():
        for name, value in {**result.values, **result.kept_on_worker}.items():
            if name not in untouched:
                merged.setdefault(name, {})[worker] = value
        if result.kept_on_worker:
            kept = ", ".join(handle.describe() for handle in result.kept_on_worker.values())
            notice(f"{kept} stayed on worker {worker!r}: the notebook holds a handle")
        for note in result.notes:
            notice(f"on worker {worker!r}: {note}")
    namespace.update(merged)
    if results:
        deleted = set.intersection(*(set(result.deleted) for result in results.values()))
        for name in deleted - set(merged) - untouched:
            namespace.pop(name, None)
    namespace.update(gathered)


def _views(value: Any, array: Any) -> bool:
    """Is ``value`` a numpy array sharing memory with ``array``?"""
    numpy = sys.modules.get("numpy")
    return (numpy is not None and isinstance(value, numpy.ndarray) and isinstance(array, numpy.ndarray)
            and bool(numpy.may_share_memory(value, array)))
