"""One harness for soaks: clients keep submitting while faults happen, and every job ends exactly once.

A soak (tests/end_to_end/test_soak.py: processes killed, stopped, restarted; test_blips.py: connections
dropped and cut) runs client threads (``Workload``) that submit jobs and settle each one (``Tally.settle``),
beside threads that cause the faults (``SoakThread``), for a while (``soak``). Every job appends its own
token to a run log (``RunLog``: one write under O_APPEND, so lines never interleave) before it does anything
else, so at the end the test counts how often each job ran. ``Tally.problems`` then says what went wrong:
a job that never ended by its deadline, one that ran twice, a wrong result, an error the faults don't
explain, a success that didn't run exactly once, or a job the client was told never ran that did.
"""

from __future__ import annotations

import concurrent.futures
import os
import random
import threading
import time
import traceback
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

THINK_S = (0.0, 0.3)
"""How long a client thread waits between two actions: the workload's pace."""

RECORD_CELL = """\
import os
_fd = os.open(runs, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
os.write(_fd, (token + "\\n").encode())
os.close(_fd)
"""
"""The start of a soak's cell (its inputs: ``runs``, ``token``): it records that it ran, in the run log."""


def seed_from(variable: str) -> int:
    """The soak's seed: ``$variable`` to replay a run, else a fresh one (the test prints it)."""
    return int(os.environ.get(variable) or random.SystemRandom().randrange(2**32))


def recorded_calls() -> tuple[Callable[[str, str], None], Callable[[str, str, int], str]]:
    """``record(runs, token)``, which appends the token to the run log, and ``tiny(runs, token, n)``, which
    records and returns ``"token:n²"``: made here, nested, so cloudpickle sends them to workers by value."""

    def record(runs: str, token: str) -> None:
        import os

        fd = os.open(runs, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (token + "\n").encode())  # one write under O_APPEND: lines never interleave
        finally:
            os.close(fd)

    def tiny(runs: str, token: str, n: int) -> str:
        record(runs, token)
        return f"{token}:{n * n}"

    return record, tiny


@dataclass(frozen=True)
class RunLog:
    """The file every job appends its token to when it runs."""

    path: Path

    def ran(self) -> Counter[str]:
        """How many times each job token is in the run log."""
        return Counter(self.path.read_text().splitlines()) if self.path.exists() else Counter()

    def watch_for_a_second_run(self, token: str, window: float) -> int:
        """How often ``token`` ran, watching ``window`` seconds for a second run (returns as soon as one shows)."""
        deadline = time.monotonic() + window
        while (runs := self.ran()[token]) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # polling period of a bounded watch, not synchronisation
        return runs


def expect(value: Any) -> Callable[[Any], str]:
    """A job's check: '' when it returned ``value``, else what it returned."""
    def check(got: Any) -> str:
        return "" if got == value else f"returned {_short(got)}, expected {_short(value)}"

    return check


def _short(value: Any) -> str:
    if isinstance(value, bytes):
        import hashlib

        return f"{len(value)} bytes (sha256 {hashlib.sha256(value).hexdigest()[:12]})"
    return repr(value)[:200]


@dataclass
class Job:
    """One submitted job: how to check its value, and until when it may take to end."""

    kind: str
    token: str
    future: "Future[Any]"
    check: Callable[[Any], str]  # what is wrong with its value ('' when it is right)
    deadline: float = 0.0
    submitted_at: float = field(default_factory=time.monotonic)


def never(*_: Any) -> bool:
    return False


