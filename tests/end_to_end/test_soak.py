"""Soak: a fleet of real remote-worker processes under random faults while clients keep submitting.

A hub (with its in-process worker 'home') and two joined workers serve three clients, each in its
own thread, that submit bursts of calls and run cells (some printing more than 64 KiB, some with a
result over the hub's --max-message-size). Meanwhile a fault thread kills executors, kills and
restarts joined workers, stops and continues them, and restarts the hub on the same port. At the
end: every job ended within its deadline, every result is right, nothing ran twice, every failure
is one the faults explain, and every worker and client serves again.

In the default suite it injects faults for 30 s. ``REMOTE_MAGIC_SOAK_S=600`` soaks longer;
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
import traceback
import uuid
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil
import pytest

import remote_magic
from remote_magic import ConnectionFailed, ExecutorDied, JobCancelled, OutputError, WorkerLost
from remote_magic.wire.protocol import HEARTBEAT_LIVENESS
from remote_magic.wire.tokens import Token
from support import WorkerProcess, in_thread, start_worker, wait_for

SOAK_S = float(os.environ.get("REMOTE_MAGIC_SOAK_S", "30"))
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

RECORD = """\
import os
_fd = os.open(runs, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
os.write(_fd, (token + "\\n").encode())
os.close(_fd)
out = f"{token}:{n * 3}"
"""
"""A cell that records that it ran: one line, its job token, appended to the shared run log."""


def _recorder() -> Callable[[str, str, int], str]:
    """The function the bursts submit (nested, so cloudpickle sends it by value to the workers)."""

    def record(runs: str, token: str, n: int) -> str:
        import os

        fd = os.open(runs, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (token + "\n").encode())  # one write under O_APPEND: lines never interleave
        finally:
            os.close(fd)
        return f"{token}:{n * n}"

    return record


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


# -- what happened to each job ----------------------------------------------------------------


@dataclass
class Job:
    """One submitted job: what it should return, and how long it may take to end."""

    kind: str  # "call", "cell", "big-print", "oversized"
    token: str
    expected: str
    future: "Future[Any]"
    deadline: float
    printed: list[str] = field(default_factory=list)
    submitted_at: float = field(default_factory=time.monotonic)


@dataclass
class Tally:
    """Every job's outcome, counted once, from all the client threads."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    submitted: Counter[str] = field(default_factory=Counter)
    succeeded: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    submit_failed: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    wrong: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    lost: list[Job] = field(default_factory=list)
    hung: list[str] = field(default_factory=list)
    succeeded_tokens: set[str] = field(default_factory=set)
    not_run_tokens: set[str] = field(default_factory=set)  # jobs we were told never ran

    def submit_failure(self, kind: str, token: str, error: BaseException) -> None:
        with self.lock:
            self.submitted[kind] += 1
            if isinstance(error, ConnectionFailed) and str(error).strip():
                self.submit_failed[type(error).__name__] += 1
                self.not_run_tokens.add(token)
            else:
                self.unexpected.append(f"{kind} {token}: submit raised {type(error).__name__}: {error!r}")

    def settle(self, job: Job) -> None:
        """Wait for the job until its deadline; check and count how it ended."""
        try:
            error = job.future.exception(timeout=max(0.0, job.deadline - time.monotonic()))
        except concurrent.futures.TimeoutError:
            with self.lock:
                self.submitted[job.kind] += 1
                self.lost.append(job)
            return
        with self.lock:
            self.submitted[job.kind] += 1
            if error is None:
                problem = self._check(job, job.future.result())
                if problem:
                    self.wrong.append(f"{job.kind} {job.token}: {problem}")
                else:
                    self.succeeded += 1
                    self.succeeded_tokens.add(job.token)
            elif isinstance(error, ConnectionFailed) and "nothing was sent" in str(error):
                self.submit_failed[type(error).__name__] += 1  # execute() refused it at submit time
                self.not_run_tokens.add(job.token)
            elif self._expected(job, error):  # (a restarted hub can't say whether its former self ran it)
                self.failed[type(error).__name__] += 1
            else:
                self.unexpected.append(f"{job.kind} {job.token}: {type(error).__name__}: {error!r}\n"
                                       + "".join(traceback.format_exception(error)))

    @staticmethod
    def _check(job: Job, value: Any) -> str:
        """What is wrong with a successful job's value ('' when it is right)."""
        if job.kind == "oversized":
            return f"a result over the 1 MiB limit came back: {type(value).__name__}"
        got = value if job.kind == "call" else value.values.get("out")
        if got != job.expected:
            return f"returned {got!r}, expected {job.expected!r}"
        if job.kind != "call" and value.worker not in ("home", *JOINERS):  # from the job's STARTED message
            return f"its JobResult names worker {value.worker!r}, not one of the fleet's"
        if job.kind == "big-print" and "".join(job.printed) != "x" * BIG_PRINT_CHARS + "\n":
            return f"printed {len(''.join(job.printed))} characters, not the {BIG_PRINT_CHARS + 1} it printed"
        return ""

    @staticmethod
    def _expected(job: Job, error: BaseException) -> bool:
        if not str(error).strip():
            return False
        if job.kind == "oversized" and isinstance(error, OutputError):
            return error.name == "big" and "2.1 MB frame, over the hub's 1.0 MB limit" in str(error)
        return isinstance(error, EXPECTED_FAILURES)

    def summary(self, seed: int, runs: Counter[str], duplicates: dict[str, int], seconds: float) -> str:
        total = sum(self.submitted.values())
        ran_though_not = sorted(t for t in self.not_run_tokens if runs[t])
        lines = [
            f"soak: seed {seed}, {SOAK_S:g} s of faults, "
            f"{seconds:.1f} s in all",
            f"  submitted {total} ({dict(self.submitted)}), succeeded {self.succeeded}",
            f"  failed {sum(self.failed.values())} {dict(self.failed)}",
            f"  failed at submit {sum(self.submit_failed.values())} {dict(self.submit_failed)}",
            f"  faults {sum(self.faults.values())} {dict(self.faults)}",
            f"  lines in the run log {sum(runs.values())}, duplicates {len(duplicates)}, lost {len(self.lost)}, "
            f"hung {len(self.hung)}, wrong {len(self.wrong)}, unexpected {len(self.unexpected)}, "
            f"ran though told it did not {len(ran_though_not)}",
        ]
        return "\n".join(lines)


# -- the workload -----------------------------------------------------------------------------


class Workload(threading.Thread):
    """One client's thread: bursts of calls and cells, one action at a time, until ``stop``."""

    def __init__(self, index: int, client: remote_magic.Client, seed: int, runs: Path, tally: Tally,
                 stop: threading.Event) -> None:
        super().__init__(name=f"soak-client-{index}", daemon=True)
        self.client = client
        self.rng = random.Random(f"{seed}/client-{index}")
        self.runs = str(runs)
        self.tally = tally
        self.stop_event = stop
        self.doing = "starting"  # for the report when this thread doesn't end
        self.error: BaseException | None = None
        self.record = _recorder()

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                roll = self.rng.random()
                if roll < 0.7:
                    self.burst(self.rng.randint(*BURST))
                else:
                    self.cell("cell" if roll < 0.85 else "big-print" if roll < 0.93 else "oversized")
                self.doing = "thinking"
                self.stop_event.wait(self.rng.uniform(0.0, 0.3))  # think time: the workload's pace
        except BaseException as exc:  # reported by the test: a workload thread must not die silently
            self.error = exc

    def burst(self, size: int) -> None:
        self.doing = f"submitting a burst of {size}"
        jobs: list[Job] = []
        for n in range(size):
            token = uuid.uuid4().hex
            try:
                future = self.client.submit(self.record, self.runs, token, n)
            except Exception as exc:  # a lost connection refuses submits: a failed submit, not a lost job
                self.tally.submit_failure("call", token, exc)
                break
            jobs.append(Job("call", token, f"{token}:{n * n}", future, 0.0))
        self.doing = f"waiting for a burst of {len(jobs)}"
        deadline = time.monotonic() + EXPIRY_S + JOB_SLACK_S + PER_QUEUED_JOB_S * len(jobs)
        for job in jobs:
            job.deadline = deadline
            self.tally.settle(job)

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
        self.tally.settle(Job(kind, token, f"{token}:{n * 3}", future, deadline, printed))


# -- the faults -------------------------------------------------------------------------------


class Faults(threading.Thread):
    """Injects one fault every 1-4 s until ``stop``; continues every worker it stopped when it ends."""

    KINDS = ("kill-executor", "kill-executor", "restart-joiner", "stop-joiner", "restart-hub")

    def __init__(self, fleet: SoakFleet, seed: int, tally: Tally, stop: threading.Event) -> None:
        super().__init__(name="soak-faults", daemon=True)
        self.fleet = fleet
        self.rng = random.Random(f"{seed}/faults")
        self.tally = tally
        self.stop_event = stop
        self.doing = "starting"
        self.error: BaseException | None = None

    def run(self) -> None:
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
        except BaseException as exc:  # reported by the test with the logs
            self.error = exc
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
        with self.tally.lock:
            self.tally.faults[kind] += 1


# -- the test ---------------------------------------------------------------------------------


def _serves(client: remote_magic.Client, runs: Path, worker: str | None, within: float) -> str:
    """'' once ``client`` ran a normal job (on ``worker``) correctly within ``within`` s, else what went wrong.

    A client that lost its hub may refuse jobs (ConnectionFailed) until it is welcomed back; that
    is retried until the deadline, nothing else is.
    """
    deadline = time.monotonic() + within
    while True:
        token = uuid.uuid4().hex
        future = in_thread(lambda: client.run(RECORD, {"runs": str(runs), "token": token, "n": 14}, ["out"],
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
    seed = int(os.environ.get("REMOTE_MAGIC_SOAK_SEED") or random.SystemRandom().randrange(2**32))
    with capsys.disabled():  # the counts belong in CI's log, passed or not
        print(f"\nsoak: seed {seed} (REMOTE_MAGIC_SOAK_SEED={seed} replays it), {SOAK_S:g} s, logs in {tmp_path}")
    started = time.monotonic()
    fleet = soak_fleet
    runs = tmp_path / "runs" / "runs.log"
    runs.parent.mkdir()
    tally = Tally()
    stop = threading.Event()
    wait_for(lambda: sorted(fleet.listed() or []) == sorted(fleet.workers()), 30, "every worker to join")
    clients = [remote_magic.connect(fleet.client_token, timeout=10) for _ in range(CLIENTS)]
    workloads = [Workload(i, client, seed, runs, tally, stop) for i, client in enumerate(clients)]
    faults = Faults(fleet, seed, tally, stop)
    try:
        for thread in [*workloads, faults]:
            thread.start()
        stop.wait(SOAK_S)  # the soak's length: the threads work until then
        stop.set()
        faults.join(180)  # a hub restart waits for the new hub to start
        assert not faults.is_alive(), f"the fault thread did not end within 180 s ({faults.doing})"
        assert faults.error is None, "".join(traceback.format_exception(faults.error)) + \
            f"\nfault thread failed; worker logs under {tmp_path}"
        thread_deadline = time.monotonic() + EXPIRY_S + JOB_SLACK_S + CELL_TIMEOUT_S + PER_QUEUED_JOB_S * BURST[1]
        for workload in workloads:
            workload.join(max(0.0, thread_deadline - time.monotonic()))
            if workload.is_alive():
                tally.hung.append(f"{workload.name} did not end: {workload.doing}")
            elif workload.error is not None:
                tally.unexpected.append(f"{workload.name} failed: " +
                                        "".join(traceback.format_exception(workload.error)))

        # After the faults: each worker, by name, serves a normal job; each client is back.
        wait_for(lambda: sorted(fleet.listed() or []) == sorted(fleet.workers()), 30,
                 "every worker to be listed again")
        with remote_magic.connect(fleet.client_token, timeout=10) as checker:
            not_serving = {name: problem for name in fleet.workers()
                           if (problem := _serves(checker, runs, name, JOB_SLACK_S))}
        clients_not_serving = {i: problem for i, client in enumerate(clients)
                               if (problem := _serves(client, runs, None, JOB_SLACK_S))}
    finally:
        stop.set()
        for client in clients:
            in_thread(client.close, "close-client").exception(timeout=10)

    ran = Counter(runs.read_text().splitlines())
    duplicates = {token: count for token, count in ran.items() if count > 1}
    summary = tally.summary(seed, ran, duplicates, time.monotonic() - started)
    lost = [f"{job.kind} {job.token} submitted {job.submitted_at - started:.1f} s in, "
            f"{'ended after its deadline' if job.future.done() else 'still pending'}" for job in tally.lost]
    with capsys.disabled():
        print("\n".join([summary, *(f"  lost: {line}" for line in lost), *(f"  hung: {line}" for line in tally.hung)]))
    where = f"\n{summary}\nworker logs: {tmp_path}/*/worker.log"
    assert not fleet.anomalies, f"{fleet.anomalies}{where}"
    assert not lost and not tally.hung, f"jobs that never ended: {lost[:10]} {tally.hung}{where}"
    assert not duplicates, f"jobs that ran more than once: {dict(list(duplicates.items())[:10])}{where}"
    assert not tally.wrong, f"wrong results: {tally.wrong[:10]}{where}"
    assert not tally.unexpected, f"unexpected errors: {tally.unexpected[:5]}{where}"
    assert not [t for t in tally.succeeded_tokens if ran[t] != 1], f"successes that didn't run once{where}"
    ran_though_not = [t for t in tally.not_run_tokens if ran[t]]
    assert not ran_though_not, f"jobs that ran though the client was told they did not: {ran_though_not[:10]}{where}"
    assert not not_serving, f"workers that don't serve after the faults: {not_serving}{where}"
    assert not clients_not_serving, f"clients that don't serve after the faults: {clients_not_serving}{where}"
    assert tally.succeeded > 0 and sum(tally.faults.values()) > 0, f"nothing happened{where}"
