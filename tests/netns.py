"""Two network namespaces joined by a veth pair, made for one test and removed after it.

Both ends are created inside the namespaces, so no interface appears on this machine's own network
and nothing a test sends there reaches it. A link may be slowed to a rate (a token bucket on each
end, so both directions), as a home connection or a tunnel is.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import pytest


@dataclass(frozen=True)
class Link:
    """Namespaces ``a`` and ``b`` on one link, at 10.X.Y.1 (device ``a_device``) and 10.X.Y.2."""

    a: str
    b: str
    a_ip: str
    b_ip: str
    a_device: str
    b_device: str

    def run(self, namespace: str) -> tuple[str, ...]:
        """The command prefix that runs a program inside ``namespace`` (it execs it: same pid)."""
        return ("ip", "netns", "exec", namespace)

    def sent_bytes(self, namespace: str) -> int:
        """How many bytes ``namespace``'s end of the link has sent so far."""
        device = self.a_device if namespace == self.a else self.b_device
        out = subprocess.run(["ip", "netns", "exec", namespace, "cat", f"/sys/class/net/{device}/statistics/tx_bytes"],
                             capture_output=True, text=True, check=True, timeout=30).stdout
        return int(out)


def ip(*args: str) -> None:
    """Run ``ip ARGS``; a failure fails the test with ip's own words."""
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise AssertionError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")


@contextmanager
def linked_namespaces(purpose: str, *, rate_mbit: float | None = None, multicast: bool = False) -> Iterator[Link]:
    """Two namespaces on one veth link, removed on exit; ``rate_mbit`` caps each direction."""
    if shutil.which("ip") is None:
        pytest.skip(f"{purpose} make network namespaces with `ip` (iproute2), which is not installed")
    if os.geteuid() != 0:
        pytest.skip(f"{purpose} make network namespaces, which takes root")
    tag = secrets.token_hex(3)
    subnet = f"10.{secrets.randbelow(200) + 50}.{secrets.randbelow(250) + 1}"
    link = Link(f"rm-a-{tag}", f"rm-b-{tag}", f"{subnet}.1", f"{subnet}.2", f"rma{tag}", f"rmb{tag}")
    made: list[str] = []
    try:
        for namespace in (link.a, link.b):
            ip("netns", "add", namespace)
            made.append(namespace)
        ip("link", "add", link.a_device, "netns", link.a, "type", "veth", "peer", "name", link.b_device,
           "netns", link.b)
        for namespace, device, address in ((link.a, link.a_device, link.a_ip), (link.b, link.b_device, link.b_ip)):
            ip("-n", namespace, "addr", "add", f"{address}/24", "dev", device)
            ip("-n", namespace, "link", "set", "lo", "up")
            ip("-n", namespace, "link", "set", device, "up", *(("multicast", "on") if multicast else ()))
            if multicast:
                ip("-n", namespace, "route", "add", "224.0.0.0/4", "dev", device)
            if rate_mbit is not None:  # the bucket holds more than one full-size packet, and 2 s of queue
                subprocess.run(["tc", "-n", namespace, "qdisc", "add", "dev", device, "root", "tbf", "rate",
                                f"{rate_mbit}mbit", "burst", "32kb", "latency", "2000ms"], check=True, timeout=30)
        yield link
    finally:
        for namespace in made:  # removing a namespace removes its end of the veth pair
            ip("netns", "del", namespace)
    remaining = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert link.a not in remaining and link.b not in remaining
