"""Soak: a fleet of real remote-worker processes under random faults while clients keep submitting.

A hub (with its in-process worker 'home') and two joined workers serve three clients, each in its
own thread, that submit bursts of calls and run cells (some printing more than 64 KiB, some with a
result over the hub's --max-message-size). Meanwhile a fault thread kills executors, kills and
restarts joined workers, stops and continues them, and restarts the hub on the same port. At the
end: every job ended within its deadline, every result is right, nothing ran twice, every failure
is one the faults explain, and every worker and client serves again.

In the default suite it injects faults for 20 s. ``REMOTE_MAGIC_SOAK_S=600`` soaks longer;
``REMOTE_MAGIC_SOAK_SEED=N`` replays a run's workload and fault choices (the seed is printed;
thread timing still differs between runs).
"""

from __future__ import annotations

import concurrent.futures
import os
import random
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil
import pytest
from soak import RECORD_CELL, Job, RunLog, SoakThread, Tally, Workload, expect, recorded_calls, seed_from, soak

import remote_magic
from remote_magic import ConnectionFailed, ExecutorDied, JobCancelled, OutputError, WorkerLost
from remote_magic.wire.protocol import HEARTBEAT_LIVENESS
from remote_magic.wire.tokens import Token
from support import WorkerProcess, in_thread, start_worker, wait_for

SOAK_S = float(os.environ.get("REMOTE_MAGIC_SOAK_S", "20"))
"""How long faults are injected while the clients submit."""

HEARTBEAT_S = 0.2
EXPIRY_S = HEARTBEAT_S * HEARTBEAT_LIVENESS
"""The heartbeat bound: a silent hub or worker is given up on after this long."""

JOB_SLACK_S = 30.0
"""How long past the heartbeat bound a job may take to end: queued behind the other clients'
bursts, and behind executors and workers restarting, on two busy cores."""

PER_QUEUED_JOB_S = 0.1
"""And per job of its own burst ahead of it."""

CELL_TIMEOUT_S = 20.0
"""The timeout each cell is sent with; its cells take milliseconds."""

FAULT_INTERVAL_S = (1.0, 4.0)
STOPPED_S = (2.0, 8.0)
BURST = (20, 200)
CLIENTS = 3
JOINERS = ("joiner-a", "joiner-b")
BIG_PRINT_CHARS = 100_000  # over the 64 Ki characters one STREAM message carries
EXECUTOR_MARK = "remote_magic.worker.executor"  # in an executor's command line
EXPECTED_FAILURES = (WorkerLost, ExecutorDied, ConnectionFailed, JobCancelled)
"""What the faults explain (ConnectionFailed with its subclasses, NotConnected among them);
OutputError too, for the cells whose result is over the limit."""

pytestmark = pytest.mark.timeout(SOAK_S + 240)  # a backstop: every wait below has its own deadline

RECORD = RECORD_CELL + 'out = f"{token}:{n * 3}"\n'
"""A cell that records that it ran (one line, its job token, appended to the shared run log) and returns."""


# -- the fleet ---------------------------------------------------------------------------------


