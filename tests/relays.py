"""User-space relays for emulated links: what this machine's kernel can't do (it has no netem).

Two relays, each a child process this module starts and stops:

- ``PacketRelay`` carries the IP packets of a link between two TUN devices, one in each network
  namespace, applying the link's rate (a serialising queue with a bounded backlog: what exceeds it
  is dropped, as a router does), loss (each packet lost at random, on its own, each way) and delay
  (half the round trip each way); ``cut`` loses every packet until ``restore``, as a dropped Wi-Fi
  does. Everything happens to packets on the wire, so each TCP connection across the link sees the
  whole round trip and the losses, and recovers from them as it would on a real link (a relay that
  ended TCP connections would recover losses over a sub-millisecond hop).
- ``StreamRelay`` forwards TCP connections from a port in one namespace to a port beyond the link,
  each byte held back by a delay, and can be cut and restored on the same port: a link that goes down.

Run as a script, this file is the relay itself (``python relays.py packets|stream ...``); the classes
start it so.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import fcntl
import json
import os
import random
import select
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Sequence

HERE = Path(__file__).resolve()

QUEUE_S = 0.25
"""The rate queue's bound, in seconds of the link's rate: a packet that would wait longer is dropped."""

MIN_QUEUE_BYTES = 64 << 10
"""And at least this many bytes of backlog, so that a slow link still holds a few full windows' bursts."""

_TUNSETIFF = 0x400454CA
_IFF_TUN = 0x0001
_IFF_NO_PI = 0x1000
_READ_BYTES = 65536
_STOP_S = 10.0


# -- the packet relay (runs in its own process) ------------------------------------------------


@dataclass
class _Line:
    """One direction of a packet link: a rate queue, random loss and a delay line, then the far device."""

    out_fd: int
    bits_per_s: float | None
    delay_s: float
    loss: float
    rng: random.Random
    backlog_s: float
    cut: bool = False  # the link is down: every packet is lost
    in_flight: "collections.deque[tuple[float, bytes]]" = field(default_factory=collections.deque)
    free_at: float = 0.0  # when the rate queue has sent what it holds
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("packets", "bytes", "delivered", "lost", "overflowed", "cut"), 0))

    def offer(self, packet: bytes, now: float) -> None:
        """Take one packet from the near device: queue it at the link's rate, lose it, or deliver it later."""
        self.counts["packets"] += 1
        self.counts["bytes"] += len(packet)
        if self.cut:
            self.counts["cut"] += 1
            return
        departs = now
        if self.bits_per_s is not None:
            start = max(now, self.free_at)
            if start - now > self.backlog_s:  # the queue is full: tail drop
                self.counts["overflowed"] += 1
                return
            departs = self.free_at = start + len(packet) * 8 / self.bits_per_s
        if self.loss and self.rng.random() < self.loss:  # lost on the wire, after taking its time on it
            self.counts["lost"] += 1
            return
        self.in_flight.append((departs + self.delay_s, packet))

    def next_due(self) -> float | None:
        return self.in_flight[0][0] if self.in_flight else None

    def deliver(self, now: float) -> None:
        """Write every packet whose time has come to the far device, in order."""
        while self.in_flight and self.in_flight[0][0] <= now:
            _, packet = self.in_flight.popleft()
            try:
                os.write(self.out_fd, packet)
            except OSError:  # the far device is gone (its namespace was removed): the packet is lost
                continue
            self.counts["delivered"] += 1


def _open_tun(name: str) -> int:
    """A new TUN device ``name`` (IP packets, no packet-info header) in this process's namespace; its fd."""
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH22x", name.encode(), _IFF_TUN | _IFF_NO_PI))
    return fd


