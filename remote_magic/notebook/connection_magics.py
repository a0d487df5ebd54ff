# mypy: allow-untyped-decorators, allow-untyped-calls
# (IPython's magic decorators and argument parser carry no type hints.)
"""The connection and the fleet: %offload_connect, %offload_serve, %offload_disconnect, %offload_workers,
%offload_reset."""

from __future__ import annotations

import os

from IPython.core.error import UsageError
from IPython.core.magic import line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .. import progress
from ..engine import HUB_SCHEME, parse
from ..errors import EngineError, NoSuchWorker, TokenError
from ..wire.addresses import check_endpoint, parse_host_port
from ..wire.protocol import Role
from ..wire.sizes import parse_size
from .arguments import worker_option
from .connection import MagicsGroup
from .notices import describe_connection, describe_reset, notice
from .tables import WorkersTable
from .workers_view import ASK_TIMEOUT_S, WorkersView


@magics_class
class ConnectionMagics(MagicsGroup):
    """Connect this notebook to a hub (or serve one), and see and reset the workers behind it."""

    @magic_arguments()
    @argument("token", nargs="?", help="the token remote-worker printed (default: $REMOTE_MAGIC_TOKEN), "
              "or dask://HOST:PORT for a Dask scheduler")
    @argument("--timeout", type=float, default=None,
              help="seconds to wait for the hub (with --lan: to browse the network, default 3)")
    @argument("--lan", action="store_true",
              help="find hubs on this network (remote-worker --lan); with a token, connect to its hub there")
    @argument("--max-transfer", default=None, metavar="SIZE",
              help="send and receive at most SIZE (e.g. 1GB) over this connection (a tunnel's monthly cap)")
    @argument("--outage-grace", type=float, default=None, metavar="SECONDS",
              help="how long a running cell waits for a link that went down to come back before it fails "
                   "(default: the hub's, 300 s unless remote-worker --outage-grace says otherwise)")
    @line_magic
    def offload_connect(self, line: str) -> None:
        """Connect this notebook to a remote-worker's hub.

        With --lan, list the hubs advertised on this network (remote-worker --lan); with a token too,
        connect to the hub that token opens at the address it is found at now (the token's address may
        be out of date). Discovery never replaces the token: without one it only lists.

        With dask://HOST:PORT, offloaded cells (and --all, --split) run on that Dask scheduler's
        workers instead, Dask placing them; refused there: --gpu and GPU kernels, --retries, --require and
        --prefer (name a worker with --worker), %offload_get and %offload_put.

        With --max-transfer SIZE, a cell that would send more than is left of SIZE over this connection
        is stopped before anything is sent, and results that would pass it stay on the worker as handles
        (%offload_workers shows what was sent and received).

        While the link is down (a dropped Wi-Fi, a tunnel restarting), a running cell says so once and
        waits for it, up to --outage-grace seconds; when it is back, the cell ends as it would have.

        Usage: %offload_connect TOKEN [--max-transfer SIZE] [--outage-grace S]
               %offload_connect  (with REMOTE_MAGIC_TOKEN set)
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
        scheme = parse(token).scheme if token else HUB_SCHEME
        if args.lan and scheme != HUB_SCHEME:
            raise UsageError(f"--lan finds remote-worker hubs; {scheme}:// is reached by its address alone: "
                             f"%offload_connect {token}")
        try:
            wait = self.connection.settings.connect_timeout
            client = (self.connection.connect_on_lan(token, args.timeout, wait) if args.lan
                      else self.connection.connect(token, args.timeout or wait))
        except (TokenError, EngineError) as exc:
            raise UsageError(str(exc)) from None
        if client is None:  # --lan without a token lists the hubs only: the connection this notebook has stays
            return
        try:
            client.limit_link(max_transfer=budget, outage_grace=args.outage_grace)
        except EngineError as exc:
            raise UsageError(str(exc)) from None
        print(describe_connection(client, client.workers()))
        for note in client.version_notes:
            notice(note)

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
        served = self.connection.serve(host, port, ngrok=args.ngrok, ngrok_authtoken=args.ngrok_authtoken,
                                       advertise=advertise, timeout=self.connection.settings.connect_timeout)
        print(f"Serving a hub at {served.address}. On each worker machine run:\n\n"
              f"    REMOTE_MAGIC_JOIN_TOKEN={served.token(Role.WORKER).encode()} remote-worker --join\n\n"
              "This notebook is connected to it; %offload_workers lists the workers that joined.")

    @line_magic
    def offload_disconnect(self, line: str) -> None:
        """Disconnect from the hub; running jobs are cancelled. A hub this kernel serves stops."""
        self.connection.disconnect()

    @magic_arguments()
    @argument("--all", action="store_true", help="every column, as a wide table")
    @line_magic
    def offload_workers(self, line: str) -> WorkersView | WorkersTable:
        """The fleet in a notebook's width: per worker its name, state, what it runs now (for how long, and
        the job's first line), its GPU in short (adapter, and discrete, integrated or software), and data in
        and out (or this notebook's large message crossing now). In a notebook the view refreshes every
        second while connected, until a newer one is shown; its ``.workers`` holds the hub's dicts.

        With --all, the fleet as a table: name, host, platform, Python, CPUs (and measured speed), memory,
        GPU, power (battery and whether it takes jobs), state, work done (jobs, busy and GPU seconds, bytes
        in and out), the sessions each keeps (how many, their memory, and this notebook's), and labels.

        Usage: %offload_workers [--all]
        """
        args = parse_argstring(self.offload_workers, line)
        client = self.connection.connected()
        if args.all:
            return WorkersTable(client.workers(), client.hub_cache, client.traffic())

        def now() -> WorkersView | None:
            if self.connection.client is not client:  # disconnected, or connected elsewhere since
                return None
            return WorkersView(client.workers(ASK_TIMEOUT_S), client.hub_cache, client.traffic(),
                               progress.crossing(), refresh=now)

        return WorkersView(client.workers(), client.hub_cache, client.traffic(), progress.crossing(), refresh=now)

    @magic_arguments()
    @worker_option("reset this notebook's session only on")
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
            reset = self.connection.connected().reset(args.worker)
        except (NoSuchWorker, EngineError) as exc:
            raise UsageError(str(exc)) from None
        print(describe_reset(reset, args.worker))
