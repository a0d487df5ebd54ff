"""Slow links (issue 11): large values over rate-limited links between network namespaces, beside raw pyzmq.

Two links, each a veth pair between two namespaces this script makes and removes, capped by a token
bucket on each end (both directions): "home" (40 Mbit/s) and "poor" (5 Mbit/s). This machine's kernel
has no netem, so the links have no added delay or loss: the rates are the issue's, the round trips are
not. The worker runs in one namespace, the notebook side (a child process) in the other. Per link, in
one run:

1. remote-magic: an empty job's round trip; a random float64 array sent (``s = x.sum()``) and one
   returned (``y = ...``), each checked, with the time and the rate; the same array sent again, and
   the returned one sent back (both held by the hub: they cross as digests); the same size of zeros
   (compressed). Bytes on the wire are the notebook end's veth counters.
2. raw pyzmq: one DEALER→ROUTER message of the same size over the same link, CurveZMQ on (as every
   remote-magic socket), no heartbeats.

And on loopback (no namespaces): a 100 MB array there and back through remote-magic beside raw pyzmq
+ CurveZMQ echoing it, to show chunking costs nothing where the link is fast.

Needs root (network namespaces). Run from the repository root::

    sudo python benchmarks/bench_links.py               # both links, about 5 minutes
    python benchmarks/bench_links.py --home-mb 20 --poor-mb 4 --no-write
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

from netns import Link, linked_namespaces  # noqa: E402  (tests/netns.py: the links the tests use)
from report import write_section, zmq_peer_lines  # noqa: E402

SECTION_TITLE = "## Slow links (issue 11)"

NOTEBOOK = r'''
import json, sys, time
import numpy as np
import remote_magic

token, size = sys.argv[1], int(sys.argv[2])
def mark(name):
    print(json.dumps({"mark": name}), flush=True)
    sys.stdin.readline()
def timed(call):
    start = time.perf_counter()
    value = call()
    return value, time.perf_counter() - start
x = np.random.default_rng(0).random(size // 8)
out = {}
with remote_magic.connect(token, timeout=60) as client:
    client.run("pass", outputs=[])
    out["empty_ms"] = 1000 * min(timed(lambda: client.run("pass", outputs=[]))[1] for _ in range(20))
    mark("up")
    total, out["up_s"] = timed(lambda: client.run("s = float(x.sum())", {"x": x}, outputs=["s"], timeout=900)["s"])
    assert total == float(x.sum())
    mark("down")
    y, out["down_s"] = timed(lambda: client.run(f"import numpy as np\ny = np.random.default_rng(1).random({x.size})",
                                                outputs=["y"], timeout=900)["y"])
    assert np.array_equal(y, np.random.default_rng(1).random(x.size))
    mark("again")
    _, out["again_s"] = timed(lambda: client.run("a = float(x[0] + y[0])", {"x": x, "y": y}, outputs=["a"]))
    mark("zeros")
    zeros = np.zeros(size // 8)
    _, out["zeros_s"] = timed(lambda: client.run("z = float(zeros.sum())", {"zeros": zeros}, outputs=["z"],
                                                 timeout=900))
    mark("done")
print(json.dumps(out), flush=True)
'''

RAW = r'''
import os, sys, time, zmq
role, address, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
public, secret = zmq.curve_keypair() if role == "client" else (None, None)
context = zmq.Context()
if role == "server":
    server_public, server_secret = sys.argv[4].encode(), sys.argv[5].encode()
    sock = context.socket(zmq.ROUTER)
    sock.curve_server, sock.curve_publickey, sock.curve_secretkey = True, server_public, server_secret
    port = sock.bind_to_random_port(f"tcp://{address}")
    print(port, flush=True)
    identity, data = sock.recv_multipart(copy=False)
    sock.send_multipart([identity.bytes, str(len(data)).encode()])
    sock.recv_multipart()
else:
    sock = context.socket(zmq.DEALER)
    sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = sys.argv[4].encode(), public, secret
    sock.connect(f"tcp://{address}")
    payload = os.urandom(size)
    start = time.perf_counter()
    sock.send(payload, copy=False)
    assert int(sock.recv()) == size
    print(time.perf_counter() - start, flush=True)
    sock.send(b"bye")
'''


def remote_magic_on(link: Link, size: int, tmp: Path) -> dict[str, Any]:
    """The notebook script's timings, with the bytes the notebook's end sent and received in each step."""
    script = tmp / "notebook.py"
    script.write_text(NOTEBOOK)
    worker = subprocess.Popen([*link.run(link.a), sys.executable, "-m", "remote_magic.worker.cli", "--listen",
                               f"{link.a_ip}:0", "--gpu", "off", "--token-file", str(tmp / "token")],
                              env={**os.environ, "REMOTE_MAGIC_HOME": str(tmp / "home")}, cwd=tmp,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (tmp / "token").exists() or not (tmp / "token").read_text().strip():
            if time.monotonic() > deadline or worker.poll() is not None:
                raise RuntimeError("remote-worker did not start")
            time.sleep(0.1)
        token = (tmp / "token").read_text().strip()
        notebook = subprocess.Popen([*link.run(link.b), sys.executable, str(script), token, str(size)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert notebook.stdin is not None and notebook.stdout is not None
        wire: dict[str, int] = {}
        last, start = None, (0, 0)
        while True:
            line = json.loads(notebook.stdout.readline())
            counters = link.sent_bytes(link.b), link.sent_bytes(link.a)
            if last is not None:
                wire[f"{last}_up"], wire[f"{last}_down"] = counters[0] - start[0], counters[1] - start[1]
            if "mark" not in line:
                return {**line, "wire": wire}
            last, start = line["mark"], counters
            notebook.stdin.write("\n")
            notebook.stdin.flush()
    finally:
        worker.terminate()
        worker.wait(30)


def raw_pyzmq_on(link: Link, size: int, tmp: Path) -> float:
    """Seconds for one message of ``size`` bytes over the link, raw pyzmq with CurveZMQ."""
    import zmq

    script = tmp / "raw.py"
    script.write_text(RAW)
    public, secret = (key.decode() for key in zmq.curve_keypair())
    server = subprocess.Popen([*link.run(link.a), sys.executable, str(script), "server", link.a_ip, str(size),
                               public, secret], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    port = server.stdout.readline().strip()
    client = subprocess.run([*link.run(link.b), sys.executable, str(script), "client", f"{link.a_ip}:{port}",
                             str(size), public], capture_output=True, text=True, timeout=1800, check=True)
    server.wait(60)
    return float(client.stdout.strip())


def loopback(size: int) -> tuple[float, float]:
    """Seconds for ``size`` bytes there and back: remote-magic, and raw pyzmq + CurveZMQ (bench_roundtrip's)."""
    import numpy as np
    from bench_roundtrip import bench_pyzmq, remote_worker  # the round-trip benchmark's own peers

    import remote_magic

    array = np.random.default_rng(0).random(size // 8)
    with remote_worker() as token, remote_magic.connect(token) as client:
        times = []
        for _ in range(4):
            start = time.perf_counter()
            back = client.run("b = a", {"a": array}, ["b"])["b"]
            times.append(time.perf_counter() - start)
            assert np.array_equal(back, array)
    _, raw = bench_pyzmq(array, 1, 1, 4, curve=True)
    return sorted(times)[len(times) // 2], raw.median


def mbit(size: int, seconds: float) -> str:
    return f"{size * 8 / seconds / 1e6:.1f} Mbit/s"


def run(args: argparse.Namespace) -> str:
    rows = []
    for name, rate, size_mb in (("home", 40, args.home_mb), ("poor", 5, args.poor_mb)):
        size = int(size_mb * 1e6)
        with tempfile.TemporaryDirectory() as folder, linked_namespaces("the slow-link benchmark",
                                                                        rate_mbit=rate) as link:
            ours = remote_magic_on(link, size, Path(folder))
            raw = raw_pyzmq_on(link, size, Path(folder))
        wire = ours["wire"]
        print(f"{name}: {json.dumps(ours)} raw {raw:.1f} s", file=sys.stderr)
        rows += [
            f"| {name} ({rate} Mbit/s) | empty job | {ours['empty_ms']:.1f} ms | | |",
            f"| {name} | {size_mb:g} MB random array sent | {ours['up_s']:.1f} s ({mbit(size, ours['up_s'])}) | "
            f"{wire['up_up'] / 1e6:.1f} MB | raw pyzmq + CurveZMQ, one message: {raw:.1f} s ({mbit(size, raw)}) |",
            f"| {name} | {size_mb:g} MB random array returned | {ours['down_s']:.1f} s "
            f"({mbit(size, ours['down_s'])}) | {wire['down_down'] / 1e6:.1f} MB | |",
            f"| {name} | both sent again (the hub holds them) | {ours['again_s']:.2f} s | "
            f"{wire['again_up'] / 1e6:.3f} MB | before: every byte again |",
            f"| {name} | {size_mb:g} MB of zeros sent | {ours['zeros_s']:.2f} s | {wire['zeros_up'] / 1e6:.3f} MB | |",
        ]
    ours_s, raw_s = loopback(int(args.loopback_mb * 1e6))
    rate = lambda seconds: f"{2 * args.loopback_mb / 1e3 / seconds:.2f} GB/s"  # noqa: E731
    rows += [f"| loopback | {args.loopback_mb:g} MB there and back | {ours_s * 1e3:.0f} ms ({rate(ours_s)}) | | "
             f"raw pyzmq + CurveZMQ echo: {raw_s * 1e3:.0f} ms ({rate(raw_s)}); "
             f"remote-magic at {raw_s / ours_s:.0%} of it |"]
    return "\n".join(["| link | what | time | bytes the notebook end sent (received, for returns) | beside it |",
                      "| --- | --- | ---: | ---: | --- |", *rows])


NOTES = ("Each link is a veth pair between two network namespaces with a token bucket (tbf) on each end; this "
         "machine's kernel has no netem, so the links add no delay or loss. Bytes are the notebook end's veth "
         "counters (TCP/IP and CurveZMQ included). Random arrays are checked on arrival. Raw pyzmq sends one "
         "message of the same size with CurveZMQ, no heartbeats, as a bound on the link's pace.")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home-mb", type=float, default=200.0, help="array size over the home link (default 200)")
    parser.add_argument("--poor-mb", type=float, default=20.0, help="array size over the poor link (default 20)")
    parser.add_argument("--loopback-mb", type=float, default=100.0, help="array size on loopback (default 100)")
    parser.add_argument("--no-write", action="store_true", help="print the table only; leave results.md alone")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    table = run(args)
    print(table)
    if not args.no_write:
        body = "\n".join(["Measured by `python benchmarks/bench_links.py` (as root).", "",
                          *zmq_peer_lines(load_before), "", table, "", NOTES])
        write_section(SECTION_TITLE, body)


if __name__ == "__main__":
    main()
