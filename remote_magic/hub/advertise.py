"""`remote-worker --lan`: advertise a hub on the local network by mDNS/DNS-SD (zeroconf).

Only on the addresses the hub listens on: its own IPv4 address, or each non-loopback IPv4 address of
this machine when it listens on 0.0.0.0. zeroconf is bound to those interfaces (``interfaces=``), so
no multicast leaves by any other. What is published is public (see ``wire/discovery.py``); a hub
found this way is useless without its token.
"""

from __future__ import annotations

import ipaddress
import logging
import platform
import re

from .._version import __version__
from ..errors import DiscoveryError
from ..wire.discovery import SERVICE_TYPE, fingerprint, require_zeroconf, txt_record
from ..wire.protocol import PROTOCOL_VERSION

log = logging.getLogger(__name__)

_WILDCARDS = ("0.0.0.0", "", "*")
_LABEL_CHARS = re.compile(r"[^A-Za-z0-9-]+")
_INSTANCE_CHARS = 40  # a DNS-SD instance name is one DNS label (63 bytes); the fingerprint's start follows


def lan_interfaces(listen_host: str) -> list[str]:
    """The IPv4 addresses to advertise a hub that listens on ``listen_host`` at (and to send multicast from).

    Raises DiscoveryError, saying what to listen on instead, when the hub can't be reached from the LAN.
    """
    if listen_host in _WILDCARDS:
        addresses = _non_loopback_ipv4()
        if not addresses:
            raise DiscoveryError("--lan: this machine has no IPv4 address besides loopback to advertise the hub on")
        return addresses
    try:
        address = ipaddress.ip_address(listen_host)
    except ValueError:
        address = None
    if listen_host == "localhost" or (address is not None and address.is_loopback):
        raise DiscoveryError(f"--lan: the hub listens on {listen_host} only, which no other machine can reach. "
                             "Listen on a LAN address, e.g. `--listen 0.0.0.0:5587` (every interface) or "
                             "`--listen 192.168.1.20:5587` (one)")
    if not isinstance(address, ipaddress.IPv4Address):
        raise DiscoveryError(f"--lan advertises IPv4 addresses: listen on this machine's IPv4 LAN address or "
                             f"0.0.0.0, not {listen_host}")
    return [str(address)]


def _non_loopback_ipv4() -> list[str]:
    import ifaddr  # zeroconf's own dependency

    found: list[str] = []
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            if isinstance(ip.ip, str) and not ipaddress.ip_address(ip.ip).is_loopback and ip.ip not in found:
                found.append(ip.ip)
    return found


class LanAdvertisement:
    """A hub's DNS-SD service, registered on ``interfaces`` until ``close()``.

    ``name``: the hub's name in the listing (remote-worker's --name); ``server_public``: the hub's
    public key (Z85), of which only the fingerprint is published.
    """

    def __init__(self, name: str, server_public: bytes, port: int, interfaces: list[str]) -> None:
        require_zeroconf()
        from zeroconf import Error as ZeroconfError, IPVersion, ServiceInfo, Zeroconf

        self.interfaces = list(interfaces)
        self.fingerprint = fingerprint(server_public)
        host = platform.node() or "remote-magic"
        label = _LABEL_CHARS.sub("-", host).strip("-")[:_INSTANCE_CHARS] or "remote-magic"
        instance = f"{name[:_INSTANCE_CHARS]} {self.fingerprint[:8]}"
        self.info = ServiceInfo(
            SERVICE_TYPE, f"{instance}.{SERVICE_TYPE}", port=port, server=f"{label}.local.",
            properties=txt_record(name, host, PROTOCOL_VERSION.decode(), __version__, self.fingerprint, port),
            parsed_addresses=self.interfaces)
        try:
            self.zeroconf = Zeroconf(interfaces=self.interfaces, ip_version=IPVersion.V4Only)
        except OSError as exc:
            raise DiscoveryError(f"--lan: can't open mDNS on {', '.join(self.interfaces)}: {exc}") from exc
        try:
            self.zeroconf.register_service(self.info, allow_name_change=True)
        except (ZeroconfError, OSError) as exc:
            self.zeroconf.close()
            raise DiscoveryError(f"--lan: can't advertise the hub by mDNS: {exc}") from exc
        log.info("advertising %s (fingerprint %s) on %s port %d", self.info.name, self.fingerprint,
                 ", ".join(self.interfaces), port)

    @property
    def service_name(self) -> str:
        """The DNS-SD instance name it was registered under (zeroconf renames it on a clash)."""
        return str(self.info.name)

    def close(self) -> None:
        """Withdraw the advertisement (a goodbye packet, so browsers forget the hub at once), then stop mDNS."""
        try:
            self.zeroconf.unregister_service(self.info)
        finally:
            self.zeroconf.close()
