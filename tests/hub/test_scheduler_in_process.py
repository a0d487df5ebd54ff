"""The hub's scheduler and delivery in one process, through a recording ``PeerSender`` (tests/hub_parts.py).

What a real hub does with jobs, without sockets or processes: queueing, placement onto idle workers that meet
a job's requirements, a worker lost mid-job, cancelling, results going to their client, and jobs that outlive
their notebook (detached, listed, collected). Each test reads the messages the parts sent, by peer.
"""

from __future__ import annotations

import pytest
from hub_parts import GPU, SOFTWARE_GPU, HubParts

from remote_magic.hub import detached as detached_module, scheduler as scheduler_module
from remote_magic.hub.records import Peer
from remote_magic.notebook.notices import describe_jobs
from remote_magic.wire.protocol import Message, MessageType as T, session_id


@pytest.fixture
def hub() -> HubParts:
    return HubParts()


# -- queueing -------------------------------------------------------------------------------------


def test_a_job_waits_for_a_worker_and_goes_to_the_first_that_joins_in_the_clients_session(hub: HubParts) -> None:
    client = hub.client()
    hub.submit(client, "job-1", code="print('hi')", session="the client's own idea")
    assert [job.id for job in hub.fleet.queue] == ["job-1"] and hub.sender.to(client) == []

    worker = hub.worker("box")
    [submit] = hub.sender.to(worker)
    assert submit.type is T.SUBMIT and submit.header["job"] == "job-1" and submit.header["code"] == "print('hi')"
    assert submit.header["session"] == session_id(client.routing_id)  # the hub says whose, whatever the client wrote
    assert worker.job is not None and worker.job.id == "job-1" and not hub.fleet.queue
    assert worker.usage.bytes_in > 0


def test_jobs_go_one_at_a_time_oldest_first_and_the_next_goes_when_a_result_frees_the_worker(hub: HubParts) -> None:
    client, worker = hub.client(), hub.worker("box")
    for n in range(3):
        hub.submit(client, f"job-{n}")
    assert [m.header["job"] for m in hub.sender.to(worker, T.SUBMIT)] == ["job-0"]
    assert [job.id for job in hub.fleet.queue] == ["job-1", "job-2"]

    hub.from_worker(worker, T.STARTED, "job-0", worker="box")
    hub.from_worker(worker, T.STREAM, "job-0", name="stdout", text="working\n")
    hub.from_worker(worker, T.RESULT, "job-0", buffers=[b"value"], stats={"gpu_time_s": 0.5})
    assert hub.sender.types_to(client) == [T.STARTED, T.STREAM, T.RESULT]
    assert hub.sender.to(client, T.RESULT)[0].buffers == [b"value"]
    assert [m.header["job"] for m in hub.sender.to(worker, T.SUBMIT)] == ["job-0", "job-1"]
    assert worker.jobs_done == 1 and worker.usage.gpu_s == 0.5 and "job-0" not in hub.fleet.jobs


def test_a_second_submit_of_one_job_never_runs_it_twice(hub: HubParts) -> None:
    client, other, worker = hub.client(), hub.client("other"), hub.worker("box")
    hub.submit(client, "job-1")
    hub.submit(client, "job-1")  # the same SUBMIT again (a resend after a reconnect): its answer is on its way
    assert len(hub.sender.to(worker, T.SUBMIT)) == 1 and hub.sender.to(client) == []

    hub.submit(other, "job-1")  # another client with the same id is told
    [error] = hub.sender.to(other)
    assert error.header["error"] == "ProtocolError" and "was used already" in error.header["message"]
    assert len(hub.sender.to(worker, T.SUBMIT)) == 1


