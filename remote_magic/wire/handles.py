"""Handles: what the notebook holds for a value that stayed on the worker.

A value that can't cross (it can't be pickled, or it is a matplotlib object) stays in the
worker's session; the notebook gets a ``RemoteValue`` naming it. An offloaded cell that reads the
handle gets the value itself, in place, without transfer; a local cell that uses it is told where it
lives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .sizes import human_size

CLOSED_FILE = "a closed file"
"""Why a file the cell closed (``with open(...) as f``) stayed on the worker: nothing is lost there, so no
notice says so; its handle stands for the closed file."""

SHUT_DOWN_POOL = "a pool of processes or threads that was shut down"
"""Why an executor or ``multiprocessing.Pool`` the cell was done with (``with ProcessPoolExecutor() as ex``)
stayed on the worker: as for a closed file, nothing is lost there, and no notice says so."""

NOTHING_LOST = (CLOSED_FILE, SHUT_DOWN_POOL)
"""Reasons a value stayed on the worker that no notice needs to mention."""

CELL_VALUE = "__value__"
"""The name a cell's value travels under (its last expression, as IPython's ``Out`` holds it)."""


@dataclass(frozen=True)
class RemoteValue:
    """A value that lives on a worker: its session there holds it under ``id``."""

    id: str
    name: str
    type_name: str   # the value's type, module-qualified
    why: str         # why it stayed there
    worker: str
    summary: str = ""  # its shape and size, where the worker could tell: "float64 (1000, 1000), 8.0 MB"
    pullable: bool = True  # False: it can't be pickled, so it can never come to the notebook

    @property
    def kind(self) -> str:
        return self.type_name.rpartition(".")[2]

    def __repr__(self) -> str:
        summary = f" {self.summary}" if self.summary else ""
        if self.name == CELL_VALUE:  # no name a later cell could use it by
            return (f"<{self.kind}{summary} on worker {self.worker!r}, not here: {self.why}. It was an offloaded "
                    "cell's value; the cell's output shows it as the worker rendered it>")
        pull = f"%offload_pull {self.name} brings it here" if self.pullable else "it can't come here"
        return (f"<{self.kind}{summary} on worker {self.worker!r}, not here: {self.why}. "
                f"Offloaded cells use `{self.name}` in place; {pull}>")

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        if self.name == CELL_VALUE:
            raise AttributeError(f"an offloaded cell's value, a {self.kind}, stayed on worker {self.worker!r} "
                                 f"({self.why}): bind it to a name in the cell to use it in later offloaded cells")
        raise AttributeError(f"`{self.name}` is a {self.kind} that stayed on worker {self.worker!r} ({self.why}): "
                             f"use it in an offloaded cell, where it is the {self.kind} itself")

    def describe(self) -> str:
        summary = f" {self.summary}" if self.summary else ""
        shown = "the cell's value" if self.name == CELL_VALUE else f"`{self.name}`"
        return f"{shown} ({self.kind}{summary}: {self.why})"


def summarize(value: Any) -> str:
    """A kept value's shape and size, as its handle shows them: "float64 (1000, 1000), 8.0 MB"."""
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int):  # numpy, and arrays like it
        dtype, shape = getattr(value, "dtype", None), getattr(value, "shape", None)
        described = " ".join(str(part) for part in (dtype, shape) if part is not None)
        return f"{described}, {human_size(nbytes)}" if described else human_size(nbytes)
    usage = getattr(value, "memory_usage", None)
    if callable(usage) and hasattr(value, "shape"):  # pandas
        try:
            total = usage(deep=True)
            return f"{value.shape}, {human_size(int(getattr(total, 'sum', lambda: total)()))}"
        except (TypeError, ValueError):
            pass
    return f"{len(value)} items" if isinstance(value, (list, tuple, dict, set)) else ""


def kept_description(kept: dict[str, Any], worker: str) -> dict[str, RemoteValue]:
    """The handles a RESULT's ``kept_on_worker`` header describes."""
    return {str(name): RemoteValue(str(info.get("id")), str(name), str(info.get("type")), str(info.get("why")), worker,
                                   str(info.get("summary") or ""), info.get("pull") is not False)
            for name, info in kept.items() if isinstance(info, dict)}
