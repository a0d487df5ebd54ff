"""A TCP proxy on 127.0.0.1 that blips: it drops one direction's bytes for a while, then cuts the connection.

That is what a tunnel, a NAT or a flaky Wi-Fi does just before a connection dies: what was sent is
read and lost, then the connection goes (with FIN, or RST), and the peer dials again. The proxy
listens on one port and forwards each connection to one target port; a peer that dials again after
a cut gets through at once.

    peer (client, joined worker) ──UP──> proxy ──UP──> target (the hub)
                                <─DOWN──       <─DOWN──

``drop`` starts discarding a direction's bytes; ``cut`` closes every connection (and stops dropping);
``blip`` does both on a timer, starting at once or once a number of bytes has crossed a direction
(so it lands inside a large transfer, or at its very end). The proxy counts connections, bytes each
way, bytes dropped, cuts and blips. It runs an asyncio loop in a thread of its own; every method is
safe to call from any other thread.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import enum
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

T = TypeVar("T")

IN_TRANSFER_BYTES = 64 << 10
"""A blip is counted as inside a transfer when this many bytes crossed in the ``IN_TRANSFER_S`` before it."""

IN_TRANSFER_S = 0.1

CALL_TIMEOUT_S = 10.0
"""How long a method waits for the proxy's loop to do what it asked."""

_READ_PAUSED_ABOVE = 1 << 20  # bytes waiting to be written to one side before the other side stops being read


class Direction(str, enum.Enum):
    """Which way bytes go: UP from the dialing peer to the target, DOWN back."""

    UP = "up"
    DOWN = "down"

    @property
    def other(self) -> "Direction":
        return Direction.DOWN if self is Direction.UP else Direction.UP


@dataclass
class Blip:
    """One blip: a direction's bytes dropped for ``drop_s``, then every connection cut."""

    number: int
    direction: Direction
    drop_s: float
    rst: bool
    after: tuple[Direction, int] | None  # started once this many bytes crossed that way (None: at once)
    started_at: float | None = None  # monotonic, when the drop began
    in_transfer: bool = False  # IN_TRANSFER_BYTES crossed (either way) in the IN_TRANSFER_S before the drop
    dropped: int = 0  # bytes discarded
    cut: int = 0  # connections closed
    done: threading.Event = field(default_factory=threading.Event)

    def describe(self) -> str:
        when = f" after {self.after[1]} B {self.after[0].value}" if self.after else ""
        return (f"blip {self.number}: {self.direction.value} dropped {self.drop_s:.2f} s{when} ({self.dropped} B), "
                f"{'RST' if self.rst else 'FIN'} to {self.cut} connection(s)"
                f"{', inside a transfer' if self.in_transfer else ''}")


@dataclass
class Counts:
    """What a proxy did, so far."""

    connections: int = 0
    forwarded: dict[Direction, int] = field(default_factory=lambda: dict.fromkeys(Direction, 0))
    dropped: dict[Direction, int] = field(default_factory=lambda: dict.fromkeys(Direction, 0))
    cuts: int = 0
    blips: int = 0
    blips_in_transfer: int = 0


class _Side(asyncio.Protocol):
    """One TCP connection of a proxied pair; what it receives goes ``direction`` to the other one."""

    def __init__(self, pair: "_Pair", direction: Direction) -> None:
        self.pair = pair
        self.direction = direction
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(_READ_PAUSED_ABOVE)
        if self.direction is Direction.UP:  # the peer's side: not read until the target answers
            transport.pause_reading()

    def data_received(self, data: bytes) -> None:
        self.pair.proxy._carry(self.pair, self.direction, data)

    def eof_received(self) -> bool:
        return False  # close this side; connection_lost closes the other

    def connection_lost(self, exc: Exception | None) -> None:
        self.pair.close()

    def pause_writing(self) -> None:  # the other side sends faster than this one takes
        self.pair.pause_reading(self.direction.other)

    def resume_writing(self) -> None:
        self.pair.resume_reading(self.direction.other)


