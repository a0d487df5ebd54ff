"""Connection blips: every job ends exactly once, with its result, when connections drop and come back.

A hub ('home') and a worker joined to it ('far', labelled `far`: every job here requires it, so each
crosses both links) run as real processes, with a blip proxy (``blip_proxy.BlipProxy``) between the
clients and the hub and another between the hub and 'far'. A blip drops one direction's bytes for up
to a second (what a tunnel does just before it dies), then cuts the connection; the peer dials again
within 0.1 s, far inside the 5 s heartbeat bound, so nothing here may end a job with an error.

Each job appends its own token to a run log in 'far''s working folder (one write under O_APPEND), so
the test counts how often each ran, and returns what the test can check (a digest of its input,
bytes made from a seed, what it printed).

- The small cases, one message each, lost in flight: a SUBMIT client→hub and hub→worker, a RESULT
  worker→hub and hub→client (drop that direction, send, cut).
- The end of a chunked message (over 1 MiB, it crosses as 256 KiB chunks, each acknowledged): the
  direction carrying the acknowledgements is dropped just as the last chunk goes, then cut; for a
  SUBMIT and a RESULT on each link. The job must run once, and the link serve on.
- The soak: three clients submit jobs of every size (tiny calls, 2-5 MB inputs and results, cells
  that print) while both proxies blip at random moments, half of them timed to land inside a
  transfer. At the end: no job hung, none ran twice, none returned a wrong result, none failed.

The soak blips for 20 s in the default suite (``REMOTE_MAGIC_BLIP_S=600`` for longer);
``REMOTE_MAGIC_BLIP_SEED=N`` replays its workload and blip choices (the seed is printed; thread timing still
differs between runs).
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import os
import random
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from blip_proxy import CALL_TIMEOUT_S, BlipProxy, Direction
from soak import RECORD_CELL, Job, RunLog, SoakThread, Tally, Workload, expect, recorded_calls, seed_from, soak

import remote_magic
from remote_magic.wire.tokens import Token
from support import WorkerProcess, hub_port, in_thread, start_worker, wait_for, worker_token

BLIP_S = float(os.environ.get("REMOTE_MAGIC_BLIP_S", "20"))
"""How long the soak blips while the clients submit."""

FAR = "far"
"""The joined worker's name, and its label: every job requires it."""

DROP_S = (0.0, 1.0)
"""How long a blip drops one direction before it cuts: well inside the 5 s heartbeat bound."""

BLIP_GAP_S = (0.5, 2.5)
"""The time between one proxy's blips."""

IN_TRANSFER_WITHIN_S = 3.0
"""A blip timed to land inside a transfer waits this long for one, then blips anyway."""

JOB_DEADLINE_S = 30.0
"""How long a job may take to end, from its submission: behind the other clients' jobs on one worker,
with blips (each well under 2 s) in between, on two busy cores."""

PER_QUEUED_JOB_S = 0.1
"""And per job of its own burst ahead of it."""

DUPLICATE_WINDOW_S = 6.0
"""How long after a chunked message's job ended the test watches for it to run again: the code this
test was written against sends an unacknowledged chunked message again after 4 s."""

CHUNK_BYTES = 256 << 10
"""The size of one chunk of a large message (docs/protocol.md, "Large messages")."""

BIG_BYTES = (2 << 20, 5 << 20)
"""The sizes of the soak's large inputs and results: several chunks each."""

CHUNKED_BYTES = 3 << 20
"""The size of the chunked message in the end-of-chunked-message cases."""

SMALL_BYTES = 32 << 10
"""The payload of a small message: one message, under the 1 MiB a message is chunked from."""

CLIENTS = 3
BURST = (5, 30)
PRINTED_LINES = (1, 3000)  # a cell prints this many lines: up to ~100 kB, several STREAM messages

RECORD = RECORD_CELL + """\
for _i in range(lines):
    print(token, _i)
out = f"{token}:{n * 3}"
"""
"""A cell that records that it ran, prints ``lines`` lines, and returns what the test expects."""


# -- what the jobs run ------------------------------------------------------------------------


