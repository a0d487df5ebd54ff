"""Which address goes into a token: the one peers dial, not necessarily the one the hub binds."""

from __future__ import annotations

import ipaddress
import re
import socket

_ENDPOINT = re.compile(r"^tcp://[^\s:/]+:\d{1,5}$")


def lan_address() -> str:
    """The IPv4 address this machine reaches its network from (what to advertise when listening on 0.0.0.0)."""
    # Connecting a UDP socket only asks the kernel for a route; no packet is sent.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: never a real host
            return str(probe.getsockname()[0])
        except OSError:  # no route at all
            return "127.0.0.1"


def check_endpoint(text: str) -> str:
    """An --advertise value: ``tcp://HOST:PORT`` or a ValueError saying so."""
    if not _ENDPOINT.match(text or ""):
        raise ValueError(f"{text!r} is not an address like tcp://HOST:PORT")
    return text


def parse_host_port(text: str) -> tuple[str, int]:
    """'HOST:PORT' -> (host, port); port 0 means any free port. Hubs listen on IPv4 only: an IPv6 address
    is a ValueError saying so."""
    host, sep, port = (text or "").rpartition(":")
    if not sep or not port.isdigit() or not host or int(port) > 65535:
        raise ValueError(f"{text!r} is not HOST:PORT (e.g. 0.0.0.0:5587, or 127.0.0.1:0 for any free port)")
    host = host.strip("[]")
    if ":" in host:
        raise ValueError(f"{text!r} is an IPv6 address, and a hub listens on IPv4 only: use 0.0.0.0:{port} (every "
                         f"IPv4 address of this machine) or 127.0.0.1:{port} (this machine only)")
    return host, int(port)


def bind_endpoint(host: str, port: int) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def advertised_address(listen_host: str, port: int, advertise: str | None = None) -> str:
    """``advertise`` when given, else the listening host (or this machine's LAN address for 0.0.0.0)."""
    if advertise:
        return check_endpoint(advertise)
    host = lan_address() if listen_host in ("0.0.0.0", "::", "*", "") else listen_host
    return bind_endpoint(host, port)


def who_can_reach(address: str, *, tunnel: bool = False, advertised: bool = False) -> str:
    """Which notebooks can dial ``address`` (``tcp://HOST:PORT``, a token's), in words for remote-worker to print
    under its token: a LAN or loopback address works from no Colab."""
    where = address.removeprefix("tcp://")
    host = where.rpartition(":")[0].strip("[]")
    if tunnel:
        return f"the token's address, {where}, is the ngrok tunnel's: notebooks anywhere reach it, Colab's included"
    if advertised:
        return f"the token's address, {where}, is the one given (--advertise): notebooks reach it where it leads"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return f"the token's address, {where}, is a name: notebooks that can resolve and reach it connect"
    if ip.is_loopback:
        return (f"the token's address, {where}, is this machine's own: only notebooks on this machine reach it. "
                "For another machine: --listen 0.0.0.0:PORT (your network), or --ngrok (anywhere, Colab included)")
    if ip.is_private or ip.is_link_local:
        return (f"the token's address, {where}, is on this machine's local network: notebooks on that network reach "
                "it; Colab and Kaggle, outside it, don't: start remote-worker with --ngrok for them")
    return (f"the token's address, {where}, is public: notebooks anywhere reach it unless a firewall or NAT stops "
            "them (--ngrok goes through both)")
