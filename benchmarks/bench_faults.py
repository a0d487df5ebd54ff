"""Faults and bursts benchmark for remote-magic (issue 10, item 7), beside ipyparallel and Dask.

Everything is measured in one run on this machine, each peer alone, over 127.0.0.1 only:

1. a burst of tiny submits: ``client.submit(square, i)`` for i in range(10,000) in a tight loop
   against a private ``remote-worker``, then a wait for every future; jobs/s from the first submit
   to the last result, every result checked, futures still pending after a generous deadline
   counted as lost. For context, the same burst through ipyparallel (one engine, a load-balanced
   view's ``apply_async``) and Dask (``client.submit(..., pure=False)``, one worker process with one
   thread), when they are installed;
2. the time a running job takes to fail once its worker is gone: a hub (``--name home``) and a
   second worker process ``joiner`` that joined it run a job on ``joiner`` that prints a line and
   spins; once the line arrives the joiner is SIGKILLed, SIGSTOPped, or loses its network (it
   reaches the hub through a TCP relay that stops forwarding bytes but keeps every socket open),
   and the seconds until the client's call raises are measured, with the exception it raised.
   Default heartbeats throughout, with ``--outage-grace 5``: since issue 34 a worker out of reach is
   waited for up to that bound (300 s by default) before its job fails, so the figure a user sees by
   default is 300 s more.

The tables are printed (markdown) and written into the "## Faults and bursts (issue 10)" section
of ``benchmarks/results.md``, with the machine they ran on.

Run it from the repository root (the project installed, ``pip install -e .``)::

    python benchmarks/bench_faults.py                        # the full run, a few minutes
    python benchmarks/bench_faults.py --burst 500 --repeat 1 --no-ipyparallel --no-dask --no-write

Optional peers: ``pip install ipyparallel "dask[distributed]"``; without them their rows say so.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import logging
import os
import platform
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Coroutine, Iterator, Sequence

import psutil
from report import RESULTS_PATH, write_section, zmq_peer_lines

log = logging.getLogger("bench_faults")

SECTION_TITLE = "## Faults and bursts (issue 10)"
OUTAGE_GRACE_S = 5.0
"""The hub's --outage-grace here: how long a worker out of reach is waited for before its job fails."""

WORKER_START_TIMEOUT_S = 60.0
"""How long a remote-worker (hub or joiner) may take to start and be listed as idle."""
STOP_TIMEOUT_S = 10.0
"""How long a process may take to exit after SIGTERM before it is killed."""
TOKEN_COMMAND_TIMEOUT_S = 30.0
PEER_START_TIMEOUT_S = 120.0
"""How long the warm-up call of a burst may take (it waits for the peer's first worker)."""
SPIN_START_TIMEOUT_S = 60.0
"""How long the spinning job may take to print its line once submitted."""
FAIL_TIMEOUT_S = 120.0
"""How long after the fault the client's call may take to raise before it counts as never failing."""
RECOVERY_TIMEOUT_S = 60.0
"""How long the joiner may take to run a job again after SIGCONT or after the network heals."""
ORPHAN_TIMEOUT_S = 30.0
"""How long a SIGKILLed joiner's executor may outlive it before this script kills it."""
RELAY_CALL_TIMEOUT_S = 5.0

SPIN_CODE = "print('spinning', flush=True)\nwhile True:\n    pass\n"
SPIN_LINE = "spinning"
JOINER = "joiner"
FAULTS = ("kill", "stop", "network")
FAULT_LABELS = {"kill": "SIGKILL of the joiner process", "stop": "SIGSTOP of the joiner process",
                "network": "network loss (relay forwards nothing, sockets stay open)"}


def square(i: int) -> int:
    """The burst's job: tiny, and its answer is easy to check."""
    return i * i


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``predicate`` until it holds, or raise TimeoutError naming ``what``; returns the seconds it took."""
    started = time.monotonic()
    deadline = started + timeout
    delay = 0.01
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout:g} s")
        time.sleep(delay)  # polling with a deadline, not synchronisation
        delay = min(delay * 1.5, 0.2)
    return time.monotonic() - started


# -- processes -------------------------------------------------------------------------------

@dataclass
class WorkerProcess:
    """A ``remote-worker`` this script started, with its private key directory and log."""

    process: subprocess.Popen[bytes]
    home: Path
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def check_alive(self) -> None:
        """Raise with the log's end if the process has exited."""
        if self.process.poll() is not None:
            raise RuntimeError(f"remote-worker exited with {self.process.returncode}: {self.log_tail()}")

    def executors(self) -> list[psutil.Process]:
        """The processes it started (its executor), which a SIGKILL leaves behind."""
        try:
            return psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> None:
        """SIGCONT (it may be stopped), SIGTERM, and SIGKILL if it ignores that."""
        if self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGCONT)
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.warning("remote-worker %d ignored SIGTERM for %g s; killing it", self.pid, STOP_TIMEOUT_S)
            self.process.kill()
            self.process.wait()


