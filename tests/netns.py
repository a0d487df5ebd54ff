"""Two network namespaces joined by a veth pair, made for one test and removed after it.

Both ends are created inside the namespaces, so no interface appears on this machine's own network
and nothing a test sends there reaches it. A link may be slowed to a rate (a token bucket on each
end, so both directions), as a home connection or a tunnel is.

A link with a round trip or loss is emulated instead: this machine's kernel has no netem, so its
packets cross a user-space relay between a TUN device in each namespace (``relays.PacketRelay``),
which applies the rate, the delay and the loss to each packet on the wire, each way. TCP then sees
the whole round trip and every loss, and recovers as on a real link.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest
from relays import PacketRelay


@dataclass(frozen=True)
class Link:
    """Namespaces ``a`` and ``b`` on one link, at 10.X.Y.1 (device ``a_device``) and 10.X.Y.2."""

    a: str
    b: str
    a_ip: str
    b_ip: str
    a_device: str
    b_device: str
    relay: PacketRelay | None = field(default=None, compare=False)
    """What carries the packets of a link with a round trip or loss (None: a veth pair)."""

    def run(self, namespace: str) -> tuple[str, ...]:
        """The command prefix that runs a program inside ``namespace`` (it execs it: same pid)."""
        return ("ip", "netns", "exec", namespace)

    def sent_bytes(self, namespace: str) -> int:
        """How many bytes ``namespace``'s end of the link has sent so far."""
        device = self.a_device if namespace == self.a else self.b_device
        out = subprocess.run(["ip", "netns", "exec", namespace, "cat", f"/sys/class/net/{device}/statistics/tx_bytes"],
                             capture_output=True, text=True, check=True, timeout=30).stdout
        return int(out)

    def relay_stats(self) -> dict[str, dict[str, int]]:
        """An emulated link's counters per direction (``a_to_b``, ``b_to_a``): packets, lost, overflowed, ..."""
        if self.relay is None:
            raise ValueError("this link is a veth pair: it has no relay to count what it lost")
        return self.relay.stats()


def ip(*args: str) -> None:
    """Run ``ip ARGS``; a failure fails the test with ip's own words."""
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise AssertionError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")


def _set_congestion_control(link: Link, namespace: str, algorithm: str) -> None:
    """Make ``algorithm`` TCP's congestion control in ``namespace``; fail saying which ones it may pick."""
    setting = "/proc/sys/net/ipv4/tcp_congestion_control"  # inside the namespace: its own setting
    result = subprocess.run([*link.run(namespace), "tee", setting], input=algorithm, capture_output=True, text=True,
                            timeout=30)
    if result.returncode != 0:
        allowed = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control").read_text().strip()
        raise AssertionError(f"TCP congestion control {algorithm!r} can't be set in a namespace "
                             f"({result.stderr.strip()}): it may pick one of {allowed}")


@contextmanager
def linked_namespaces(purpose: str, *, rate_mbit: float | None = None, multicast: bool = False,
                      rtt_ms: float = 0.0, loss_percent: float = 0.0, congestion_control: str | None = None,
                      seed: int | None = None) -> Iterator[Link]:
    """Two namespaces on one link, removed on exit; ``rate_mbit`` caps each direction.

    ``rtt_ms`` (the round trip, half of it each way) or ``loss_percent`` (each packet, each way) make
    the link an emulated one, through a packet relay (``seed``: its random losses; None picks one).
    ``congestion_control`` sets TCP's algorithm in both namespaces (otherwise they inherit this machine's
    default). A namespace may only pick one the machine allows (``tcp_allowed_congestion_control``):
    ``reno`` is always allowed, and backs off on loss as ``cubic`` (the usual default at a notebook's
    and a worker's end) does on a link this small; ``bbr`` hardly slows down for random loss.
    """
    if shutil.which("ip") is None:
        pytest.skip(f"{purpose} make network namespaces with `ip` (iproute2), which is not installed")
    if os.geteuid() != 0:
        pytest.skip(f"{purpose} make network namespaces, which takes root")
    emulated = bool(rtt_ms or loss_percent)
    if emulated and multicast:
        raise ValueError("an emulated link (rtt_ms, loss_percent) carries unicast only")
    if emulated and not os.path.exists("/dev/net/tun"):
        pytest.skip(f"{purpose} emulate a link through TUN devices, and /dev/net/tun is missing")
    tag = secrets.token_hex(3)
    subnet = f"10.{secrets.randbelow(200) + 50}.{secrets.randbelow(250) + 1}"
    link = Link(f"rm-a-{tag}", f"rm-b-{tag}", f"{subnet}.1", f"{subnet}.2", f"rma{tag}", f"rmb{tag}")
    made: list[str] = []
    try:
        for namespace in (link.a, link.b):
            ip("netns", "add", namespace)
            made.append(namespace)
        if emulated:  # made here, then moved: the relay keeps each device's fd wherever the device goes
            relay = PacketRelay(link.a_device, link.b_device, rate_mbit=rate_mbit, rtt_ms=rtt_ms,
                                loss_percent=loss_percent, seed=secrets.randbits(32) if seed is None else seed)
            link = Link(link.a, link.b, link.a_ip, link.b_ip, link.a_device, link.b_device, relay)
            for namespace, device in ((link.a, link.a_device), (link.b, link.b_device)):
                ip("link", "set", device, "netns", namespace)
        else:
            ip("link", "add", link.a_device, "netns", link.a, "type", "veth", "peer", "name", link.b_device,
               "netns", link.b)
        for namespace, device, address in ((link.a, link.a_device, link.a_ip), (link.b, link.b_device, link.b_ip)):
            ip("-n", namespace, "addr", "add", f"{address}/24", "dev", device)
            ip("-n", namespace, "link", "set", "lo", "up")
            ip("-n", namespace, "link", "set", device, "up", *(("multicast", "on") if multicast else ()))
            if multicast:
                ip("-n", namespace, "route", "add", "224.0.0.0/4", "dev", device)
            if rate_mbit is not None and not emulated:
                # The bucket holds more than one full-size packet, and 2 s of queue.
                subprocess.run(["tc", "-n", namespace, "qdisc", "add", "dev", device, "root", "tbf", "rate",
                                f"{rate_mbit}mbit", "burst", "32kb", "latency", "2000ms"], check=True, timeout=30)
            if congestion_control is not None:
                _set_congestion_control(link, namespace, congestion_control)
        yield link
    finally:
        for namespace in made:  # removing a namespace removes its end of the link
            ip("netns", "del", namespace)
        if link.relay is not None:
            link.relay.close()
    remaining = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert link.a not in remaining and link.b not in remaining
