"""The executor's matplotlib backend (``MPLBACKEND=module://remote_magic.worker.figures``).

Agg canvases, and a ``plt.show()`` that shows each open figure in the running job's output at
once and closes it, as IPython's inline backend does; what is still open when the cell ends is
shown after the cell's value.
"""

from __future__ import annotations

from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg as FigureCanvas  # noqa: F401  (matplotlib looks it up)

from .outputs import show_open_figures


def show(*args: Any, **kwargs: Any) -> None:
    """plt.show(): display every open figure now, then close them."""
    show_open_figures()