def remote_worker_executable() -> str:
    executable = shutil.which("remote-worker")
    if executable is None:
        raise SystemExit("remote-worker is not on PATH: run `pip install -e .` in the repository root")
    return executable


def spawn_worker(home: Path, args: Sequence[str], env: dict[str, str] | None = None) -> WorkerProcess:
    """Start ``remote-worker ARGS`` with ``home`` as its REMOTE_MAGIC_HOME; stdout and stderr go to its log."""
    home.mkdir(parents=True, exist_ok=True)
    log_path = home / "worker.log"
    environment = {**os.environ, "REMOTE_MAGIC_HOME": str(home), **(env or {})}
    with open(log_path, "wb") as worker_log:
        process = subprocess.Popen([remote_worker_executable(), *args], env=environment,
                                   stdout=worker_log, stderr=subprocess.STDOUT)
    return WorkerProcess(process, home, log_path)


def start_hub(home: Path, *args: str) -> tuple[WorkerProcess, str]:
    """Start a hub on 127.0.0.1 (any free port); returns it and its client token, once written."""
    token_file = home / "token"
    hub = spawn_worker(home, ["--listen", "127.0.0.1:0", "--token-file", str(token_file), "--gpu", "off", *args])
    try:
        def ready() -> bool:
            hub.check_alive()
            return token_file.exists() and token_file.read_text().strip() != ""
        seconds = wait_until(ready, WORKER_START_TIMEOUT_S, "remote-worker did not write its token")
        log.info("remote-worker ready in %.2f s", seconds)
        return hub, token_file.read_text().strip()
    except BaseException:
        hub.stop()
        raise


@contextlib.contextmanager
def private_hub(*args: str) -> Iterator[tuple[WorkerProcess, str]]:
    """A hub in a temporary REMOTE_MAGIC_HOME, stopped (and the directory removed) on the way out."""
    with tempfile.TemporaryDirectory(prefix="rm-bench-") as home:
        hub, token = start_hub(Path(home) / "hub", *args)
        try:
            yield hub, token
        finally:
            hub.stop()


# -- bursts ----------------------------------------------------------------------------------

@dataclass
class Burst:
    """One peer's burst: how long it took and what came back."""

    peer: str
    count: int
    call: str = ""          # what was called, for the table
    submit_s: float = 0.0   # the submit loop alone
    total_s: float = 0.0    # first submit to last result (or to the deadline, when some were lost)
    lost: int = 0           # still pending at the deadline
    wrong: int = 0          # a wrong value, or an exception
    first_error: str = ""
    skipped: str = ""       # why the peer has no figures

    @property
    def rate(self) -> float:
        return self.count / self.total_s


def check_results(burst: Burst, outcomes: Sequence[tuple[bool, Any, BaseException | None]]) -> None:
    """Count lost and wrong results: ``outcomes[i]`` is (done, value, exception) for ``square(i)``."""
    for i, (done, value, error) in enumerate(outcomes):
        if not done:
            burst.lost += 1
        elif error is not None or value != square(i):
            burst.wrong += 1
            if not burst.first_error:
                burst.first_error = (f"{type(error).__name__}: {first_line(str(error))}" if error is not None
                                     else f"square({i}) came back as {value!r}")


def future_outcome(future: concurrent.futures.Future[Any]) -> tuple[bool, Any, BaseException | None]:
    if not future.done():
        return False, None, None
    error = future.exception()
    return True, None if error is not None else future.result(), error


def timed_burst(peer: str, call: str, count: int, deadline: float, submit: Callable[[int], Any],
                wait: Callable[[list[Any], float], None]) -> tuple[Burst, list[Any]]:
    """Submit ``count`` jobs in a tight loop, then ``wait(futures, deadline)`` for them all."""
    burst = Burst(peer, count, call)
    log.info("%s: burst of %d submits", peer, count)
    start = time.perf_counter()
    futures = [submit(i) for i in range(count)]
    burst.submit_s = time.perf_counter() - start
    wait(futures, deadline)
    burst.total_s = time.perf_counter() - start
    return burst, futures


