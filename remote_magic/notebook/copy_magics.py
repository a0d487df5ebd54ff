# mypy: allow-untyped-decorators, allow-untyped-calls
# (IPython's magic decorators and argument parser carry no type hints.)
"""Files and values between the notebook and a worker: %offload_get, %offload_put, %offload_pull."""

from __future__ import annotations

from IPython.core.error import UsageError
from IPython.core.magic import line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from ..errors import EngineError, FileTransferError, OutputError
from ..wire.handles import RemoteValue
from .arguments import copy_options
from .connection import MagicsGroup
from .notices import describe_copy


@magics_class
class CopyMagics(MagicsGroup):
    """Copy files to and from a worker, and bring values that stayed on one into the notebook."""

    @magic_arguments()
    @argument("path", help="the file or folder on the worker (relative to where its cells run)")
    @argument("local", nargs="?", default=None, help="where to put it here (default: the same relative path)")
    @copy_options("copy from")
    @line_magic
    def offload_get(self, line: str) -> None:
        """Copy a file or folder from the worker to this machine, with a progress bar for large ones.

        PATH is relative to the worker's working directory (where offloaded cells run) or
        absolute; LOCAL defaults to the same relative path here. An existing LOCAL is kept
        unless --force.

        Usage: %offload_get PATH [LOCAL] [--worker NAME] [--force]
        """
        args = parse_argstring(self.offload_get, line)
        try:
            copied = self.connection.connected().get_file(args.path, args.local, worker=args.worker,
                                                          overwrite=args.force)
        except (FileTransferError, EngineError) as exc:
            raise UsageError(str(exc)) from None
        print(f"Copied {describe_copy(copied)} from worker {copied.worker!r} to {copied.destination}")

    @magic_arguments()
    @argument("local", help="the file or folder here")
    @argument("path", nargs="?", default=None,
              help="where to put it on the worker (default: the same relative path in its working directory)")
    @copy_options("copy to")
    @line_magic
    def offload_put(self, line: str) -> None:
        """Copy a file or folder from this machine to the worker, with a progress bar for large ones.

        PATH defaults to the same relative path in the worker's working directory (where
        offloaded cells run, so they open it by that name). An existing PATH is kept unless --force.

        Usage: %offload_put LOCAL [PATH] [--worker NAME] [--force]
        """
        args = parse_argstring(self.offload_put, line)
        try:
            copied = self.connection.connected().put_file(args.local, args.path, worker=args.worker,
                                                          overwrite=args.force)
        except (FileTransferError, EngineError) as exc:
            raise UsageError(str(exc)) from None
        print(f"Copied {describe_copy(copied)} to worker {copied.worker!r} at {copied.destination}")

    @magic_arguments()
    @argument("names", nargs="+", help="the names whose values stayed on a worker (their handles)")
    @line_magic
    def offload_pull(self, line: str) -> None:
        """Bring values that stayed on a worker (``%%offload --keep``, or that couldn't cross) into the
        notebook, replacing their handles, with a progress bar for large ones.

        Usage: %offload_pull NAME [NAME ...]
        """
        args = parse_argstring(self.offload_pull, line)
        handles = [self._handle(name) for name in args.names]
        for handle in handles:
            if not handle.pullable:
                raise UsageError(f"`{handle.name}` can't come here: {handle.why}. It stays on worker "
                                 f"{handle.worker!r}, where offloaded cells use it in place; bring what you need of "
                                 f"it as plain data (an offloaded cell that assigns it)")
        client = self.connection.connected()
        for handle in handles:
            try:
                self.namespace[handle.name] = client.pull(handle)
            except OutputError as exc:
                raise UsageError(f"{exc}; it stays on the worker, where offloaded cells use it") from None
            print(f"Pulled `{handle.name}`{f' ({handle.summary})' if handle.summary else ''} "
                  f"from worker {handle.worker!r}")

    def _handle(self, name: str) -> RemoteValue:
        """The handle ``name`` holds, or a UsageError saying what it holds instead."""
        value = self.namespace.get(name)
        if not isinstance(value, RemoteValue):
            what = "isn't defined" if name not in self.namespace else f"is a {type(value).__name__} here already"
            raise UsageError(f"`{name}` {what}: %offload_pull brings values that stayed on a worker "
                             "(their handles) into the notebook")
        return value
