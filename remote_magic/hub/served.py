"""A hub this process serves: bound, reachable at an address peers can dial, and its tokens.

`remote-worker` (with keys kept on disk) and `%offload_serve` (with fresh keys per kernel) both
serve their hub through this one class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..wire.addresses import advertised_address, bind_endpoint
from ..wire.frame_cache import DEFAULT_CACHE_BYTES
from ..wire.keys import HubKeys
from ..wire.protocol import DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_OUTAGE_GRACE_S, HEARTBEAT_INTERVAL_S, Role
from ..wire.tokens import Token
from .broker import Hub

if TYPE_CHECKING:
    from .tunnel import Tunnel


class ServedHub:
    """A started hub on ``host:port`` (port 0: any free port), and the address that goes into tokens.

    The address is an ngrok tunnel's public one with ``ngrok``, ``advertise`` when you forward
    the port yourself, else the listening host (this machine's LAN address for 0.0.0.0).
    """

    def __init__(self, keys: HubKeys, host: str, port: int, *, ngrok: bool = False,
                 ngrok_authtoken: str | None = None, advertise: str | None = None,
                 heartbeat_interval: float = HEARTBEAT_INTERVAL_S, outage_grace: float = DEFAULT_OUTAGE_GRACE_S,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, cache_bytes: int = DEFAULT_CACHE_BYTES,
                 jupyter_kernels: bool = True) -> None:
        self.keys = keys
        self.hub = Hub(keys, bind_endpoint(host, port), heartbeat_interval=heartbeat_interval,
                       outage_grace=outage_grace, max_message_bytes=max_message_bytes, cache_bytes=cache_bytes,
                       jupyter_kernels=jupyter_kernels).start()
        self.tunnel: Tunnel | None = None
        try:
            if ngrok:
                from .tunnel import open_tcp_tunnel

                self.tunnel = open_tcp_tunnel(self.hub.port, authtoken=ngrok_authtoken)
                self.address = self.tunnel.public_address
            else:
                self.address = advertised_address(host, self.hub.port, advertise)
        except BaseException:
            self.hub.stop()
            raise

    def token(self, role: Role) -> Token:
        """The token a peer of this role pastes to reach the hub from elsewhere."""
        return self.keys.token(role, self.address)

    def loopback_token(self, role: Role) -> Token:
        """A token for a peer on this machine: it dials the hub's port directly."""
        return self.keys.token(role, f"tcp://127.0.0.1:{self.hub.port}")

    def set_keys(self, keys: HubKeys) -> None:
        """Replace the keys: old tokens stop working, and peers holding them are dropped."""
        self.keys = keys
        self.hub.set_keys(keys)

    def close(self) -> None:
        """Close the tunnel, then stop the hub."""
        if self.tunnel is not None:
            self.tunnel.close()
        self.hub.stop()