def wait_futures(futures: list[Any], deadline: float) -> None:
    concurrent.futures.wait(futures, timeout=deadline)


def burst_remote_magic(count: int, deadline: float) -> Burst:
    """``client.submit(square, i)`` against a private remote-worker."""
    import remote_magic

    with private_hub() as (_, token), remote_magic.connect(token) as client:
        if client.submit(square, -1).result(PEER_START_TIMEOUT_S) != 1:
            raise RuntimeError("remote-magic: the warm-up call came back wrong")
        burst, futures = timed_burst("remote-magic", "client.submit(square, i)", count, deadline,
                                     lambda i: client.submit(square, i), wait_futures)
        check_results(burst, [future_outcome(f) for f in futures])
    return burst


def burst_ipyparallel(count: int, deadline: float) -> Burst:
    """A load-balanced view's ``apply_async(square, i)`` on one engine."""
    import ipyparallel

    cluster = ipyparallel.Cluster(n=1, log_level=logging.WARNING)
    started = time.monotonic()
    rc = cluster.start_and_connect_sync()
    try:
        log.info("ipyparallel: 1 engine up in %.1f s", time.monotonic() - started)
        view = rc.load_balanced_view()
        if view.apply_async(square, -1).get(PEER_START_TIMEOUT_S) != 1:
            raise RuntimeError("ipyparallel: the warm-up call came back wrong")
        burst, results = timed_burst("ipyparallel", "view.apply_async(square, i)", count, deadline,
                                     lambda i: view.apply_async(square, i), wait_futures)
        check_results(burst, [ipyparallel_outcome(r) for r in results])
    finally:
        rc.close()
        cluster.stop_cluster_sync()
    return burst


def ipyparallel_outcome(result: Any) -> tuple[bool, Any, BaseException | None]:
    if not result.ready():
        return False, None, None
    try:
        return True, result.get(0), None
    except Exception as exc:  # the task's remote error: counted as wrong, named in the notes
        return True, None, exc


def burst_dask(count: int, deadline: float) -> Burst:
    """``client.submit(square, i, pure=False)`` on a LocalCluster of one process with one thread."""
    from dask.distributed import Client, LocalCluster, wait

    for name in ("distributed", "tornado", "bokeh"):
        logging.getLogger(name).setLevel(logging.ERROR)
    started = time.monotonic()
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,  # type: ignore[no-untyped-call]
                      dashboard_address=None, silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client:  # type: ignore[no-untyped-call]
        log.info("dask: 1 worker up in %.1f s", time.monotonic() - started)
        if client.submit(square, -1, pure=False).result(PEER_START_TIMEOUT_S) != 1:
            raise RuntimeError("dask: the warm-up call came back wrong")

        def wait_all(futures: list[Any], seconds: float) -> None:
            with contextlib.suppress(TimeoutError):  # the ones still pending are counted as lost
                wait(futures, timeout=seconds)  # type: ignore[no-untyped-call]

        # pure=False: a fresh key for every call, so none is answered from another's result.
        burst, futures = timed_burst("Dask", "client.submit(square, i, pure=False)", count, deadline,
                                     lambda i: client.submit(square, i, pure=False), wait_all)
        check_results(burst, [dask_outcome(f) for f in futures])
    return burst


def dask_outcome(future: Any) -> tuple[bool, Any, BaseException | None]:
    if future.status not in ("finished", "error"):
        return False, None, None
    try:
        return True, future.result(), None
    except Exception as exc:  # the task's error: counted as wrong, named in the notes
        return True, None, exc


def run_bursts(count: int, deadline: float, with_ipyparallel: bool, with_dask: bool) -> list[Burst]:
    """remote-magic's burst, then ipyparallel's and Dask's when asked for and installed."""
    bursts = [burst_remote_magic(count, deadline)]
    peers: list[tuple[str, str, bool, Callable[[int, float], Burst], str]] = [
        ("ipyparallel", "ipyparallel", with_ipyparallel, burst_ipyparallel, "pip install ipyparallel"),
        ("Dask", "distributed", with_dask, burst_dask, 'pip install "dask[distributed]"'),
    ]
    for label, module, wanted, bench, install in peers:
        if not wanted:
            bursts.append(Burst(label, count, skipped=f"left out (--no-{module.replace('distributed', 'dask')})"))
            continue
        try:
            __import__(module)
        except ImportError:
            bursts.append(Burst(label, count, skipped=f"not installed (`{install}`)"))
            continue
        bursts.append(bench(count, deadline))
    return bursts