def test_a_notebook_past_its_share_of_the_queue_is_told_busy_and_its_job_is_not_queued() -> None:
    hub = HubParts(max_queued_bytes=1000)
    client = hub.client()
    hub.submit(client, "fits", buffers=[b"x" * 600])
    hub.submit(client, "too-much", buffers=[b"x" * 600])
    [error] = hub.sender.to(client)
    assert error.header["job"] == "too-much" and error.header["error"] == "Busy"
    assert "waiting for a worker" in error.header["message"] and "Run it again" in error.header["message"]
    assert [job.id for job in hub.fleet.queue] == ["fits"]


def test_the_queue_bound_counts_jobs_as_well_as_bytes(hub: HubParts, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scheduler_module, "MAX_QUEUED_JOBS", 2)
    client = hub.client()
    for n in range(3):
        hub.submit(client, f"job-{n}")
    assert [m.header["job"] for m in hub.sender.to(client, T.ERROR)] == ["job-2"]
    assert hub.fleet.queued_by(client.routing_id)[0] == 2


# -- placement ------------------------------------------------------------------------------------


def test_a_job_goes_to_the_idle_worker_that_meets_its_requirements(hub: HubParts) -> None:
    client = hub.client()
    plain = hub.worker("plain")
    lab = hub.worker("lab", labels={"zone": "lab"}, memory_bytes=32 << 30)
    hub.submit(client, "job-1", require=["zone==lab", "memory>=16GB"])
    assert hub.sender.to(plain) == [] and [m.header["job"] for m in hub.sender.to(lab, T.SUBMIT)] == ["job-1"]

    hub.submit(client, "job-2", require=["zone==lab"])  # 'lab' is busy: it waits for it, not for 'plain'
    assert [job.id for job in hub.fleet.queue] == ["job-2"] and hub.sender.to(plain) == []
    hub.submit(client, "job-3")  # a job without requirements passes it, to the idle worker
    assert [m.header["job"] for m in hub.sender.to(plain, T.SUBMIT)] == ["job-3"]

    hub.from_worker(lab, T.RESULT, "job-1")
    assert [m.header["job"] for m in hub.sender.to(lab, T.SUBMIT)] == ["job-1", "job-2"]


def test_a_gpu_job_goes_to_a_hardware_gpu_before_a_software_adapter(hub: HubParts) -> None:
    client = hub.client()
    software = hub.worker("lavapipe", gpu=SOFTWARE_GPU)
    hardware = hub.worker("h100", gpu=GPU)
    hub.submit(client, "job-1", require=["gpu"])
    assert [m.header["job"] for m in hub.sender.to(hardware, T.SUBMIT)] == ["job-1"]
    hub.submit(client, "job-2", require=["gpu"])  # the hardware GPU is busy: the software adapter meets `gpu`
    assert [m.header["job"] for m in hub.sender.to(software, T.SUBMIT)] == ["job-2"]


def test_prefer_fastest_picks_the_worker_with_the_highest_measured_speed(hub: HubParts) -> None:
    client = hub.client()
    slow = hub.worker("slow", speed=1.0)
    fast = hub.worker("fast", speed=3.0)
    hub.submit(client, "job-1", prefer="fastest")
    assert hub.sender.to(slow) == [] and len(hub.sender.to(fast, T.SUBMIT)) == 1


def test_a_requirement_no_worker_meets_is_refused_at_once_saying_what_each_has(hub: HubParts) -> None:
    client = hub.client()
    hub.worker("box", labels={"zone": "home"})
    hub.submit(client, "job-1", require=["zone==lab"])
    [error] = hub.sender.to(client)
    assert error.header["error"] == "NoMatchingWorker" and error.header["job"] == "job-1"
    assert "--require 'zone==lab'" in error.header["message"] and "'box' has zone home" in error.header["message"]
    assert not hub.fleet.queue and "job-1" not in hub.fleet.jobs


def test_a_job_for_a_worker_not_connected_is_refused_naming_those_that_are(hub: HubParts) -> None:
    client = hub.client()
    hub.worker("box")
    hub.submit(client, "job-1", worker="gone")
    [error] = hub.sender.to(client)
    assert error.header["error"] == "NoSuchWorker" and "'gone'" in error.header["message"]
    assert "workers: box" in error.header["message"]


