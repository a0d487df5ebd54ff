"""What the notebook's groups of magics share: one connection (`NotebookConnection`), their settings
(`OffloadSettings`, which users configure as ``c.OffloadMagics.*``), and their base class (`MagicsGroup`).
"""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics
from traitlets import Float
from traitlets.config import Configurable

from ..engine import Engine
from ..engines import connect
from ..hub.served import ServedHub
from ..wire.keys import HubKeys
from ..wire.protocol import Role


class OffloadSettings(Configurable):
    """The magics' settings. Users set them under the name ``OffloadMagics`` (the class below)."""

    connect_timeout = Float(10.0, help="Seconds %offload_connect waits for the hub.").tag(config=True)
    default_timeout = Float(None, allow_none=True, help="Default --timeout of %%offload, in seconds.").tag(config=True)


class OffloadMagics(OffloadSettings):
    """``OffloadSettings`` under the name users configure them by, kept from before they had a class of their
    own: ``c.OffloadMagics.default_timeout = 60`` in a config file, or ``%config OffloadMagics.default_timeout =
    60`` (``%config OffloadMagics`` lists them). traitlets takes ``c.OffloadSettings.*`` for them too."""


class NotebookConnection:
    """The engine this notebook is connected through (a hub's ``Client``, or a ``DaskClient``: the magics never
    ask which), the hub it serves, if any, and the magics' settings."""

    def __init__(self, settings: OffloadSettings) -> None:
        self.settings = settings
        self.client: Engine | None = None
        self.served: ServedHub | None = None  # a hub this kernel serves (%offload_serve)

    def connected(self) -> Engine:
        """The engine, or a UsageError saying how to connect."""
        if self.client is None:
            raise UsageError("not connected: run %offload_connect TOKEN first "
                             "(the token is the line remote-worker printed)")
        return self.client

    def connect(self, token: str | None, timeout: float) -> Engine:
        """Connect to the hub ``token`` opens (or the engine its scheme names; default: $REMOTE_MAGIC_TOKEN),
        in place of any connection."""
        self.disconnect()
        self.client = connect(token, timeout=timeout)
        return self.client

    def connect_on_lan(self, token: str | None, browse_s: float | None, timeout: float) -> Engine | None:
        """List the hubs advertised on this network; with a token, connect to its hub where it is found now.

        Without a token this only lists (None): the connection this notebook has stays.
        """
        from ..lan import connect_discovered  # zeroconf: only for --lan
        from .lan import find_lan_hub

        found = find_lan_hub(token, browse_s)
        if found is None:
            return None
        self.disconnect()
        client = self.client = connect_discovered(*found, timeout=timeout)
        return client

    def serve(self, host: str, port: int, *, ngrok: bool, ngrok_authtoken: str | None, advertise: str | None,
              timeout: float) -> ServedHub:
        """Host a hub in this kernel (in place of any connection) and connect to it."""
        self.disconnect()
        # A notebook's hub lives as long as the kernel: fresh keys each time.
        served = self.served = ServedHub(HubKeys.generate(), host, port, ngrok=ngrok,
                                         ngrok_authtoken=ngrok_authtoken, advertise=advertise)
        try:
            self.client = connect(served.loopback_token(Role.CLIENT), timeout=timeout)
        except BaseException:
            self.disconnect()
            raise
        return served

    def disconnect(self) -> None:
        """Close the client, and a hub this kernel serves; running jobs are cancelled."""
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.served is not None:
            self.served.close()
            self.served = None


class MagicsGroup(Magics):
    """What every group of remote-magic magics shares: the notebook's connection and its settings."""

    def __init__(self, shell: Any, connection: NotebookConnection, **kwargs: Any) -> None:
        super().__init__(shell=shell, **kwargs)
        self.connection = connection

    @property
    def namespace(self) -> dict[str, Any]:
        """The notebook's variables."""
        assert self.shell is not None  # IPython registers magics with their shell
        return self.shell.user_ns  # type: ignore[no-any-return]

    def close(self) -> None:
        """Undo what this group hooked into the shell (the extension is unloading)."""
