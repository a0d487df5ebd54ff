"""Exceptions raised by remote-magic.

Every error a user can catch derives from one root::

    RemoteMagicError
    ├── ConnectionFailed      the hub could not be reached, or refused us
    │   ├── VersionMismatch   the peers speak different protocol versions
    │   ├── PermissionDenied  these credentials may not do that (a worker token submitting, ...)
    │   ├── CredentialsRotated  the hub's keys were replaced: the token no longer works
    │   └── NotConnected      the hub doesn't know this peer (it restarted, or timed us out)
    ├── TokenError            a token is malformed, or of the wrong kind
    ├── RequirementError      a job's --require or --prefer is malformed (checked before sending)
    ├── SplitError            inputs can't be split as asked (checked before sending; names one)
    ├── GatherError           a name's per-piece values can't be concatenated (carries ``results``)
    ├── ProtocolError         a peer sent a message that breaks the wire protocol
    │   └── InvalidTransition  a job was moved to a state it can't reach from where it is
    ├── Busy                  the queue to the hub stayed full past the bound the caller set
    ├── OverBudget            a job would send more than is left of the client's transfer budget
    ├── SerializationError    a value could not be pickled or unpickled
    │   ├── InputError        ... a variable sent to the worker (names it)
    │   └── OutputError       ... a variable coming back (names it)
    ├── JobError              a job did not produce a result
    │   ├── RemoteError       user code raised on the worker (carries its traceback)
    │   ├── WorkerLost        the worker stopped answering while running the job
    │   ├── ExecutorDied      user code killed the executor process (segfault, os._exit, memory)
    │   ├── JobCancelled      the job was interrupted or its client went away
    │   ├── JobTimeout        the job ran past its timeout
    │   ├── NoSuchJob         no job with that id waits to be collected (%offload_attach)
    │   ├── NoSuchWorker      the job asked for a worker the hub does not know
    │   ├── NoMatchingWorker  no connected worker has what the job requires (lists what they have)
    │   └── FleetError        a job run on several workers failed on some (``failures``, ``results``)
    ├── FileTransferError     a file or folder could not be copied to or from the worker (names it)
    ├── GpuError              the worker's GPU could not do what was asked
    │   ├── ShaderError       WGSL failed to compile (carries line and column)
    │   └── GpuLimitError     the data exceeds a device limit and cannot be split
    ├── TunnelError           an ngrok tunnel could not be opened
    ├── EngineError           the engine connected can't do what was asked (names the option, and what instead)
    │   └── DaskError         ... a Dask cluster (no session, no GPU there), or distributed is missing
    ├── KernelError           a whole Jupyter kernel on a worker could not start, or was lost
    └── DiscoveryError        LAN discovery could not run, or found no hub that a token opens

Ctrl-C while a job runs raises ``JobInterrupted``: a KeyboardInterrupt (so not under the root), which
says which jobs were stopped on which workers.

Messages say what happened and what to do next.
"""

from __future__ import annotations

from typing import Any, Mapping


class RemoteMagicError(Exception):
    """Root of every error raised by remote-magic.

    ``partial``: where a cell raised it (its own exception, a :class:`RemoteError`, or the worker's GPU failing it
    midway, a :class:`GpuError`), what the cell had changed by then (a ``JobResult``; else None). As in a local
    run, ``%%offload`` keeps those changes.
    """

    partial: Any = None

    def _render_traceback_(self) -> list[str]:
        """In IPython, show the message without the library's own stack: it says what to do."""
        return [f"{type(self).__name__}: {self}"]


class ConnectionFailed(RemoteMagicError):
    """The hub could not be reached, or it refused the connection."""


class VersionMismatch(ConnectionFailed):
    """The two peers speak different versions of the wire protocol."""


class PermissionDenied(ConnectionFailed):
    """The hub refused a message these credentials may not send."""


class CredentialsRotated(ConnectionFailed):
    """The hub's keys were replaced (`remote-worker token --rotate`): this token no longer works."""


