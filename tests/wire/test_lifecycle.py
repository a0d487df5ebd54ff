"""One job lifecycle, written once (issue 10, item 1): the state machine, and the client, the hub
and the worker each moving their jobs through it, every move logged at DEBUG."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

import remote_magic
from remote_magic.errors import (
    ExecutorDied,
    InvalidTransition,
    JobCancelled,
    JobTimeout,
    NotConnected,
    RemoteError,
    WorkerLost,
)
from remote_magic.wire.failures import error_header
from remote_magic.wire.lifecycle import TERMINAL, JobState, Lifecycle, terminal_state
from support import start_worker

S = JobState


@pytest.mark.parametrize("path", [
    [S.SENT, S.RUNNING, S.DONE],
    [S.RUNNING, S.FAILED],            # the worker's view: queued for its executor, then running
    [S.CANCELLED],                    # cancelled while queued
    [S.SENT, S.LOST],                 # the worker went away before it said the job started
    [S.SENT, S.RUNNING, S.TIMED_OUT],
])
def test_a_job_takes_the_steps_of_the_diagram(path: list[JobState]) -> None:
    job = Lifecycle("j1", "hub")
    for state in path:
        job.move(state)
    assert job.state is path[-1] and job.ended


@pytest.mark.parametrize("start, then", [
    ([S.SENT, S.RUNNING, S.DONE], S.FAILED),    # a second ending
    ([S.SENT, S.RUNNING, S.DONE], S.RUNNING),   # a STARTED after the result
    ([S.SENT, S.RUNNING], S.SENT),              # backwards
    ([S.SENT, S.RUNNING], S.RUNNING),           # twice
    ([S.CANCELLED], S.QUEUED),
])
def test_an_impossible_step_is_an_error_naming_the_job_and_both_states(start: list[JobState], then: JobState) -> None:
    job = Lifecycle("j2", "worker 'w1'")
    for state in start:
        job.move(state)
    with pytest.raises(InvalidTransition, match=f"worker 'w1': job j2 can't go from {start[-1].value} to {then.value}"):
        job.move(then)
    assert job.state is start[-1]  # unchanged


def test_every_state_but_the_terminal_ones_can_end() -> None:
    for state in set(JobState) - TERMINAL:
        for end in TERMINAL:
            job = Lifecycle("j", "client")
            job.state = state
            job.move(end)
            assert job.state is end


@pytest.mark.parametrize("error, state", [
    (None, S.DONE),
    (JobTimeout("too slow"), S.TIMED_OUT),
    (JobCancelled("interrupted"), S.CANCELLED),
    (WorkerLost("gone"), S.LOST),
    (NotConnected("the hub restarted"), S.LOST),
    (ExecutorDied("segfault"), S.FAILED),
    (RemoteError("ZeroDivisionError", "division by zero"), S.FAILED),
])
def test_an_error_names_the_state_a_job_ends_in(error, state: JobState) -> None:
    assert terminal_state(error) is state
    if error is not None:  # the same from the ERROR header that carries it
        assert terminal_state(error_header(error, "j")) is state


def _moves(text: str, party: str, job: str) -> list[str]:
    """The states a party logged for a job, in order."""
    moves = re.findall(rf"{re.escape(party)}: job {job} (?:queued$|\w+ -> (\w+))", text, re.MULTILINE)
    return ["queued" if not state else state for state in moves]


def test_client_hub_and_worker_log_every_step_of_a_job_at_debug(tmp_path: Path, caplog) -> None:
    worker = start_worker(tmp_path, "--listen", "127.0.0.1:0", "--gpu", "off", "--name", "home", "-vv")
    caplog.set_level(logging.DEBUG, logger="remote_magic.wire.lifecycle")
    try:
        with remote_magic.connect(worker.token) as client:
            assert client.run("x = 6 * 7") == {"x": 42}
            with pytest.raises(RemoteError):
                client.run("1 / 0")
            with pytest.raises(JobTimeout):
                client.run("import time\ntime.sleep(30)", timeout=0.5)
        ours = "\n".join(r.getMessage() for r in caplog.records)
        jobs = re.findall(r"^client: job (\w+) queued$", ours, re.MULTILINE)
        assert len(jobs) == 3
        log = worker.log()
        for job, end in zip(jobs, ["done", "failed", "timed_out"]):
            assert _moves(ours, "client", job) == ["queued", "sent", "running", end]
            assert _moves(log, "hub", job) == ["queued", "sent", "running", end]
            assert _moves(log, "worker 'home'", job) == ["queued", "running", end]
    finally:
        worker.stop()
