"""The notebook surface: %offload_connect, %%offload, %offload_workers, %offload_reset, %offload_get,
%offload_put, %offload_disconnect.

Each magic parses its line, calls the client API and shows the result; the work is in
``client.py``. A user's mistake becomes a UsageError (a short message, no traceback).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from IPython.core import magic as ipython_magic
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from traitlets import Float

from ..client import Client, connect
from ..dask_engine import DaskClient, is_dask_address
from ..errors import (
    DaskError,
    FileTransferError,
    FleetError,
    GatherError,
    InputError,
    NoSuchJob,
    NoSuchWorker,
    OutputError,
    RemoteError,
    RequirementError,
    SplitError,
    TokenError,
)
from ..hub.served import ServedHub
from ..results import FileChanges, JobResult
from ..transfer import Transfer
from ..wire.addresses import check_endpoint, parse_host_port
from ..wire.cellcode import names_read
from ..wire.definitions import INSTALLED
from ..wire.displays import TEXT_FORMAT
from ..wire.handles import RemoteValue
from ..wire.keys import HubKeys
from ..wire.protocol import Role
from ..wire.sizes import human_size, parse_size
from . import on_several
from .cell_display import CellDisplay
from .shared_state import SharedState
from .tables import WorkersTable

# IPython 8.13 lets `%%offload` end with `;` to hide the cell's value; 7.34 (Colab's) has no such decorator.
_output_can_be_silenced = getattr(ipython_magic, "output_can_be_silenced", lambda function: function)


NOTICE_FILES = 3
"""How many files a notice about the files a cell wrote names; it counts the rest."""

NOTICE_SIZE_BYTES = 1_000_000
"""Files at least this large are named with their size."""


def _notice(text: str) -> None:
    print(f"remote-magic: {text}", file=sys.stderr)


@magics_class
class OffloadMagics(Magics):
    """Run cells on a remote-magic worker."""

    connect_timeout = Float(10.0, help="Seconds %offload_connect waits for the hub.").tag(config=True)
    default_timeout = Float(None, allow_none=True, help="Default --timeout of %%offload, in seconds.").tag(config=True)

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell=shell, **kwargs)
        self.client: Client | DaskClient | None = None  # DaskClient: %offload_connect dask://HOST:PORT
        self.kernels: dict[str, str] = {}
        self.served: ServedHub | None = None  # a hub this kernel serves (%offload_serve)
        self.cell_display = CellDisplay(shell)
        self.shared_state = SharedState(shell)

    # -- connection ------------------------------------------------------------------------

    @magic_arguments()
    @argument("token", nargs="?", help="the token remote-worker printed (default: $REMOTE_MAGIC_TOKEN), "
              "or dask://HOST:PORT for a Dask scheduler")
    @argument("--timeout", type=float, default=None,
              help="seconds to wait for the hub (with --lan: to browse the network, default 3)")
    @argument("--lan", action="store_true",
              help="find hubs on this network (remote-worker --lan); with a token, connect to its hub there")
    @argument("--max-transfer", default=None, metavar="SIZE",
              help="send and receive at most SIZE (e.g. 1GB) over this connection (a tunnel's monthly cap)")
    @line_magic
    def offload_connect(self, line: str) -> None:
        """Connect this notebook to a remote-worker's hub.

        With --lan, list the hubs advertised on this network (remote-worker --lan); with a token too,
        connect to the hub that token opens at the address it is found at now (the token's address may
        be out of date). Discovery never replaces the token: without one it only lists.

        With dask://HOST:PORT, offloaded cells (and --all, --split) run on that Dask scheduler's
        workers instead, Dask placing them; see docs/fleet.md for what differs there.

        With --max-transfer SIZE, a cell that would send more than is left of SIZE over this connection
        is stopped before anything is sent, and results that would pass it stay on the worker as handles
        (%offload_workers shows what was sent and received).

        Usage: %offload_connect TOKEN [--max-transfer SIZE]  (or set REMOTE_MAGIC_TOKEN: %offload_connect)
               %offload_connect --lan [TOKEN] [--timeout S]
               %offload_connect dask://HOST:PORT
        """
        args = parse_argstring(self.offload_connect, line)
        try:
            budget = None if args.max_transfer is None else parse_size(args.max_transfer)
        except ValueError as exc:
            raise UsageError(f"--max-transfer: {exc}") from None
        token = args.token or os.environ.get("REMOTE_MAGIC_TOKEN")
        if not token and not args.lan:
            raise UsageError("%offload_connect needs the token remote-worker printed "
                             "(or set REMOTE_MAGIC_TOKEN in the environment); %offload_connect --lan "
                             "lists the hubs on this network")
        try:
            if args.lan and is_dask_address(token):
                raise UsageError("--lan finds remote-worker hubs; a Dask scheduler is named by its address alone: "
                                 f"%offload_connect {token}")
            if args.lan:
                from ..lan import connect_discovered
                from .lan import find_lan_hub

                found = find_lan_hub(token, args.timeout)
                if found is None:  # listed only: the connection this notebook has stays
                    return
                self.disconnect()
                self.client = connect_discovered(*found, timeout=self.connect_timeout)
            else:
                self.disconnect()
                self.client = connect(token, timeout=args.timeout or self.connect_timeout)
        except (TokenError, DaskError) as exc:
            raise UsageError(str(exc)) from None
        client = self.client
        if budget is not None:
            if isinstance(client, DaskClient):
                raise UsageError("--max-transfer counts what crosses a remote-worker hub's link; on Dask, data moves "
                                 "between the Dask workers and the scheduler")
            client.max_transfer = budget
        workers = client.workers()
        names = ", ".join(w["name"] for w in workers) or "none yet"
        where = client.address if isinstance(client, DaskClient) else client.token.address
        print(f"Connected to {where} — {'Dask ' if isinstance(client, DaskClient) else ''}workers: {names}")
        for note in client.version_notes:
            _notice(note)

    @magic_arguments()
    @argument("--ngrok", action="store_true", help="expose the hub through an ngrok TCP tunnel (NGROK_AUTHTOKEN)")
    @argument("--ngrok-authtoken", default=None, help="ngrok auth token (default: $NGROK_AUTHTOKEN)")
    @argument("--listen", default="0.0.0.0:0", help="HOST:PORT the hub binds (default 0.0.0.0:0, any free port)")
    @argument("--advertise", default=None, help="tcp://HOST:PORT to put in the worker token (your own forwarding)")
    @line_magic
    def offload_serve(self, line: str) -> None:
        """Host a hub in this kernel, so workers dial in to the notebook.

        Prints the `remote-worker --join` command to run on each worker machine; this
        notebook is connected to its own hub at once. With --ngrok the hub is reachable through a
        public ngrok TCP address; with --advertise, through your own forwarding.
        """
        args = parse_argstring(self.offload_serve, line)
        try:
            host, port = parse_host_port(args.listen)
            advertise = check_endpoint(args.advertise) if args.advertise else None
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        self.disconnect()
        # A notebook's hub lives as long as the kernel: fresh keys each time.
        self.served = ServedHub(HubKeys.generate(), host, port, ngrok=args.ngrok,
                                ngrok_authtoken=args.ngrok_authtoken, advertise=advertise)
        try:
            self.client = connect(self.served.loopback_token(Role.CLIENT), timeout=self.connect_timeout)
        except BaseException:
            self.disconnect()
            raise
        print(f"Serving a hub at {self.served.address}. On each worker machine run:\n\n"
              f"    REMOTE_MAGIC_JOIN_TOKEN={self.served.token(Role.WORKER).encode()} remote-worker --join\n\n"
              "This notebook is connected to it; %offload_workers lists the workers that joined.")

    @line_magic
    def offload_disconnect(self, line: str) -> None:
        """Disconnect from the hub; running jobs are cancelled. A hub this kernel serves stops."""
        self.disconnect()

    def disconnect(self) -> None:
        """What %offload_disconnect does: close the client, and a hub this kernel serves."""
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.served is not None:
            self.served.close()
            self.served = None

    def _client(self) -> Client | DaskClient:
        if self.client is None:
            raise UsageError("not connected: run %offload_connect TOKEN first "
                             "(the token is the line remote-worker printed)")
        return self.client

    # -- running cells ---------------------------------------------------------------------

    @magic_arguments()
    @argument("kernels", nargs="?", default=None,
              help="run numpy work on the worker's GPU with these kernels, e.g. matmul or matmul,softmax")
    @argument("--gpu", action="store_true", help="run numpy work on the worker's GPU with every kernel")
    @argument("--worker", default=None, help="run on the worker with this name")
    @argument("--all", action="store_true", help="run on every worker at once; names come back as {worker: value}")
    @argument("--workers", default=None, help="run on these workers at once, e.g. box,laptop (as --all)")
    @argument("--split", default=None, metavar="X[,Y]",
              help="cut these inputs along axis 0, one piece per worker (sized by speed), and run the cell on each")
    @argument("--gather", default=None, metavar="NAME[,NAME]",
              help="with --split: concatenate these names' pieces in order (other names come back as {worker: value})")
    @argument("--retries", type=int, default=0,
              help="run the cell again on another worker, up to N times, when its worker is lost")
    @argument("--timeout", type=float, default=None, help="stop the job after this many seconds")
    @argument("--keep", default=None, metavar="NAME[,NAME]",
              help="leave these values on the worker: the notebook gets handles (%%offload_pull NAME brings one here)")
    @argument("--stats", action="store_true", help="show what ran on the GPU, for how long, and bytes moved")
    @argument("--require", action="append", default=None, metavar="REQUIREMENT",
              help="run on a worker that has this: gpu, memory>=16GB, cpus>=8, a --label (repeatable; docs/fleet.md)")
    @argument("--prefer", default=None, choices=["fastest"], help="fastest: the fastest idle worker that matches")
    @_output_can_be_silenced
    @cell_magic
    def offload(self, line: str, cell: str) -> Any:
        """Run this cell on a worker; the names it assigns come back into the notebook.

        Only the variables the cell reads are sent. Output streams while it runs, display()
        and matplotlib figures appear here, and the last expression is shown as the cell's
        value. An exception shows the worker's traceback; what the cell did before it stays done, as locally.

        --all (or --workers A,B) runs the cell on each of those workers at once: output comes under
        labels such as [stdout:A], each name it assigns comes back as {worker: value}, and so does its
        value. One worker failing stops none of the others; the error says which failed and why.
        --split X[,Y] cuts those inputs along axis 0 (arrays, lists, tuples, DataFrames, Series) into one
        contiguous piece per worker (every worker, or --workers A,B), sized by each one's measured speed, and
        runs the cell on each piece at once; the other inputs go whole. --gather NAME concatenates NAME's
        pieces in order; other names come back as {worker: value}, as with --all.
        --retries N runs the cell again elsewhere when its worker is lost (it may have run partly there).
        --keep NAME[,NAME] leaves those values on the worker (large results over a slow link): the
        notebook gets a handle showing type and size, later offloaded cells use the value in place, and
        %offload_pull NAME brings it here.

        Usage: %%offload [matmul[,softmax...]] [--gpu] [--worker NAME | --all | --workers A,B] [--retries N]
        [--timeout S] [--stats] [--keep NAME[,NAME]]
                         [--require REQUIREMENT ...] [--prefer fastest]
                         [--split X[,Y] [--gather NAME[,NAME]]]
        """
        args = parse_argstring(self.offload, line)
        placed = bool(args.require or args.prefer)
        if args.split is not None and args.worker is None and not (placed or args.retries):
            args.all = args.all or args.workers is None  # --split runs on several: every worker, unless named
        several = on_several.chosen_workers(args.all, args.workers, args.worker, args.retries, placed=placed)
        client = self._client()
        try:
            reads = names_read(cell)
        except SyntaxError as exc:  # raised as such, as the same cell run locally raises it
            line = (exc.text or "").strip()
            if line.startswith(("%", "!", "?")) or line.endswith("?"):
                exc.msg += ": %%offload runs plain Python (no other magics, !commands or ? help)"
            raise
        assert self.shell is not None  # IPython registers magics with their shell
        namespace = self.shell.user_ns
        hidden = self.shell.user_ns_hidden
        inputs = {name: namespace[name] for name in reads if name in namespace and (
                  _HISTORY.fullmatch(name) or not (name in hidden and hidden[name] is namespace[name]))}
        gpu: bool | list[str] | None = True if args.gpu else (
            [k.strip() for k in args.kernels.split(",") if k.strip()] if args.kernels else None)
        on_module_error = lambda name, ref, exc: _notice(  # noqa: E731
            f"`{name}` stays on the worker: module {ref.name!r} can't be imported here ({exc})")
        split = on_several.chosen_split(args.split, args.gather, inputs, namespace, args.worker, args.retries, placed)
        if several is not None:
            if args.keep:
                raise UsageError("--keep leaves values on the one worker a cell runs on: drop --all, --workers "
                                 "or --split, or keep them with a cell on one worker")
            return self._offload_on_several(client, cell, inputs, several, args, gpu, on_module_error, split)
        worker = _worker_holding(inputs, args.worker)
        crossed = _crossed(client)
        # Random seeds, print and display options, rcParams: one process's locally. The cell takes the notebook's.
        try:
            result = client.execute(
                cell, inputs, worker=worker, timeout=args.timeout or self.default_timeout, gpu=gpu,
                kernels=self.kernels or None, figure_formats=_figure_formats(self.shell),
                text_format=_text_format(self.shell),
                on_display=self.cell_display.show, on_module_error=on_module_error,
                on_files=lambda files: _notice(_describe_files(files)), retries=args.retries, on_retry=_notice,
                require=_unquoted(args.require), prefer=args.prefer, keep=_names(args.keep),
                module_state=self.shared_state.for_cell())
        except (RequirementError, DaskError) as exc:
            raise UsageError(str(exc)) from None
        except RemoteError as error:
            if error.partial is not None:  # as locally: what the cell did before it raised stays done
                self.shared_state.take(error.partial.module_state)
                _apply(error.partial, namespace, inputs)
            _say_if_a_local_module(str(error))
            if error.remote_type == "SystemExit":  # as locally: IPython says so, without a traceback
                raise SystemExit(_exit_code(error.remote_message)) from None
            raise
        except InputError as error:
            _say_if_a_local_module(str(error))
            raise
        self.shared_state.take(result.module_state)
        _apply(result, namespace, inputs)
        if args.stats:
            sent, received = (after - before for after, before in zip(_crossed(client), crossed))
            _notice(f"{_format_stats(result.worker, result.stats)}; over the link: sent {human_size(sent)}, "
                    f"received {human_size(received)}")
        if not result.has_value:
            return None
        self.cell_display.show_value_as(result.value, result.value_display)
        return result.value

    def _offload_on_several(self, client: Client | DaskClient, cell: str, inputs: dict[str, Any],
                            several: on_several.Several, args: Any, gpu: bool | list[str] | None, on_module_error: Any,
                            split: on_several.Split | None) -> Any:
        """%%offload --all / --workers / --split: the cell on each worker (or piece) at once; names come back
        as {worker: value}, gathered ones concatenated."""
        assert self.shell is not None
        if any(isinstance(value, RemoteValue) for value in inputs.values()):
            raise UsageError("this cell reads values that live on one worker (handles): it can run only there, "
                             "not on several workers")
        labelled = on_several.Labels(self.cell_display.show)
        options: dict[str, Any] = dict(
            workers=several.workers, timeout=args.timeout or self.default_timeout, gpu=gpu,
            kernels=self.kernels or None, figure_formats=_figure_formats(self.shell),
            text_format=_text_format(self.shell),
            on_stream=labelled.stream, on_display=labelled.display, on_module_error=on_module_error)
        gathered: dict[str, Any] = {}
        try:
            if split is None:
                results = client.execute_all(cell, inputs, **options)
            else:
                outcome = client.split(cell, inputs, split=split.names, gather=split.gather, **options)
                results, gathered = outcome.results, outcome.gathered
                for note in outcome.notes:
                    _notice(note)
        except (NoSuchWorker, SplitError, DaskError) as exc:
            raise UsageError(str(exc)) from None
        except FleetError as error:  # as locally: what the cells did stays done, on the workers that ran it
            partial = {worker: failed.partial for worker, failed in error.failures.items()
                       if isinstance(failed, RemoteError) and failed.partial is not None}
            on_several.apply(self.shell.user_ns, {**error.results, **partial}, _notice,
                             leave=split.gather if split else ())  # nothing gathered: those names stay as they were
            raise
        except GatherError as error:  # every piece ran: what they assigned comes back as with --all
            on_several.apply(self.shell.user_ns, error.results, _notice)
            _notice("nothing was gathered: every name the cell assigned is in the notebook as {worker: value}")
            raise
        on_several.apply(self.shell.user_ns, results, _notice, leave=gathered)
        self.shell.user_ns.update(gathered)
        if args.stats:
            for worker, result in results.items():
                _notice(_format_stats(worker, result.stats))
        values = {worker: result.value for worker, result in results.items() if result.has_value}
        return values or None

    @magic_arguments()
    @argument("name", help="the name the kernel is called by: gpu.NAME(...)")
    @cell_magic
    def offload_kernel(self, line: str, cell: str) -> None:
        """Define a custom WGSL compute kernel, callable as gpu.NAME(...) in offloaded cells.

        The worker compiles it now; a compile error shows its line and column.
        See docs/gpu.md for the binding convention.
        """
        args = parse_argstring(self.offload_kernel, line)
        if not args.name.isidentifier():
            raise UsageError(f"{args.name!r} is not a valid Python name for gpu.{args.name}")
        try:
            self._client().execute("pass", gpu=True, kernels={**self.kernels, args.name: cell})
        except DaskError as exc:
            raise UsageError(str(exc)) from None
        self.kernels[args.name] = cell
        print(f"kernel gpu.{args.name} compiled")

    # -- files -----------------------------------------------------------------------------

    @magic_arguments()
    @argument("path", help="the file or folder on the worker (relative to where its cells run)")
    @argument("local", nargs="?", default=None, help="where to put it here (default: the same relative path)")
    @argument("--worker", default=None, help="copy from the worker with this name")
    @argument("--force", action="store_true", help="replace what is already at the destination")
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
            copied = self._client().get_file(args.path, args.local, worker=args.worker, overwrite=args.force)
        except (FileTransferError, DaskError) as exc:
            raise UsageError(str(exc)) from None
        print(f"Copied {_describe_copy(copied)} from worker {copied.worker!r} to {copied.destination}")

    @magic_arguments()
    @argument("names", nargs="+", help="the names whose values stayed on a worker (their handles)")
    @line_magic
    def offload_pull(self, line: str) -> None:
        """Bring values that stayed on a worker (``%%offload --keep``, or that couldn't cross) into the
        notebook, replacing their handles, with a progress bar for large ones.

        Usage: %offload_pull NAME [NAME ...]
        """
        args = parse_argstring(self.offload_pull, line)
        assert self.shell is not None
        namespace = self.shell.user_ns
        handles = []
        for name in args.names:
            value = namespace.get(name)
            if not isinstance(value, RemoteValue):
                what = "isn't defined" if name not in namespace else f"is a {type(value).__name__} here already"
                raise UsageError(f"`{name}` {what}: %offload_pull brings values that stayed on a worker "
                                 "(their handles) into the notebook")
            handles.append(value)
        client = self._client()
        for handle in handles:
            try:
                namespace[handle.name] = client.pull(handle)
            except OutputError as exc:
                raise UsageError(f"{exc}; it stays on the worker, where offloaded cells use it") from None
            print(f"Pulled `{handle.name}`{f' ({handle.summary})' if handle.summary else ''} "
                  f"from worker {handle.worker!r}")

    @magic_arguments()
    @argument("local", help="the file or folder here")
    @argument("path", nargs="?", default=None,
              help="where to put it on the worker (default: the same relative path in its working directory)")
    @argument("--worker", default=None, help="copy to the worker with this name")
    @argument("--force", action="store_true", help="replace what is already at the destination")
    @line_magic
    def offload_put(self, line: str) -> None:
        """Copy a file or folder from this machine to the worker, with a progress bar for large ones.

        PATH defaults to the same relative path in the worker's working directory (where
        offloaded cells run, so they open it by that name). An existing PATH is kept unless --force.

        Usage: %offload_put LOCAL [PATH] [--worker NAME] [--force]
        """
        args = parse_argstring(self.offload_put, line)
        try:
            copied = self._client().put_file(args.local, args.path, worker=args.worker, overwrite=args.force)
        except (FileTransferError, DaskError) as exc:
            raise UsageError(str(exc)) from None
        print(f"Copied {_describe_copy(copied)} to worker {copied.worker!r} at {copied.destination}")

    # -- jobs that outlived their notebook ------------------------------------------------------

    @line_magic
    def offload_jobs(self, line: str) -> None:
        """List the jobs that outlived the notebook that submitted them (a runtime that restarted, a link down
        past the heartbeat bound) and wait to be collected with %offload_attach JOB: any submitted with this
        notebook's token, running or ended."""
        client = self._client()
        if isinstance(client, DaskClient):
            raise UsageError("%offload_jobs lists a remote-worker hub's jobs; on Dask, use the Dask dashboard")
        waiting = client.jobs()
        if not waiting:
            print("No job waits to be collected: jobs whose notebook went away while they ran show here.")
            return
        for job in waiting:
            ended = f"{job['state']} {job['ended_s']:.0f} s ago" if job.get("ended_s") is not None else "running"
            print(f"{job['job']}  {ended} on {job['worker']!r}, {human_size(job['output_bytes'])} of output: "
                  f"{job['summary']}")
        print("Collect one with %offload_attach JOB: its output is shown again and its values land here.")

    @magic_arguments()
    @argument("job", help="the job's id, as %%offload_jobs lists it")
    @line_magic
    def offload_attach(self, line: str) -> Any:
        """Collect a job that outlived the notebook that submitted it: its output is shown again, in order
        (and what it still prints, if it runs on), and what it changed lands in this namespace, as if this
        notebook had run the cell. Usage: %offload_attach JOB
        """
        args = parse_argstring(self.offload_attach, line)
        client = self._client()
        if isinstance(client, DaskClient):
            raise UsageError("%offload_attach collects a remote-worker hub's jobs; a Dask connection has none")
        assert self.shell is not None
        namespace = self.shell.user_ns
        try:
            result = client.attach(args.job, on_display=self.cell_display.show)
        except NoSuchJob as exc:
            raise UsageError(str(exc)) from None
        except RemoteError as error:
            if error.partial is not None:
                _apply(error.partial, namespace, {})
            raise
        _apply(result, namespace, {})
        if not result.has_value:
            return None
        self.cell_display.show_value_as(result.value, result.value_display)
        return result.value

    @line_magic
    def offload_workers(self, line: str) -> WorkersTable:
        """The fleet as a table: name, host, platform, Python, CPUs (and measured speed), memory, GPU, power
        (battery and whether it takes jobs), state, work done (jobs, busy and GPU seconds, bytes in and
        out), the sessions each keeps (how many, their memory, and this notebook's), and labels."""
        client = self._client()
        workers = client.workers()
        if isinstance(client, DaskClient):
            return WorkersTable(workers)
        return WorkersTable(workers, client.hub_cache, (*_crossed(client), client.max_transfer))

    @magic_arguments()
    @argument("--worker", default=None, help="reset the session on the worker with this name only")
    @line_magic
    def offload_reset(self, line: str) -> None:
        """Give this notebook a fresh interpreter on the worker: the next offloaded cell starts clean.

        Ends this notebook's session, the worker process that keeps what earlier offloaded cells
        left behind (imports, module globals, random seeds, print options, the working directory).
        The notebook's own variables are untouched. Without --worker, every worker this notebook
        ran a cell on.

        Usage: %offload_reset [--worker NAME]
        """
        args = parse_argstring(self.offload_reset, line)
        try:
            reset = self._client().reset(args.worker)
        except (NoSuchWorker, DaskError) as exc:
            raise UsageError(str(exc)) from None
        if reset:
            names = ", ".join(repr(name) for name in reset)
            print(f"Reset this notebook's session on worker{'s' if len(reset) > 1 else ''} {names}: the next "
                  "offloaded cell there starts in a fresh interpreter.")
        elif args.worker:
            print(f"Nothing to reset: this notebook has no session on worker {args.worker!r}.")
        else:
            print("Nothing to reset: this notebook has no session on any worker.")


