"""Slow and lossy links (issues 11 and 23): the WAN benchmark, over emulated links between network
namespaces, beside raw pyzmq on the same link in the same run.

Each link joins two network namespaces this script makes and removes (``tests/netns.py``). This
machine's kernel has no netem, so a user-space packet relay between a TUN device in each namespace
(``tests/relays.py``) applies the link's rate, its delay (half the round trip each way) and its loss
(each packet on its own, each way) to every packet on the wire; TCP sees the whole round trip and
every loss. TCP in both namespaces is reno (``--congestion``): it backs off on loss as cubic, the
usual default at a notebook's and a worker's end, does (cubic itself can be set only in the
machine's own namespace; bbr hardly slows down for random loss). Profiles, as the issues name them:
"home" (60 ms round trip, 40 Mbit/s) and "poor" (200 ms, 5 Mbit/s), each without loss, with 0.1% and
with 1%.

Per link, the worker in one namespace and the notebook (a child process) in the other:

- remote-magic's first sends: a random float64 array sent up as a job's input, and one as large come
  down as a job's result (made on the worker from a seed), each checked on arrival, each beside
  raw pyzmq (CurveZMQ on, one DEALER/ROUTER message) moving as many bytes the same way; bytes on the
  wire (the sending end's counter: TCP/IP, CurveZMQ, resends included) beside the data's size; the
  array sent once more (the hub holds it, so its digest crosses);
- without loss, also: an empty job's round trip (median of 10) beside a tiny raw message's; a 95%-zeros
  array sent (it crosses compressed); a job's result after a 10 s outage, collected with
  ``attach`` (the notebook dials the hub through a stream relay that is cut and restored); and Ctrl-C
  once a tenth of a 20 MB result has come down: how long until the cell raises, and until the next
  cell's result, beside raw pyzmq interrupted in its receive of as many bytes (its next answer comes
  after the rest of the reply on the same socket; on a new socket, after a new handshake).

And on loopback (no namespaces): a 100 MB array there and back through remote-magic beside raw pyzmq +
CurveZMQ echoing it, to show chunking costs nothing where the link is fast.

Goals (issue 23): each first send at least 90% of raw pyzmq's speed on the same link, both ways; at
most 1.05 bytes on the wire per byte of data, read against raw pyzmq's bytes for the same data (TCP/IP
headers and TCP's own retransmissions are every sender's).

Needs root (network namespaces). Run from the repository root::

    sudo python benchmarks/bench_links.py           # every profile, about half an hour
    sudo python benchmarks/bench_links.py --profiles poor --losses 1 --lossy-size-mb 2 --no-loopback --no-write
    sudo python benchmarks/bench_links.py --losses 0 --ctrl-c-only --no-loopback  # minutes; its own section
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

from netns import Link, linked_namespaces  # noqa: E402  (tests/netns.py: the links the tests use)
from relays import StreamRelay  # noqa: E402
from report import write_section, zmq_peer_lines  # noqa: E402

from remote_magic.wire.tokens import Token  # noqa: E402
from support import RAW_PYZMQ, raw_pyzmq_over, raw_pyzmq_server  # noqa: E402

SECTION_TITLE = "## Slow links (issue 11)"  # its loss rows are issue 23's; the title stays, so the section is replaced
CTRL_C_SECTION_TITLE = "## Ctrl-C during a download (issue 34)"
"""Where ``--ctrl-c-only`` writes its rows, leaving the whole table's section as it is."""
PROFILES = {"home": (40, 60), "poor": (5, 200)}  # name: Mbit/s, round trip in ms
LOSSES = (0.0, 0.1, 1.0)  # percent of packets, each way
OUTAGE_S = 10.0
CTRL_C_MB = 20.0
CTRL_C_AFTER = 0.1  # of the download: when Ctrl-C is pressed
SPEED_GOAL = 0.9  # of raw pyzmq's speed
WIRE_GOAL = 1.05  # bytes on the wire per byte of data

