"""The tunnel path without ngrok (issue 4, item 6): a TCP relay on another loopback port stands in
for an ngrok TCP tunnel's public address, because ngrok's service can't be reached from the test
machines. `remote-worker --advertise` puts the relay's address into the token, so the client
really connects through it. A cell in flight while the relay is away rides it out; past the cell's
outage grace it fails with a clear error, and restarting the relay on the same port lets the client
reconnect by itself.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
from tcp_relay import Relay, listening_port

import remote_magic
from remote_magic.wire.protocol import HEARTBEAT_LIVENESS
from remote_magic.wire.tokens import Token
from support import start_worker, wait_for

HEARTBEAT_INTERVAL_S = 0.2
"""The worker's --heartbeat-interval: a silent hub is noticed after HEARTBEAT_LIVENESS of these."""

FAILURE_BOUND_S = HEARTBEAT_INTERVAL_S * HEARTBEAT_LIVENESS + 1.0 + 5.0
"""How long a job may take to fail once the relay is gone: the expiry and a 1 s grace, plus slack for a busy CI."""



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
        relay.target = listening_port(worker.process.pid)
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
            # (Its reason is the grace, or that nothing listens there once the refusals outlast the heartbeat
            # bound; either way it says to start the worker again and connect with the token it prints.)
            started = time.monotonic()
            with pytest.raises(remote_magic.ConnectionFailed, match=r"(?s)(outage_grace|nothing listens at).*"
                                                                    r"(Start its remote-worker again|stopped).*"
                                                                    r"the token it print(s|ed)"):
                client.run("x = 2")
            assert time.monotonic() - started < FAILURE_BOUND_S

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
