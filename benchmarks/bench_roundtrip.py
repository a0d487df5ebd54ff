"""Round-trip benchmark for remote-magic (issue 2, item 10), beside raw pyzmq, ipyparallel and Dask.

Everything is measured in one run on this machine, each peer alone (the others stopped):

1. remote-magic ``Client.run("pass")`` against a local ``remote-worker`` (median, p90);
2. an empty ``%%offload`` cell through a real ``IPython.InteractiveShell`` (and, for context,
   a plain local ``run_cell`` of the same empty cell);
3. a float64 array (100 MB by default) sent and returned: ``c.run("b = a", {"a": arr}, ["b"])``;
   the rate counts both directions (200 MB moved for 100 MB) over the median time, and every
   returned array is checked against the input;
4. raw pyzmq DEALER/ROUTER over TCP loopback to an echo child process: a tiny message and the
   same array (``copy=False`` on both sides); the same pair with CurveZMQ, for context, since
   every remote-magic socket is encrypted;
5. ipyparallel with one engine: ``view.execute("pass", block=True)`` and push+pull of the array;
   Dask (when installed): ``client.submit(f, pure=False).result()``.

The table is printed (markdown) and written into the "## Round trip (issue 2)" section of
``benchmarks/results.md``, with the machine it ran on.

Run it from the repository root (the project installed, ``pip install -e .``)::

    python benchmarks/bench_roundtrip.py                     # the full run, about a minute
    python benchmarks/bench_roundtrip.py --iterations 200 --size-mb 10 --no-ipyparallel --no-write

Optional peers: ``pip install ipyparallel "dask[distributed]"``; without them their rows say so.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import zmq
from report import RESULTS_PATH, write_section, zmq_peer_lines

log = logging.getLogger("bench_roundtrip")

SECTION_TITLE = "## Round trip (issue 2)"

GOAL_RUN_PASS_S = 0.5e-3
GOAL_OFFLOAD_CELL_S = 1e-3
GOAL_RATE_FRACTION = 0.90

WORKER_START_TIMEOUT_S = 60.0
ECHO_START_TIMEOUT_S = 30.0
ECHO_REPLY_TIMEOUT_MS = 60_000
STOP_TIMEOUT_S = 10.0


# -- measurements ----------------------------------------------------------------------------

@dataclass
class Sample:
    """Seconds per call of one measured operation; ``nbytes`` is the payload each way, if any."""

    seconds: list[float]
    nbytes: int = 0

    @property
    def median(self) -> float:
        return float(np.median(self.seconds))

    @property
    def p90(self) -> float:
        return float(np.percentile(self.seconds, 90))

    @property
    def rate_gbs(self) -> float:
        """Both directions counted: 2 × nbytes over the median time, in GB/s (10^9 B)."""
        return 2 * self.nbytes / self.median / 1e9


@dataclass
class Row:
    """One line of the results table."""

    what: str
    median: str
    spread: str
    goal: str = "—"
    met: str = "—"


def time_calls(call: Callable[[], Any], warmup: int, iterations: int,
               check: Callable[[Any], None] | None = None) -> list[float]:
    """Run ``call`` ``warmup`` times untimed, then ``iterations`` times timed.

    ``check`` (outside the timed part) sees every result, so a wrong answer stops the run
    instead of producing a figure.
    """
    for _ in range(warmup):
        result = call()
        if check is not None:
            check(result)
    seconds: list[float] = []
    for _ in range(iterations):
        start = time.perf_counter()
        result = call()
        seconds.append(time.perf_counter() - start)
        if check is not None:
            check(result)
    return seconds


def make_array(size_mb: float) -> np.ndarray:
    """A float64 array of ``size_mb`` × 10^6 bytes with non-trivial contents."""
    count = int(size_mb * 1e6) // 8
    return np.random.default_rng(2).standard_normal(count)


def equal_to(expected: np.ndarray, what: str) -> Callable[[Any], None]:
    """A check that fails loudly when a returned array differs from what was sent."""
    def check(value: Any) -> None:
        if not (isinstance(value, np.ndarray) and np.array_equal(value, expected)):
            raise AssertionError(f"{what}: the array that came back differs from the one sent")
    return check


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` until it holds, or raise TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout
    delay = 0.01
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout:g} s")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.2)


# -- remote-magic ----------------------------------------------------------------------------

@contextlib.contextmanager
def remote_worker(gpu: str = "off", *, cwd: Path | None = None, command: Sequence[str] | None = None,
                  env: dict[str, str] | None = None) -> Iterator[str]:
    """Start ``remote-worker --gpu GPU`` on 127.0.0.1 with a private key directory; yield its client token.

    ``cwd``: the folder it starts in (default: a fresh one, beside its keys); ``command``: what runs it
    (default: the ``remote-worker`` on PATH); ``env``: variables added to this process's environment.
    """
    if command is None:
        executable = shutil.which("remote-worker")
        if executable is None:
            raise SystemExit("remote-worker is not on PATH: run `pip install -e .` in the repository root")
        command = [executable]
    with tempfile.TemporaryDirectory(prefix="rm-bench-") as home:
        token_file = Path(home) / "token"
        log_path = Path(home) / "worker.log"
        environment = dict(os.environ, REMOTE_MAGIC_HOME=home, **(env or {}))
        with open(log_path, "wb") as worker_log:
            # stdout carries the token: it goes nowhere; stderr is kept to explain a failed start.
            # Its working directory is a fresh folder, as a project's would be: cells look through it
            # for the files they write (docs/semantics.md, "Files"), and the repository is larger.
            process = subprocess.Popen(
                [*command, "--listen", "127.0.0.1:0", "--token-file", str(token_file), "--gpu", gpu],
                env=environment, stdout=subprocess.DEVNULL, stderr=worker_log, cwd=cwd or home)
            try:
                def ready() -> bool:
                    if process.poll() is not None:
                        raise RuntimeError(f"remote-worker exited with {process.returncode}: "
                                           f"{log_path.read_text(errors='replace')[-2000:]}")
                    return token_file.exists() and token_file.read_text().strip() != ""
                started = time.monotonic()
                wait_until(ready, WORKER_START_TIMEOUT_S, "remote-worker did not write its token")
                log.info("remote-worker ready in %.2f s", time.monotonic() - started)
                yield token_file.read_text().strip()
            finally:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    log.warning("remote-worker ignored SIGTERM for %g s; killing it", STOP_TIMEOUT_S)
                    process.kill()
                    process.wait()


def bench_client_pass(token: str, warmup: int, iterations: int) -> Sample:
    """``Client.run("pass")`` round trips."""
    import remote_magic

    with remote_magic.connect(token) as client:
        return Sample(time_calls(lambda: client.run("pass"), warmup, iterations))


def bench_client_array(token: str, array: np.ndarray, repeats: int) -> Sample:
    """``Client.run("b = a", {"a": array}, ["b"])``: the array there and back."""
    import remote_magic

    check = equal_to(array, "remote-magic")
    with remote_magic.connect(token) as client:
        seconds = time_calls(lambda: client.run("b = a", {"a": array}, ["b"])["b"], 1, repeats, check)
    return Sample(seconds, array.nbytes)


def _quiet_shell() -> Any:
    """A real IPython InteractiveShell, with history kept in memory (nothing written to ~/.ipython)."""
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    return InteractiveShell.instance(config=config)


def bench_offload_cell(token: str, warmup: int, iterations: int) -> tuple[Sample, Sample]:
    """An empty ``%%offload`` cell through ``run_cell``, and a plain local empty cell beside it."""
    main_module = sys.modules["__main__"]  # the shell puts its own namespace there; this script's comes back after
    shell = _quiet_shell()
    shell.run_line_magic("load_ext", "remote_magic")
    with contextlib.redirect_stdout(io.StringIO()):  # "Connected to ..." is not the table
        shell.run_line_magic("offload_connect", token)

    def run(cell: str) -> Callable[[], None]:
        def call() -> None:
            result = shell.run_cell(cell)
            if not result.success:
                raise RuntimeError(f"run_cell({cell!r}) failed: {result.error_in_exec or result.error_before_exec}")
        return call

    try:
        offload = Sample(time_calls(run("%%offload\npass\n"), warmup, iterations))
        local = Sample(time_calls(run("pass\n"), warmup, iterations))
    finally:
        shell.run_line_magic("offload_disconnect", "")
        sys.modules["__main__"] = main_module
    return offload, local


# -- raw pyzmq -------------------------------------------------------------------------------

ECHO_SECRET_ENV = "BENCH_ROUNDTRIP_CURVE_SECRET"


def echo_server() -> int:
    """Child process: a ROUTER that sends every message back as it came, without copying.

    Prints its port on stdout; CurveZMQ server when $BENCH_ROUNDTRIP_CURVE_SECRET holds a key.
    """
    context = zmq.Context()
    sock = context.socket(zmq.ROUTER)
    sock.linger = 0
    secret = os.environ.get(ECHO_SECRET_ENV)
    if secret:
        sock.curve_server = True
        sock.curve_secretkey = secret.encode()
    print(sock.bind_to_random_port("tcp://127.0.0.1"), flush=True)
    while True:
        frames = sock.recv_multipart(copy=False)
        if len(frames) == 2 and frames[1].bytes == b"stop":
            break
        sock.send_multipart(frames, copy=False)
    sock.close()
    context.term()
    return 0


@contextlib.contextmanager
def echo_peer(curve: bool) -> Iterator[zmq.Socket]:
    """An echo child process and a DEALER connected to it over TCP loopback (CurveZMQ if asked)."""
    server_public, server_secret = zmq.curve_keypair() if curve else (b"", b"")
    env = dict(os.environ, **{ECHO_SECRET_ENV: server_secret.decode()})
    child = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--echo-server"],
                             env=env, stdout=subprocess.PIPE, text=True)
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.rcvtimeo = ECHO_REPLY_TIMEOUT_MS  # a broken peer raises zmq.Again instead of hanging the run
    try:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], ECHO_START_TIMEOUT_S)
        line = child.stdout.readline() if ready else ""
        if not line.strip().isdigit():
            raise RuntimeError(f"the pyzmq echo process did not report its port within {ECHO_START_TIMEOUT_S:g} s "
                               f"(exit status {child.poll()})")
        if curve:
            client_public, client_secret = zmq.curve_keypair()
            sock.curve_serverkey = server_public
            sock.curve_publickey = client_public
            sock.curve_secretkey = client_secret
        sock.connect(f"tcp://127.0.0.1:{int(line)}")
        yield sock
        sock.send(b"stop")
    finally:
        sock.close()
        context.term()
        try:
            child.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def bench_pyzmq(array: np.ndarray, warmup: int, iterations: int, repeats: int, curve: bool) -> tuple[Sample, Sample]:
    """Tiny-message round trips and the array echoed, DEALER/ROUTER between two processes."""
    with echo_peer(curve) as sock:
        def tiny() -> None:
            sock.send(b"x")
            sock.recv()

        def big() -> np.ndarray:
            sock.send(array, copy=False)
            frame = sock.recv(copy=False)
            return np.frombuffer(frame.buffer, dtype=array.dtype)

        small = Sample(time_calls(tiny, warmup, iterations))
        large = Sample(time_calls(big, 1, repeats, equal_to(array, "raw pyzmq")), array.nbytes)
    return small, large


# -- ipyparallel and Dask --------------------------------------------------------------------

def bench_ipyparallel(array: np.ndarray, warmup: int, iterations: int, repeats: int) -> tuple[Sample, Sample]:
    """One engine: ``execute("pass")`` and push+pull of the array."""
    import ipyparallel

    cluster = ipyparallel.Cluster(n=1, log_level=logging.WARNING)
    started = time.monotonic()
    rc = cluster.start_and_connect_sync()
    try:
        log.info("ipyparallel: 1 engine up in %.1f s", time.monotonic() - started)
        view = rc[0]
        execute = Sample(time_calls(lambda: view.execute("pass", block=True), warmup, iterations))

        def push_pull() -> Any:
            view.push({"a": array}, block=True)
            return view.pull("a", block=True)

        transfer = Sample(time_calls(push_pull, 1, repeats, equal_to(array, "ipyparallel")), array.nbytes)
    finally:
        rc.close()
        cluster.stop_cluster_sync()
    return execute, transfer


def _nothing() -> None:
    return None


def bench_dask(warmup: int, iterations: int) -> Sample | None:
    """``client.submit(f, pure=False).result()`` against a one-process LocalCluster; None without Dask."""
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        return None
    for name in ("distributed", "tornado", "bokeh"):
        logging.getLogger(name).setLevel(logging.ERROR)
    started = time.monotonic()
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        log.info("dask: 1 worker up in %.1f s", time.monotonic() - started)
        # pure=False: a fresh key each time, so no call is answered from a previous result.
        return Sample(time_calls(lambda: client.submit(_nothing, pure=False).result(), warmup, iterations))


# -- report ----------------------------------------------------------------------------------

def ms(seconds: float) -> str:
    value = seconds * 1e3
    return f"{value:.3f} ms" if value < 10 else f"{value:.1f} ms" if value < 1000 else f"{value:.0f} ms"


def latency_row(what: str, sample: Sample, goal_s: float | None = None) -> Row:
    if goal_s is None:
        return Row(what, ms(sample.median), f"p90 {ms(sample.p90)}")
    return Row(what, ms(sample.median), f"p90 {ms(sample.p90)}", f"≤ {ms(goal_s)}",
               "yes" if sample.median <= goal_s else "no")


def rate_row(what: str, sample: Sample, goal: str = "—", met: str = "—") -> Row:
    return Row(what, ms(sample.median), f"{sample.rate_gbs:.2f} GB/s", goal, met)


def markdown_table(rows: Sequence[Row]) -> str:
    lines = ["| what | median | p90 or rate | goal | met? |", "| --- | ---: | ---: | --- | --- |"]
    lines += [f"| {r.what} | {r.median} | {r.spread} | {r.goal} | {r.met} |" for r in rows]
    return "\n".join(lines)


# -- main ------------------------------------------------------------------------------------

@dataclass
class Settings:
    """What every peer is asked to do, from the command line."""

    warmup: int
    iterations: int
    repeats: int
    array: np.ndarray

    @property
    def size(self) -> str:
        return f"{self.array.nbytes / 1e6:g} MB"


@dataclass
class RemoteMagicSamples:
    run_pass: Sample
    offload_cell: Sample
    local_cell: Sample
    transfer: Sample


def remote_magic_samples(run: Settings) -> RemoteMagicSamples:
    """remote-magic against a private remote-worker: pass, %%offload cell, local cell, array."""
    w, n, r = run.warmup, run.iterations, run.repeats
    log.info("remote-magic: starting remote-worker")
    with remote_worker() as token:
        log.info("remote-magic: Client.run('pass') × %d", n)
        run_pass = bench_client_pass(token, w, n)
        log.info("remote-magic: empty %%%%offload cell × %d", n)
        offload_cell, local_cell = bench_offload_cell(token, w, n)
        log.info("remote-magic: %s there and back × %d", run.size, r)
        transfer = bench_client_array(token, run.array, r)
    return RemoteMagicSamples(run_pass, offload_cell, local_cell, transfer)


def remote_magic_rows(run: Settings, rm: RemoteMagicSamples, raw: Sample) -> list[Row]:
    """remote-magic's rows, with the goals; the array goal compares with raw pyzmq's rate."""
    fraction = rm.transfer.rate_gbs / raw.rate_gbs
    return [
        latency_row('remote-magic `Client.run("pass")`', rm.run_pass, GOAL_RUN_PASS_S),
        latency_row("remote-magic empty `%%offload` cell (`run_cell`)", rm.offload_cell, GOAL_OFFLOAD_CELL_S),
        latency_row("local empty `run_cell` (context)", rm.local_cell),
        rate_row(f"remote-magic {run.size} there and back", rm.transfer,
                 f"≥ {GOAL_RATE_FRACTION:.0%} of raw pyzmq ({GOAL_RATE_FRACTION * raw.rate_gbs:.2f} GB/s)",
                 f"{'yes' if fraction >= GOAL_RATE_FRACTION else 'no'} ({fraction:.0%})"),
    ]


def pyzmq_rows(run: Settings) -> tuple[list[Row], list[Sample]]:
    """Raw pyzmq rows, plain and with CurveZMQ; also their array samples, in that order."""
    rows: list[Row] = []
    transfers: list[Sample] = []
    for curve in (False, True):
        label = "raw pyzmq + CurveZMQ" if curve else "raw pyzmq DEALER/ROUTER"
        context = " (context)" if curve else ""
        log.info("%s: tiny × %d, %s × %d", label, run.iterations, run.size, run.repeats)
        tiny, transfer = bench_pyzmq(run.array, run.warmup, run.iterations, run.repeats, curve)
        rows += [latency_row(f"{label}, tiny message{context}", tiny),
                 rate_row(f"{label}, {run.size} echo{context}", transfer)]
        transfers.append(transfer)
    return rows, transfers


def ipyparallel_rows(run: Settings, notes: list[str]) -> list[Row]:
    """ipyparallel's rows, or a note when it isn't installed."""
    try:
        import ipyparallel  # noqa: F401
    except ImportError:
        notes.append("ipyparallel is not installed (`pip install ipyparallel`), so it has no rows.")
        return []
    log.info("ipyparallel: execute('pass') × %d, push+pull %s × %d", run.iterations, run.size, run.repeats)
    execute, transfer = bench_ipyparallel(run.array, run.warmup, run.iterations, run.repeats)
    return [latency_row('ipyparallel `execute("pass", block=True)`', execute),
            rate_row(f"ipyparallel push+pull {run.size}", transfer)]


def dask_rows(run: Settings, notes: list[str]) -> list[Row]:
    """Dask's row, or a note when it isn't installed."""
    log.info("dask: submit().result() × %d", run.iterations)
    submit = bench_dask(run.warmup, run.iterations)
    if submit is None:
        notes.append('Dask is not installed (`pip install "dask[distributed]"`), so it has no row.')
        return []
    return [latency_row("Dask `client.submit(f, pure=False).result()`", submit)]


def method_text(run: Settings) -> str:
    """How the figures were taken, for results.md."""
    return (f"Latencies: {run.warmup} warm-up calls, then the median and 90th percentile of {run.iterations} "
            f"timed calls. Transfers: a {run.size} float64 array, 1 warm-up then {run.repeats} timed round "
            "trips, every returned array checked with `np.array_equal`; the rate counts both directions "
            "(2 × size) over the median time. Each peer runs alone, over TCP loopback; remote-magic goes "
            "client → hub (TCP, CurveZMQ) → worker → executor and back, the last hops inside the "
            "remote-worker process and its executor child. Raw pyzmq is an echo child process with "
            "`copy=False` on both sides. "
            "Goals from issue 2, item 10.")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=1000,
                        help="timed round trips per latency figure (default 1000)")
    parser.add_argument("--warmup", type=int, default=50,
                        help="untimed round trips before each latency figure (default 50)")
    parser.add_argument("--size-mb", type=float, default=100.0, help="array size in MB, 10^6 bytes (default 100)")
    parser.add_argument("--repeats", type=int, default=10, help="timed transfers of the array per peer (default 10)")
    parser.add_argument("--no-ipyparallel", action="store_true", help="leave out ipyparallel")
    parser.add_argument("--no-dask", action="store_true", help="leave out Dask")
    parser.add_argument("--no-write", action="store_true", help="print the table only; leave results.md alone")
    parser.add_argument("--echo-server", action="store_true", help=argparse.SUPPRESS)  # the raw pyzmq peer
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(arguments)
    if args.echo_server:
        return echo_server()
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    load_before = os.getloadavg()
    run = Settings(args.warmup, args.iterations, args.repeats, make_array(args.size_mb))
    notes: list[str] = []

    remote = remote_magic_samples(run)
    zmq_rows, (raw, raw_curve) = pyzmq_rows(run)
    rows = remote_magic_rows(run, remote, raw) + zmq_rows
    if args.no_ipyparallel:
        notes.append("ipyparallel left out (--no-ipyparallel).")
    else:
        rows += ipyparallel_rows(run, notes)
    if args.no_dask:
        notes.append("Dask left out (--no-dask).")
    else:
        rows += dask_rows(run, notes)

    transfer = remote.transfer
    table = markdown_table(rows)
    summary = (f"remote-magic's {run.size} rate is {transfer.rate_gbs / raw.rate_gbs:.0%} of raw pyzmq's in "
               f"the same run ({transfer.rate_gbs:.2f} vs {raw.rate_gbs:.2f} GB/s), and "
               f"{transfer.rate_gbs / raw_curve.rate_gbs:.0%} of raw pyzmq with CurveZMQ's "
               f"({raw_curve.rate_gbs:.2f} GB/s).")
    print("\n".join([table, "", summary, *notes]))
    if not args.no_write:
        command = " ".join(["python benchmarks/bench_roundtrip.py", *arguments])
        body = "\n".join([f"Measured by `{command}`.", "", *zmq_peer_lines(load_before, f"numpy {np.__version__}"),
                          "", table, "", summary, *notes, "", method_text(run)])
        write_section(SECTION_TITLE, body)
        log.info("wrote the table to %s", RESULTS_PATH)
    return 0


if __name__ == "__main__":
    sys.exit(main())
