"""``remote-worker kernelspec install|list|remove``: kernelspecs that run a whole kernel on a worker.

Run on the notebook's machine (where Jupyter runs). The kernelspec names the provisioner and where
it finds the client token at each start: an environment variable (default ``REMOTE_MAGIC_TOKEN``)
or a file; the token itself goes into kernel.json (owner-only) only with ``--store-token``. Installed
through jupyter_client's KernelSpecManager, so JupyterLab's launcher, VS Code, ``jupyter console
--kernel NAME``, nbclient and papermill all see it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from remote_magic.errors import TokenError
from remote_magic.wire.tokens import Token

PROVISIONER_NAME = "remote-magic-provisioner"
DEFAULT_NAME = "remote-magic"
DEFAULT_TOKEN_ENV = "REMOTE_MAGIC_TOKEN"


def kernel_json(display_name: str, worker: str | None = None, token_env: str = DEFAULT_TOKEN_ENV,
                token_file: str | None = None, token: str | None = None, share_token: bool = False) -> dict[str, Any]:
    """A kernelspec whose kernel runs on a worker; ``argv`` is what the worker runs, for the record."""
    config: dict[str, Any] = {"token_env": token_env}
    if share_token:
        config["share_token"] = True
    if worker:
        config["worker"] = worker
    if token_file:
        config["token_file"] = token_file
    if token:
        config["token"] = token
    return {
        "argv": ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": display_name,
        "language": "python",
        "interrupt_mode": "signal",
        "metadata": {"kernel_provisioner": {"provisioner_name": PROVISIONER_NAME, "config": config}},
    }


def install(name: str = DEFAULT_NAME, display_name: str | None = None, worker: str | None = None,
            token_env: str = DEFAULT_TOKEN_ENV, token_file: str | None = None, store_token: bool = False,
            user: bool = True, prefix: str | None = None, share_token: bool = False) -> str:
    """Install the kernelspec; returns the folder it went to."""
    from jupyter_client.kernelspec import KernelSpecManager

    token = None
    if store_token:
        text = Path(token_file).expanduser().read_text() if token_file else os.environ.get(token_env, "")
        token = Token.decode(text.strip()).encode()  # TokenError when it isn't one
        token_file = None
    elif token_file:
        token_file = str(Path(token_file).expanduser().resolve())
    shown = display_name or f"Python (remote-magic{': ' + worker if worker else ''})"
    with tempfile.TemporaryDirectory() as folder:
        spec = Path(folder) / "kernel.json"
        spec.write_text(json.dumps(kernel_json(shown, worker, token_env, token_file, token, share_token), indent=1))
        if token:
            spec.chmod(0o600)
        target = KernelSpecManager().install_kernel_spec(folder, name, user=user and prefix is None,
                                                         prefix=prefix)
    if token:
        (Path(target) / "kernel.json").chmod(0o600)
        Path(target).chmod(0o700)
    return str(target)


def installed() -> dict[str, dict[str, Any]]:
    """The kernelspecs that use this provisioner: {name: {"resource_dir", "spec"}}."""
    from jupyter_client.kernelspec import KernelSpecManager

    specs: dict[str, dict[str, Any]] = KernelSpecManager().get_all_specs()
    return {name: found for name, found in specs.items()
            if (found["spec"].get("metadata") or {}).get("kernel_provisioner", {}).get("provisioner_name")
            == PROVISIONER_NAME}


def remove(name: str) -> str:
    """Remove one of this provisioner's kernelspecs; returns its folder. KeyError when there is none."""
    from jupyter_client.kernelspec import KernelSpecManager

    if name not in installed():
        raise KeyError(name)
    return str(KernelSpecManager().remove_kernel_spec(name))


def add_parser(commands: Any) -> None:
    """Add ``kernelspec`` to remote-worker's subcommands."""
    parser = commands.add_parser("kernelspec", help="install, list or remove Jupyter kernelspecs whose kernel "
                                                    "runs on a worker (run these on the notebook's machine)")
    actions = parser.add_subparsers(dest="action", required=True)
    add = actions.add_parser("install", help="install a kernelspec (JupyterLab's launcher shows it)")
    add.add_argument("--name", default=DEFAULT_NAME, help=f"the kernelspec's name (default {DEFAULT_NAME})")
    add.add_argument("--display-name", help="what the launcher shows")
    add.add_argument("--worker", help="run kernels on this worker (default: the hub picks one)")
    add.add_argument("--token-env", default=DEFAULT_TOKEN_ENV, metavar="NAME",
                     help=f"read the client token from this environment variable at each start "
                          f"(default {DEFAULT_TOKEN_ENV})")
    add.add_argument("--token-file", metavar="PATH", help="read the client token from this file at each start")
    add.add_argument("--store-token", action="store_true",
                     help="write the token itself (from --token-file or the variable) into kernel.json, "
                          "owner-only: anyone who can read that file can run code on the worker")
    add.add_argument("--share-token", action="store_true",
                     help="give the kernel the token as well ($REMOTE_MAGIC_TOKEN on the worker), so %%offload_connect "
                          "inside it reaches this hub and %%%%offload cells there can use the other workers")
    add.add_argument("--prefix", metavar="PATH", help="install under PATH/share/jupyter/kernels (e.g. sys.prefix, for "
                                                      "one Python environment) instead of for this user")
    actions.add_parser("list", help="the kernelspecs that run on a worker")
    drop = actions.add_parser("remove", help="remove one of them")
    drop.add_argument("name")


def run_command(args: argparse.Namespace) -> int:
    """``remote-worker kernelspec ...``: what it did is printed; an error is one line on stderr."""
    if args.action == "install":
        try:
            folder = install(args.name, args.display_name, args.worker, args.token_env, args.token_file,
                             args.store_token, prefix=args.prefix, share_token=args.share_token)
        except (TokenError, OSError) as exc:
            print(f"remote-worker: {exc}", file=sys.stderr)
            return 1
        print(f"installed kernelspec {args.name!r} in {folder}")
        if not args.store_token and not args.token_file and not os.environ.get(args.token_env):
            print(f"note: set ${args.token_env} to the client token (rmc1.…) before starting Jupyter")
        return 0
    if args.action == "list":
        for name, found in sorted(installed().items()):
            config = found["spec"]["metadata"]["kernel_provisioner"].get("config") or {}
            source = "token stored in kernel.json" if config.get("token") else \
                f"token from {config['token_file']}" if config.get("token_file") else \
                f"token from ${config.get('token_env', DEFAULT_TOKEN_ENV)}"
            print(f"{name}\t{config.get('worker') or 'any worker'}\t{source}\t{found['resource_dir']}")
        return 0
    try:
        print(f"removed kernelspec {args.name!r} from {remove(args.name)}")
    except KeyError:
        print(f"remote-worker: no remote-magic kernelspec is named {args.name!r} "
              "(see remote-worker kernelspec list)", file=sys.stderr)
        return 1
    return 0
