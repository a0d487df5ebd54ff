"""The notebook's magics, registered together by ``%load_ext remote_magic``.

Connection and fleet (`ConnectionMagics`): %offload_connect, %offload_serve, %offload_disconnect,
%offload_workers, %offload_reset.
Cells (`CellMagics`): %%offload, %%offload_kernel, %offload_jobs, %offload_attach.
Files and values (`CopyMagics`): %offload_get, %offload_put, %offload_pull.

Each group is a `MagicsGroup`, and all share one `NotebookConnection`, which holds the settings
(`OffloadSettings`, which users configure as ``c.OffloadMagics.*``). A magic parses its line, calls the
engine it is connected through and shows the result; a user's mistake becomes a UsageError (a short
message, no traceback).
"""

from __future__ import annotations

from typing import Any

from ..wire.displays import pickle_display_handles_portably
from . import cell_outputs
from .cell_magics import CellMagics
from .connection import MagicsGroup, NotebookConnection, OffloadMagics
from .connection_magics import ConnectionMagics
from .copy_magics import CopyMagics

MAGICS_CLASSES: tuple[type[MagicsGroup], ...] = (ConnectionMagics, CellMagics, CopyMagics)
"""Every group of magics the extension registers."""


def load_ipython_extension(ipython: Any) -> None:
    """Register every group of magics, sharing one connection."""
    pickle_display_handles_portably()  # a display handle goes to the worker and back whatever IPython it has
    settings = OffloadMagics(parent=ipython)
    ipython.configurables.append(settings)  # so %config OffloadMagics finds it
    connection = NotebookConnection(settings)
    ipython.register_magics(*(magics(ipython, connection) for magics in MAGICS_CLASSES))
    cell_outputs.watch(ipython)  # a progress bar leaves its cell when it closes, as if it had never been there


def unload_ipython_extension(ipython: Any) -> None:
    """Disconnect, unhook from the shell, and remove every magic the extension registered."""
    manager = ipython.magics_manager
    registered = [manager.registry.pop(magics.__name__) for magics in MAGICS_CLASSES
                  if magics.__name__ in manager.registry]
    for magics in registered:
        magics.close()
        for kind, names in type(magics).magics.items():
            for name in names:
                manager.magics[kind].pop(name, None)
    cell_outputs.unwatch()
    for connection in {magics.connection for magics in registered}:
        connection.disconnect()
        if connection.settings in ipython.configurables:
            ipython.configurables.remove(connection.settings)