def test_a_worker_on_battery_that_takes_no_jobs_holds_them_saying_why_once_until_it_is_plugged_in(
        hub: HubParts) -> None:
    client = hub.client()
    laptop = hub.worker("laptop", on_battery="never", battery={"percent": 80, "plugged_in": False})
    hub.submit(client, "job-1")
    hub.submit(client, "job-2")
    assert hub.sender.to(laptop) == []
    told = hub.sender.to(client, T.STREAM)
    assert [m.header["job"] for m in told] == ["job-1", "job-2"]
    assert "worker 'laptop' is on battery (80%) and takes no jobs on battery" in told[0].header["text"]
    hub.scheduler.assign()
    assert len(hub.sender.to(client, T.STREAM)) == 2  # said once per job

    hub.scheduler.on_heartbeat(laptop, _heartbeat(plugged_in=True), [])
    assert [m.header["job"] for m in hub.sender.to(laptop, T.SUBMIT)] == ["job-1"]


def _heartbeat(plugged_in: bool) -> Message:
    return Message(T.HEARTBEAT, {"stats": {"battery": {"percent": 80, "plugged_in": plugged_in}}})


# -- a worker lost mid-job ----------------------------------------------------------------------


def test_a_worker_lost_mid_job_ends_its_job_with_worker_lost_and_the_queue_moves_on(hub: HubParts) -> None:
    client = hub.client()
    doomed, spare = hub.worker("doomed"), hub.worker("spare")
    hub.submit(client, "running")       # to 'doomed', the first idle one
    hub.submit(client, "also-running")  # to 'spare'
    hub.submit(client, "queued")
    hub.from_worker(doomed, T.STARTED, "running", worker="doomed")
    hub.leave(doomed, "stopped answering")

    [error] = hub.sender.to(client, T.ERROR)
    assert error.header["job"] == "running" and error.header["error"] == "WorkerLost"
    assert "worker 'doomed' on doomed.local stopped answering while running this job" in error.header["message"]
    assert "Run the cell again" in error.header["message"]
    assert "running" not in hub.fleet.jobs
    hub.from_worker(spare, T.RESULT, "also-running")
    assert [m.header["job"] for m in hub.sender.to(spare, T.SUBMIT)] == ["also-running", "queued"]
    # A late word from the lost worker about its job goes nowhere.
    hub.from_worker(doomed, T.RESULT, "running")
    assert [m.header["job"] for m in hub.sender.to(client, T.RESULT)] == ["also-running"]


def test_jobs_only_the_lost_worker_could_run_fail_rather_than_wait_forever(hub: HubParts) -> None:
    client = hub.client()
    lab = hub.worker("lab", labels={"zone": "lab"})
    hub.worker("plain")
    hub.submit(client, "on-lab", require=["zone==lab"])
    hub.submit(client, "needs-lab", require=["zone==lab"])
    hub.submit(client, "named", worker="lab")
    hub.leave(lab, "shut down")
    errors = {m.header["job"]: m.header for m in hub.sender.to(client, T.ERROR)}
    assert errors["on-lab"]["error"] == "WorkerLost"
    assert errors["named"]["error"] == "NoSuchWorker" and "which this job was waiting for, shut down" in \
        errors["named"]["message"]
    assert errors["needs-lab"]["error"] == "NoMatchingWorker" and "it was the one that matched" in \
        errors["needs-lab"]["message"]
    assert not hub.fleet.queue and not hub.fleet.jobs


def test_a_worker_back_after_a_reconnect_without_a_job_it_was_handed_fails_that_job(hub: HubParts) -> None:
    client, worker = hub.client(), hub.worker("box")
    hub.submit(client, "job-1")
    hub.sender.acknowledge(worker.routing_id)  # the SUBMIT reached it
    hub.scheduler.on_resume(worker, Message(T.RESUME, {"jobs": [], "received": 1}), [])
    [error] = hub.sender.to(client, T.ERROR)
    assert error.header["error"] == "WorkerLost" and "no record of this job" in error.header["message"]