def carry_packets(a_name: str, b_name: str, rate_mbit: float | None, rtt_ms: float, loss_percent: float,
                  seed: int, control: IO[str], report: IO[str]) -> None:
    """Make TUN devices ``a_name`` and ``b_name`` and carry packets between them until ``control`` ends.

    Says ``ready`` on ``report`` once the devices exist (the caller moves them into their namespaces),
    and answers each ``stats`` line on ``control`` with the counters of each direction as one JSON line;
    ``cut`` and ``restore`` take the link down and up again, answered with ``ok``.
    """
    fds = {name: _open_tun(name) for name in (a_name, b_name)}
    bits_per_s = rate_mbit * 1e6 if rate_mbit else None
    backlog_s = max(QUEUE_S, MIN_QUEUE_BYTES * 8 / bits_per_s) if bits_per_s else 0.0
    rng = random.Random(seed)
    lines = {
        fds[a_name]: _Line(fds[b_name], bits_per_s, rtt_ms / 2000, loss_percent / 100, rng, backlog_s),
        fds[b_name]: _Line(fds[a_name], bits_per_s, rtt_ms / 2000, loss_percent / 100, rng, backlog_s),
    }
    names = {fds[a_name]: "a_to_b", fds[b_name]: "b_to_a"}
    print("ready", file=report, flush=True)
    while True:
        dues = [due for line in lines.values() if (due := line.next_due()) is not None]
        timeout = max(0.0, min(dues) - time.monotonic()) if dues else None
        readable, _, _ = select.select([*lines, control.fileno()], [], [], timeout)
        now = time.monotonic()
        for fd in readable:
            if fd == control.fileno():
                command = control.readline()
                if not command:  # the parent is gone or closed us: the link goes down with us
                    return
                if command.strip() == "stats":
                    print(json.dumps({names[fd]: line.counts for fd, line in lines.items()}), file=report,
                          flush=True)
                elif command.strip() in ("cut", "restore"):
                    for line in lines.values():
                        line.cut = command.strip() == "cut"
                    print("ok", file=report, flush=True)
                continue
            try:
                packet = os.read(fd, _READ_BYTES)
            except OSError:  # the device was removed with its namespace
                return
            lines[fd].offer(packet, now)
        now = time.monotonic()
        for line in lines.values():
            line.deliver(now)


# -- the stream relay (runs in its own process) ------------------------------------------------


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    """Forward what arrives, each piece held back by ``delay_s`` from when it arrived, in order."""
    pieces: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def write() -> None:
        while True:
            due, data = await pieces.get()
            await asyncio.sleep(max(0.0, due - time.monotonic()))  # the delay itself
            if not data:
                writer.close()
                return
            writer.write(data)
            await writer.drain()

    writing = asyncio.ensure_future(write())
    while True:
        data = await reader.read(_READ_BYTES)
        pieces.put_nowait((time.monotonic() + delay_s, data))
        if not data:
            break
    await writing


async def _relay_streams(listen_host: str, listen_port: int, target_host: str, target_port: int,
                         delay_s: float, report: IO[str]) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        target_reader, target_writer = await asyncio.open_connection(target_host, target_port)
        await asyncio.gather(_pump(reader, target_writer, delay_s), _pump(target_reader, writer, delay_s),
                             return_exceptions=True)

    server = await asyncio.start_server(serve, listen_host, listen_port, reuse_address=True)
    print(server.sockets[0].getsockname()[1], file=report, flush=True)
    await server.serve_forever()


# -- the parent's handles ----------------------------------------------------------------------