class _Pair:
    """A dialing peer's connection and the proxy's connection to the target for it."""

    def __init__(self, proxy: "BlipProxy") -> None:
        self.proxy = proxy
        self.peer = _Side(self, Direction.UP)  # receives what goes up
        self.target = _Side(self, Direction.DOWN)  # receives what comes down
        self.closed = False

    def receiver(self, direction: Direction) -> _Side:
        """The side that writes what goes ``direction``."""
        return self.target if direction is Direction.UP else self.peer

    def pause_reading(self, direction: Direction) -> None:
        source = self.peer if direction is Direction.UP else self.target
        if source.transport is not None and not source.transport.is_closing():
            source.transport.pause_reading()

    def resume_reading(self, direction: Direction) -> None:
        source = self.peer if direction is Direction.UP else self.target
        if source.transport is not None and not source.transport.is_closing():
            source.transport.resume_reading()

    def cut(self, rst: bool) -> None:
        """Close both connections now, discarding what waits to be written; with RST when ``rst``."""
        for side in (self.peer, self.target):
            if side.transport is None:
                continue
            if rst:
                sock = side.transport.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            side.transport.abort()
        self.close()

    def close(self) -> None:
        """The other side closed: close both, after what waits to be written."""
        if self.closed:
            return
        self.closed = True
        self.proxy._pairs.discard(self)
        for side in (self.peer, self.target):
            if side.transport is not None and not side.transport.is_closing():
                side.transport.close()


@dataclass
class _Trigger:
    direction: Direction
    remaining: int
    fire: Callable[[], None]


