"""The ``remote-worker`` command: a hub and a worker on this machine, or a worker joining a hub."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import platform
import re
import signal
import ssl
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from remote_magic.errors import RemoteMagicError
from remote_magic.hub.advertise import LanAdvertisement, lan_interfaces
from remote_magic.hub.placement import DEFAULT_MIN_BATTERY, ON_BATTERY
from remote_magic.hub.served import ServedHub
from remote_magic.wire import keys as keystore, sizes
from remote_magic.wire.addresses import check_endpoint, parse_host_port, who_can_reach
from remote_magic.wire.frame_cache import DEFAULT_CACHE_BYTES
from remote_magic.wire.install import install_command
from remote_magic.wire.protocol import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_OUTAGE_GRACE_S,
    HEARTBEAT_INTERVAL_S,
    Role,
)
from remote_magic.wire.requirements import BUILTIN_TRAITS
from remote_magic.wire.sizes import human_size
from remote_magic.wire.tokens import Token, write_private

from . import DEFAULT_MAX_SESSIONS, DEFAULT_ORPHAN_GRACE_S

if TYPE_CHECKING:  # the supervisor needs the [worker] extra, which main() checks for first
    from remote_magic.hub.tunnel import Tunnel

    from .browser.server import TabServer
    from .browser.tab_workers import TabWorkers
    from .executor_processes import ExecutorOptions
    from .supervisor import Supervisor

log = logging.getLogger("remote-worker")

DEFAULT_LISTEN = "0.0.0.0:5587"
DEFAULT_BROWSER_LISTEN = "127.0.0.1:5588"
JOIN_TOKEN_ENV = "REMOTE_MAGIC_JOIN_TOKEN"
"""Where `remote-worker --join` reads its worker token: an environment variable is readable only
by its own user (/proc/PID/environ), a command line by everyone (ps)."""

NGROK_ON_COMMAND_LINE = (
    "--ngrok-authtoken would put your ngrok auth token on the command line, where every user of this machine "
    "can read it (ps). Set it in the environment instead: `NGROK_AUTHTOKEN=… remote-worker --ngrok`")


def parse_size(text: str) -> int:
    """'512M', '2GiB', '1.5g', '1000000' -> bytes, for argparse."""
    try:
        return sizes.parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def describe_gpu(gpu: dict[str, Any]) -> str:
    """The worker's GPU, as its start says it: what runs array work, and how much stays on the GPU between
    cells (--gpu-memory)."""
    if not gpu.get("adapter"):
        return f"no GPU: {gpu.get('reason') or 'GPU support is off (--gpu off)'}"
    where = f"{gpu['adapter']} ({gpu.get('backend')})"
    if not gpu.get("active"):
        return f"GPU {where}: not used: {gpu.get('reason')}"
    kept = human_size(gpu["gpu_memory"]) if gpu.get("gpu_memory") else "nothing"
    return f"GPU {where}; arrays kept on it between cells, per notebook: {kept} (--gpu-memory)"


def parse_label(text: str) -> tuple[str, str]:
    """'zone=lab' -> ('zone', 'lab'); 'fast' -> ('fast', 'true')."""
    key, _, value = text.partition("=")
    key, value = key.strip(), value.strip() if "=" in text else "true"
    if not re.match(r"^[A-Za-z_][A-Za-z0-9_.-]*$", key) or not value or any(c.isspace() for c in value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a label like KEY=VALUE (zone=lab, vram=24GB) or KEY")
    if key in BUILTIN_TRAITS:
        raise argparse.ArgumentTypeError(f"{key!r} is a trait every worker reports itself; pick another label name")
    return key, value


def _percent(text: str) -> int:
    if not text.strip().isdigit() or int(text) > 100:
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage from 0 to 100")
    return int(text)


def parse_listen(text: str) -> tuple[str, int]:
    try:
        return parse_host_port(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="remote-worker",
        description="Run notebook cells on this machine: starts a hub and a worker and prints the "
                    "line to paste into the notebook.")
    parser.add_argument("--listen", type=parse_listen, default=DEFAULT_LISTEN, metavar="HOST:PORT",
                        help=f"where the hub listens, IPv4 only (default {DEFAULT_LISTEN}; port 0 picks a free port)")
    parser.add_argument("--token-file", type=Path, metavar="PATH",
                        help="also write the client token to PATH (owner-only) once the worker accepts jobs")
    parser.add_argument("--join", nargs="?", const="", metavar="TOKEN",
                        help=f"join the hub a worker token points at instead of starting a hub; the token comes "
                             f"from ${JOIN_TOKEN_ENV} or --join-file (never the command line, which every "
                             "user of this machine can read)")
    parser.add_argument("--join-file", type=Path, metavar="PATH",
                        help="join the hub whose worker token is in PATH (implies --join)")
    parser.add_argument("--name", default=platform.node() or "worker", help="this worker's name in the fleet")
    parser.add_argument("--advertise", type=_endpoint, metavar="tcp://HOST:PORT",
                        help="the address to put in the token when you forward the port yourself")
    parser.add_argument("--lan", action="store_true",
                        help="advertise the hub on the local network by mDNS (DNS-SD), on the addresses it listens "
                             "on, so %%offload_connect --lan finds it; notebooks still need the token")
    parser.add_argument("--ngrok", action="store_true",
                        help="expose the hub through an ngrok TCP tunnel (needs NGROK_AUTHTOKEN, from your ngrok "
                             "account): notebooks anywhere reach it, Colab's included")
    parser.add_argument("--ngrok-authtoken", metavar="TOKEN",
                        help="refused: the command line is visible to every user of this machine (ps); set "
                             "$NGROK_AUTHTOKEN instead")
    parser.add_argument("--browser", nargs="?", const=DEFAULT_BROWSER_LISTEN, type=parse_listen, metavar="HOST:PORT",
                        help="serve a page (default on " + DEFAULT_BROWSER_LISTEN + "; port 0 picks a free one) whose "
                             "link makes any browser tab with WebGPU a GPU worker")
    parser.add_argument("--browser-cert", type=Path, metavar="PATH",
                        help="serve the --browser page over HTTPS with this certificate (a phone on the LAN needs "
                             "HTTPS); with --browser-key")
    parser.add_argument("--browser-key", type=Path, metavar="PATH", help="the private key of --browser-cert")
    parser.add_argument("--gpu", choices=["auto", "on", "off"], default=os.environ.get("REMOTE_MAGIC_GPU", "auto"),
                        help="auto: GPU kernels only on a hardware adapter; on: always; off: never")
    parser.add_argument("--adapter", default=os.environ.get("REMOTE_MAGIC_ADAPTER"), metavar="SUBSTRING",
                        help="use the GPU adapter whose name contains SUBSTRING")
    parser.add_argument("--backend", choices=["vulkan", "metal", "d3d12"],
                        default=os.environ.get("REMOTE_MAGIC_BACKEND"), help="use this wgpu backend")
    parser.add_argument("--gpu-memory", type=parse_size, metavar="SIZE",
                        help="keep up to SIZE of each notebook's arrays on the GPU between cells, so an unchanged "
                             "input isn't uploaded again (e.g. 4G; 0: none; default: half the adapter's largest "
                             "buffer, at most 2GB)")
    parser.add_argument("--max-memory", type=parse_size, metavar="SIZE",
                        help="kill a job whose processes (all it started) use more than SIZE (e.g. 8G), and the "
                             "largest Jupyter kernel when all of them together do; default: 90%% of RAM")
    parser.add_argument("--max-sessions", type=_positive_int, default=DEFAULT_MAX_SESSIONS, metavar="N",
                        help="keep at most N notebooks' interpreters at once; a new one beyond that replaces the "
                             f"least recently used (default {DEFAULT_MAX_SESSIONS})")
    parser.add_argument("--max-message-size", type=parse_size, default=DEFAULT_MAX_MESSAGE_BYTES, metavar="SIZE",
                        help="largest frame the hub accepts (default 2GiB)")
    parser.add_argument("--cache-size", type=parse_size, default=DEFAULT_CACHE_BYTES, metavar="SIZE",
                        help="how much of each notebook's large values the hub keeps, so one sent again crosses "
                             "as its digest (default 1GiB; 0: none)")
    parser.add_argument("--label", type=parse_label, action="append", default=[], metavar="KEY=VALUE",
                        help="a trait of your own that jobs can require (%%%%offload --require zone==lab); repeatable")
    parser.add_argument("--on-battery", choices=ON_BATTERY, default="last",
                        help="on battery: take jobs only when no plugged-in worker that matches is idle (last, the "
                             "default), never, or always")
    parser.add_argument("--min-battery", type=_percent, default=DEFAULT_MIN_BATTERY, metavar="PERCENT",
                        help=f"on battery below PERCENT, take no jobs (default {DEFAULT_MIN_BATTERY})")
    parser.add_argument("--jupyter-kernels", choices=["on", "off"], default="on",
                        help="on (the default): notebooks may run whole Jupyter kernels here through the hub "
                             "(`remote-worker kernelspec install` adds the kernel to Jupyter); off: refuse them")
    parser.add_argument("--kernels", choices=["on", "off"], dest="jupyter_kernels",
                        help=argparse.SUPPRESS)  # --jupyter-kernels' former name, still taken
    parser.add_argument("--jupyter-kernel-python", metavar="PATH",
                        help="the Python that runs those Jupyter kernels (needs ipykernel; default: this worker's "
                             "own)")
    parser.add_argument("--max-jupyter-kernels", type=_positive_int, metavar="N",
                        help="run at most N Jupyter kernels at once; one more is refused (default: no limit). "
                             "Together, with what they start, they are also held to --max-memory")
    parser.add_argument("--jupyter-kernel-grace", type=float, default=DEFAULT_ORPHAN_GRACE_S, metavar="SECONDS",
                        help="how long a Jupyter kernel whose notebook is gone (its link down past --outage-grace) "
                             f"lives on before it is killed; each kernel is told at start (default "
                             f"{DEFAULT_ORPHAN_GRACE_S:g})")
    # the former names, still taken
    parser.add_argument("--kernel-python", dest="jupyter_kernel_python", help=argparse.SUPPRESS)
    parser.add_argument("--max-kernels", type=_positive_int, dest="max_jupyter_kernels", help=argparse.SUPPRESS)
    parser.add_argument("--kernel-grace", type=float, dest="jupyter_kernel_grace", help=argparse.SUPPRESS)
    parser.add_argument("--outage-grace", type=float, default=DEFAULT_OUTAGE_GRACE_S, metavar="SECONDS",
                        help="how long a notebook or worker whose link went down (a dropped Wi-Fi, a tunnel "
                             "restarting) is waited for, its jobs and session kept, before it is taken for gone; "
                             f"at least the 5 s it takes to notice (default {DEFAULT_OUTAGE_GRACE_S:g})")
    parser.add_argument("--heartbeat-interval", type=float, default=HEARTBEAT_INTERVAL_S, metavar="SECONDS",
                        help=argparse.SUPPRESS)
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-vv for debug)")
    sub = parser.add_subparsers(dest="command")
    token = sub.add_parser("token", help="show the client token again (or replace the keys)")
    token.add_argument("--rotate", action="store_true", help="replace the keys: every old token stops working")
    token.add_argument("--worker", action="store_true", help="show the worker token (for remote-worker --join)")
    from remote_magic.kernel_provider.kernelspec import add_parser as add_kernelspec_parser

    add_kernelspec_parser(sub)
    return parser


def _positive_int(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
    return int(text)


def _endpoint(text: str) -> str:
    try:
        return check_endpoint(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _address_file() -> Path:
    """The address of the hub that started last with this home, running or not."""
    return keystore.config_dir() / "address"


def _running_file(pid: int) -> Path:
    """Where a running hub with this home keeps its address: one file per process, removed as it stops."""
    return keystore.config_dir() / "running" / str(pid)


def _running_addresses() -> dict[int, str]:
    """The addresses of the hubs running with this home now, by pid (files of processes gone are removed)."""
    found = {}
    for path in sorted((keystore.config_dir() / "running").glob("[0-9]*")):
        try:
            os.kill(int(path.name), 0)
            found[int(path.name)] = path.read_text().strip()
        except ProcessLookupError:  # it ended without removing its file (killed)
            path.unlink(missing_ok=True)
        except (ValueError, OSError):  # not a pid, or a file that went meanwhile
            continue
    return found


def show_token(args: argparse.Namespace) -> int:
    try:
        keys = keystore.rotate() if args.rotate else keystore.load_or_create()
    except OSError as exc:  # the write is atomic: on a full disk the old keys stay as they were
        print(f"remote-worker: can't write the keys in {keystore.config_dir()}: {exc.strerror}. Nothing changed: "
              "the tokens you have still work. Free some space (or fix the folder's permissions) and run it again",
              file=sys.stderr)
        return 1
    running = _running_addresses()
    if len(set(running.values())) > 1:
        listed = ", ".join(f"{address} (pid {pid})" for pid, address in running.items())
        print(f"remote-worker: several hubs run with this home ({keystore.config_dir()}): {listed}. Their tokens "
              "differ only by address: give each remote-worker its own REMOTE_MAGIC_HOME, or stop all but one",
              file=sys.stderr)
        return 1
    address_file = _address_file()
    if not running and not address_file.exists():
        print("remote-worker: no hub has run on this machine yet; start `remote-worker` first", file=sys.stderr)
        return 1
    if args.rotate:
        print("remote-worker: keys replaced; old tokens no longer work. A running remote-worker picks "
              "the new keys up within a few seconds.", file=sys.stderr)
    role = Role.WORKER if args.worker else Role.CLIENT
    address = next(iter(running.values())) if running else address_file.read_text().strip()
    print(keys.token(role, address).encode())
    return 0


KEY_CHECK_INTERVAL_S = 2.0
"""How often a running remote-worker looks for keys replaced by `remote-worker token --rotate`."""


class LocalHub(ServedHub):
    """The hub remote-worker serves by default: keys kept on disk, so tokens outlive a restart, and
    picked up again after `remote-worker token --rotate`."""

    def __init__(self, args: argparse.Namespace) -> None:
        host, port = args.listen
        super().__init__(keystore.load_or_create(), host, port, ngrok=args.ngrok, advertise=args.advertise,
                         heartbeat_interval=args.heartbeat_interval, outage_grace=args.outage_grace,
                         max_message_bytes=args.max_message_size,
                         cache_bytes=args.cache_size, jupyter_kernels=args.jupyter_kernels == "on")
        self.key_mtime = keystore.key_file().stat().st_mtime
        write_private(_address_file(), self.address)
        write_private(_running_file(os.getpid()), self.address)

    def close(self) -> None:
        """Stop the hub, and say so to `remote-worker token`."""
        _running_file(os.getpid()).unlink(missing_ok=True)
        super().close()

    def local_worker(self, name: str, options: ExecutorOptions, max_sessions: int,
                     placement: dict[str, Any] | None = None, **kernel_options: Any) -> Supervisor:
        """The worker in this process, dialing the hub in-process (no TCP, no encryption, no copies);
        ``kernel_options``: the Supervisor's ``jupyter_kernels``, ``jupyter_kernel_python``,
        ``jupyter_kernel_grace_s`` and ``max_jupyter_kernels``."""
        from .supervisor import Supervisor

        token = self.keys.token(Role.WORKER, self.hub.local_endpoint)
        return Supervisor(token, name, options, context=self.hub.context, max_sessions=max_sessions,
                          placement=placement, **kernel_options)

    def reload_rotated_keys(self) -> bool:
        """Pick up keys replaced by `remote-worker token --rotate`; True when they changed."""
        mtime = keystore.key_file().stat().st_mtime
        if mtime == self.key_mtime:
            return False
        self.key_mtime = mtime
        self.set_keys(keystore.load_or_create())
        log.warning("keys rotated: old tokens no longer work")
        return True


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="remote-worker: %(levelname)s %(name)s: %(message)s")
    if args.ngrok_authtoken is not None:
        print(f"remote-worker: {NGROK_ON_COMMAND_LINE}", file=sys.stderr)
        return 2
    if args.command == "token":
        return show_token(args)
    if args.command == "kernelspec":  # on the notebook's machine, which may lack the worker's packages
        from remote_magic.kernel_provider.kernelspec import run_command

        return run_command(args)
    missing = missing_worker_packages(args)
    if missing:
        print(f"remote-worker: this machine lacks {', '.join(missing)}, which a worker needs. Install the "
              f"worker side with:\n\n    {install_command('worker')}\n\n(remote-magic without [worker] is the "
              "notebook side.)", file=sys.stderr)
        return 2
    from .browser.tab_workers import TabWorkers, tls_context
    from .descendants import hide_process_memory, tree
    from .executor_processes import ExecutorOptions
    from .own_wheel import ServedWheel
    from .supervisor import Supervisor

    try:
        join = join_token(args)
        lan = lan_interfaces(args.listen[0]) if args.lan and join is None else None
        tls = tls_context(args.browser_cert, args.browser_key)
    except (ValueError, RemoteMagicError) as exc:
        print(f"remote-worker: {exc}", file=sys.stderr)
        return 2
    if args.lan and join is not None:
        print("remote-worker: --lan advertises the hub this command starts; a worker that joins another hub "
              "has none (run --lan where that hub runs)", file=sys.stderr)
        return 2
    # Whatever a job starts stays this process's to count and kill (descendants.py), and no job can read
    # this process's environment (the join and ngrok tokens) or memory, unless it runs as root.
    tree().adopt_orphans()
    hide_process_memory()
    options = ExecutorOptions(args.gpu, args.adapter, args.backend, args.max_memory or _default_memory_limit(),
                              gpu_memory_bytes=args.gpu_memory)
    placement = {"labels": dict(args.label), "on_battery": args.on_battery, "min_battery": args.min_battery}
    kernel_options = {"jupyter_kernels": args.jupyter_kernels == "on",
                      "jupyter_kernel_python": args.jupyter_kernel_python,
                      "jupyter_kernel_grace_s": args.jupyter_kernel_grace,
                      "max_jupyter_kernels": args.max_jupyter_kernels}
    local: LocalHub | None = None
    supervisor: Supervisor | None = None
    advertisement: LanAdvertisement | None = None
    tabs: Tabs | None = None
    wheel: ServedWheel | None = None

    def make_worker(name: str, options: ExecutorOptions, placement: dict[str, Any],
                    **kernel_options: Any) -> Supervisor:
        if local is not None:
            return local.local_worker(name, options, args.max_sessions, placement, **kernel_options)
        assert join is not None
        return Supervisor(Token.decode(join), name, options, max_sessions=args.max_sessions, placement=placement,
                          **kernel_options)

    try:
        if join is None:
            local = LocalHub(args)
            # The notebook side's wheel of this very copy, packed while the worker starts.
            wheel = ServedWheel(args.listen[0], parse_host_port(local.address.removeprefix("tcp://"))[0],
                                advertised=bool(args.advertise))
        supervisor = make_worker(args.name, options, placement, **kernel_options)
        supervisor.start()
        if local is not None and lan is not None:
            advertisement = LanAdvertisement(args.name, local.keys.server_public, local.hub.port, lan)
        if args.browser is not None:
            tabs = Tabs(args, TabWorkers(lambda *a: make_worker(*a, jupyter_kernels=False), options, placement), tls,
                        local.tunnel if local is not None else None)
        if wheel is not None and local is not None and local.tunnel is not None:  # after the page's, which needs one
            wheel.expose_through(local.tunnel)
    except (RemoteMagicError, OSError, RuntimeError) as exc:
        print(f"remote-worker: {exc}", file=sys.stderr, flush=True)
        if supervisor is not None:
            supervisor.stop()
        if wheel is not None:
            wheel.close()
        if local is not None:
            local.close()
        return 1
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    if local is not None:
        client_token = local.token(Role.CLIENT).encode()
        if args.token_file:
            write_private(args.token_file, client_token + "\n")
        print(f"remote-worker: worker {supervisor.name!r} is ready. In your notebook run:\n", flush=True)
        cell = [wheel.install_line() if wheel is not None else "", "%load_ext remote_magic",
                f"%offload_connect {client_token}"]
        print("\n".join(line for line in cell if line) + "\n", flush=True)
        reach = who_can_reach(local.address, tunnel=local.tunnel is not None, advertised=bool(args.advertise))
        print(f"remote-worker: {reach}\n", flush=True)
        if wheel is not None:
            print(f"remote-worker: {wheel.reach()}\n", flush=True)
        if advertisement is not None:
            print(f"remote-worker: advertising this hub on the LAN as {advertisement.service_name!r} (mDNS on "
                  f"{', '.join(advertisement.interfaces)} only; key fingerprint {advertisement.fingerprint[:16]}). "
                  "A notebook on this network finds its current address with %offload_connect --lan TOKEN\n",
                  flush=True)
    else:
        print(f"remote-worker: worker {supervisor.name!r} joined {supervisor.token.address}", flush=True)
    print(f"remote-worker: {describe_gpu(supervisor.gpu)}", flush=True)
    if tabs is not None:
        tabs.announce()
    try:
        while not stop.wait(KEY_CHECK_INTERVAL_S):
            if local is not None and local.reload_rotated_keys() and args.token_file:
                write_private(args.token_file, local.token(Role.CLIENT).encode() + "\n")
    finally:
        if tabs is not None:
            tabs.close()
        if advertisement is not None:
            advertisement.close()
        supervisor.stop()
        if wheel is not None:
            wheel.close()
        if local is not None:
            local.close()
    return 0


class Tabs:
    """The ``--browser`` page, reached through an ngrok HTTPS tunnel with ``--ngrok``."""

    def __init__(self, args: argparse.Namespace, workers: TabWorkers, tls: ssl.SSLContext | None,
                 hub_tunnel: Tunnel | None) -> None:
        from remote_magic.hub.tunnel import open_https_tunnel

        from .browser.tab_workers import serve_tabs

        host, port = args.browser
        self.server: TabServer = serve_tabs(host, port, workers, tls=tls)
        self.tunnel: Tunnel | None = None
        if args.ngrok:
            try:  # beside the hub's, on its session: a free ngrok account has one at a time
                self.tunnel = (hub_tunnel.https_endpoint(self.server.port) if hub_tunnel is not None
                               else open_https_tunnel(self.server.port))
            except BaseException:
                self.server.close()
                raise
            self.server.public_url = self.tunnel.public_address

    def announce(self) -> None:
        """Print the link to open, who can open it, and its QR code where a phone's camera can use it."""
        from .browser.announce import PageAddress, announcement

        page = PageAddress(self.server.host, self.server.link, tls=self.server.tls is not None,
                           tunnel=self.tunnel is not None)
        print(announcement(page), end="", flush=True)

    def close(self) -> None:
        """Stop serving the page; the tabs' workers leave."""
        if self.tunnel is not None:
            self.tunnel.close()
        self.server.close()


