"""An offloaded cell's output in the order a local cell's would come.

The cell's value is shown as the worker rendered it (with that session's print and pandas options),
while ``_`` and ``Out`` hold the value itself; the figures still open when the cell ended appear
after the value, as IPython's inline backend shows them, also after an error.
"""

from __future__ import annotations

from typing import Any, Mapping

from IPython.display import publish_display_data

from ..results import display_options
from ..wire.displays import clear_output_here, clears

Bundle = tuple[dict[str, Any], dict[str, Any]]  # a mime bundle and its metadata


class CellDisplay:
    """Hooks into one IPython shell's display formatter and post_execute event."""

    def __init__(self, shell: Any) -> None:
        self._shell = shell
        self._value: Any = None
        self._rendered: Bundle | None = None
        self._after_cell: list[Mapping[str, Any]] = []
        self._format = shell.display_formatter.format
        shell.display_formatter.format = self._format_value
        shell.events.register("post_execute", self._end_of_cell)

    def show_value_as(self, value: Any, rendered: Mapping[str, Any] | None) -> None:
        """When the displayhook shows ``value`` next, show ``rendered`` (a data/metadata pair) instead."""
        if rendered is not None:
            self._value = value
            self._rendered = dict(rendered.get("data") or {}), dict(rendered.get("metadata") or {})

    def show(self, header: Mapping[str, Any]) -> None:
        """A DISPLAY from the worker: now, or once the cell's value is shown; a clear clears the cell's
        output (``wait``: when the next output comes), as the cell's clear_output() does locally."""
        if clears(header):
            clear_output_here(header)
        elif header.get("after_cell"):
            self._after_cell.append(header)
        else:
            publish_display_data(header.get("data") or {}, header.get("metadata") or {},  # type: ignore[no-untyped-call]
                                 **display_options(header))

    def close(self) -> None:
        self._shell.display_formatter.format = self._format
        self._shell.events.unregister("post_execute", self._end_of_cell)

    def _format_value(self, obj: Any, include: Any = None, exclude: Any = None) -> Bundle:
        if self._rendered is not None and obj is self._value:
            rendered, self._value, self._rendered = self._rendered, None, None
            return rendered
        return self._format(obj, include=include, exclude=exclude)  # type: ignore[no-any-return]

    def _end_of_cell(self) -> None:
        shown, self._after_cell = self._after_cell, []
        self._value, self._rendered = None, None
        for header in shown:
            publish_display_data(header.get("data") or {}, header.get("metadata") or {},  # type: ignore[no-untyped-call]
                                 **display_options(header))