SENDS = r'''
import json, sys, time
import numpy as np
import remote_magic

token, size = sys.argv[1], int(sys.argv[2])
out = {}
def mark(name):
    print(json.dumps({"mark": name}), flush=True)
    sys.stdin.readline()
def step(name, call):
    """Time one step; a step that fails is timed to its failure and named (the next steps still run)."""
    mark(name)
    start = time.perf_counter()
    try:
        call()
    except Exception as exc:
        out[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    out[f"{name}_s"] = time.perf_counter() - start
def up():
    assert client.run("s = float(x.sum())", {"x": x}, outputs=["s"], timeout=7200)["s"] == float(x.sum())
def down():
    y = client.run("import numpy as np\ny = np.random.default_rng(1).random(n)", {"n": size // 8}, outputs=["y"],
                   timeout=7200)["y"]
    assert np.array_equal(y, np.random.default_rng(1).random(size // 8))
x = np.random.default_rng(0).random(size // 8)
with remote_magic.connect(token, timeout=60) as client:
    client.run("pass", outputs=[])  # connected, the session's interpreter up: what follows is the data
    step("up", up)
    step("down", down)
    step("again", up)  # the hub holds x now: its digest crosses
    mark("done")
print(json.dumps(out), flush=True)
'''

LOSSLESS = r'''
import json, statistics, sys, time
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
rng = np.random.default_rng(0)
sparse = np.where(rng.random(size // 8) < 0.05, rng.random(size // 8), 0.0)
out = {}
with remote_magic.connect(token, timeout=60) as client:
    client.run("pass", outputs=[])
    out["empty_ms"] = 1000 * statistics.median(timed(lambda: client.run("pass", outputs=[]))[1] for _ in range(10))
    mark("sparse")
    total, out["sparse_s"] = timed(lambda: client.run("s = float(x.sum())", {"x": sparse}, outputs=["s"],
                                                      timeout=1800)["s"])
    assert total == float(sparse.sum())
    mark("outage")
    def started(header):
        if "started" in header["text"]:
            print(json.dumps({"event": "started"}), flush=True)
    try:  # the link goes down 1 s into this job, for longer than the heartbeat bound
        client.execute("import time\nprint('started', flush=True)\ntime.sleep(4)\nprint('ended')\nz = 7",
                       on_stream=started)
        raise AssertionError("the job ended though its link was down")
    except remote_magic.ConnectionFailed:
        pass
    sys.stdin.readline()  # the link is back
    back = time.perf_counter()
    while True:
        try:
            waiting = client.jobs(timeout=5)
        except remote_magic.RemoteMagicError:
            waiting = []
        if waiting:
            break
        time.sleep(0.01)
    printed = []
    result = client.attach(waiting[0]["job"], on_stream=lambda h: printed.append(h["text"]))
    out["outage_result_s"] = time.perf_counter() - back
    assert result.values["z"] == 7 and "".join(printed) == "started\nended\n", printed
    mark("done")
print(json.dumps(out), flush=True)
'''


CTRL_C = r'''
import json, os, signal, sys, threading, time
import remote_magic

token, size, after = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
out, pressed = {}, []
with remote_magic.connect(token, timeout=60) as client:
    client.run("pass", outputs=[])
    before = client.bytes_received
    def press():
        deadline = time.monotonic() + 3600
        while client.bytes_received - before < after * size and time.monotonic() < deadline:
            time.sleep(0.005)  # polling the counter, bounded by the deadline
        pressed.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)
    threading.Thread(target=press, daemon=True).start()
    try:
        client.run(f"import os\ny = os.urandom({size})", outputs=["y"], timeout=3600)
        out["error"] = "the download ended before Ctrl-C"
    except KeyboardInterrupt:
        out["raise_s"] = time.perf_counter() - pressed[0]
    assert client.run("z = 2", outputs=["z"])["z"] == 2
    out["next_s"] = time.perf_counter() - pressed[0]
print(json.dumps(out), flush=True)
'''