_HISTORY = re.compile(r"_{1,3}|_i{1,3}|_i?\d+")
"""IPython's output and input history (``_``, ``__``, ``_5``, ``_i``): hidden names a cell may read."""


def _apply(result: JobResult, namespace: dict[str, Any], inputs: dict[str, Any]) -> None:
    """Bring what a cell changed into the notebook's namespace, and say where that differs from a
    local run: what stayed on the worker, and objects changed in place that came back as new ones."""
    replaced = {name: inputs[name] for name in result.in_place
                if name in inputs and result.values.get(name) is not inputs[name]}
    namespace.update(result.values)
    namespace.update(result.kept_on_worker)
    for name in result.deleted:
        namespace.pop(name, None)
    if result.kept_on_worker:
        kept = ", ".join(handle.describe() for handle in result.kept_on_worker.values())
        _notice(f"{kept} stayed on worker {result.worker!r}: the notebook holds a handle, and offloaded cells "
                "use the value there in place")
    for name, old in replaced.items():
        others = [f"`{other}`" for other, value in namespace.items()
                  if (value is old or _views(value, old)) and other != name and not other.startswith("_")]
        if others:
            numpy = sys.modules.get("numpy")
            why = ("an array whose shape, dtype or memory changed" if numpy is not None and
                   isinstance(old, numpy.ndarray) else f"a {type(old).__name__}")
            _notice(f"`{name}` was changed in place on the worker and came back as a new object ({why} can't be "
                    f"updated in place here): {', '.join(others)}, which shared it here, still hold the old value")
    for note in result.notes:
        _notice(note)


