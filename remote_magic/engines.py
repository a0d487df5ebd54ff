"""The engines by address scheme, and ``connect``, which opens the one an address names.

As distributed's ``comm/registry.py`` picks a backend by scheme (``tcp://``, ``ucx://``), ``connect`` reads
the address's scheme once (``Address``) and opens the engine registered for it::

    rmc1.…  (a token: its hub is reached over tcp)  ->  client.Client
    dask://HOST:PORT                                ->  dask_client.DaskClient

The table names each engine by module, so this module loads none of them: the one an address names is
imported when it is opened (Dask's ``distributed`` only for a ``dask://`` address). Every engine is an
``Engine`` (``engine.py``), opened with its classmethod ``open(address, options)``; above this, nothing
asks which one it got.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING

from .engine import DEFAULT_CONNECT_TIMEOUT_S, HUB_SCHEME, Address, ConnectOptions, Engine, parse
from .errors import TokenError

if TYPE_CHECKING:
    from .wire.tokens import Token

ENGINES: dict[str, str] = {HUB_SCHEME: "remote_magic.client:Client", "dask": "remote_magic.dask_client:DaskClient"}
"""The engine ``connect`` opens for each scheme of address, as ``module:class``."""


def engine_class(address: Address) -> type[Engine]:
    """The engine registered for the address's scheme; TokenError, saying what ``connect`` takes, for another."""
    target = ENGINES.get(address.scheme)
    if target is None:
        raise TokenError(f"{address.scheme}:// is not something connect opens: pass the line remote-worker printed "
                         f"(a token), or {', '.join(f'{s}://HOST:PORT' for s in ENGINES if s != HUB_SCHEME)} "
                         "for a Dask scheduler")
    module, name = target.split(":")
    engine: type[Engine] = getattr(importlib.import_module(module), name)
    return engine


def connect(token: "str | Token | None" = None, *, timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
            name: str | None = None, send_timeout: float | None = None, max_transfer: int | None = None) -> Engine:
    """Connect to the hub a token points at (default: $REMOTE_MAGIC_TOKEN), or to a Dask scheduler.

    A token opens a ``Client``; ``dask://HOST:PORT`` connects to that Dask scheduler instead and returns a
    ``DaskClient``: the same ``run``, ``execute``, ``execute_all``, ``split`` and ``map``, with Dask placing the
    jobs (no GPU kernels, retries, require or prefer there: name a worker instead). Both are an ``Engine``.

    Raises ConnectionFailed within ``timeout`` seconds with what to check when the hub can't
    be reached or refuses the token. The engine is a context manager.

    Jobs are never dropped: when more are submitted than the link to the hub carries, ``submit``
    and ``run`` wait for room; with ``send_timeout`` they wait at most that long, then raise Busy.

    ``max_transfer`` bounds the bytes this client sends and receives in all (a tunnel's monthly cap):
    a job that would send more than is left raises OverBudget before anything is sent, and results that
    would pass it stay on the worker as handles, saying so (``bytes_sent``, ``bytes_received``).
    """
    token = token or os.environ.get("REMOTE_MAGIC_TOKEN")
    if not token:
        raise TokenError("no token: pass the line remote-worker printed, or set REMOTE_MAGIC_TOKEN")
    address = parse(token)
    return engine_class(address).open(address, ConnectOptions(timeout=timeout, name=name, send_timeout=send_timeout,
                                                               max_transfer=max_transfer))
