"""Find hubs on the local network (`remote-worker --lan`) by mDNS/DNS-SD, and connect to one with its token.

Needs the optional zeroconf package (the ``lan`` extra; ``install_command("lan")`` names the pip command for
this copy), imported only when a browse
starts. Discovery supplies a hub's current address; the token still decides which hub, and
authenticates to it.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Sequence
from typing import Any

from . import errors
from .engine import Engine
from .engines import connect
from .wire.discovery import DEFAULT_BROWSE_S, SERVICE_TYPE, DiscoveredHub, hub_from_record, require_zeroconf
from .wire.tokens import Token

log = logging.getLogger(__name__)

RESOLVE_TIMEOUT_S = 1.0
"""The longest one found service may take to answer for its address and TXT record."""


def discover(timeout: float = DEFAULT_BROWSE_S, *, token: str | Token | None = None,
             interfaces: Sequence[str] | None = None) -> list[DiscoveredHub]:
    """The remote-magic hubs that answer on the local network within ``timeout`` seconds.

    ``token``: stop as soon as the hub this token opens has answered (the hubs found until then are
    returned, that one included); ``interfaces``: the IPv4 addresses of this machine's interfaces to
    browse from (default: every interface). Raises DiscoveryError when zeroconf is not installed.
    """
    require_zeroconf()
    from zeroconf import InterfaceChoice, IPVersion, ServiceBrowser, ServiceStateChange, Zeroconf

    wanted = None if token is None else (token if isinstance(token, Token) else Token.decode(token))
    names: queue.Queue[str] = queue.Queue()

    def on_change(**event: Any) -> None:  # zeroconf's thread: hand the name over, resolve it here
        if event["state_change"] in (ServiceStateChange.Added, ServiceStateChange.Updated):
            names.put(event["name"])

    try:
        zc = Zeroconf(interfaces=list(interfaces) if interfaces else InterfaceChoice.All, ip_version=IPVersion.V4Only)
    except OSError as exc:
        raise errors.DiscoveryError(f"can't browse the LAN by mDNS: {exc}") from exc
    found: dict[str, DiscoveredHub] = {}
    deadline = time.monotonic() + timeout
    browser = ServiceBrowser(zc, SERVICE_TYPE, handlers=[on_change])
    try:
        while (left := deadline - time.monotonic()) > 0:
            try:
                name = names.get(timeout=left)
            except queue.Empty:
                break
            info = zc.get_service_info(SERVICE_TYPE, name, timeout=int(1000 * min(RESOLVE_TIMEOUT_S, left) + 1))
            hub = None if info is None else hub_from_record(
                name, info.parsed_addresses(), info.port, dict(info.properties))
            if hub is None:
                log.debug("ignoring %s: no well-formed remote-magic advertisement", name)
                continue
            found[name] = hub
            if wanted is not None and hub.matches(wanted):
                break
    finally:
        browser.cancel()
        zc.close()
    return sorted(found.values(), key=lambda hub: (hub.name, hub.host, hub.address))


def connect_discovered(token: str | Token, hub: DiscoveredHub, *, timeout: float) -> Engine:
    """Connect with ``token`` to a discovered hub, trying each address it was advertised at in turn.

    Raises TokenError when the token is for another hub, ConnectionFailed (the last address's) when
    none answers within ``timeout`` seconds in all.
    """
    if not hub.addresses:
        raise errors.DiscoveryError(f"hub {hub.name!r} was advertised without an address")
    deadline = time.monotonic() + timeout
    failure = errors.ConnectionFailed(f"{hub.name!r} answered at none of {', '.join(hub.endpoints())}")
    for endpoint in hub.endpoints():
        attempt = hub.token_for(token, endpoint)
        try:
            return connect(attempt, timeout=max(deadline - time.monotonic(), 0.5))
        except errors.ConnectionFailed as exc:
            log.info("%s did not answer at %s: %s", hub.name, endpoint, exc)
            failure = exc
    raise failure
