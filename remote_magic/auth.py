"""CurveZMQ authentication for the hub: only the keys the hub issued get in.

libzmq asks this ZAP handler about every CURVE handshake before any message from the peer is
delivered, so a peer without a valid token never gets a byte to the hub's code, let alone to
the unpickler. The User-Id it returns is the peer's role and key, which the hub reads off each message.
"""

from __future__ import annotations

import logging

import zmq
from zmq.utils import z85
from zmq.auth.thread import ThreadAuthenticator

from .keys import HubKeys

log = logging.getLogger(__name__)


class HubAuthenticator(ThreadAuthenticator):
    """A ZAP handler that accepts the hub's client and worker keys and names the role."""

    def __init__(self, context: zmq.Context, keys: HubKeys) -> None:
        super().__init__(context, log=log)
        self.keys = keys
        self.configure_curve_callback(domain="*", credentials_provider=self)

    def callback(self, domain: str, client_key: bytes) -> bool:
        """Called by pyzmq's ZAP handler with the peer's Z85 public key."""
        allowed = self.keys.role_of(client_key) is not None
        if not allowed:
            log.warning("refused a CURVE handshake from an unknown key")
        return allowed

    def curve_user_id(self, client_public_key: bytes) -> str:
        # "role:key", so the hub can tell the role and re-check the key after a rotation.
        key = z85.encode(client_public_key)
        role = self.keys.role_of(key)
        return f"{role.value}:{key.decode()}" if role else ""
