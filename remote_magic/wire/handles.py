"""Handles: what the notebook holds for a value that stayed on the worker.

A value that can't cross (it can't be pickled, or it is a matplotlib object) stays in the
worker's session; the notebook gets a ``RemoteValue`` naming it. An offloaded cell that reads the
handle gets the value itself, in place, without transfer; a local cell that uses it is told where it
lives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RemoteValue:
    """A value that lives on a worker: its session there holds it under ``id``."""

    id: str
    name: str
    type_name: str   # the value's type, module-qualified
    why: str         # why it stayed there
    worker: str

    @property
    def kind(self) -> str:
        return self.type_name.rpartition(".")[2]

    def __repr__(self) -> str:
        return (f"<{self.kind} on worker {self.worker!r}, not here: {self.why}. "
                f"Offloaded cells use `{self.name}` in place>")

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        raise AttributeError(f"`{self.name}` is a {self.kind} that stayed on worker {self.worker!r} ({self.why}): "
                             f"use it in an offloaded cell, where it is the {self.kind} itself")

    def describe(self) -> str:
        return f"`{self.name}` ({self.kind}: {self.why})"


def kept_description(kept: dict[str, Any], worker: str) -> dict[str, RemoteValue]:
    """The handles a RESULT's ``kept_on_worker`` header describes."""
    return {str(name): RemoteValue(str(info.get("id")), str(name), str(info.get("type")), str(info.get("why")), worker)
            for name, info in kept.items() if isinstance(info, dict)}