RAW_CTRL_C = r'''
import json, os, signal, sys, threading, time, zmq

address, server_key, size, after = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3]), float(sys.argv[4])
context = zmq.Context()
def dealer():
    sock = context.socket(zmq.DEALER)
    public, secret = zmq.curve_keypair()
    sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = server_key, public, secret
    sock.linger = 0
    sock.connect(f"tcp://{address}")
    return sock
def received():  # what this namespace's devices took in: a raw message shows nothing until it is whole
    lines = open("/proc/net/dev").read().splitlines()[2:]
    return sum(int(line.split(":")[1].split()[0]) for line in lines if line.split(":")[0].strip() != "lo")
out = {}
for fresh in (False, True):
    sock = dealer()
    sock.send(b"x")
    sock.recv()
    before, pressed = received(), []
    def press():
        deadline = time.monotonic() + 3600
        while received() - before < after * size and time.monotonic() < deadline:
            time.sleep(0.005)  # polling the counter, bounded by the deadline
        pressed.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)
    threading.Thread(target=press, daemon=True).start()
    try:
        sock.send(f"get:{size}".encode())
        sock.recv(copy=False)
        out["error"] = "the download ended before Ctrl-C"
    except KeyboardInterrupt:  # the slower of the two presses
        out["raise_s"] = max(out.get("raise_s", 0.0), time.perf_counter() - pressed[0])
    if fresh:  # what a user who knows the rest would come first does: a new socket
        sock.close()
        sock = dealer()
    sock.send(b"x")
    while sock.recv(copy=False).bytes != b"1":  # on the same socket, the rest of the reply comes first
        pass
    out["new_socket_s" if fresh else "same_socket_s"] = time.perf_counter() - pressed[0]
    sock.close()
print(json.dumps(out), flush=True)
'''


@dataclass
class Measured:
    """One link's figures: what the notebook script reported, and the bytes each end sent in each step."""

    report: dict[str, Any]
    notebook_sent: dict[str, int]
    hub_sent: dict[str, int]


def _python(link: Link, namespace: str, source: str, tmp: Path, *args: str, **popen: Any) -> subprocess.Popen[str]:
    script = tmp / f"script-{abs(hash(source))}.py"
    script.write_text(source)
    return subprocess.Popen([*link.run(namespace), sys.executable, str(script), *args], text=True, **popen)