@dataclass
class Tally:
    """Every job's outcome, counted once, from all the client threads.

    ``explained(job, error)``: an error the soak's faults explain (a worker killed mid-job); by default
    none is. ``never_ran(error)``: a job's error that says it was never sent (a client refusing a job while
    its hub is away), so it must not be in the run log. ``may_refuse(error)``: a submit that raised (nothing
    was sent) with this error is one the faults explain. By default neither is.
    """

    started: float = field(default_factory=time.monotonic)
    explained: Callable[[Job, BaseException], bool] = never
    never_ran: Callable[[BaseException], bool] = never
    may_refuse: Callable[[BaseException], bool] = never
    lock: threading.Lock = field(default_factory=threading.Lock)
    submitted: Counter[str] = field(default_factory=Counter)
    succeeded: set[str] = field(default_factory=set)
    failed: Counter[str] = field(default_factory=Counter)      # errors the faults explain, by type
    not_run: Counter[str] = field(default_factory=Counter)     # refused before anything was sent, by type
    not_run_tokens: set[str] = field(default_factory=set)
    wrong: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    hung: list[str] = field(default_factory=list)

    def settle(self, job: Job) -> None:
        """Wait for the job until its deadline; check and count how it ended."""
        try:
            error = job.future.exception(timeout=max(0.0, job.deadline - time.monotonic()))
        except concurrent.futures.TimeoutError:
            with self.lock:
                self.submitted[job.kind] += 1
                self.hung.append(f"{job.kind} {job.token} submitted {job.submitted_at - self.started:.1f} s in, "
                                 f"{'ended after its deadline' if job.future.done() else 'still pending'}")
            return
        with self.lock:
            self.submitted[job.kind] += 1
            if error is None:
                if problem := job.check(job.future.result()):
                    self.wrong.append(f"{job.kind} {job.token}: {problem}")
                else:
                    self.succeeded.add(job.token)
            elif self.never_ran(error):
                self.not_run[type(error).__name__] += 1
                self.not_run_tokens.add(job.token)
            elif self.explained(job, error):
                self.failed[type(error).__name__] += 1
            else:
                self.unexpected.append(f"{job.kind} {job.token}: {type(error).__name__}: {error!r}\n"
                                       + "".join(traceback.format_exception(error)))

    def refused(self, kind: str, token: str, error: BaseException) -> None:
        """A submit that raised (so nothing was sent): a job that never ran if the faults explain it, else
        an unexpected error."""
        with self.lock:
            self.submitted[kind] += 1
            if self.may_refuse(error):
                self.not_run[type(error).__name__] += 1
                self.not_run_tokens.add(token)
            else:
                self.unexpected.append(f"{kind} {token}: submit raised {type(error).__name__}: {error!r}")

    def summary(self, ran: Counter[str]) -> list[str]:
        """What happened to the jobs, in two lines."""
        duplicates = sum(1 for count in ran.values() if count > 1)
        return [
            f"  jobs {sum(self.submitted.values())} {dict(self.submitted)}, succeeded {len(self.succeeded)}, "
            f"failed as the faults explain {sum(self.failed.values())} {dict(self.failed)}, "
            f"refused unsent {sum(self.not_run.values())} {dict(self.not_run)}",
            f"  lines in the run log {sum(ran.values())}, duplicates {duplicates}, hung {len(self.hung)}, "
            f"wrong {len(self.wrong)}, unexpected {len(self.unexpected)}",
        ]

    def problems(self, ran: Counter[str]) -> list[str]:
        """Every way the soak broke 'every job ends exactly once, right': empty when it held."""
        duplicates = {token: count for token, count in ran.items() if count > 1}
        not_once = sorted(token for token in self.succeeded if ran[token] != 1)
        ran_though_not = sorted(token for token in self.not_run_tokens if ran[token])
        found = [
            f"jobs that never ended: {self.hung[:10]}" if self.hung else "",
            f"jobs that ran more than once: {dict(list(duplicates.items())[:10])}" if duplicates else "",
            f"wrong results: {self.wrong[:10]}" if self.wrong else "",
            f"unexpected errors: {self.unexpected[:5]}" if self.unexpected else "",
            f"successes that did not run exactly once: {not_once[:10]}" if not_once else "",
            f"jobs that ran though the client was told they did not: {ran_though_not[:10]}" if ran_though_not else "",
            "no job succeeded" if not self.succeeded else "",
        ]
        return [line for line in found if line]


class SoakThread(threading.Thread):
    """A soak's thread: it works (``work``) until ``stop`` is set; ``doing`` says what it is at, for a report
    when it doesn't end, and whatever it raised is kept in ``error`` (a soak's thread must not die silently)."""

    def __init__(self, name: str, stop: threading.Event) -> None:
        super().__init__(name=name, daemon=True)
        self.stop_event = stop
        self.doing = "starting"
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.work()
        except BaseException as exc:  # reported by the soak
            self.error = exc

    def work(self) -> None:
        raise NotImplementedError


class Workload(SoakThread):
    """One client's thread: an action at a time (``act``, drawn from ``rng``), with think time between."""

    def __init__(self, name: str, seed: int, tally: Tally, stop: threading.Event) -> None:
        super().__init__(name, stop)
        self.rng = random.Random(f"{seed}/{name}")
        self.tally = tally

    def work(self) -> None:
        while not self.stop_event.is_set():
            self.act()
            self.doing = "thinking"
            self.stop_event.wait(self.rng.uniform(*THINK_S))  # think time: the workload's pace

    def act(self) -> None:
        raise NotImplementedError

    def settle_all(self, jobs: Sequence[Job], deadline: float) -> None:
        """Settle a burst's jobs, all due by ``deadline``."""
        self.doing = f"waiting for a burst of {len(jobs)}"
        for job in jobs:
            job.deadline = deadline
            self.tally.settle(job)


def soak(seconds: float, workloads: Sequence[Workload], faults: Sequence[SoakThread], stop: threading.Event, *,
         faults_end_s: float, workloads_end_s: float) -> list[str]:
    """Run the workloads beside the faults for ``seconds``, then stop them all: the faults first (each within
    ``faults_end_s``), then the client threads (all within ``workloads_end_s``: their last jobs settle).
    Returns what went wrong with the threads themselves; a client thread that doesn't end counts as hung."""
    problems = []
    for thread in [*workloads, *faults]:
        thread.start()
    try:
        stop.wait(seconds)  # the soak's length: the threads work until then
    finally:
        stop.set()
    for thread in faults:
        thread.join(faults_end_s)
        if thread.is_alive():
            problems.append(f"{thread.name} did not end within {faults_end_s:g} s ({thread.doing})")
        elif thread.error is not None:
            problems.append(f"{thread.name} failed: " + "".join(traceback.format_exception(thread.error)))
    deadline = time.monotonic() + workloads_end_s
    for workload in workloads:
        workload.join(max(0.0, deadline - time.monotonic()))
        if workload.is_alive():
            workload.tally.hung.append(f"{workload.name} did not end: {workload.doing}")
        elif workload.error is not None:
            problems.append(f"{workload.name} failed: " + "".join(traceback.format_exception(workload.error)))
    return problems