def test_a_worker_that_names_a_job_the_hub_no_longer_has_is_told_to_cancel_it(hub: HubParts) -> None:
    worker = hub.worker("box")
    hub.scheduler.on_resume(worker, Message(T.RESUME, {"jobs": ["forgotten"], "received": 0}), [])
    [cancel] = hub.sender.to(worker)
    assert cancel.type is T.CANCEL and cancel.header == {"job": "forgotten", "reason": "the hub no longer has this job"}


# -- cancelling ---------------------------------------------------------------------------------


def test_cancelling_a_queued_job_ends_it_here_and_a_running_one_asks_its_worker(hub: HubParts) -> None:
    client, worker = hub.client(), hub.worker("box")
    hub.submit(client, "running")
    hub.submit(client, "queued")
    hub.scheduler.on_cancel(client, Message(T.CANCEL, {"job": "queued"}), [])
    [error] = hub.sender.to(client, T.ERROR)
    assert error.header["job"] == "queued" and error.header["error"] == "JobCancelled"
    assert not hub.fleet.queue

    hub.scheduler.on_cancel(client, Message(T.CANCEL, {"job": "running"}), [])
    [cancel] = hub.sender.to(worker, T.CANCEL)
    assert cancel.header == {"job": "running", "reason": "cancelled by the notebook"}
    assert "running" in hub.fleet.jobs  # the worker's ERROR ends it


def test_cancelling_while_the_result_comes_down_drops_the_rest_and_says_so(hub: HubParts) -> None:
    client, worker = hub.client(), hub.worker("box")
    hub.submit(client, "job-1")
    hub.from_worker(worker, T.RESULT, "job-1", buffers=[b"a large value"])
    hub.scheduler.on_cancel(client, Message(T.CANCEL, {"job": "job-1"}), [])  # the RESULT is still on its way
    assert hub.sender.to(client, T.RESULT) == []
    [error] = hub.sender.to(client, T.ERROR)
    assert error.header["error"] == "JobCancelled" and "while its result came down" in error.header["message"]
    assert client.unacknowledged_ends == {}


# -- delivery: results to their client, and jobs that outlive it ---------------------------------


def test_a_result_waits_for_its_clients_acknowledgement_before_it_counts_as_delivered(hub: HubParts) -> None:
    client, worker = hub.client(), hub.worker("box")
    hub.submit(client, "job-1")
    hub.from_worker(worker, T.RESULT, "job-1")
    assert set(client.unacknowledged_ends) == {"job-1"} and hub.delivery.unacknowledged_jobs() == {"job-1"}
    hub.sender.acknowledge(client.routing_id)
    hub.delivery.forget_acknowledged_ends()
    assert client.unacknowledged_ends == {}


def test_a_client_gone_before_acknowledging_its_result_finds_the_job_ended_waiting_for_it(hub: HubParts) -> None:
    client, worker = hub.client(key=b"token-a"), hub.worker("box")
    hub.submit(client, "job-1", code="total = 42\nmore()")
    hub.from_worker(worker, T.STARTED, "job-1", worker="box")
    hub.from_worker(worker, T.RESULT, "job-1", buffers=[b"42"])
    hub.leave(client, "disconnected")

    back = hub.client("notebook again", key=b"token-a")
    hub.delivery.on_jobs(back, Message(T.JOBS, {"request": 7}), [])
    [listing] = hub.sender.to(back, T.JOBS)
    [job] = listing.header["jobs"]
    assert listing.header["request"] == 7
    assert (job["job"], job["state"], job["worker"], job["summary"]) == ("job-1", "done", "box", "total = 42")

    hub.delivery.on_attach(back, Message(T.ATTACH, {"job": "job-1"}), [])
    replayed = hub.sender.to(back, T.STARTED, T.RESULT)
    assert [m.type for m in replayed] == [T.STARTED, T.RESULT] and replayed[1].buffers == [b"42"]