class BlipProxy:
    """A proxy from a port on 127.0.0.1 to ``target_port`` that drops and cuts on command."""

    def __init__(self, target_port: int, *, name: str = "proxy", target_host: str = "127.0.0.1") -> None:
        self.name = name
        self.target = (target_host, target_port)
        self.counts = Counts()  # written by the loop's thread only; read through stats()
        self.blips: list[Blip] = []
        self._pairs: set[_Pair] = set()
        self._dropping: dict[Direction, Blip | None] = {}
        self._triggers: list[_Trigger] = []
        self._recent: collections.deque[tuple[float, int]] = collections.deque()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"blip-proxy-{name}", daemon=True)
        self._thread.start()
        self._server = self._call(self._listen())
        self.port: int = self._server.sockets[0].getsockname()[1]

    @property
    def address(self) -> str:
        """Where peers dial it: ``tcp://127.0.0.1:PORT``."""
        return f"tcp://127.0.0.1:{self.port}"

    # -- commands, from any thread -----------------------------------------------------------------

    def drop(self, direction: Direction) -> None:
        """Discard every byte that goes ``direction`` from now until the next ``cut``."""
        self._call_soon(lambda: self._dropping.setdefault(direction, None))

    def cut(self, rst: bool = False) -> int:
        """Close every connection now (RST when ``rst``, else FIN) and stop dropping; how many were cut."""
        return self._call_soon(lambda: self._cut(rst))

    def blip(self, direction: Direction, drop_s: float, *, rst: bool = False,
             after: tuple[Direction, int] | None = None, within: float | None = None) -> Blip:
        """Drop ``direction`` for ``drop_s``, then cut; ``Blip.done`` is set once cut.

        ``after=(way, n)``: start only once ``n`` more bytes have crossed ``way`` (inside a transfer, or
        at its end), or once ``within`` seconds passed without that (then at once).
        """
        blip = Blip(len(self.blips) + 1, direction, drop_s, rst, after)
        self.blips.append(blip)
        self._call_soon(lambda: self._arm(blip, within))
        return blip

    def stats(self) -> Counts:
        """A copy of the counts, taken in the proxy's thread."""
        return self._call_soon(lambda: Counts(self.counts.connections, dict(self.counts.forwarded),
                                              dict(self.counts.dropped), self.counts.cuts, self.counts.blips,
                                              self.counts.blips_in_transfer))

    def forwarded(self, direction: Direction) -> int:
        return self.stats().forwarded[direction]

    def dropped(self, direction: Direction) -> int:
        return self.stats().dropped[direction]

    def close(self) -> None:
        """Cut every connection, stop listening and end the proxy's thread."""
        if not self._loop.is_running():
            return
        self._call_soon(lambda: self._cut(rst=False, count=False))
        self._server.close()
        self._call(self._server.wait_closed())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CALL_TIMEOUT_S)
        self._loop.close()

    def __enter__(self) -> "BlipProxy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the loop's side ---------------------------------------------------------------------------

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(CALL_TIMEOUT_S)

    def _call_soon(self, fn: Callable[[], T]) -> T:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the caller
                future.set_exception(exc)

        self._loop.call_soon_threadsafe(run)
        return future.result(CALL_TIMEOUT_S)

    async def _listen(self) -> asyncio.Server:
        return await self._loop.create_server(self._accept, "127.0.0.1", 0)

    def _accept(self) -> asyncio.Protocol:
        """A peer dialed: its side of a new pair; the target is dialed while the peer waits, unread."""
        pair = _Pair(self)
        self._pairs.add(pair)
        self.counts.connections += 1
        self._loop.call_soon(lambda: asyncio.ensure_future(self._dial_target(pair)))
        return pair.peer

    async def _dial_target(self, pair: _Pair) -> None:
        try:
            await self._loop.create_connection(lambda: pair.target, *self.target)
        except OSError:
            pair.cut(rst=False)
            return
        if pair.closed:  # cut while dialing
            assert pair.target.transport is not None
            pair.target.transport.abort()
            return
        assert pair.peer.transport is not None
        pair.peer.transport.resume_reading()

    def _carry(self, pair: _Pair, direction: Direction, data: bytes) -> None:
        if direction in self._dropping:
            self.counts.dropped[direction] += len(data)
            blip = self._dropping[direction]
            if blip is not None:
                blip.dropped += len(data)
            return
        receiver = pair.receiver(direction).transport
        if receiver is None or receiver.is_closing():
            return
        receiver.write(data)
        self.counts.forwarded[direction] += len(data)
        now = time.monotonic()
        self._recent.append((now, len(data)))
        while self._recent and self._recent[0][0] < now - IN_TRANSFER_S:
            self._recent.popleft()
        for trigger in [t for t in self._triggers if t.direction is direction]:
            trigger.remaining -= len(data)
            if trigger.remaining <= 0:
                self._triggers.remove(trigger)
                trigger.fire()

    def _cut(self, rst: bool, count: bool = True) -> int:
        pairs = list(self._pairs)
        for pair in pairs:
            pair.cut(rst)
        self._dropping.clear()
        if count:
            self.counts.cuts += 1
        return len(pairs)

    def _arm(self, blip: Blip, within: float | None) -> None:
        if blip.after is None:
            self._start(blip)
            return
        trigger = _Trigger(blip.after[0], blip.after[1], lambda: self._start(blip))
        self._triggers.append(trigger)
        if within is not None:
            def give_up_waiting() -> None:
                if trigger in self._triggers:
                    self._triggers.remove(trigger)
                    self._start(blip)

            self._loop.call_later(within, give_up_waiting)

    def _start(self, blip: Blip) -> None:
        now = time.monotonic()
        blip.started_at = now
        blip.in_transfer = sum(n for at, n in self._recent if at >= now - IN_TRANSFER_S) >= IN_TRANSFER_BYTES
        self.counts.blips += 1
        self.counts.blips_in_transfer += blip.in_transfer
        self._dropping[blip.direction] = blip

        def end() -> None:
            blip.cut = self._cut(blip.rst)
            blip.done.set()

        self._loop.call_later(blip.drop_s, end)

