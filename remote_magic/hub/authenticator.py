"""CurveZMQ authentication for the hub: only the keys the hub issued get in.

libzmq asks this ZAP handler about every CURVE handshake before any message from the peer is
delivered, so a peer without a valid token never gets a byte to the hub's code, let alone to
the unpickler. The User-Id it returns is the peer's role and key, which the hub reads off each
message. An address with too many failed handshakes is refused outright for a while.

Built on pyzmq's public ``zmq.auth`` API only: a ``ThreadAuthenticator`` whose CURVE check is a
credentials provider (``configure_curve_callback``), and whose User-Id mapping is ``curve_user_id``.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict, deque
from typing import Any

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from ..wire.keys import HubKeys

log = logging.getLogger(__name__)

MAX_FAILED_HANDSHAKES = 20
"""Failed handshakes one address may make within FAILED_HANDSHAKE_WINDOW_S before it is blocked."""

FAILED_HANDSHAKE_WINDOW_S = 60.0


class HubCredentials:
    """The CURVE credentials provider: a key the hub issued passes, unless its address is blocked.

    An address that made ``MAX_FAILED_HANDSHAKES`` failed handshakes within
    ``FAILED_HANDSHAKE_WINDOW_S`` is refused whatever key it shows, until its failures age out.
    """

    def __init__(self, keys: HubKeys) -> None:
        self.keys = keys
        self.address = ""  # whose handshake is being checked (the auth thread checks one at a time)
        self._failures: defaultdict[str, deque[float]] = defaultdict(deque)

    def callback(self, domain: str, client_key: bytes) -> bool:
        """Called by pyzmq's ZAP handler with the peer's Z85 public key: may it in?"""
        if self._blocked(self.address):
            return False
        if self.keys.role_of(client_key) is not None:
            return True
        failures = self._failures[self.address]
        failures.append(time.monotonic())
        log.warning("refused a CURVE handshake from %s: unknown key", self.address or "an unknown address")
        if len(failures) == MAX_FAILED_HANDSHAKES:
            log.warning("blocking %s for %.0f s after %d failed handshakes", self.address,
                        FAILED_HANDSHAKE_WINDOW_S, MAX_FAILED_HANDSHAKES)
        return False

    def _blocked(self, address: str) -> bool:
        failures = self._failures.get(address)
        if not failures:
            return False
        horizon = time.monotonic() - FAILED_HANDSHAKE_WINDOW_S
        while failures and failures[0] < horizon:
            failures.popleft()
        if not failures:
            del self._failures[address]
        return len(failures) >= MAX_FAILED_HANDSHAKES


class HubAuthenticator(ThreadAuthenticator):
    """A ZAP handler, on its own thread, that accepts the hub's client and worker keys and names the role.

    ``keys`` may be replaced while it runs (rotation): the next handshake is checked against the new ones.
    """

    def __init__(self, context: zmq.Context[Any], keys: HubKeys) -> None:
        super().__init__(context, log=log)
        self.credentials = HubCredentials(keys)
        self.configure_curve_callback(domain="*", credentials_provider=self.credentials)

    @property
    def keys(self) -> HubKeys:
        return self.credentials.keys

    @keys.setter
    def keys(self, keys: HubKeys) -> None:
        self.credentials.keys = keys

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        """Check one handshake; the credentials provider learns the address it comes from first."""
        self.credentials.address = msg[3].decode("utf-8", "replace") if len(msg) > 3 else ""
        await super().handle_zap_message(msg)

    def curve_user_id(self, client_public_key: bytes) -> str:
        """The User-Id the hub reads off each message: "role:key", so it can tell the role and re-check
        the key after a rotation."""
        key = z85.encode(client_public_key)
        role = self.keys.role_of(key)
        return f"{role.value}:{key.decode()}" if role else ""
