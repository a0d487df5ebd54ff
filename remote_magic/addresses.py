"""Which address goes into a token: the one peers dial, not necessarily the one the hub binds."""

from __future__ import annotations

import re
import socket

import psutil

_ENDPOINT = re.compile(r"^tcp://[^\s:/]+:\d{1,5}$")


def lan_address() -> str:
    """This machine's first non-loopback IPv4 address (what to advertise when listening on 0.0.0.0)."""
    for addresses in psutil.net_if_addrs().values():
        for addr in addresses:
            if addr.family == socket.AF_INET and not addr.address.startswith("127."):
                return addr.address
    return "127.0.0.1"


def check_endpoint(text: str) -> str:
    """An --advertise value: ``tcp://HOST:PORT`` or a ValueError saying so."""
    if not _ENDPOINT.match(text or ""):
        raise ValueError(f"{text!r} is not an address like tcp://HOST:PORT")
    return text


def parse_host_port(text: str) -> tuple[str, int]:
    """'HOST:PORT' -> (host, port); port 0 means any free port."""
    host, sep, port = (text or "").rpartition(":")
    if not sep or not port.isdigit() or not host or int(port) > 65535:
        raise ValueError(f"{text!r} is not HOST:PORT (e.g. 0.0.0.0:5587, or 127.0.0.1:0 for any free port)")
    return host.strip("[]"), int(port)


def bind_endpoint(host: str, port: int) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def advertised_address(listen_host: str, port: int, advertise: str | None = None) -> str:
    """``advertise`` when given, else the listening host (or this machine's LAN address for 0.0.0.0)."""
    if advertise:
        return check_endpoint(advertise)
    host = lan_address() if listen_host in ("0.0.0.0", "::", "*", "") else listen_host
    return bind_endpoint(host, port)