@dataclass(frozen=True)
class JobFunctions:
    """The functions jobs call on 'far' (made in ``_job_functions``, so cloudpickle sends them by value).

    Each first appends its token to the run log ``runs``.
    """

    tiny: Callable[[str, str, int], str]  # runs, token, n -> "token:n²"
    digest: Callable[[str, str, bytes], tuple[str, str, int]]  # runs, token, data -> (token, sha256, size)
    make: Callable[[str, str, int, int], bytes]  # runs, token, seed, size -> random bytes from the seed
    reverse: Callable[[str, str, bytes], bytes]  # runs, token, data -> data reversed
    held: Callable[[str, str, str, int, int], bytes]  # runs, token, go, seed, size -> make's bytes once `go` exists


def _job_functions() -> JobFunctions:
    record, tiny = recorded_calls()

    def digest(runs: str, token: str, data: bytes) -> tuple[str, str, int]:
        import hashlib

        record(runs, token)
        return token, hashlib.sha256(data).hexdigest(), len(data)

    def make(runs: str, token: str, seed: int, size: int) -> bytes:
        import random

        record(runs, token)
        return random.Random(seed).randbytes(size)

    def reverse(runs: str, token: str, data: bytes) -> bytes:
        record(runs, token)
        return data[::-1]

    def held(runs: str, token: str, go: str, seed: int, size: int) -> bytes:
        import os
        import random
        import time

        record(runs, token)
        deadline = time.monotonic() + 60
        while not os.path.exists(go):  # the test makes `go` once it drops what this job sends back
            if time.monotonic() > deadline:
                raise TimeoutError(f"{go} did not appear within 60 s")
            time.sleep(0.01)
        return random.Random(seed).randbytes(size)

    return JobFunctions(tiny, digest, make, reverse, held)


# -- the fleet --------------------------------------------------------------------------------


class BlipFleet:
    """The hub and 'far' as real processes, each link through a blip proxy; clients dial the clients' proxy."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.clients: list[remote_magic.Client] = []
        self.processes: list[WorkerProcess] = []  # what ``close`` stops
        self.proxies: list[BlipProxy] = []
        self.fn = _job_functions()
        far_cwd = tmp / "far-cwd"  # 'far''s working folder: the run log is there
        far_cwd.mkdir()
        self.runs = RunLog(far_cwd / "runs.log")

    def start(self) -> None:
        """The hub, both proxies, then 'far' through its proxy; returns once the hub lists 'far'."""
        self.hub = start_worker(self.tmp / "hub", "--listen", "127.0.0.1:0", "--gpu", "off", "--name", "home", "-v")
        self.processes.append(self.hub)
        self.clients_proxy = BlipProxy(hub_port(self.hub), name="clients")
        self.worker_proxy = BlipProxy(hub_port(self.hub), name="worker")
        self.proxies += [self.clients_proxy, self.worker_proxy]
        self.client_token = Token.decode(self.hub.token).with_address(self.clients_proxy.address).encode()
        join_token = worker_token(self.hub, self.worker_proxy.address)
        self.far = start_worker(self.tmp / "far", "--join", "--gpu", "off", "--name", FAR, "--label", FAR, "-v",
                                token_file=False, cwd=self.runs.path.parent,
                                env={"REMOTE_MAGIC_JOIN_TOKEN": join_token})
        self.processes.append(self.far)
        monitor = self.connect()
        wait_for(lambda: FAR in [w["name"] for w in monitor.workers(timeout=5)], 30, f"{FAR!r} to be listed")

    def connect(self) -> remote_magic.Client:
        """A client through the clients' proxy, closed with the fleet."""
        client = remote_magic.Client(self.client_token, timeout=10)
        self.clients.append(client)
        return client

    def proxy(self, link: str) -> BlipProxy:
        return self.clients_proxy if link == "clients" else self.worker_proxy

    def logs(self) -> str:
        return "logs: " + " and ".join(str(process.log_file) for process in self.processes)

    def close(self) -> None:
        """Close every client, stop 'far' and the hub, close the proxies."""
        for client in self.clients:
            try:
                in_thread(client.close, "close-client").exception(timeout=10)
            except concurrent.futures.TimeoutError:  # left to its daemon thread: the processes still stop
                continue
        for process in reversed(self.processes):
            process.stop()
        for proxy in self.proxies:
            proxy.close()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[BlipFleet]:
    made = BlipFleet(tmp_path)
    try:
        made.start()
        yield made
    finally:
        made.close()