def join_token(args: argparse.Namespace) -> str | None:
    """The worker token to join with (from --join-file or $REMOTE_MAGIC_JOIN_TOKEN), or None to serve a hub."""
    if args.join:  # a value on the command line
        raise ValueError(
            "a token on the command line can be read by every user of this machine (ps). Give it through the "
            f"environment, `{JOIN_TOKEN_ENV}=rmw1.… remote-worker --join`, or a file only you can read, "
            "`remote-worker --join-file PATH`")
    if args.join_file is not None:
        path: Path = args.join_file
        try:
            return path.read_text().strip()
        except OSError as exc:
            raise ValueError(f"can't read the worker token from {args.join_file}: {exc.strerror}") from None
    if args.join is None:
        return None
    token = os.environ.get(JOIN_TOKEN_ENV, "").strip()
    if not token:
        raise ValueError(f"--join needs the worker token in ${JOIN_TOKEN_ENV} (or use --join-file PATH); "
                         "`remote-worker token --worker` on the hub's machine prints it")
    return token


def missing_worker_packages(args: argparse.Namespace) -> list[str]:
    """The [worker] extra's packages these options need and this environment lacks."""
    needed = ["psutil", "xxhash"] + (["wgpu"] if args.gpu != "off" else []) + (["ngrok"] if args.ngrok else []) \
        + (["zeroconf"] if args.lan else []) + (["aiohttp", "segno"] if args.browser is not None else [])
    return [name for name in needed if importlib.util.find_spec(name) is None]


def _default_memory_limit() -> int:
    import psutil

    return int(psutil.virtual_memory().total * 0.9)


if __name__ == "__main__":
    sys.exit(main())
