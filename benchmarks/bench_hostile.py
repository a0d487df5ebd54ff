"""A hostile token holder against the hub (issue 34): how much memory it can make the hub hold.

A private ``remote-worker --max-message-size 256MB`` on 127.0.0.1; the hub process's resident memory
is sampled every 50 ms while, for ``--seconds`` each:

1. **unfinished large messages**: 8 authenticated sockets each start large messages (256 MB claimed,
   4 MiB chunks) and never finish them, as fast as the hub reads;
2. **jobs waiting for a worker**: the worker is kept busy while one notebook submits jobs with
   32 MB inputs as fast as the hub answers.

Reported: the hub's memory before, its peak, and the bound it should stay under: its configured
bounds (two of the largest messages it takes arriving at once; two queued per notebook) plus 100 MB
(the issue's goal). Before issue 34 the first attack took a hub from 42 MB to 1.2 GB in 2 s, and it
stayed there.

Run from the repository root::

    python benchmarks/bench_hostile.py                  # about half a minute
    python benchmarks/bench_hostile.py --seconds 3 --no-write
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import zmq

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

from report import write_section, zmq_peer_lines  # noqa: E402

import remote_magic  # noqa: E402
from remote_magic.wire.protocol import MessageType as T, encode  # noqa: E402
from remote_magic.wire.tokens import Token  # noqa: E402
from remote_magic.wire.versions import local_versions  # noqa: E402
from support import start_worker  # noqa: E402

MAX_MESSAGE = 256 * 10**6
PIECE = 4 << 20
SOCKETS = 8
GOAL_SLACK = 100 * 10**6


class PeakMemory:
    """Samples a process's resident memory every 50 ms in a thread; ``peak`` is the highest seen."""

    def __init__(self, pid: int) -> None:
        self._process = psutil.Process(pid)
        self.before = self.peak = self._process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.05):  # a sampling period, not synchronisation
            self.peak = max(self.peak, self._process.memory_info().rss)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def unfinished_messages(token: Token, seconds: float) -> int:
    """Start large messages from several sockets for ``seconds``; how many chunks were sent."""
    context = zmq.Context()
    sent = 0
    try:
        sockets = []
        for _ in range(SOCKETS):
            sock = context.socket(zmq.DEALER)
            sock.linger = 0
            sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = (token.server_public, token.public,
                                                                                 token.secret)
            sock.connect(token.address)
            sock.send_multipart(encode(T.HELLO, {"role": "client", "name": "hostile", "versions": local_versions()}))
            sockets.append(sock)
        piece = os.urandom(PIECE)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for i, sock in enumerate(sockets):
                header = {"transfer": f"t{i}-{sent}", "offset": 0, "sizes": [3, 6, 64, MAX_MESSAGE - 100]}
                try:
                    sock.send_multipart(encode(T.CHUNK, header, [piece]), zmq.NOBLOCK)
                    sent += 1
                except zmq.Again:
                    pass
                while sock.poll(0):
                    sock.recv_multipart()
    finally:
        context.destroy(linger=0)
    return sent


def waiting_jobs(token: str, seconds: float) -> tuple[int, int]:
    """Keep the worker busy and submit jobs with 32 MB inputs for ``seconds``: (queued, refused)."""
    queued = refused = 0
    with remote_magic.connect(token) as client:
        busy = client.submit(time.sleep, 3600)
        deadline = time.monotonic() + seconds
        futures = []
        while time.monotonic() < deadline:
            futures.append(client.submit(len, os.urandom(32 * 10**6)))
            try:
                futures[-1].result(timeout=0.5)
            except remote_magic.Busy:
                refused += 1
            except TimeoutError:
                queued += 1
        busy.cancel()
        for future in futures:
            future.cancel()
    return queued, refused


def _row(attack: str, before: int, peak: int, bound: int) -> str:
    grown = peak - before
    return (f"| {attack} | {before / 1e6:.0f} MB | {peak / 1e6:.0f} MB | {grown / 1e6:.0f} MB | "
            f"{(bound + GOAL_SLACK) / 1e6:.0f} MB | {'met' if grown <= bound + GOAL_SLACK else 'missed'} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="how long each attack lasts")
    parser.add_argument("--no-write", action="store_true", help="print the table; leave results.md as it is")
    args = parser.parse_args()
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        hub = start_worker(Path(folder) / "hub", "--listen", "127.0.0.1:0", "--gpu", "off",
                           "--max-message-size", str(MAX_MESSAGE))
        try:
            bound = 2 * MAX_MESSAGE
            memory = PeakMemory(hub.process.pid)
            chunks = unfinished_messages(Token.decode(hub.token), args.seconds)
            peak = memory.stop()
            rows.append(_row(f"{SOCKETS} sockets start large messages, {chunks:,} chunks of {PIECE >> 20} MiB",
                             memory.before, peak, bound))
            time.sleep(2)  # the hostile peers' records go in the outage grace; the next attack is measured alone
            memory = PeakMemory(hub.process.pid)
            queued, refused = waiting_jobs(hub.token, args.seconds)
            peak = memory.stop()
            rows.append(_row(f"one notebook queues 32 MB jobs: {queued} queued, {refused} refused (Busy)",
                             memory.before, peak, bound))
        finally:
            hub.stop()
    body = "\n".join([
        *zmq_peer_lines(load_before),
        f"- Hub: `remote-worker --max-message-size {MAX_MESSAGE // 10**6}MB` on 127.0.0.1; each attack "
        f"{args.seconds:g} s; resident memory sampled every 50 ms. Before issue 34 the first attack took a hub "
        "from 42 MB to 1.2 GB in 2 s (default settings), and it stayed there.",
        "",
        "| attack | hub before | hub peak | grew by | its bounds + 100 MB | goal |",
        "|---|---:|---:|---:|---:|---|",
        *rows,
    ])
    print(body)
    if not args.no_write:
        write_section("## A hostile token holder against the hub (issue 34)", body)


if __name__ == "__main__":
    main()