def _ended(future: "Future[Any]", what: str, fleet: BlipFleet) -> Any:
    """The job's value once it ends within JOB_DEADLINE_S; fails saying ``what`` when it hangs."""
    try:
        return future.result(timeout=JOB_DEADLINE_S)
    except concurrent.futures.TimeoutError:
        raise AssertionError(f"the job hung (no end within {JOB_DEADLINE_S:g} s): {what}. {fleet.logs()}") from None


def _serves_on(fleet: BlipFleet, client: remote_magic.Client, what: str) -> None:
    """A tiny job after the fault ends at once with its result: the links serve on."""
    token = uuid.uuid4().hex
    value = _ended(client.submit(fleet.fn.tiny, str(fleet.runs.path), token, 12, require=FAR), f"the job after {what}",
                   fleet)
    assert value == f"{token}:144", value


def _once(fleet: BlipFleet, token: str, what: str) -> None:
    runs = fleet.runs.ran()[token]
    assert runs == 1, f"{what}: the job ran {runs} times. {fleet.logs()}"


# -- one message lost in flight -----------------------------------------------------------------


@dataclass(frozen=True)
class InFlight:
    """A message and the link and direction it is lost on."""

    message: str  # "submit" or "result"
    link: str  # "clients" (client-hub) or "worker" (hub-'far')
    direction: Direction  # UP: towards the hub

    @property
    def ends(self) -> tuple[str, str]:
        """Where the message goes from and to."""
        peer = "client" if self.link == "clients" else "worker"
        return (peer, "hub") if self.direction is Direction.UP else ("hub", peer)

    @property
    def id(self) -> str:
        return f"{self.message}-{self.ends[0]}-to-{self.ends[1]}"

    def __str__(self) -> str:
        return f"a {self.message.upper()} {self.ends[0]}→{self.ends[1]}"


EACH_WAY = [
    InFlight("submit", "clients", Direction.UP),
    InFlight("submit", "worker", Direction.DOWN),
    InFlight("result", "worker", Direction.UP),
    InFlight("result", "clients", Direction.DOWN),
]
"""A job's SUBMIT and RESULT on each link they cross."""


@pytest.mark.parametrize("lost", EACH_WAY, ids=lambda lost: lost.id)
def test_a_small_message_lost_in_flight_when_the_connection_drops_still_ends_its_job_once(
        fleet: BlipFleet, lost: InFlight) -> None:
    client = fleet.connect()
    proxy = fleet.proxy(lost.link)
    token = uuid.uuid4().hex
    what = f"{lost} was lost when its connection dropped"
    if lost.message == "submit":
        data = os.urandom(SMALL_BYTES)
        proxy.drop(lost.direction)
        future = client.submit(fleet.fn.digest, str(fleet.runs.path), token, data, require=FAR)
        expected: Any = (token, hashlib.sha256(data).hexdigest(), SMALL_BYTES)
    else:
        go = fleet.tmp / f"go-{token}"
        future = client.submit(fleet.fn.held, str(fleet.runs.path), token, str(go), 7, SMALL_BYTES, require=FAR)
        wait_for(lambda: fleet.runs.ran()[token], JOB_DEADLINE_S, "the job to start")
        proxy.drop(lost.direction)
        go.touch()  # the job returns now, into the drop
        expected = random.Random(7).randbytes(SMALL_BYTES)
    wait_for(lambda: proxy.dropped(lost.direction) >= SMALL_BYTES, 10, f"{lost} to be dropped")
    proxy.cut()
    assert _ended(future, what, fleet) == expected
    _serves_on(fleet, client, what)
    _once(fleet, token, what)


# -- the end of a chunked message -------------------------------------------------------------------


