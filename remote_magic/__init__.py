"""remote-magic: run Jupyter notebook cells on a GPU machine you own.

In a notebook::

    %load_ext remote_magic
    %offload_connect <token printed by remote-worker>

From a script::

    with remote_magic.connect(token) as client:
        client.run("c = a @ b", {"a": a, "b": b})["c"]
"""

from ._version import __version__
from .client import Client, connect
from .dask_client import DaskClient
from .errors import (
    Busy,
    ConnectionFailed,
    DaskError,
    DiscoveryError,
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
from .file_copy import Transfer
from .lan import discover
from .results import FileChanges, JobResult
from .split_gather import SplitResult
from .wire.discovery import DiscoveredHub
from .wire.handles import RemoteValue

__all__ = [
    "__version__", "Client", "DaskClient", "JobResult", "FileChanges", "Transfer", "RemoteValue", "connect",
    "RemoteMagicError", "Busy", "OverBudget", "ConnectionFailed", "VersionMismatch", "TokenError", "ProtocolError",
    "SerializationError", "InputError", "OutputError", "JobError", "RemoteError", "WorkerLost",
    "ExecutorDied", "JobCancelled", "JobTimeout", "NoSuchJob", "NoSuchWorker", "NoMatchingWorker", "RequirementError",
    "GpuError", "ShaderError", "GpuLimitError", "TunnelError", "FileTransferError", "FleetError",
    "SplitResult", "SplitError", "GatherError",
    "discover", "DiscoveredHub", "DiscoveryError", "DaskError", "KernelError",
    "load_ipython_extension", "unload_ipython_extension",
]


def load_ipython_extension(ipython):  # type: ignore[no-untyped-def]
    """``%load_ext remote_magic``: register the %offload magics."""
    from .notebook.magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython):  # type: ignore[no-untyped-def]
    """``%unload_ext remote_magic``: disconnect and remove the magics."""
    from .notebook.magics import unload_ipython_extension as unload

    unload(ipython)