class SoakFleet:
    """The hub ('home') and the joined workers as real processes; restartable, each run logged apart."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.home = tmp / "hub-home"  # the hub's keys: a restarted hub issues the same tokens
        self.incarnations: Counter[str] = Counter()
        self.everything: list[WorkerProcess] = []  # every process started, for the clean-up
        self.stopped: dict[str, float] = {}  # SIGSTOPped joiners: when to continue them
        self.anomalies: list[str] = []
        self.joiners: dict[str, WorkerProcess] = {}
        self.monitor: remote_magic.Client | None = None

    def start(self) -> None:
        """The hub on a free port, then the joiners; ``close`` stops whatever started."""
        self.hub = self._start_hub("0")
        self.client_token = self.hub.token
        self.port = Token.decode(self.client_token).address.rsplit(":", 1)[1]  # where a restarted hub listens
        self.worker_token = self._worker_token()
        for name in JOINERS:
            self.joiners[name] = self._start_joiner(name)
        self.monitor = remote_magic.connect(self.client_token, timeout=10)

    def _run_dir(self, name: str) -> Path:
        """A folder per process started: a restarted worker's log doesn't overwrite its predecessor's."""
        self.incarnations[name] += 1
        return self.tmp / f"{name}-{self.incarnations[name]}"

    def _start_hub(self, port: str) -> WorkerProcess:
        hub = start_worker(self._run_dir("home"), "--listen", f"127.0.0.1:{port}", "--gpu", "off", "--name", "home",
                           "--heartbeat-interval", str(HEARTBEAT_S), "--outage-grace", "1", "--max-message-size", "1M",
                           "-v",
                           home=self.home)
        self.everything.append(hub)
        return hub

    def _worker_token(self) -> str:
        printed = subprocess.run(["remote-worker", "token", "--worker"], capture_output=True, text=True, check=True,
                                 env={**os.environ, "REMOTE_MAGIC_HOME": str(self.home)}).stdout.strip()
        return Token.decode(printed).with_address(Token.decode(self.client_token).address).encode()

    def _start_joiner(self, name: str) -> WorkerProcess:
        joiner = start_worker(self._run_dir(name), "--join", "--gpu", "off", "--name", name, "-v", token_file=False,
                              env={"REMOTE_MAGIC_JOIN_TOKEN": self.worker_token})
        self.everything.append(joiner)
        return joiner

    def workers(self) -> dict[str, WorkerProcess]:
        return {"home": self.hub, **self.joiners}

    def listed(self) -> list[str] | None:
        """The names the hub lists now, or None while the monitor can't reach it."""
        assert self.monitor is not None
        try:
            return [w["name"] for w in self.monitor.workers(timeout=2)]
        except ConnectionFailed:
            return None

    # -- faults -----------------------------------------------------------------------------

    def kill_executor(self, name: str) -> bool:
        """SIGKILL the executor child of worker ``name``; False when it has none now (one is starting)."""
        executors = _executors(self.workers()[name])
        for executor in executors:
            try:
                executor.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                continue
        return bool(executors)

    def restart_joiner(self, name: str) -> None:
        """SIGKILL a joined worker and start it again once the hub has let its name go."""
        old = self.joiners[name]
        executors = _executors(old)
        old.process.kill()
        old.process.wait()
        self.stopped.pop(name, None)
        self._reap(name, executors)
        wait_for(lambda: (names := self.listed()) is not None and name not in names, 30,
                 f"the hub to drop the killed {name!r}")  # else the new one would be named {name}-2
        self.joiners[name] = self._start_joiner(name)

    def stop_joiner(self, name: str, until: float) -> None:
        self.joiners[name].process.send_signal(signal.SIGSTOP)
        self.stopped[name] = until

    def continue_joiner(self, name: str) -> None:
        self.stopped.pop(name, None)
        self.joiners[name].process.send_signal(signal.SIGCONT)

    def restart_hub(self, sig: signal.Signals) -> None:
        """Stop the hub with ``sig`` and start it again on the same port with the same keys."""
        old = self.hub
        executors = _executors(old)
        old.process.send_signal(sig)
        try:
            old.process.wait(15)
        except subprocess.TimeoutExpired:
            self.anomalies.append(f"the hub (pid {old.process.pid}) did not exit within 15 s of {sig.name}; "
                                  f"killed it. Log: {old.log_file}")
            old.process.kill()
            old.process.wait()
        self._reap("home", executors)
        self.hub = self._start_hub(self.port)
        if self.hub.token != self.client_token:
            self.anomalies.append(f"the restarted hub issued another client token. Log: {self.hub.log_file}")

    def _reap(self, name: str, executors: list[psutil.Process]) -> None:
        """The executors of a worker that ended end with it (their watchdog); kill any that don't."""
        _, alive = psutil.wait_procs(executors, timeout=10)
        for executor in alive:
            self.anomalies.append(f"{name}'s executor {executor.pid} outlived its worker by 10 s")
            executor.kill()

    def close(self) -> None:
        """Stop every process this fleet started, and their executors."""
        for name in list(self.stopped):
            self.continue_joiner(name)
        if self.monitor is not None:
            in_thread(self.monitor.close, "close-monitor").exception(timeout=10)
        for worker in self.everything:
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGCONT)
                executors = _executors(worker)
                worker.stop()
                self._reap("a worker", executors)