def _gone_mid_job(hub: HubParts, why: str) -> tuple[Peer, Peer]:
    """A notebook whose job 'long' printed "epoch 1" on 'box', and whose job 'queued' waits, goes away.
    Returns (the notebook, the worker)."""
    client, worker = hub.client(key=b"token-a"), hub.worker("box")
    hub.submit(client, "long", code="train()")
    hub.submit(client, "queued")
    hub.from_worker(worker, T.STARTED, "long", worker="box")
    hub.from_worker(worker, T.STREAM, "long", name="stdout", text="epoch 1\n")
    hub.sender.clear()
    hub.leave(client, why)
    return client, worker


def test_a_running_job_whose_notebook_goes_runs_on_and_a_notebook_with_its_token_collects_it(hub: HubParts) -> None:
    client, worker = _gone_mid_job(hub, "disconnected")

    assert [m.type for m in hub.sender.to(worker)] == []  # no CANCEL, and its session stays: a job runs in it
    assert "queued" not in hub.fleet.jobs  # a job that never started won't
    hub.from_worker(worker, T.STREAM, "long", name="stdout", text="epoch 2\n")
    hub.from_worker(worker, T.RESULT, "long", buffers=[b"model"])
    [session_end] = hub.sender.to(worker, T.SESSION_END)  # its last job ended: its session can go
    assert session_end.header == {"session": session_id(client.routing_id), "reason": "its notebook went away"}

    stranger = hub.client("stranger", key=b"token-b")
    hub.delivery.on_attach(stranger, Message(T.ATTACH, {"job": "long"}), [])
    [refused] = hub.sender.to(stranger)
    assert refused.header["error"] == "NoSuchJob" and "%offload_jobs lists those that wait" in refused.header["message"]

    back = hub.client("notebook again", key=b"token-a")
    hub.delivery.on_attach(back, Message(T.ATTACH, {"job": "long"}), [])
    replayed = hub.sender.to(back)
    assert [m.type for m in replayed] == [T.STARTED, T.STREAM, T.STREAM, T.RESULT]
    assert [m.header.get("text") for m in replayed[1:3]] == ["epoch 1\n", "epoch 2\n"]
    assert replayed[3].buffers == [b"model"]


def test_the_same_notebook_back_after_the_hub_forgot_it_collects_what_it_had_not_had(hub: HubParts) -> None:
    _, worker = _gone_mid_job(hub, "stopped answering")  # the notebook had both of long's messages
    hub.from_worker(worker, T.STREAM, "long", name="stdout", text="epoch 2\n")
    back = hub.client("notebook", key=b"token-a")
    hub.delivery.on_jobs(back, Message(T.JOBS, {"request": 1}), [])
    [listing] = hub.sender.to(back, T.JOBS)
    listed = describe_jobs(listing.header["jobs"])
    assert "long  running on 'box'" in listed and "queued  cancelled 0 s ago before a worker took it" in listed
    hub.sender.clear()

    hub.delivery.on_attach(back, Message(T.ATTACH, {"job": "long", "received": 2}), [])
    assert [(m.type, m.header.get("text")) for m in hub.sender.to(back)] == [(T.STREAM, "epoch 2\n")]
    hub.from_worker(worker, T.RESULT, "long", buffers=[b"model"])
    assert hub.sender.types_to(back) == [T.STREAM, T.RESULT]
    hub.sender.clear()
    # A job still queued when the notebook went was cancelled: collected, it says why.
    hub.delivery.on_attach(back, Message(T.ATTACH, {"job": "queued", "received": 0}), [])
    [cancelled] = hub.sender.to(back)
    assert cancelled.header["error"] == "JobCancelled" and "before a worker took it: run it again" in \
        cancelled.header["message"]


