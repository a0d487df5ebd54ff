"""remote-magic: run Jupyter notebook cells on a GPU machine you own.

In a notebook::

    %load_ext remote_magic
    %offload_connect <token printed by remote-worker>

From a script::

    with remote_magic.connect(token) as client:
        client.run("c = a @ b", {"a": a, "b": b})["c"]

The notebook's names (``connect``, ``Client``, ...) load on first use (PEP 562), so a worker, hub
or executor process, which imports ``remote_magic.<its side>``, never loads the notebook's client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import (
    Busy,
    ConnectionFailed,
    DaskError,
    DiscoveryError,
    EngineError,
    ExecutorDied,
    FileTransferError,
    FleetError,
    GatherError,
    GpuError,
    GpuLimitError,
    InputError,
    JobCancelled,
    JobError,
    JobTimeout,
    KernelError,
    NoMatchingWorker,
    NoSuchJob,
    NoSuchWorker,
    OutputError,
    OverBudget,
    ProtocolError,
    RemoteError,
    RemoteMagicError,
    RequirementError,
    SerializationError,
    ShaderError,
    SplitError,
    TokenError,
    TunnelError,
    VersionMismatch,
    WorkerLost,
)

if TYPE_CHECKING:
    from .client import Client
    from .dask_client import DaskClient
    from .engine import Engine
    from .engines import connect
    from .file_copy import Transfer
    from .lan import discover
    from .results import FileChanges, JobResult
    from .split_gather import SplitResult
    from .wire.discovery import DiscoveredHub
    from .wire.handles import RemoteValue

_LAZY = {"Client": ".client", "connect": ".engines", "Engine": ".engine", "DaskClient": ".dask_client",
         "Transfer": ".file_copy", "discover": ".lan", "FileChanges": ".results", "JobResult": ".results",
         "SplitResult": ".split_gather", "DiscoveredHub": ".wire.discovery", "RemoteValue": ".wire.handles"}
"""Each public name that loads on first use, and the module it comes from."""

__all__ = [
    "__version__", "Client", "DaskClient", "JobResult", "FileChanges", "Transfer", "RemoteValue", "connect",
    "RemoteMagicError", "Busy", "OverBudget", "ConnectionFailed", "VersionMismatch", "TokenError", "ProtocolError",
    "SerializationError", "InputError", "OutputError", "JobError", "RemoteError", "WorkerLost",
    "ExecutorDied", "JobCancelled", "JobTimeout", "NoSuchJob", "NoSuchWorker", "NoMatchingWorker", "RequirementError",
    "GpuError", "ShaderError", "GpuLimitError", "TunnelError", "FileTransferError", "FleetError",
    "SplitResult", "SplitError", "GatherError",
    "discover", "DiscoveredHub", "DiscoveryError", "DaskError", "EngineError", "Engine", "KernelError",
    "load_ipython_extension", "unload_ipython_extension",
]


def __getattr__(name: str) -> Any:
    """A lazy public name: its module is imported now, and the name kept here for the next use."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


def load_ipython_extension(ipython):  # type: ignore[no-untyped-def]
    """``%load_ext remote_magic``: register the %offload magics."""
    from .notebook.magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython):  # type: ignore[no-untyped-def]
    """``%unload_ext remote_magic``: disconnect and remove the magics."""
    from .notebook.magics import unload_ipython_extension as unload

    unload(ipython)