def _exit_code(message: str) -> int | str | None:
    """``sys.exit(code)``'s code, from the message it came with."""
    if not message:
        return None
    try:
        return int(message)
    except ValueError:
        return message


_NO_MODULE = re.compile(r"No module named '([\w.]+)'")


def _say_if_a_local_module(error: str) -> None:
    """When the worker lacks a module that is a file or folder beside the notebook (not an installed
    package), say so, and how to copy it there."""
    missing = _NO_MODULE.search(error)
    if missing is None:
        return
    top = missing[1].partition(".")[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return
    origin = spec.origin if spec is not None else None
    if not origin or origin in ("built-in", "frozen") or origin.startswith(INSTALLED):
        return
    path = Path(origin).parent if spec is not None and spec.submodule_search_locations else Path(origin)
    try:
        shown = str(path.relative_to(Path.cwd()))
    except ValueError:
        shown = str(path)
    _notice(f"`{top}` is {shown} here, next to the notebook, not a package installed on the worker: "
            f"`%offload_put {shown}` copies it into the worker's working directory, where offloaded cells import from")


def _views(value: Any, array: Any) -> bool:
    """Is ``value`` a numpy array sharing memory with ``array``?"""
    numpy = sys.modules.get("numpy")
    return (numpy is not None and isinstance(value, numpy.ndarray) and isinstance(array, numpy.ndarray)
            and bool(numpy.may_share_memory(value, array)))


def _worker_holding(inputs: dict[str, Any], asked: str | None) -> str | None:
    """The worker a cell must run on: the one holding the values it reads by handle, or the one asked for."""
    holders = {value.worker: name for name, value in inputs.items() if isinstance(value, RemoteValue)}
    if len(holders) > 1 or (holders and asked is not None and asked not in holders):
        where = ", ".join(f"`{name}` on {worker!r}" for worker, name in holders.items())
        raise UsageError(f"this cell reads values that live on workers ({where}), so it can run only there"
                         + (f", not on {asked!r}" if asked else "") + ": make them again where it runs")
    return asked if asked is not None else next(iter(holders), None)


def _names(listed: str | None) -> list[str] | None:
    """``a, b`` as typed after an option: the names."""
    return [name.strip() for name in listed.split(",") if name.strip()] if listed else None


def _unquoted(values: list[str] | None) -> list[str] | None:
    """``--require "memory>=16GB"`` as typed: IPython's magic parser keeps the quotes."""
    return None if values is None else [v[1:-1] if len(v) > 1 and v[0] == v[-1] and v[0] in "'\"" else v
                                        for v in values]


def _figure_formats(shell: Any) -> list[str]:
    """The formats this notebook shows figures in (``%config InlineBackend.figure_formats``, or the older
    ``figure_format``)."""
    inline = sys.modules.get("matplotlib_inline.backend_inline")
    if inline is not None and inline.InlineBackend.initialized():
        return sorted(inline.InlineBackend.instance().figure_formats)
    configured = shell.config.get("InlineBackend", {})
    formats = configured.get("figure_formats") or (
        [configured["figure_format"]] if "figure_format" in configured else [])
    return sorted(formats) or ["png"]


def _text_format(shell: Any) -> dict[str, Any]:
    """How this notebook shows values as text, for the worker to show the cell's value alike."""
    plain = shell.display_formatter.formatters["text/plain"]
    return {name: getattr(plain, name) for name in TEXT_FORMAT}


def _describe_files(files: FileChanges) -> str:
    """One line: which files the cell wrote or removed on the worker, and how to copy them here."""
    def listed(names: list[str], count: int) -> str:
        more = count - len(names)
        return ", ".join(names) + (f" and {more} more" if more > 0 else "")

    written = [f"{path} ({human_size(size)})" if size >= NOTICE_SIZE_BYTES else path
               for path, size in list(files.written.items())[:NOTICE_FILES]]
    deleted = files.deleted[:NOTICE_FILES]
    done = [f"wrote {listed(written, files.written_count)}" if files.written_count else "",
            f"deleted {listed(deleted, files.deleted_count)}" if files.deleted_count else ""]
    text = f"the cell {' and '.join(d for d in done if d)} on worker {files.worker!r}"
    if files.written:
        first = next(iter(files.written))
        text += f" — they are there, not here: %offload_get {shlex.quote(first)} copies one here"
    if not files.complete:
        text += f" (its folder {files.folder} is too large to look through: some changes may be missing)"
    return text


def _describe_copy(copied: Transfer) -> str:
    what = f"{copied.files:,} file{'s' if copied.files != 1 else ''}, " if copied.files != 1 else ""
    return f"{os.path.basename(copied.source)} ({what}{human_size(copied.bytes)})"


def _crossed(client: Client | DaskClient) -> tuple[int, int]:
    """Bytes the client has sent and received over its link so far (a Dask client: none counted)."""
    return (0, 0) if isinstance(client, DaskClient) else (client.bytes_sent, client.bytes_received)


def _format_stats(worker: str, stats: dict[str, Any]) -> str:
    def counts(key: str) -> str:
        return ", ".join(f"{name}×{count}" for name, count in (stats.get(key) or {}).items()) or "none"

    return (f"ran on {worker}: GPU kernels {counts('kernels')}; with numpy {counts('numpy')}; "
            f"GPU time {stats.get('gpu_time_s', 0.0) * 1e3:.2f} ms; "
            f"uploaded {stats.get('bytes_uploaded', 0):,} B, read back {stats.get('bytes_downloaded', 0):,} B")


def load_ipython_extension(ipython: Any) -> None:
    ipython.register_magics(OffloadMagics)


def unload_ipython_extension(ipython: Any) -> None:
    magics = ipython.magics_manager.registry.get("OffloadMagics")
    if magics is not None:
        magics.disconnect()
        magics.cell_display.close()
        magics.shared_state.close()
        for kind, names in OffloadMagics.magics.items():  # every magic the class registered
            for name in names:
                ipython.magics_manager.magics[kind].pop(name, None)
        del ipython.magics_manager.registry["OffloadMagics"]
