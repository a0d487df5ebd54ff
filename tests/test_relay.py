"""The tunnel path without ngrok (issue 4, item 6): a TCP relay on another loopback port stands in
for an ngrok TCP tunnel's public address, because ngrok's service can't be reached from the test
machines. `remote-worker --advertise` puts the relay's address into the token, so the client
really connects through it. A cell in flight while the relay is away rides it out; past the cell's
outage grace it fails with a clear error, and restarting the relay on the same port lets the client
reconnect by itself.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from pathlib import Path
from typing import Any, Coroutine, Iterator

import numpy as np
import psutil
import pytest

import remote_magic
from remote_magic.wire.protocol import HEARTBEAT_LIVENESS
from remote_magic.wire.tokens import Token
from support import start_worker, wait_for

HEARTBEAT_INTERVAL_S = 0.2
"""The worker's --heartbeat-interval: a silent hub is noticed after HEARTBEAT_LIVENESS of these."""

FAILURE_BOUND_S = HEARTBEAT_INTERVAL_S * HEARTBEAT_LIVENESS + 1.0 + 5.0
"""How long a job may take to fail once the relay is gone: the expiry and a 1 s grace, plus slack for a busy CI."""


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


def _listening_port(pid: int) -> int:
    """The one TCP port a remote-worker process listens on: its hub's."""
    process = psutil.Process(pid)
    connections = process.net_connections("tcp") if hasattr(process, "net_connections") else process.connections("tcp")
    ports = {c.laddr.port for c in connections if c.status == psutil.CONN_LISTEN}
    assert len(ports) == 1, f"expected the hub's port alone, found {ports}"
    return ports.pop()


@pytest.fixture
def relay() -> Iterator[Relay]:
    relay = Relay()
    yield relay
    relay.stop()


def test_a_cell_rides_out_a_tunnel_that_goes_and_comes_back_and_fails_clearly_past_its_grace(
        relay: Relay, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The relay stands in for ngrok's public address: ngrok's service can't be reached from the
    test machines, and what the client sees when a tunnel comes and goes is the same."""
    worker = start_worker(tmp_path, "--listen", "127.0.0.1:0", "--advertise", relay.address, "--gpu", "off",
                          "--heartbeat-interval", str(HEARTBEAT_INTERVAL_S))
    try:
        printed = re.search(r"%offload_connect (\S+)", worker.log())
        assert printed is not None and Token.decode(printed.group(1)).address == relay.address
        assert worker.token == printed.group(1)  # the --token-file copy is the same token
        relay.target = _listening_port(worker.process.pid)
        assert relay.target != relay.port
        a = np.arange(12.0).reshape(3, 4)
        with remote_magic.connect(worker.token, timeout=10) as client:
            assert relay.connections == 1  # the client's only way in is the relay
            np.testing.assert_array_equal(client.run("c = a.T @ a", {"a": a})["c"], a.T @ a)

            # A cell in flight when the tunnel goes waits for it, says so once, and ends as it would have.
            outcome: list[Any] = []
            cell = threading.Thread(target=lambda: outcome.append(client.run(
                "import time\nprint('started', flush=True)\ntime.sleep(0.5)\nprint('ended')\ny = x + 1",
                {"x": 41}, ["y"])))
            cell.start()
            relay.stop()
            wait_for(lambda: "the link to the hub is down" in capsys.readouterr().err, 30,
                     "the waiting cell to say the link is down")
            relay.start()
            cell.join(30)
            assert outcome == [{"y": 42}]
            err = capsys.readouterr()
            assert "the link to the hub is back after" in err.err, err
            assert "the link to the hub is down" not in err.err, err  # said once
            assert (err.out.count("started"), err.out.count("ended")) == (1, 1), err.out  # none shown twice
            assert relay.connections >= 2

            # Past the grace the user set, a waiting cell fails saying so; the next one at once, saying why.
            client.outage_grace = 1.0
            relay.stop()
            started = time.monotonic()
            with pytest.raises(remote_magic.ConnectionFailed, match=r"out of reach for 1 s \(outage_grace\)"):
                client.run("x = 1")
            assert time.monotonic() - started < FAILURE_BOUND_S
            with pytest.raises(remote_magic.ConnectionFailed, match="nothing listens at .*the token it printed"):
                client.run("x = 2")

            relay.start()
            wait_for(lambda: _runs(client, a), 30, "the client to reconnect through the restarted relay")
        assert worker.process.poll() is None
    finally:
        worker.stop()


def _runs(client: remote_magic.Client, a: np.ndarray) -> bool:
    """True once a job goes through; False while the connection is still down."""
    try:
        result = client.run("c = a.T @ a", {"a": a})
    except remote_magic.ConnectionFailed:
        return False
    np.testing.assert_array_equal(result["c"], a.T @ a)
    return True