def _executors(worker: WorkerProcess) -> list[psutil.Process]:
    """The executor child processes of a remote-worker process."""
    try:
        children = psutil.Process(worker.process.pid).children()
    except psutil.NoSuchProcess:
        return []
    found = []
    for child in children:
        try:
            if any(EXECUTOR_MARK in part for part in child.cmdline()):
                found.append(child)
        except psutil.Error:  # ended meanwhile
            continue
    return found


@pytest.fixture
def soak_fleet(tmp_path: Path) -> Iterator[SoakFleet]:
    fleet = SoakFleet(tmp_path)
    try:
        fleet.start()
        yield fleet
    finally:
        fleet.close()


# -- the workload -----------------------------------------------------------------------------


def _explained(job: Job, error: BaseException) -> bool:
    """An error the faults explain (a restarted hub can't say whether its former self ran the job)."""
    if not str(error).strip():
        return False
    if job.kind == "oversized" and isinstance(error, OutputError):
        return error.name == "big" and "2.1 MB frame, over the hub's 1.0 MB limit" in str(error)
    return isinstance(error, EXPECTED_FAILURES)


def _told_unsent(error: BaseException) -> bool:
    """A job's error that says it was refused before anything was sent (execute() while the hub is away)."""
    return isinstance(error, ConnectionFailed) and "nothing was sent" in str(error)


def _refused(error: BaseException) -> bool:
    """A submit a lost connection refuses: a failed submit, not a lost job."""
    return isinstance(error, ConnectionFailed) and bool(str(error).strip())


def _cell_check(kind: str, expected: str, printed: list[str]) -> Callable[[Any], str]:
    """What is wrong with a cell's JobResult ('' when it is right)."""
    def check(result: Any) -> str:
        if kind == "oversized":
            return f"a result over the 1 MiB limit came back: {type(result).__name__}"
        if result.values.get("out") != expected:
            return f"returned {result.values.get('out')!r}, expected {expected!r}"
        if result.worker not in ("home", *JOINERS):  # from the job's STARTED message
            return f"its JobResult names worker {result.worker!r}, not one of the fleet's"
        if kind == "big-print" and "".join(printed) != "x" * BIG_PRINT_CHARS + "\n":
            return f"printed {len(''.join(printed))} characters, not the {BIG_PRINT_CHARS + 1} it printed"
        return ""

    return check