@contextmanager
def worker_on(link: Link, tmp: Path) -> Iterator[Token]:
    """A remote-worker in the link's namespace ``a``; its client token."""
    token_file = tmp / "token"
    worker = subprocess.Popen([*link.run(link.a), sys.executable, "-m", "remote_magic.worker.cli", "--listen",
                               f"{link.a_ip}:0", "--gpu", "off", "--token-file", str(token_file)],
                              env={**os.environ, "REMOTE_MAGIC_HOME": str(tmp / "home")}, cwd=tmp,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not token_file.exists() or not token_file.read_text().strip():
            if time.monotonic() > deadline or worker.poll() is not None:
                raise RuntimeError("remote-worker did not start")
            time.sleep(0.1)  # polling for the token file, bounded by the deadline
        yield Token.decode(token_file.read_text().strip())
    finally:
        worker.terminate()
        worker.wait(30)


def notebook_steps(link: Link, source: str, token: Token, size: int, tmp: Path,
                   relay: StreamRelay | None = None) -> Measured:
    """Run a notebook script in namespace ``b``, reading both ends' byte counters at each of its marks.

    An ``event: started`` line from it cuts ``relay`` for OUTAGE_S (a link that goes down), then restores it.
    """
    notebook = _python(link, link.b, source, tmp, token.encode(), str(size), stdin=subprocess.PIPE,
                       stdout=subprocess.PIPE)
    assert notebook.stdin is not None and notebook.stdout is not None
    notebook_sent: dict[str, int] = {}
    hub_sent: dict[str, int] = {}
    last, start = None, (0, 0)
    try:
        while True:
            line = json.loads(notebook.stdout.readline() or "{}")
            if line.get("event") == "started" and relay is not None:
                relay.cut()
                time.sleep(OUTAGE_S)  # the outage itself, not a wait for anything
                relay.restore()
                notebook.stdin.write("back\n")
                notebook.stdin.flush()
                continue
            counters = link.sent_bytes(link.b), link.sent_bytes(link.a)
            if last is not None:
                notebook_sent[last], hub_sent[last] = counters[0] - start[0], counters[1] - start[1]
            if "mark" not in line:
                if not line:
                    raise RuntimeError(f"the notebook script failed ({notebook.wait(30)})")
                return Measured(line, notebook_sent, hub_sent)
            last, start = line["mark"], counters
            notebook.stdin.write("\n")
            notebook.stdin.flush()
    finally:
        if notebook.poll() is None:
            notebook.kill()
        notebook.wait(30)


def ctrl_c_rows(name: str, link: Link, token: Token, tmp: Path, rtt: str) -> list[str]:
    """Ctrl-C during a download: remote-magic's cell, and raw pyzmq interrupted in its receive."""
    size = int(CTRL_C_MB * 1e6)
    ours = _python(link, link.b, CTRL_C, tmp, token.encode(), str(size), str(CTRL_C_AFTER), stdout=subprocess.PIPE)
    assert ours.stdout is not None
    report = json.loads(ours.stdout.readline() or '{"error": "the notebook script failed"}')
    ours.wait(60)
    with raw_pyzmq_server(link, tmp / "raw-server.py", RAW_PYZMQ) as (address, key):
        raw_client = _python(link, link.b, RAW_CTRL_C, tmp, address, key, str(size), str(CTRL_C_AFTER),
                             stdout=subprocess.PIPE)
        assert raw_client.stdout is not None
        raw = json.loads(raw_client.stdout.readline() or '{"error": "the raw script failed"}')
        raw_client.wait(60)
    print(f"{name} Ctrl-C: {json.dumps(report)} raw {json.dumps(raw)}", file=sys.stderr)
    what = f"Ctrl-C {CTRL_C_AFTER:.0%} into a {CTRL_C_MB:g} MB result: the cell raises, the next cell's result"
    if "error" in report or "error" in raw:
        return [_row(name, what, report.get("error", ""), raw.get("error", ""), "raises at once; next < 1 s",
                     "no (failed)")]
    met = report["raise_s"] <= 0.1 and report["next_s"] - report["raise_s"] <= 1.0
    return [_row(name, what, f"raised in {report['raise_s'] * 1e3:.0f} ms, next result {report['next_s']:.2f} s "
                             "after the press",
                 f"raised in {raw['raise_s'] * 1e3:.0f} ms; next answer {raw['same_socket_s']:.2f} s (same socket: "
                 f"the rest of the reply first), {raw['new_socket_s']:.2f} s (a new socket); RTT {rtt}",
                 "raises at once; next cell < 1 s later", "yes" if met else "no")]


def loopback(size: int) -> tuple[float, float]:
    """Seconds for ``size`` bytes there and back: remote-magic, and raw pyzmq + CurveZMQ (bench_roundtrip's)."""
    import numpy as np
    from bench_roundtrip import bench_pyzmq, remote_worker  # the round-trip benchmark's own peers

    import remote_magic

    array = np.random.default_rng(0).random(size // 8)
    with remote_worker() as token, remote_magic.connect(token) as client:
        times = []
        for _ in range(5):
            start = time.perf_counter()
            back = client.run("b = a", {"a": array}, ["b"])["b"]
            times.append(time.perf_counter() - start)
            assert np.array_equal(back, array)
    _, raw = bench_pyzmq(array, 1, 1, 5, curve=True)
    return sorted(times)[len(times) // 2], raw.median


def _row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


def _send_row(name: str, what: str, sends: Measured, step: str, wire: int, size: int, raw_s: float,
              raw_wire: int) -> str:
    """A first send's row: speed against raw pyzmq's, and bytes on the wire against raw pyzmq's."""
    seconds = sends.report[f"{step}_s"]
    raw = f"{raw_s:.1f} s ({raw_wire / 1e6:.2f} MB, {raw_wire / size:.3f}×)"
    goal = f"≥ {SPEED_GOAL:.0%} of raw's speed; bytes ≤ {WIRE_GOAL}× raw's"
    error = sends.report.get(f"{step}_error")
    if error:
        return _row(name, what, f"failed after {seconds:.1f} s ({wire / 1e6:.2f} MB): {error.split(':')[0]}", raw,
                    goal, "no (failed)")
    speed, overhead = raw_s / seconds, wire / raw_wire
    met = "yes" if speed >= SPEED_GOAL and overhead <= WIRE_GOAL else "no"
    return _row(name, what, f"{seconds:.1f} s ({wire / 1e6:.2f} MB, {wire / size:.3f}×)", raw, goal,
                f"{met} ({speed:.0%}, {overhead:.3f}×)")


def link_rows(name: str, rate: int, rtt_ms: int, loss: float, size: int, congestion: str,
              ctrl_c_only: bool = False) -> list[str]:
    """The table's rows for one emulated link (``ctrl_c_only``: the Ctrl-C row alone)."""
    label = f"{name} ({rtt_ms} ms, {rate} Mbit/s, {loss:g}% loss)"
    with tempfile.TemporaryDirectory() as folder, linked_namespaces(
            "the link benchmark", rate_mbit=rate, rtt_ms=rtt_ms, loss_percent=loss,
            congestion_control=congestion) as link:
        tmp = Path(folder)
        if ctrl_c_only:
            with worker_on(link, tmp) as token:
                return ctrl_c_rows(label, link, token, tmp, f"{rtt_ms} ms (the link's)")
        with worker_on(link, tmp) as token:
            sends = notebook_steps(link, SENDS, token, size, tmp)
            lossless = None
            if not loss:
                with StreamRelay(link.run(link.b), link.b_ip, link.a_ip, int(token.address.rsplit(":", 1)[1])) \
                        as relay:
                    relayed = token.with_address(f"tcp://{link.b_ip}:{relay.port}")
                    lossless = notebook_steps(link, LOSSLESS, relayed, size, tmp, relay)
                ctrl_c = ctrl_c_rows(name, link, token, tmp, f"{rtt_ms} ms (the link's)")
        raw = raw_pyzmq_over(link, size, tmp)
        lost = link.relay_stats()
    print(f"{label}: {json.dumps(sends.__dict__)} {json.dumps(lossless.__dict__ if lossless else None)} "
          f"raw {raw} relay {lost}", file=sys.stderr)
    mb, rtt = f"{size / 1e6:g} MB", f"{raw.rtt_s * 1e3:.1f} ms"
    rows = [
        _send_row(label, f"{mb} random array sent up (first send)", sends, "up", sends.notebook_sent["up"], size,
                  raw.seconds["up"], raw.wire["up"]),
        _send_row(name, f"{mb} random array back down (a first result)", sends, "down", sends.hub_sent["down"],
                  size, raw.seconds["down"], raw.wire["down"]),
    ]
    again = sends.report["again_s"]
    if sends.report.get("up_error") or sends.report.get("again_error"):  # the hub may not hold it: no figure
        rows.append(_row(name, "the random array again (the hub holds it)",
                         f"failed: {sends.report.get('again_error') or 'the first send failed'}"[:120], f"RTT {rtt}",
                         "≤ 2 × RTT", "no (failed)"))
    else:
        rows.append(_row(name, "the random array again (the hub holds it)",
                         f"{again * 1e3:.0f} ms ({sends.notebook_sent['again'] / 1e3:.1f} kB)", f"RTT {rtt}",
                         "≤ 2 × RTT", "yes" if again <= 2 * raw.rtt_s else f"no ({again / raw.rtt_s:.1f}×)"))
    if lossless is not None:
        ours = lossless.report
        rows += [
            _row(name, "empty job, round trip", f"{ours['empty_ms']:.1f} ms", f"tiny message {rtt}", "≤ 1.1 × RTT",
                 "yes" if ours["empty_ms"] <= 1.1 * raw.rtt_s * 1e3
                 else f"no ({ours['empty_ms'] / raw.rtt_s / 1e3:.2f}×)"),
            _row(name, f"{mb} compressible array sent (95% zeros)",
                 f"{ours['sparse_s']:.1f} s ({lossless.notebook_sent['sparse'] / 1e6:.1f} MB)",
                 f"{raw.seconds['up']:.1f} s (random)", "faster than raw",
                 "yes" if ours["sparse_s"] < raw.seconds["up"] else "no"),
            _row(name, f"a job's result after a {OUTAGE_S:g} s outage (it ran on; collected with `attach`)",
                 f"{ours['outage_result_s']:.2f} s after the link's return, all its output", f"RTT {rtt}",
                 "within 1 RTT of the return", "yes" if ours["outage_result_s"] <= raw.rtt_s
                 else f"no ({ours['outage_result_s'] / raw.rtt_s:.0f}×)"),
            *ctrl_c,
        ]
    return rows


def run(args: argparse.Namespace) -> str:
    rows = []
    for name in args.profiles:
        rate, rtt_ms = PROFILES[name]
        for loss in args.losses:
            size = int((args.lossy_size_mb if loss else args.size_mb) * 1e6)
            rows += link_rows(name, rate, rtt_ms, loss, size, args.congestion, args.ctrl_c_only)
    if args.loopback_mb:
        ours_s, raw_s = loopback(int(args.loopback_mb * 1e6))

        def speed(seconds: float) -> str:
            return f"{2 * args.loopback_mb / 1e3 / seconds:.2f} GB/s"

        rows.append(_row("loopback", f"{args.loopback_mb:g} MB there and back",
                         f"{ours_s * 1e3:.0f} ms ({speed(ours_s)})", f"echo {raw_s * 1e3:.0f} ms ({speed(raw_s)})",
                         "not slower than raw", f"{'yes' if ours_s <= raw_s else 'no'} ({ours_s / raw_s:.0%} of "
                         "raw's time)"))
    return "\n".join(["| link | what | remote-magic (bytes on the wire, per byte of data) | raw pyzmq + CurveZMQ, "
                      "same link (the same) | goal | met? |", "| --- | --- | ---: | ---: | --- | --- |", *rows])


NOTES = ("Each link joins two network namespaces through a user-space packet relay between TUN devices (this "
         "machine's kernel has no netem): the relay serialises each direction at the link's rate (a queue of at most "
         "0.25 s, tail drop), loses each packet at random with the link's loss rate, and delivers it half the round "
         "trip later, so TCP sees the whole round trip and every loss. TCP is reno in both namespaces (loss-based, as"
         " the cubic of most notebook and worker machines; this machine's bbr hardly slows down for random loss). Raw"
         " pyzmq moves one message of the same size the same way on the same link, after remote-magic, in the same "
         "run. Bytes on the wire are the sending end's device counter (TCP/IP, CurveZMQ, resends included): the "
         "notebook's for what goes up, the hub's for what comes down, beside the data's size. The issue's goal (at "
         "most 1.05 bytes per byte of data) counts what remote-magic adds; any sender also pays TCP/IP headers (3.6% "
         "at a 1500-byte MTU) and TCP's own retransmissions, so the goal is read against raw pyzmq's bytes for the "
         "same data on the same link. A result's time includes making it on the worker (a random array from a seed: a"
         " fraction of a second). Every array is checked on arrival. The outage: the notebook dials the hub through a"
         " stream relay, which stops 1 s into a 4 s job and starts again 10 s later; the notebook's call fails after "
         "the 5 s heartbeat bound (ConnectionFailed), the job runs on, and the time runs from the link's return until"
         " `Client.attach` has the result and the job's whole output. Ctrl-C: pressed (SIGINT) once a tenth of a 20 MB"
         " random result has come down (the notebook's received-bytes counter; for raw pyzmq, whose message shows"
         " nothing until whole, the namespace's received bytes); times run from the press.")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profiles", nargs="+", choices=sorted(PROFILES), default=list(PROFILES),
                        help="which links (default: all)")
    parser.add_argument("--losses", nargs="+", type=float, default=list(LOSSES),
                        help="loss rates in percent, each way (default: 0 0.1 1)")
    parser.add_argument("--size-mb", type=float, default=50.0, help="array size over a lossless link (default 50)")
    parser.add_argument("--lossy-size-mb", type=float, default=10.0, help="array size over a lossy link (default 10)")
    parser.add_argument("--loopback-mb", type=float, default=100.0, help="array size on loopback (default 100)")
    parser.add_argument("--no-loopback", dest="loopback_mb", action="store_const", const=0.0,
                        help="leave the loopback row out")
    parser.add_argument("--ctrl-c-only", action="store_true", help="only the Ctrl-C rows: minutes, not half an hour")
    parser.add_argument("--congestion", default="reno", help="TCP congestion control in the namespaces (default reno)")
    parser.add_argument("--no-write", action="store_true", help="print the table only; leave results.md alone")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    table = run(args)
    print(table)
    if not args.no_write:
        options = " --losses 0 --ctrl-c-only --no-loopback" if args.ctrl_c_only else ""
        body = "\n".join([f"Measured by `python benchmarks/bench_links.py{options}` (as root).", "",
                          *zmq_peer_lines(load_before), "", table, "", NOTES])
        write_section(CTRL_C_SECTION_TITLE if args.ctrl_c_only else SECTION_TITLE, body)


if __name__ == "__main__":
    main()