class NotConnected(ConnectionFailed):
    """The hub doesn't know this peer: it restarted or timed the peer out, so the peer says hello again."""


class TokenError(RemoteMagicError, ValueError):
    """A token is malformed, or is not the kind this command needs."""


class RequirementError(RemoteMagicError, ValueError):
    """A job's requirement (``--require``) or preference (``--prefer``) is malformed; nothing was sent."""


class SplitError(RemoteMagicError, ValueError):
    """Inputs could not be split as asked (``Client.split``, ``--split``): one is not something that can be
    cut along axis 0, they differ in length, or it is not among the inputs. ``name`` names it. Nothing ran."""

    def __init__(self, message: str, name: str | None = None) -> None:
        super().__init__(message)
        self.name = name


class GatherError(RemoteMagicError):
    """A name's values from the pieces of a split could not be concatenated (or a piece did not assign it).

    Every piece ran: ``results`` maps each worker to its ``JobResult``, in piece order; ``name`` is the name.
    """

    def __init__(self, message: str, name: str | None = None, results: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.name = name
        self.results: dict[str, Any] = dict(results or {})


class ProtocolError(RemoteMagicError):
    """A peer sent a message that does not follow the wire protocol."""


class InvalidTransition(ProtocolError):
    """A job was moved to a state it can't reach from its current one (a STARTED after its RESULT)."""


class Busy(RemoteMagicError):
    """The queue to the hub stayed full for longer than the client's ``send_timeout``, or the hub holds as
    many of this notebook's jobs waiting for a worker as it keeps: nothing was sent, or queued."""


class OverBudget(RemoteMagicError):
    """Sending a job would pass what is left of the client's transfer budget (``max_transfer``,
    ``%offload_connect --max-transfer``): nothing was sent."""


class SerializationError(RemoteMagicError):
    """A value could not be pickled or unpickled."""


class InputError(SerializationError):
    """A variable the cell reads could not be sent to the worker."""

    def __init__(self, message: str, name: str | None = None) -> None:
        super().__init__(message)
        self.name = name


class OutputError(SerializationError):
    """A variable the cell assigns could not come back from the worker."""

    def __init__(self, message: str, name: str | None = None) -> None:
        super().__init__(message)
        self.name = name


class JobError(RemoteMagicError):
    """A job ended without a result.

    ``attempts``: when the job was retried (``retries=N``), each attempt before the last, as
    ``(worker, error)``; the message lists them too.
    """

    attempts: tuple[tuple[str, "JobError"], ...] = ()


class RemoteError(JobError):
    """User code raised an exception on the worker.

    ``remote_type`` is the exception's qualified type name on the worker,
    ``remote_message`` its message and ``remote_traceback`` the formatted traceback. When the
    worker's exception type exists in the notebook too, the error is also an instance of it
    (``except ZeroDivisionError`` catches a ZeroDivisionError raised on the worker).

    ``partial`` is what the cell had changed before it raised (a ``JobResult``, or None when the job
    was not a cell): as in a local run, ``%%offload`` keeps those changes.
    """

    shows_type = True
    """Whether ``str()`` names the remote type first. One that is also the local type says only what that
    type says, as locally: ``str()`` of a KeyError('k') from the worker is ``'k'``."""

    def __init__(self, remote_type: str, remote_message: str, remote_traceback: str = "") -> None:
        # Not super(): as the worker's type too, the next __init__ may be that type's, which takes other
        # arguments (json's JSONDecodeError takes three).
        if not self.shows_type:
            BaseException.__init__(self, remote_message)
        else:
            BaseException.__init__(self, f"{remote_type}: {remote_message}" if remote_message else remote_type)
        self.remote_type = remote_type
        self.remote_message = remote_message
        self.remote_traceback = remote_traceback

    def _render_traceback_(self) -> list[str]:
        """Let IPython show the worker's traceback instead of the local one."""
        text = self.remote_traceback or (f"{self.remote_type}: {self.remote_message}\n" if self.remote_message
                                         else f"{self.remote_type}\n")
        return ["[remote traceback]", *text.rstrip("\n").splitlines()]


class JobInterrupted(KeyboardInterrupt):
    """Ctrl-C while jobs ran: they were stopped on their workers. Still a KeyboardInterrupt, and shown as a
    local one is: a line saying what was stopped, then ``KeyboardInterrupt``, without the notebook's
    internals. ``jobs``: {job id: the worker it ran on, "" when it had not reached one}."""

    def __init__(self, jobs: Mapping[str, str]) -> None:
        self.jobs = dict(jobs)
        stopped = "; ".join(f"job {job} on worker {worker!r}" if worker else f"job {job} before it reached a worker"
                            for job, worker in self.jobs.items())
        super().__init__(f"stopped {stopped}" if stopped else "")

    def _render_traceback_(self) -> list[str]:
        """What IPython shows for it, in place of a traceback through the client's waiting."""
        return [f"remote-magic: {self}", "KeyboardInterrupt"] if self.jobs else ["KeyboardInterrupt"]


class WorkerLost(JobError):
    """The worker running the job stopped answering heartbeats."""


class ExecutorDied(JobError):
    """User code killed the worker's executor process; a fresh executor was started."""


class JobCancelled(JobError):
    """The job was interrupted before it finished."""


class NoSuchJob(JobError):
    """No job with that id waits to be collected by this token's holders (it never did, it was collected
    already, or it ended longer ago than the hub keeps results)."""


class JobTimeout(JobError):
    """The job ran past its timeout and was stopped."""


class NoSuchWorker(JobError):
    """The job named a worker the hub does not know."""


class NoMatchingWorker(JobError):
    """No connected worker has what the job requires; the message lists what each one has."""


class FleetError(JobError):
    """A job run on several workers at once failed on some of them.

    ``failures`` maps each worker that failed to its error; ``results`` maps each worker that
    succeeded to what came back (a ``JobResult`` for a cell). The message names every failed worker
    and why.
    """

    def __init__(self, message: str, failures: dict[str, JobError | RemoteMagicError] | None = None,
                 results: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.failures: dict[str, JobError | RemoteMagicError] = dict(failures or {})
        self.results: dict[str, Any] = dict(results or {})

    def _render_traceback_(self) -> list[str]:
        """The message, then each failed worker's remote traceback, labelled."""
        lines = [f"{type(self).__name__}: {self}"]
        for worker, error in self.failures.items():
            if isinstance(error, RemoteError) and error.remote_traceback:
                lines += [f"[traceback:{worker}]", *error.remote_traceback.rstrip("\n").splitlines()]
        return lines


class FileTransferError(RemoteMagicError):
    """A file or folder could not be copied between the notebook and the worker; ``path`` names it."""

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class GpuError(RemoteMagicError):
    """The worker's GPU could not do what was asked."""


class ShaderError(GpuError):
    """WGSL source failed to compile; ``line`` and ``column`` point at the error."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None) -> None:
        super().__init__(message)
        self.line = line
        self.column = column


class GpuLimitError(GpuError):
    """The data exceeds a device limit and the kernel cannot split it."""


class TunnelError(RemoteMagicError):
    """An ngrok tunnel could not be opened."""


class EngineError(RemoteMagicError):
    """The engine this client is connected through can't do what was asked (an option that needs a
    remote-worker's session, GPU or link): the message names it and what to use instead."""


class DaskError(EngineError):
    """Offloading to a Dask cluster (``dask://HOST:PORT``) can't do what was asked: a Dask worker keeps no
    session per notebook and has no GPU runtime, so the options that need one are refused, naming the
    option and what to use instead; or ``distributed`` (or remote-magic on the Dask workers) is missing."""


class KernelError(RemoteMagicError):
    """A Jupyter kernel on a worker (``remote_magic.kernel_provider``) could not start, or was lost."""


class DiscoveryError(RemoteMagicError):
    """LAN discovery (mDNS/DNS-SD) could not run, or no hub it found is the one a token opens.

    Discovery only finds a hub's current address; connecting still takes the hub's token.
    """