class ClientWorkload(Workload):
    """One client's thread: bursts of calls and cells, one action at a time, until ``stop``."""

    def __init__(self, index: int, client: remote_magic.Client, seed: int, runs: RunLog, tally: Tally,
                 stop: threading.Event) -> None:
        super().__init__(f"soak-client-{index}", seed, tally, stop)
        self.client = client
        self.runs = str(runs.path)
        _, self.tiny = recorded_calls()

    def act(self) -> None:
        roll = self.rng.random()
        if roll < 0.7:
            self.burst(self.rng.randint(*BURST))
        else:
            self.cell("cell" if roll < 0.85 else "big-print" if roll < 0.93 else "oversized")

    def burst(self, size: int) -> None:
        self.doing = f"submitting a burst of {size}"
        jobs: list[Job] = []
        for n in range(size):
            token = uuid.uuid4().hex
            try:
                future = self.client.submit(self.tiny, self.runs, token, n)
            except Exception as exc:  # a lost connection refuses submits: a failed submit, not a lost job
                self.tally.refused("call", token, exc)
                break
            jobs.append(Job("call", token, future, expect(f"{token}:{n * n}")))
        self.settle_all(jobs, time.monotonic() + EXPIRY_S + JOB_SLACK_S + PER_QUEUED_JOB_S * len(jobs))

    def cell(self, kind: str) -> None:
        token = uuid.uuid4().hex
        n = self.rng.randint(0, 10**6)
        code, outputs = RECORD, ["out"]
        if kind == "big-print":
            code += f"print('x' * {BIG_PRINT_CHARS})\n"
        elif kind == "oversized":
            code, outputs = code + "big = bytearray(2 * 2**20)\n", ["out", "big"]
        printed: list[str] = []

        def on_stream(header: dict[str, Any]) -> None:
            if header.get("name") == "stdout":
                printed.append(str(header.get("text", "")))

        self.doing = f"running a {kind} cell"
        future = in_thread(lambda: self.client.execute(
            code, {"runs": self.runs, "token": token, "n": n}, outputs, timeout=CELL_TIMEOUT_S,
            on_stream=on_stream), f"soak-{kind}")
        deadline = time.monotonic() + CELL_TIMEOUT_S + EXPIRY_S + JOB_SLACK_S
        self.tally.settle(Job(kind, token, future, _cell_check(kind, f"{token}:{n * 3}", printed), deadline))


# -- the faults -------------------------------------------------------------------------------


class Faults(SoakThread):
    """Injects one fault every 1-4 s until ``stop``; continues every worker it stopped when it ends."""

    KINDS = ("kill-executor", "kill-executor", "restart-joiner", "stop-joiner", "restart-hub")

    def __init__(self, fleet: SoakFleet, seed: int, stop: threading.Event) -> None:
        super().__init__("soak-faults", stop)
        self.fleet = fleet
        self.rng = random.Random(f"{seed}/faults")
        self.injected: Counter[str] = Counter()

    def work(self) -> None:
        try:
            next_fault = time.monotonic() + self.rng.uniform(*FAULT_INTERVAL_S)
            while True:
                due = min([next_fault, *self.fleet.stopped.values()])
                self.doing = "waiting"
                if self.stop_event.wait(max(0.0, due - time.monotonic())):  # the faults' pace
                    break
                for name, until in list(self.fleet.stopped.items()):
                    if until <= time.monotonic():
                        self.fleet.continue_joiner(name)
                if time.monotonic() >= next_fault:
                    self.inject()
                    next_fault = time.monotonic() + self.rng.uniform(*FAULT_INTERVAL_S)
        finally:
            for name in list(self.fleet.stopped):
                self.fleet.continue_joiner(name)

    def inject(self) -> None:
        kind = self.rng.choice(self.KINDS)
        self.doing = kind
        if kind == "kill-executor":
            name = self.rng.choice(sorted(self.fleet.workers()))
            if not self.fleet.kill_executor(name):
                kind = "kill-executor (none running)"
        elif kind == "restart-joiner":
            self.fleet.restart_joiner(self.rng.choice(JOINERS))
        elif kind == "stop-joiner":
            running = [name for name in JOINERS if name not in self.fleet.stopped]
            if not running:
                kind = "stop-joiner (all stopped)"
            else:
                self.fleet.stop_joiner(self.rng.choice(running), time.monotonic() + self.rng.uniform(*STOPPED_S))
        else:
            sig = self.rng.choice([signal.SIGTERM, signal.SIGKILL])
            kind = f"restart-hub-{sig.name}"
            self.fleet.restart_hub(sig)
        self.injected[kind] += 1


# -- the test ---------------------------------------------------------------------------------


