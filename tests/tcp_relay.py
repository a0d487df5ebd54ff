"""A TCP byte forwarder on 127.0.0.1 that stands in for an ngrok tunnel's public address (ngrok's
service can't be reached from the test machines), and the port a remote-worker process listens on."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any, Coroutine

import psutil


class Relay:
    """A TCP byte forwarder on 127.0.0.1 (the stand-in for ngrok's public address).

    It binds its port when made (port 0: any free one) and keeps it across ``stop``/``start``;
    ``target`` is the port it forwards to, set once the hub's port is known. ``stop`` aborts every
    relayed connection, as a tunnel that goes away does; while ``losing`` is set, what arrives is read
    and thrown away, as a network that drops what was in flight before the connection breaks.
    """

    def __init__(self, port: int = 0) -> None:
        self.port = port
        self.target: int | None = None
        self.connections = 0
        self.losing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._transports: set[asyncio.BaseTransport] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.start()

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Listen again (on the same port after a ``stop``)."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="relay", daemon=True)
        self._thread.start()
        self._server = self._run(asyncio.start_server(self._relay, "127.0.0.1", self.port, reuse_address=True))
        self.port = self._server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        """Stop listening and cut every relayed connection."""
        if self._loop is None:
            return
        self._run(self._close())
        self.losing = False
        self._loop.call_soon_threadsafe(self._loop.stop)
        assert self._thread is not None
        self._thread.join(5)
        self._loop.close()
        self._loop = None

    def _run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(5)

    async def _close(self) -> None:
        assert self._server is not None
        self._server.close()
        for transport in self._transports:
            transport.abort()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            try:
                hub_reader, hub_writer = await asyncio.open_connection("127.0.0.1", self.target)
            except OSError:
                client_writer.transport.abort()
                return
            self.connections += 1
            self._transports |= {client_writer.transport, hub_writer.transport}
            await asyncio.gather(self._pump(client_reader, hub_writer), self._pump(hub_reader, client_writer))
        finally:
            self._tasks.discard(task)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(1 << 16):
                if not self.losing:
                    writer.write(data)
                    await writer.drain()
        except OSError:
            pass  # the other direction, or stop(), cut the connection: nothing left to relay
        finally:
            writer.transport.abort()
            self._transports.discard(writer.transport)


def listening_port(pid: int) -> int:
    """The TCP port a remote-worker process's hub listens on (the other one it listens on serves the notebook
    side's wheel over HTTP: worker/own_wheel.py)."""
    process = psutil.Process(pid)
    connections = process.net_connections("tcp") if hasattr(process, "net_connections") else process.connections("tcp")
    ports = {c.laddr.port for c in connections if c.status == psutil.CONN_LISTEN}
    hubs = {port for port in ports if not _answers_http(port)}
    assert len(hubs) == 1, f"expected the hub's port and the wheel's, found {ports}"
    return hubs.pop()


def _answers_http(port: int) -> bool:
    # The hub's ZeroMQ socket sends its greeting (0xFF...) at once and drops a peer that isn't ZMTP; the wheel
    # server answers the request.
    with socket.create_connection(("127.0.0.1", port), timeout=10) as probe:
        try:
            probe.sendall(b"HEAD / HTTP/1.0\r\n\r\n")
            return probe.recv(5) == b"HTTP/"
        except ConnectionError:  # ZeroMQ reset it
            return False