# -- a relay that can lose the network -------------------------------------------------------

@dataclass(eq=False)
class _Link:
    """One relayed connection: the sockets on both sides, and whether the network under it is gone."""

    cut: bool
    writers: list[asyncio.StreamWriter] = field(default_factory=list)


class Relay:
    """A TCP forwarder on 127.0.0.1 (from tests/hub/test_relay.py's Relay) that can lose the network.

    ``cut`` stops forwarding bytes in both directions and keeps every socket open: what arrives
    vanishes, a close on one side never reaches the other, and a new connection is accepted but
    gets nowhere, as when Wi-Fi drops. ``heal`` aborts the connections that were cut (a NAT that
    forgot them) and forwards new ones again. This differs from Relay.stop in the tests, which
    closes connections at once.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.connections = 0  # relayed to the hub so far
        self._cut = False
        self._links: set[_Link] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="relay", daemon=True)
        self._thread.start()
        self._server: asyncio.Server = self._call(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.port = int(self._server.sockets[0].getsockname()[1])

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def cut(self) -> None:
        """From now on, nothing crosses: not bytes, not closes."""
        self._call(self._set_cut())

    def heal(self) -> None:
        """Abort every connection that was cut; forward new ones again."""
        self._call(self._heal())

    def close(self) -> None:
        """Stop listening, abort every connection and stop the relay's thread."""
        if self._loop.is_closed():
            return
        self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(RELAY_CALL_TIMEOUT_S)
        self._loop.close()

    def _call(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(RELAY_CALL_TIMEOUT_S)

    async def _set_cut(self) -> None:
        self._cut = True
        for link in self._links:
            link.cut = True

    async def _heal(self) -> None:
        for link in [link for link in self._links if link.cut]:
            for writer in link.writers:
                writer.transport.abort()
            self._links.discard(link)
        self._cut = False

    async def _close(self) -> None:
        self._server.close()
        for link in self._links:
            for writer in link.writers:
                writer.transport.abort()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # always inside a task: asyncio's server runs this as one
        self._tasks.add(task)
        link = _Link(self._cut, [writer])
        self._links.add(link)
        try:
            if link.cut:  # accepted while the network is down: it reaches nothing
                await self._pump(link, reader, None)
                return
            try:
                hub_reader, hub_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
            except OSError:
                writer.transport.abort()
                return
            link.writers.append(hub_writer)
            self.connections += 1
            await asyncio.gather(self._pump(link, reader, hub_writer), self._pump(link, hub_reader, writer))
        finally:
            self._tasks.discard(task)

    async def _pump(self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter | None) -> None:
        """Forward bytes until the connection ends; while cut, read and drop them."""
        try:
            while data := await reader.read(1 << 16):
                if not link.cut and writer is not None:
                    writer.write(data)
                    await writer.drain()
        except OSError:
            pass  # the connection was reset: the finally passes that on, unless cut
        finally:
            if not link.cut:  # a close crosses the relay; while cut, nothing does
                for other in link.writers:
                    other.transport.abort()
                self._links.discard(link)


# -- faults ----------------------------------------------------------------------------------

@dataclass
class FaultOutcome:
    """One repetition of one fault."""

    fail_s: float | None          # fault to the client's exception; None: it never raised
    error: str                    # the exception's class, or what happened instead
    message: str                  # the first line of its message
    recovery_s: float | None = None  # SIGCONT or heal to a job run on the joiner again
    orphan_s: float | None = None    # SIGKILL to the orphaned executor's exit


class Fleet:
    """A hub (worker 'home') and a worker process 'joiner' that joined it, directly or through a relay."""

    def __init__(self, root: Path) -> None:
        self.root = root
        # A worker out of reach is waited for up to --outage-grace (300 s by default, issue 34): this measures
        # how soon one is taken for gone once that bound is passed, with the 5 s the heartbeats take to notice.
        self.hub, self.token = start_hub(root / "hub", "--name", "home", "--outage-grace", str(OUTAGE_GRACE_S))
        self.joiner: WorkerProcess | None = None
        self.relay: Relay | None = None
        self._leftovers: list[psutil.Process] = []  # executors of SIGKILLed joiners, killed on close
        self._restarts = 0
        try:
            self._worker_token = self._read_worker_token()
        except BaseException:
            self.close()
            raise

    def _read_worker_token(self) -> Any:
        from remote_magic.wire.tokens import Token

        output = subprocess.run([remote_worker_executable(), "token", "--worker"], capture_output=True, text=True,
                                env={**os.environ, "REMOTE_MAGIC_HOME": str(self.hub.home)},
                                timeout=TOKEN_COMMAND_TIMEOUT_S, check=True).stdout.strip()
        return Token.decode(output).with_address(Token.decode(self.token).address)

    def hub_port(self) -> int:
        from remote_magic.wire.tokens import Token

        return int(Token.decode(self.token).address.rsplit(":", 1)[1])

    def start_joiner(self, client: Any, via_relay: bool) -> None:
        """Start 'joiner' (straight to the hub, or through the relay) and wait until the hub lists it idle."""
        self.stop_joiner()
        wait_until(lambda: JOINER not in worker_states(client), WORKER_START_TIMEOUT_S,
                   f"the hub did not forget the previous {JOINER!r}")
        token = self._worker_token
        if via_relay:
            if self.relay is None:
                self.relay = Relay(self.hub_port())
            token = token.with_address(self.relay.address)
        self._restarts += 1
        self.joiner = spawn_worker(self.root / f"joiner-{self._restarts}", ["--join", "--gpu", "off", "--name", JOINER],
                                   env={"REMOTE_MAGIC_JOIN_TOKEN": token.encode()})
        joiner = self.joiner

        def idle() -> bool:
            joiner.check_alive()
            return worker_states(client).get(JOINER) == "idle"
        seconds = wait_until(idle, WORKER_START_TIMEOUT_S, f"{JOINER!r} was not listed idle")
        log.debug("%s joined%s in %.2f s", JOINER, " through the relay" if via_relay else "", seconds)
        if via_relay and self.relay is not None and self.relay.connections == 0:
            raise RuntimeError(f"{JOINER!r} joined without going through the relay")

    def stop_joiner(self) -> None:
        if self.joiner is not None:
            self._leftovers += self.joiner.executors()
            self.joiner.stop()
            self.joiner = None

    def kill_leftovers(self) -> None:
        for process in self._leftovers:
            with contextlib.suppress(psutil.Error):
                process.kill()
        self._leftovers = []

    def close(self) -> None:
        """Stop every process and the relay; safe to call more than once."""
        try:
            self.stop_joiner()
            self.kill_leftovers()
            if self.relay is not None:
                self.relay.close()
        finally:
            self.hub.stop()


def worker_states(client: Any) -> dict[str, str]:
    """{name: 'idle' or 'busy'} for every worker the hub lists."""
    return {str(w["name"]): str(w["state"]) for w in client.workers()}


def first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "(empty message)"


def spin_until_fault(client: Any, apply_fault: Callable[[], float]) -> FaultOutcome:
    """Run the spinning job on the joiner; once it prints, apply the fault and time the call's failure.

    ``apply_fault`` returns the monotonic time the fault took effect.
    """
    events: queue.SimpleQueue[tuple[str, float, BaseException | None]] = queue.SimpleQueue()

    def on_stream(header: Any) -> None:
        if SPIN_LINE in str(header.get("text", "")):
            events.put(("printed", time.monotonic(), None))

    def call() -> None:
        error: BaseException | None = None
        try:
            client.execute(SPIN_CODE, worker=JOINER, on_stream=on_stream)
        except BaseException as exc:  # what it raised is the measurement
            error = exc
        events.put(("ended", time.monotonic(), error))

    threading.Thread(target=call, name="spinning-job", daemon=True).start()
    kind, _, error = next_event(events, SPIN_START_TIMEOUT_S, "the spinning job did not print")
    if kind == "ended":
        raise RuntimeError(f"the spinning job ended before the fault: {error!r}")
    fault_at = apply_fault()
    try:
        kind, ended_at, error = next_event(events, FAIL_TIMEOUT_S, "")
    except TimeoutError:  # closing the client ends the call; the caller does that
        return FaultOutcome(None, "nothing", f"the call had not raised after {FAIL_TIMEOUT_S:g} s")
    if error is None:
        return FaultOutcome(ended_at - fault_at, "no exception", "the spinning job returned a result")
    message = first_line(str(error)).replace(platform.node(), "HOST")
    return FaultOutcome(ended_at - fault_at, type(error).__name__, message)


def next_event(events: queue.SimpleQueue[tuple[str, float, BaseException | None]], timeout: float,
               what: str) -> tuple[str, float, BaseException | None]:
    try:
        return events.get(timeout=timeout)
    except queue.Empty:
        raise TimeoutError(f"{what} within {timeout:g} s") from None


def runs_on_joiner(client: Any, timeout: float) -> float:
    """Wait until the hub lists the joiner idle and a job runs there; returns the seconds it took."""
    started = time.monotonic()
    wait_until(lambda: worker_states(client).get(JOINER) == "idle", timeout, f"{JOINER!r} was not listed idle")
    done: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def call() -> None:
        try:
            done.put(client.run("back = 1", worker=JOINER))
        except BaseException as exc:  # reported below
            done.put(exc)

    threading.Thread(target=call, name="recovery-job", daemon=True).start()
    try:
        result = done.get(timeout=max(0.0, started + timeout - time.monotonic()))
    except queue.Empty:
        raise TimeoutError(f"no job ran on {JOINER!r} within {timeout:g} s") from None
    if result != {"back": 1}:
        raise RuntimeError(f"the job on {JOINER!r} after the fault came back as {result!r}")
    return time.monotonic() - started


def signal_joiner(fleet: Fleet, signum: signal.Signals) -> Callable[[], float]:
    def apply() -> float:
        assert fleet.joiner is not None  # started by measure_fault
        os.kill(fleet.joiner.pid, signum)
        return time.monotonic()
    return apply


def cut_network(fleet: Fleet) -> Callable[[], float]:
    def apply() -> float:
        assert fleet.relay is not None  # the joiner was started through it
        fleet.relay.cut()
        return time.monotonic()
    return apply


def measure_fault(fleet: Fleet, fault: str) -> FaultOutcome:
    """One repetition: a fresh client, a joiner listed idle, the spinning job, the fault, the recovery."""
    import remote_magic

    with remote_magic.connect(fleet.token) as client:
        joiner_alive = fleet.joiner is not None and fleet.joiner.process.poll() is None
        if not joiner_alive or worker_states(client).get(JOINER) != "idle":
            fleet.start_joiner(client, via_relay=fault == "network")
        assert fleet.joiner is not None  # started just above
        if fault == "kill":
            watch = ExitWatch(fleet.joiner.executors())
            kill = signal_joiner(fleet, signal.SIGKILL)
            outcome = spin_until_fault(client, lambda: watch.start(kill()))
            fleet.joiner.process.wait(STOP_TIMEOUT_S)
            outcome.orphan_s = watch.outcome()
            fleet.stop_joiner()
        elif fault == "stop":
            outcome = spin_until_fault(client, signal_joiner(fleet, signal.SIGSTOP))
            fleet.joiner.process.send_signal(signal.SIGCONT)
            outcome.recovery_s = recover(fleet, client)
        else:
            outcome = spin_until_fault(client, cut_network(fleet))
            assert fleet.relay is not None  # the joiner was started through it
            before = fleet.relay.connections
            fleet.relay.heal()
            outcome.recovery_s = recover(fleet, client)
            log.debug("the joiner reconnected through the relay %d time(s)", fleet.relay.connections - before)
    return outcome


class ExitWatch:
    """Times, from a thread, how long processes outlive a moment: a SIGKILLed joiner's executor its parent."""

    def __init__(self, processes: list[psutil.Process]) -> None:
        self.processes = processes
        self._result: concurrent.futures.Future[float | None] = concurrent.futures.Future()

    def start(self, since: float) -> float:
        """Watch from ``since`` (a monotonic time), which is returned."""
        threading.Thread(target=self._watch, args=(since,), name="exit-watch", daemon=True).start()
        return since

    def outcome(self) -> float | None:
        """Seconds they outlived ``since``; None if they were still running after ORPHAN_TIMEOUT_S (then killed)."""
        seconds = self._result.result(ORPHAN_TIMEOUT_S + STOP_TIMEOUT_S)
        if seconds is None:
            log.warning("the SIGKILLed joiner's executor was still running after %g s; killing it", ORPHAN_TIMEOUT_S)
            for process in self.processes:
                with contextlib.suppress(psutil.Error):
                    process.kill()
        return seconds

    def _watch(self, since: float) -> None:
        try:
            wait_until(lambda: not any(map(running, self.processes)), ORPHAN_TIMEOUT_S, "")
        except TimeoutError:
            self._result.set_result(None)
        else:
            self._result.set_result(time.monotonic() - since)


def running(process: psutil.Process) -> bool:
    """Alive and not a zombie waiting for its new parent to reap it."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def recover(fleet: Fleet, client: Any) -> float | None:
    """Seconds until the joiner runs a job again; None (and a fresh joiner next time) if it doesn't."""
    try:
        return runs_on_joiner(client, RECOVERY_TIMEOUT_S)
    except (TimeoutError, RuntimeError) as exc:
        log.warning("%s: %s; the joiner is replaced for the next repetition", JOINER, exc)
        fleet.stop_joiner()
        return None


def run_faults(faults: Sequence[str], repeat: int) -> dict[str, list[FaultOutcome]]:
    """``repeat`` repetitions of each fault against one hub; the joiner is restarted when needed."""
    outcomes: dict[str, list[FaultOutcome]] = {}
    with tempfile.TemporaryDirectory(prefix="rm-bench-faults-") as root:
        fleet = Fleet(Path(root))
        try:
            for fault in faults:
                fleet.stop_joiner()  # the next one joins straight to the hub, or through the relay
                outcomes[fault] = []
                for n in range(repeat):
                    outcome = measure_fault(fleet, fault)
                    log.info("%s %d/%d: %s after %s (%s)", fault, n + 1, repeat, outcome.error,
                             "never" if outcome.fail_s is None else f"{outcome.fail_s:.2f} s", outcome.message)
                    outcomes[fault].append(outcome)
        finally:
            fleet.close()
    return outcomes


# -- report ----------------------------------------------------------------------------------

def seconds_text(value: float) -> str:
    return f"{value * 1e3:.0f} ms" if value < 1 else f"{value:.2f} s"


def burst_table(bursts: Sequence[Burst]) -> str:
    lines = ["| burst of tiny submits | jobs/s | submit loop | first submit → last result | lost | wrong |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for b in bursts:
        if b.skipped:
            lines.append(f"| {b.peer} | {b.skipped} | | | | |")
            continue
        rate = f"{b.rate:,.0f}" if b.lost == 0 else "— (jobs lost)"
        lines.append(f"| {b.peer}, {b.count:,} × `{b.call}` | {rate} | {seconds_text(b.submit_s)} | "
                     f"{seconds_text(b.total_s)} | {b.lost} | {b.wrong} |")
    return "\n".join(lines)


def fault_table(outcomes: dict[str, list[FaultOutcome]]) -> str:
    lines = ["| fault while a job runs on 'joiner' | time to fail, median | max | raised | afterwards |",
             "| --- | ---: | ---: | --- | --- |"]
    for fault, runs in outcomes.items():
        failed = [o.fail_s for o in runs if o.fail_s is not None]
        median = seconds_text(statistics.median(failed)) if failed else "never"
        worst = seconds_text(max(failed)) if len(failed) == len(runs) else f"never ({len(runs) - len(failed)}×)"
        lines.append(f"| {FAULT_LABELS[fault]} | {median} | {worst} | {raised_text(runs)} | "
                     f"{afterwards_text(fault, runs)} |")
    return "\n".join(lines)


def raised_text(runs: Sequence[FaultOutcome]) -> str:
    counts: dict[str, int] = {}
    for o in runs:
        counts[o.error] = counts.get(o.error, 0) + 1
    return ", ".join(f"`{error}` ×{n}" for error, n in counts.items())


def afterwards_text(fault: str, runs: Sequence[FaultOutcome]) -> str:
    if fault == "kill":
        gone = [o.orphan_s for o in runs if o.orphan_s is not None]
        text = f"its executor (own session) exited {spread_text(gone)} after the SIGKILL" if gone else ""
        if len(gone) < len(runs):
            text += (f"{'; ' if text else ''}executor still running after {ORPHAN_TIMEOUT_S:g} s: "
                     f"{len(runs) - len(gone)}×")
        return text
    back = [o.recovery_s for o in runs if o.recovery_s is not None]
    event = "SIGCONT" if fault == "stop" else "the network came back"
    text = f"a job ran on 'joiner' again {spread_text(back)} after {event}" if back else ""
    if len(back) < len(runs):
        text += f"{'; ' if text else ''}not within {RECOVERY_TIMEOUT_S:g} s: {len(runs) - len(back)}×"
    return text


def spread_text(values: Sequence[float]) -> str:
    return f"{seconds_text(statistics.median(values))} (max {seconds_text(max(values))})"


def message_lines(outcomes: dict[str, list[FaultOutcome]]) -> list[str]:
    """Each distinct first line of the exceptions' messages, per fault."""
    lines = ["First lines of the messages (host name replaced by HOST):", ""]
    for fault, runs in outcomes.items():
        for text in dict.fromkeys(f"`{o.error}`: {o.message}" for o in runs):
            lines.append(f"- {FAULT_LABELS[fault].split(' (')[0]}: {text}")
    return lines


def burst_notes(bursts: Sequence[Burst]) -> list[str]:
    return [f"{b.peer}: first wrong result: {b.first_error}" for b in bursts if b.first_error]


def method_text(count: int, deadline: float, repeat: int) -> str:
    """How the figures were taken, for results.md."""
    from remote_magic.wire.protocol import HEARTBEAT_INTERVAL_S, HEARTBEAT_LIVENESS

    return (f"Bursts: after one warm-up call, {count:,} calls of a module-level `square(i)` submitted in a tight "
            "loop, then a wait for them all; jobs/s is the count over the time from the first submit to the "
            f"last result. Every result is compared with `i * i`; a future still pending {deadline:g} s after "
            "the loop counts as lost. remote-magic: `client.submit` against a private `remote-worker --listen "
            "127.0.0.1:0 --gpu off`; ipyparallel: one engine, `load_balanced_view().apply_async`; Dask: "
            "`client.submit(..., pure=False)` on a LocalCluster of 1 process with 1 thread. Each peer runs alone. "
            f"Faults, {repeat} repetitions each: a hub (`--name home`) and a second process "
            "`remote-worker --join --name joiner`; a fresh client runs `print('spinning'); while True: pass` "
            "on 'joiner' with `client.execute(..., worker='joiner')` in a thread, and once the line streams "
            "back the fault is applied; the time is from the fault to the call raising. Network loss: the "
            "joiner reaches the hub through a TCP relay on 127.0.0.1 that, at the fault, forwards no byte and "
            "no close either way but keeps every socket open (new connections are accepted and go nowhere); "
            "after the call raised, the relay aborts those connections and forwards again. After SIGSTOP the "
            "joiner gets SIGCONT; after SIGKILL a new joiner is started. Default heartbeats: every "
            f"{HEARTBEAT_INTERVAL_S:g} s, a peer silent for {HEARTBEAT_LIVENESS} intervals "
            f"({HEARTBEAT_INTERVAL_S * HEARTBEAT_LIVENESS:g} s) is out of reach, and dropped past the hub's "
            f"`--outage-grace {OUTAGE_GRACE_S:g}` (300 s by default since issue 34). Issue 10, item 7.")


# -- main ------------------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--burst", type=int, default=10_000, metavar="N",
                        help="tiny submits per burst (default 10000; 0 leaves the bursts out)")
    parser.add_argument("--deadline", type=float, default=300.0, metavar="S",
                        help="seconds after a burst's submit loop before a pending job counts as lost (default 300)")
    parser.add_argument("--repeat", type=int, default=5, metavar="N", help="repetitions of each fault (default 5)")
    parser.add_argument("--faults", nargs="*", choices=FAULTS, default=list(FAULTS),
                        help="which faults to measure (default all; none leaves them out)")
    parser.add_argument("--no-ipyparallel", action="store_true", help="leave out ipyparallel's burst")
    parser.add_argument("--no-dask", action="store_true", help="leave out Dask's burst")
    parser.add_argument("--no-write", action="store_true", help="print the tables only; leave results.md alone")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(arguments)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    if not args.verbose:
        logging.getLogger("remote_magic").setLevel(logging.WARNING)  # one "connected" line per client
    load_before = os.getloadavg()

    bursts = run_bursts(args.burst, args.deadline, not args.no_ipyparallel, not args.no_dask) if args.burst > 0 else []
    outcomes = run_faults(args.faults, args.repeat) if args.repeat > 0 else {}

    parts: list[str] = []
    if bursts:
        parts += [burst_table(bursts), *([""] + burst_notes(bursts) if burst_notes(bursts) else []), ""]
    if outcomes:
        parts += [fault_table(outcomes), "", *message_lines(outcomes), ""]
    print("\n".join(parts).rstrip("\n"))
    if not args.no_write:
        command = " ".join(["python benchmarks/bench_faults.py", *arguments])
        body = "\n".join([f"Measured by `{command}`.", "", *zmq_peer_lines(load_before), "", *parts,
                          method_text(args.burst, args.deadline, args.repeat)])
        write_section(SECTION_TITLE, body)
        log.info("wrote the tables to %s", RESULTS_PATH)
    return 0


if __name__ == "__main__":
    sys.exit(main())
