"""The executor's matplotlib backend (``MPLBACKEND=module://remote_magic.worker.figures``).

Agg canvases, and a ``plt.show()`` that shows each open figure in the running job's output at
once and closes it, as IPython's inline backend does; what is still open when the cell ends is
shown after the cell's value where the inline backend would show it (a figure made with
interactive mode on: ``outputs.figure_made``).
"""

from __future__ import annotations

from typing import Any

import matplotlib
from matplotlib.backends import backend_agg
from matplotlib.backends.backend_agg import FigureCanvasAgg as FigureCanvas  # noqa: F401  (matplotlib looks it up)
from matplotlib.figure import Figure

from remote_magic.wire import module_state

from .outputs import figure_made, show_open_figures

module_state.figures_start(matplotlib)  # as the inline backend does as it starts: interactive mode on, once


def new_figure_manager(num: Any, *args: Any, FigureClass: type[Figure] = Figure, **kwargs: Any) -> Any:
    """A new figure's manager (matplotlib's backend API)."""
    return new_figure_manager_given_figure(num, FigureClass(*args, **kwargs))


def new_figure_manager_given_figure(num: Any, figure: Figure) -> Any:
    """The manager of a figure pyplot makes; the cell shows it at its end if interactive mode is on now."""
    manager = backend_agg.new_figure_manager_given_figure(num, figure)  # type: ignore[attr-defined]
    figure_made()
    return manager


def show(*args: Any, **kwargs: Any) -> None:
    """plt.show(): display every open figure now, then close them."""
    show_open_figures()
