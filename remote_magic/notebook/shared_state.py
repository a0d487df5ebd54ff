"""The notebook's side of the module state it shares with its offloaded cells (``wire/module_state.py``):
what each cell takes along, and taking what the cell changed of it."""

from __future__ import annotations

from typing import Any, Mapping

from ..wire import module_state


class SharedState:
    """The notebook's random generators, print and display options and rcParams, as offloaded cells see them."""

    def __init__(self, shell: Any) -> None:
        self._shell = shell
        self._state: dict[str, Any] | None = None  # as the last offloaded cell left it
        self._cells = 0  # cells run in this shell (any: offloaded, local, and those kept out of the history)
        self._at = -1    # the last offloaded cell's number among them
        if shell is not None:
            shell.events.register("pre_run_cell", self._count)

    def close(self) -> None:
        if self._shell is not None:
            self._shell.events.unregister("pre_run_cell", self._count)

    def _count(self, *info: Any) -> None:
        self._cells += 1

    def for_cell(self) -> dict[str, Any]:
        """The state this cell takes along: read again unless the cell before it was the last offloaded one
        (only a local cell could have changed it since)."""
        if self._state is None or self._at != self._cells - 1:
            self._state = module_state.capture()
        self._at = self._cells
        return self._state

    def take(self, changed: Mapping[str, Any]) -> None:
        """Take what the offloaded cell changed of it, here too."""
        taken = module_state.apply(changed)
        if self._state is not None:
            self._state.update(taken)