def _serves(client: remote_magic.Client, runs: RunLog, worker: str | None, within: float) -> str:
    """'' once ``client`` ran a normal job (on ``worker``) correctly within ``within`` s, else what went wrong.

    A client that lost its hub may refuse jobs (ConnectionFailed) until it is welcomed back; that
    is retried until the deadline, nothing else is.
    """
    deadline = time.monotonic() + within
    while True:
        token = uuid.uuid4().hex
        future = in_thread(lambda: client.run(RECORD, {"runs": str(runs.path), "token": token, "n": 14}, ["out"],
                                               worker=worker, timeout=CELL_TIMEOUT_S), "soak-check")
        try:
            error = future.exception(timeout=max(0.0, deadline - time.monotonic()))
        except concurrent.futures.TimeoutError:
            return f"no answer within {within:g} s"
        if error is None:
            out = future.result()
            return "" if out == {"out": f"{token}:42"} else f"returned {out!r}"
        if not isinstance(error, ConnectionFailed) or time.monotonic() > deadline:
            return f"{type(error).__name__}: {error}"
        time.sleep(0.2)  # a retry's period while the client reconnects; the deadline bounds it


def test_a_fleet_under_random_faults_ends_every_job_once_and_serves_on(soak_fleet: SoakFleet, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    seed = seed_from("REMOTE_MAGIC_SOAK_SEED")
    with capsys.disabled():  # the counts belong in CI's log, passed or not
        print(f"\nsoak: seed {seed} (REMOTE_MAGIC_SOAK_SEED={seed} replays it), {SOAK_S:g} s, logs in {tmp_path}")
    fleet = soak_fleet
    runs = RunLog(tmp_path / "runs" / "runs.log")
    runs.path.parent.mkdir()
    tally = Tally(explained=_explained, never_ran=_told_unsent, may_refuse=_refused)
    stop = threading.Event()
    wait_for(lambda: sorted(fleet.listed() or []) == sorted(fleet.workers()), 30, "every worker to join")
    clients = [remote_magic.connect(fleet.client_token, timeout=10) for _ in range(CLIENTS)]
    faults = Faults(fleet, seed, stop)
    try:
        workloads = [ClientWorkload(i, client, seed, runs, tally, stop) for i, client in enumerate(clients)]
        problems = soak(SOAK_S, workloads, [faults], stop, faults_end_s=180,  # a hub restart waits for the new hub
                        workloads_end_s=EXPIRY_S + JOB_SLACK_S + CELL_TIMEOUT_S + PER_QUEUED_JOB_S * BURST[1])
        # After the faults: each worker, by name, serves a normal job; each client is back.
        wait_for(lambda: sorted(fleet.listed() or []) == sorted(fleet.workers()), 30,
                 "every worker to be listed again")
        with remote_magic.connect(fleet.client_token, timeout=10) as checker:
            problems += [f"worker {name} does not serve after the faults: {problem}" for name in fleet.workers()
                         if (problem := _serves(checker, runs, name, JOB_SLACK_S))]
        problems += [f"client {i} does not serve after the faults: {problem}" for i, client in enumerate(clients)
                     if (problem := _serves(client, runs, None, JOB_SLACK_S))]
    finally:
        stop.set()
        for client in clients:
            in_thread(client.close, "close-client").exception(timeout=10)

    ran = runs.ran()
    summary = "\n".join([f"soak: seed {seed}, {SOAK_S:g} s of faults, {time.monotonic() - tally.started:.1f} s in all",
                         *tally.summary(ran),
                         f"  faults {sum(faults.injected.values())} {dict(faults.injected)}"])
    with capsys.disabled():
        print("\n".join([summary, *(f"  hung: {line}" for line in tally.hung[:20])]))
    problems = [*fleet.anomalies, *problems, *tally.problems(ran)]
    if not faults.injected:
        problems.append("no fault was injected")
    assert not problems, "\n".join(problems) + f"\n{summary}\nworker logs: {tmp_path}/*/worker.log"