class PacketRelay:
    """The process carrying a TUN link's packets; ``stats`` reads its counters, ``close`` ends it."""

    def __init__(self, a_device: str, b_device: str, *, rate_mbit: float | None, rtt_ms: float,
                 loss_percent: float, seed: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(HERE), "packets", a_device, b_device, "--rate-mbit", str(rate_mbit or 0),
             "--rtt-ms", str(rtt_ms), "--loss-percent", str(loss_percent), "--seed", str(seed)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        ready = self._answer(30)
        if ready != "ready":
            error = self.process.stderr.read() if self.process.stderr and self.process.poll() is not None else ""
            self.close()
            raise AssertionError(f"the packet relay did not start: {ready!r} {error}")

    def _answer(self, timeout: float) -> str:
        assert self.process.stdout is not None
        if not select.select([self.process.stdout], [], [], timeout)[0]:
            return ""
        return self.process.stdout.readline().strip()

    def stats(self) -> dict[str, dict[str, int]]:
        """Per direction (``a_to_b``, ``b_to_a``): packets and bytes offered, delivered, lost, overflowed, cut."""
        counts: dict[str, dict[str, int]] = json.loads(self._ask("stats"))
        return counts

    def cut(self) -> None:
        """Lose every packet from now on, both ways, as a link that went down (no reset reaches either end)."""
        self._ask("cut")

    def restore(self) -> None:
        """Carry packets again."""
        self._ask("restore")

    def _ask(self, command: str) -> str:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{command}\n")
        self.process.stdin.flush()
        answer = self._answer(10)
        if not answer:
            raise AssertionError(f"the packet relay did not answer {command!r} within 10 s")
        return answer

    def close(self) -> None:
        """End the relay (its devices go with it)."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            try:
                self.process.stdin.close()
            except BrokenPipeError:
                pass
        try:
            self.process.wait(_STOP_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


class StreamRelay:
    """A stream relay in namespace ``prefix`` runs in, from ``listen_host`` to ``target_host:target_port``.

    Each byte is held back ``delay_s`` each way. ``cut`` stops it, as a link that goes down; ``restore``
    starts it again on the same port (``port``).
    """

    def __init__(self, prefix: Sequence[str], listen_host: str, target_host: str, target_port: int,
                 delay_s: float = 0.0) -> None:
        self._command = [*prefix, sys.executable, str(HERE), "stream", listen_host, target_host, str(target_port),
                         "--delay-s", str(delay_s)]
        self.port = 0
        self._process: subprocess.Popen[str] | None = None
        self.restore()

    def restore(self) -> None:
        """Start relaying (again, on the same port once it had one)."""
        self._process = subprocess.Popen([*self._command, "--listen-port", str(self.port)], stdout=subprocess.PIPE,
                                         text=True)
        assert self._process.stdout is not None
        if not select.select([self._process.stdout], [], [], 30)[0]:
            self.cut()
            raise AssertionError("the stream relay did not start within 30 s")
        self.port = int(self._process.stdout.readline())

    def cut(self) -> None:
        """Stop relaying: every connection through it drops, and nothing answers on its port."""
        if self._process is not None:
            self._process.kill()
            self._process.wait(30)
            if self._process.stdout is not None:
                self._process.stdout.close()
            self._process = None

    def __enter__(self) -> "StreamRelay":
        return self

    def __exit__(self, *exc: object) -> None:
        self.cut()


def main(argv: list[str] | None = None) -> None:
    """The relays' own command line (the classes above start it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    kinds = parser.add_subparsers(dest="kind", required=True)
    packets = kinds.add_parser("packets", help="carry packets between two new TUN devices")
    packets.add_argument("a_device")
    packets.add_argument("b_device")
    packets.add_argument("--rate-mbit", type=float, default=0.0, help="each way; 0: as fast as it comes")
    packets.add_argument("--rtt-ms", type=float, default=0.0)
    packets.add_argument("--loss-percent", type=float, default=0.0, help="each way, each packet on its own")
    packets.add_argument("--seed", type=int, default=0)
    stream = kinds.add_parser("stream", help="relay TCP connections with a delay")
    stream.add_argument("listen_host")
    stream.add_argument("target_host")
    stream.add_argument("target_port", type=int)
    stream.add_argument("--delay-s", type=float, default=0.0, help="each way")
    stream.add_argument("--listen-port", type=int, default=0)
    args = parser.parse_args(argv)
    if args.kind == "packets":
        carry_packets(args.a_device, args.b_device, args.rate_mbit or None, args.rtt_ms, args.loss_percent,
                      args.seed, sys.stdin, sys.stdout)
    else:
        asyncio.run(_relay_streams(args.listen_host, args.listen_port, args.target_host, args.target_port,
                                   args.delay_s, sys.stdout))


if __name__ == "__main__":
    main()