def test_a_job_collected_again_after_it_ended_gets_its_end_whatever_the_client_says_it_had(hub: HubParts) -> None:
    client, worker = hub.client(key=b"token-a"), hub.worker("box")
    hub.submit(client, "long")
    hub.from_worker(worker, T.STARTED, "long", worker="box")
    hub.leave(client, "stopped answering")
    hub.from_worker(worker, T.RESULT, "long", buffers=[b"model"])
    back = hub.client("notebook", key=b"token-a")
    hub.delivery.on_attach(back, Message(T.ATTACH, {"job": "long", "received": 99}), [])
    assert hub.sender.types_to(back) == [T.RESULT]


def test_output_past_what_the_hub_keeps_is_said_lost_to_a_collector_that_had_not_had_it(
        hub: HubParts, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(detached_module, "JOURNAL_MAX_BYTES", 400)
    client, worker = hub.client(key=b"token-a"), hub.worker("box")
    hub.submit(client, "long")
    hub.from_worker(worker, T.STARTED, "long", worker="box")
    hub.leave(client, "stopped answering")  # it had STARTED
    for n in range(20):  # past 400 bytes: the rest is not kept
        hub.from_worker(worker, T.STREAM, "long", name="stdout", text=f"line {n}\n")
    hub.from_worker(worker, T.RESULT, "long")
    back = hub.client("notebook", key=b"token-a")
    hub.delivery.on_attach(back, Message(T.ATTACH, {"job": "long", "received": 1}), [])
    notice, *lines, end = hub.sender.to(back)
    assert notice.header["journaled"] is False and "not kept); it is not shown" in notice.header["text"]
    texts = [m.header["text"] for m in lines]
    assert 0 < len(texts) < 20 and texts == [f"line {n}\n" for n in range(len(texts))] and end.type is T.RESULT


def _collected_while_running(hub: HubParts) -> tuple[Peer, Peer, Peer]:
    """A notebook whose job 'long' runs on 'box' goes away; another with its token collects the job.
    Returns (the notebook that went, the worker, the collector)."""
    client, worker = hub.client(key=b"token-a"), hub.worker("box")
    hub.submit(client, "long")
    hub.from_worker(worker, T.STARTED, "long", worker="box")
    hub.leave(client, "disconnected")
    back = hub.client("notebook again", key=b"token-a")
    hub.delivery.on_attach(back, Message(T.ATTACH, {"job": "long"}), [])
    return client, worker, back


def test_a_collected_job_still_running_is_the_collectors_from_then_on(hub: HubParts) -> None:
    _, worker, back = _collected_while_running(hub)
    hub.from_worker(worker, T.RESULT, "long", buffers=[b"done"])
    assert [m.type for m in hub.sender.to(back)] == [T.STARTED, T.RESULT]
    assert hub.delivery.unacknowledged_jobs() == {"long"}


def test_a_notebook_that_leaves_ends_its_session_on_every_worker_not_running_its_jobs(hub: HubParts) -> None:
    client, busy, idle = hub.client(), hub.worker("busy"), hub.worker("idle")
    hub.submit(client, "job-1")  # to 'busy'
    hub.leave(client, "disconnected")
    assert hub.sender.to(busy, T.SESSION_END) == []
    [end] = hub.sender.to(idle, T.SESSION_END)
    assert end.header == {"session": session_id(client.routing_id), "reason": "disconnected"}


def test_the_departed_notebooks_session_ends_once_its_collected_job_ends(hub: HubParts) -> None:
    client, worker, _ = _collected_while_running(hub)
    hub.from_worker(worker, T.RESULT, "long")
    ended = [m.header["session"] for m in hub.sender.to(worker, T.SESSION_END)]
    assert ended == [session_id(client.routing_id)]  # as when the job ends before it is collected
