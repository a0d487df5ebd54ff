"""LAN discovery's shared vocabulary: the DNS-SD service type, what a hub's TXT record says, fingerprints.

`remote-worker --lan` publishes its hub as a ``_remote-magic._tcp.local.`` service whose TXT
record holds only public facts::

    name=box  host=box.example  proto=RM3  version=0.9.0  fp=<hub key fingerprint>  port=5587

``fp`` is a digest of the hub's CurveZMQ public key, which every token of that hub carries too: a
notebook holding a token picks the discovered hub whose ``fp`` matches, and then authenticates with
the token as always. Discovery supplies an address, never credentials. What arrives over multicast
is unauthenticated, so every field is checked here before use, and a record that fails is ignored.
No sockets here: ``hub/advertise.py`` publishes, ``remote_magic/lan.py`` browses.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from dataclasses import dataclass

from zmq.utils import z85

from ..errors import DiscoveryError, TokenError
from .addresses import bind_endpoint
from .install import install_command
from .tokens import Token

SERVICE_TYPE = "_remote-magic._tcp.local."
"""The DNS-SD service type a hub is advertised under."""

"""What installs zeroconf, the one package LAN discovery needs (the [worker] extra includes it)."""

DEFAULT_BROWSE_S = 3.0
"""How long a browse listens for hubs when it isn't looking for one token's hub."""

FINGERPRINT_CHARS = 32
"""Hex digits of SHA-256 in a fingerprint (128 bits): a short, stable name for a hub's public key."""

_MAX_FIELD_CHARS = 200  # a TXT string is at most 255 bytes; anything longer was not written by a hub
_FINGERPRINT = re.compile(rf"^[0-9a-f]{{{FINGERPRINT_CHARS}}}$")


def fingerprint(server_public: bytes) -> str:
    """The fingerprint of a hub's public key (Z85, as in a token): what its TXT record advertises."""
    return hashlib.sha256(z85.decode(server_public)).hexdigest()[:FINGERPRINT_CHARS]


def token_fingerprint(token: str | Token) -> str:
    """The fingerprint of the hub a token opens."""
    parsed = token if isinstance(token, Token) else Token.decode(token)
    return fingerprint(parsed.server_public)


def txt_record(name: str, host: str, protocol: str, version: str, hub_fingerprint: str, port: int) -> dict[str, str]:
    """The TXT record a hub publishes: public facts only, never a key or a token."""
    return {"name": name[:_MAX_FIELD_CHARS], "host": host[:_MAX_FIELD_CHARS], "proto": protocol,
            "version": version, "fp": hub_fingerprint, "port": str(port)}


@dataclass(frozen=True)
class DiscoveredHub:
    """A hub found on the LAN: what its advertisement says. Connecting still needs its token.

    ``addresses`` are the IPv4 addresses it was advertised at (the first is the one ``address`` and
    ``token_for`` use); ``fingerprint`` names its public key, as ``token_fingerprint`` does a token's.
    """

    name: str
    host: str
    addresses: tuple[str, ...]
    port: int
    fingerprint: str
    protocol: str
    version: str
    service: str = ""

    @property
    def address(self) -> str:
        """``tcp://HOST:PORT`` at the first advertised address."""
        return self.endpoints()[0]

    def endpoints(self) -> list[str]:
        """``tcp://HOST:PORT`` at each advertised address, in order."""
        return [bind_endpoint(host, self.port) for host in self.addresses]

    def matches(self, token: str | Token) -> bool:
        """True when ``token`` opens this hub (its hub key has this fingerprint)."""
        return token_fingerprint(token) == self.fingerprint

    def token_for(self, token: str | Token, address: str | None = None) -> Token:
        """``token``'s credentials at this hub's discovered address (``address``: one of ``endpoints()``).

        Raises TokenError when the token is for another hub: discovery never replaces the token.
        """
        parsed = token if isinstance(token, Token) else Token.decode(token)
        if not self.matches(parsed):
            raise TokenError(f"this token is for another hub (key fingerprint {token_fingerprint(parsed)[:12]}…), "
                             f"not {self.name!r} ({self.fingerprint[:12]}…)")
        return parsed.with_address(address or self.address)


def hub_from_record(service: str, addresses: list[str], port: int | None,
                    properties: dict[bytes, bytes | None]) -> DiscoveredHub | None:
    """The hub an advertisement describes, or None when it isn't a well-formed remote-magic record."""
    text: dict[str, str] = {}
    for key, value in properties.items():
        if value is None or len(value) > _MAX_FIELD_CHARS:
            continue
        try:
            text[key.decode("ascii")] = value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    if not _FINGERPRINT.match(text.get("fp", "")) or port is None or not 0 < port < 65536:
        return None
    if text.get("port") not in (None, str(port)):
        return None  # the TXT record and the SRV record disagree: not a record a hub wrote
    ipv4 = tuple(a for a in addresses if _is_ipv4(a))
    if not ipv4:
        return None
    printable = {k: v for k, v in text.items() if v.isprintable()}
    return DiscoveredHub(name=printable.get("name", service), host=printable.get("host", ""), addresses=ipv4,
                         port=port, fingerprint=text["fp"], protocol=printable.get("proto", ""),
                         version=printable.get("version", ""), service=service)


def _is_ipv4(text: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(text), ipaddress.IPv4Address)
    except ValueError:
        return False


def require_zeroconf() -> None:
    """Import zeroconf (an optional extra) now, or raise a DiscoveryError naming the `pip install` that adds it."""
    try:
        import zeroconf  # noqa: F401  (imported here only to find out whether it can be)
    except ImportError:
        raise DiscoveryError(f"LAN discovery needs the zeroconf package, which this Python lacks. Install it with:"
                             f"\n\n    {install_command('lan')}\n") from None