@pytest.mark.parametrize("sent", EACH_WAY, ids=lambda sent: sent.id)
def test_a_blip_at_the_end_of_a_chunked_message_runs_its_job_once(fleet: BlipFleet, sent: InFlight) -> None:
    """The acknowledgements' direction drops just as the last chunk goes, then the connection is reset (RST)."""
    client = fleet.connect()
    proxy = fleet.proxy(sent.link)
    token = uuid.uuid4().hex
    blip = proxy.blip(sent.direction.other, 0.5, rst=True, after=(sent.direction, CHUNKED_BYTES - CHUNK_BYTES // 2))
    if sent.message == "submit":
        data = os.urandom(CHUNKED_BYTES)
        future = client.submit(fleet.fn.digest, str(fleet.runs.path), token, data, require=FAR)
        expected: Any = (token, hashlib.sha256(data).hexdigest(), CHUNKED_BYTES)
    else:
        future = client.submit(fleet.fn.make, str(fleet.runs.path), token, 11, CHUNKED_BYTES, require=FAR)
        expected = random.Random(11).randbytes(CHUNKED_BYTES)
    what = f"{sent} in {CHUNKED_BYTES >> 20} MiB of chunks, its last chunk's acknowledgement lost with the connection"
    assert blip.done.wait(JOB_DEADLINE_S), f"the blip did not happen: fewer bytes crossed than {sent} has"
    assert _ended(future, what, fleet) == expected
    _serves_on(fleet, client, what)
    watched = fleet.runs.watch_for_a_second_run(token, DUPLICATE_WINDOW_S)
    assert watched == 1, f"{what}: the job ran {watched} times ({blip.describe()}). {fleet.logs()}"


# -- the soak ----------------------------------------------------------------------------------


class ClientWorkload(Workload):
    """One client's thread: bursts of tiny calls, large inputs and results, printing cells, until ``stop``."""

    KINDS = ("burst", "burst", "burst", "input", "result", "both", "cell")

    def __init__(self, index: int, fleet: BlipFleet, seed: int, tally: Tally, stop: threading.Event) -> None:
        super().__init__(f"blip-client-{index}", seed, tally, stop)
        self.client = fleet.connect()
        self.fn = fleet.fn
        self.runs = str(fleet.runs.path)

    def act(self) -> None:
        kind = self.rng.choice(self.KINDS)
        if kind == "burst":
            self.burst(self.rng.randint(*BURST))
        elif kind == "cell":
            self.cell()
        else:
            self.large(kind)

    def burst(self, size: int) -> None:
        self.doing = f"submitting a burst of {size}"
        jobs = []
        for n in range(size):
            token = uuid.uuid4().hex
            try:
                future = self.client.submit(self.fn.tiny, self.runs, token, n, require=FAR)
            except Exception as exc:  # with blips this short, no submit may fail
                self.tally.refused("tiny", token, exc)
                return
            jobs.append(Job("tiny", token, future, expect(f"{token}:{n * n}")))
        self.settle_all(jobs, time.monotonic() + JOB_DEADLINE_S + PER_QUEUED_JOB_S * len(jobs))

    def large(self, kind: str) -> None:
        token = uuid.uuid4().hex
        size = self.rng.randint(*BIG_BYTES)
        self.doing = f"a {size} B {kind}"
        if kind == "result":
            seed = self.rng.randrange(2**32)
            call: Callable[[], Future[Any]] = lambda: self.client.submit(  # noqa: E731
                self.fn.make, self.runs, token, seed, size, require=FAR)
            expected: Any = random.Random(seed).randbytes(size)
        else:
            data = self.rng.randbytes(size)
            function: Any = self.fn.digest if kind == "input" else self.fn.reverse
            call = lambda: self.client.submit(function, self.runs, token, data, require=FAR)  # noqa: E731
            expected = (token, hashlib.sha256(data).hexdigest(), size) if kind == "input" else data[::-1]
        try:
            future = call()
        except Exception as exc:
            self.tally.refused(kind, token, exc)
            return
        self.tally.settle(Job(kind, token, future, expect(expected), time.monotonic() + JOB_DEADLINE_S))

    def cell(self) -> None:
        token = uuid.uuid4().hex
        n, lines = self.rng.randint(0, 10**6), self.rng.randint(*PRINTED_LINES)
        printed: list[str] = []

        def on_stream(header: Any) -> None:
            if header.get("name") == "stdout":
                printed.append(str(header.get("text", "")))

        def check(result: Any) -> str:
            if result.values.get("out") != f"{token}:{n * 3}":
                return f"returned {result.values!r}"
            text, expected = "".join(printed), "".join(f"{token} {i}\n" for i in range(lines))
            return "" if text == expected else f"printed {len(text)} characters, not the {len(expected)} it printed"

        self.doing = f"a cell printing {lines} lines"
        future = in_thread(lambda: self.client.execute(
            RECORD, {"runs": self.runs, "token": token, "n": n, "lines": lines}, ["out"], require=[FAR],
            on_stream=on_stream), "blip-cell")
        self.tally.settle(Job("cell", token, future, check, time.monotonic() + JOB_DEADLINE_S))


class Blipper(SoakThread):
    """Blips one proxy at random moments until ``stop``: half at once, half timed to land inside a transfer."""

    def __init__(self, proxy: BlipProxy, seed: int, stop: threading.Event) -> None:
        super().__init__(f"blips-{proxy.name}", stop)
        self.proxy = proxy
        self.rng = random.Random(f"{seed}/{proxy.name}")

    def work(self) -> None:
        while not self.stop_event.wait(self.rng.uniform(*BLIP_GAP_S)):  # the blips' pace
            direction = self.rng.choice(list(Direction))
            drop_s = self.rng.uniform(*DROP_S)
            after = (self.rng.choice(list(Direction)), self.rng.randint(64 << 10, BIG_BYTES[1])) \
                if self.rng.random() < 0.5 else None
            self.doing = f"a blip dropping {direction} for {drop_s:.2f} s"
            blip = self.proxy.blip(direction, drop_s, rst=self.rng.random() < 0.5, after=after,
                                   within=IN_TRANSFER_WITHIN_S)
            if not blip.done.wait(drop_s + IN_TRANSFER_WITHIN_S + CALL_TIMEOUT_S):
                raise AssertionError(f"{self.proxy.name}: {blip.describe()} did not end")


def _proxy_lines(fleet: BlipFleet) -> list[str]:
    lines = []
    for proxy in (fleet.clients_proxy, fleet.worker_proxy):
        counts = proxy.stats()
        lines.append(f"  {proxy.name} proxy: {counts.blips} blips ({counts.blips_in_transfer} inside a transfer), "
                     f"{counts.connections} connections, {counts.forwarded[Direction.UP] / 1e6:.1f} MB up, "
                     f"{counts.forwarded[Direction.DOWN] / 1e6:.1f} MB down, dropped "
                     f"{counts.dropped[Direction.UP] / 1e6:.2f} MB up, "
                     f"{counts.dropped[Direction.DOWN] / 1e6:.2f} MB down")
    return lines


@pytest.mark.timeout(BLIP_S + 240)  # a backstop: every wait below has its own deadline
def test_blips_on_both_links_end_every_job_once_with_its_result(fleet: BlipFleet,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    seed = seed_from("REMOTE_MAGIC_BLIP_SEED")
    with capsys.disabled():  # the counts belong in CI's log, passed or not
        print(f"\nblips: seed {seed} (REMOTE_MAGIC_BLIP_SEED={seed} replays it), {BLIP_S:g} s, logs in {fleet.tmp}")
    tally = Tally()  # no error is explained: a blip this short must cost no job
    stop = threading.Event()
    workloads = [ClientWorkload(i, fleet, seed, tally, stop) for i in range(CLIENTS)]
    blippers = [Blipper(proxy, seed, stop) for proxy in (fleet.clients_proxy, fleet.worker_proxy)]
    problems = soak(BLIP_S, workloads, blippers, stop, faults_end_s=CALL_TIMEOUT_S + DROP_S[1] + IN_TRANSFER_WITHIN_S,
                    workloads_end_s=JOB_DEADLINE_S + PER_QUEUED_JOB_S * BURST[1] + 5)
    # The blips are over: every client serves a normal job at once (all checked at once, each bounded).
    checks = {workload.name: in_thread(functools.partial(_serves_on, fleet, workload.client, "the blips"),
                                        "serves-on") for workload in workloads}
    for name, check in checks.items():
        if error := check.exception(timeout=JOB_DEADLINE_S + CALL_TIMEOUT_S):
            problems.append(f"{name} does not serve after the blips: {error}")
    ran = fleet.runs.ran()
    summary = "\n".join([f"blips: seed {seed}, {BLIP_S:g} s of blips, {time.monotonic() - tally.started:.1f} s in all",
                         *tally.summary(ran), *_proxy_lines(fleet)])
    with capsys.disabled():
        print("\n".join([summary, *(f"  hung: {line}" for line in tally.hung[:20]),
                         *(f"  error: {line}" for line in tally.unexpected[:20])]))
    problems += tally.problems(ran)
    if not fleet.clients_proxy.stats().blips:
        problems.append("no blip happened")
    assert not problems, "\n".join(problems) + f"\n{summary}\n{fleet.logs()}"
