"""Jobs through the hub: taken in (SUBMIT), handed to idle workers, followed to their end.

A client's SUBMIT is checked (a job runs once, on a worker that exists and fits it), queued in the
fleet, and handed to the worker ``placement`` picks. What the worker says about the job (STARTED,
STREAM, DISPLAY, RESULT, ERROR) goes on to the job's client through ``delivery``. A job also ends
here: cancelled before it started, timed out waiting for a worker held back by its battery, or lost
with its worker. After a reconnect, RESUME reconciles what each side holds.
"""

from __future__ import annotations

import logging
import sys
from collections import OrderedDict
from typing import Any

from ..errors import (
    Busy,
    ConnectionFailed,
    JobCancelled,
    JobTimeout,
    NoMatchingWorker,
    NoSuchWorker,
    ProtocolError,
    RemoteMagicError,
    WorkerLost,
)
from ..wire.failures import error_header
from ..wire.frame_cache import FrameCache, frame_digests
from ..wire.lifecycle import JobState
from ..wire.protocol import Message, MessageType as T, Role, encode, session_id
from ..wire.requirements import check_prefer, parse_all
from ..wire.sizes import human_size
from ..wire.throttle import WarningThrottle
from ..wire.versions import with_libraries
from . import placement
from .delivery import JobDelivery
from .fleet import Fleet
from .records import JobRecord, Peer
from .sender import PeerSender

log = logging.getLogger(__name__)

MAX_QUEUED_JOBS = 100_000
"""How many of one notebook's jobs the hub keeps waiting for a worker; one more is refused (Busy)."""

QUEUED_IN_ALL = 4
"""The jobs of all notebooks waiting for a worker hold at most this many times one notebook's bound."""

RECENT_JOBS = 100_000
"""How many job ids the hub remembers having taken, so a SUBMIT that comes twice never runs twice."""


class Scheduler:
    """Takes jobs in, hands them to workers, relays what workers say about them, and ends them.

    ``warnings`` is the hub's throttle for what peers provoke; ``cache_bytes`` bounds each client's
    frame cache (``wire/frame_cache.py``).
    """

    def __init__(self, fleet: Fleet, sender: PeerSender, delivery: JobDelivery, warnings: WarningThrottle, *,
                 cache_bytes: int, max_queued_bytes: int) -> None:
        self.fleet = fleet
        self.sender = sender
        self.delivery = delivery
        self.cache_bytes = cache_bytes
        self.max_queued_bytes = max_queued_bytes  # of one notebook's jobs waiting for a worker
        self._warnings = warnings
        self._recent_jobs: OrderedDict[str, None] = OrderedDict()  # job ids taken lately: none runs twice

    # -- handlers ---------------------------------------------------------------------------------

    def on_submit(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        """SUBMIT from a client: queue the job, unless it ran already or no worker could run it."""
        job_id = msg.header["job"]
        if not isinstance(job_id, str) or not job_id or len(job_id) > 64:
            raise ValueError("job must be a short string")
        if job_id in self._recent_jobs:  # a job runs once, whatever its SUBMIT went through
            self._warnings.warning(f"{peer.role.value}:{peer.key.decode()}", "dropped a second SUBMIT of "
                                   "job %s from %s: the first one runs, or ran", job_id, peer.name)
            running = self.fleet.jobs.get(job_id)
            if running is None or running.client != peer.routing_id:  # else its own answer is on its way
                self.sender.send(peer.routing_id, T.ERROR, error_header(ProtocolError(
                    f"job id {job_id} was used already: each job needs an id of its own"), job_id))
            return
        wanted = msg.header.get("worker")
        wanted = None if wanted is None else str(wanted)  # as the fleet will compare it with names
        if wanted is not None and self.fleet.worker_named(wanted) is None:
            self.sender.send(peer.routing_id, T.ERROR, error_header(NoSuchWorker(
                f"no worker is named {wanted!r} (workers: {self.worker_names()}); see %offload_workers"), job_id))
            return
        require = parse_all(msg.header.get("require"))  # a malformed one: ValueError, answered as ProtocolError
        timeout = msg.header.get("timeout")
        if peer.cache is None:
            peer.cache = FrameCache(self.cache_bytes)
        buffers, missing = peer.cache.fill(msg.header, msg.buffers)
        if missing:  # the client sends the job again, whole
            self.sender.send(peer.routing_id, T.ERROR, error_header(ProtocolError(
                f"the hub no longer holds {len(missing)} of the values this job refers to"), job_id, missing=missing))
            return
        header = {key: value for key, value in msg.header.items() if key not in ("cached", "digests")}
        if digests := frame_digests(msg.header, len(buffers)):  # every large frame's: the worker's executor
            header["digests"] = digests  # may hold some already (worker/held_frames.py)
        # The worker runs it in the client's session; the hub says which, whatever the client wrote.
        submit = encode(T.SUBMIT, {**header, "session": session_id(peer.routing_id)}, buffers)
        code = str(msg.header.get("code") or "").strip()
        job = JobRecord(job_id, peer.routing_id, wanted, submit, require=require,
                        prefer=check_prefer(msg.header.get("prefer")),
                        summary=(code.splitlines()[0][:80] if code else str(msg.header.get("kind", "job"))),
                        timeout=float(timeout) if isinstance(timeout, (int, float))
                        and 0 < timeout <= sys.float_info.max else None)  # not NaN, inf or 10**400 (float() can't take)
        if not self.fleet.could_run(job):
            self.sender.send(peer.routing_id, T.ERROR, error_header(NoMatchingWorker(
                placement.unmatched(require, self.fleet.workers(), wanted)), job_id))
            return
        if (full := self._queue_full(peer, sum(len(frame) for frame in submit))) is not None:
            self.sender.send(peer.routing_id, T.ERROR, error_header(Busy(
                f"{full}: this one was not queued. Run it again once some of them have started"), job_id))
            return
        self._recent_jobs[job_id] = None
        if len(self._recent_jobs) > RECENT_JOBS:
            self._recent_jobs.popitem(last=False)
        self.fleet.enqueue(job)
        self.assign()

    def _queue_full(self, client: Peer, size: int) -> str | None:
        """Why the hub can't keep one more job of ``size`` bytes of ``client``'s waiting, if it can't."""
        count, held = self.fleet.queued_by(client.routing_id)
        if count >= MAX_QUEUED_JOBS or held + size > self.max_queued_bytes:
            bound = f"{MAX_QUEUED_JOBS:,} jobs, {human_size(self.max_queued_bytes)}"
            return (f"the hub holds {count:,} of this notebook's jobs ({human_size(held)}) waiting for a worker, as "
                    f"many as it keeps for one notebook ({bound})")
        if (in_all := self.fleet.queued_bytes()) + size > QUEUED_IN_ALL * self.max_queued_bytes:
            return f"the hub holds {human_size(in_all)} of jobs waiting for a worker, as much as it keeps"
        return None

    def on_cancel(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        """CANCEL from a client: stop its job, queued or running."""
        job_id = msg.header["job"]
        job = self.fleet.jobs.get(job_id)
        if job is None:  # it ended: the rest of its end, coming down the client's link, isn't sent
            if self.sender.abandon(peer.routing_id, job_id):
                peer.unacknowledged_ends.pop(job_id, None)
                self.sender.send(peer.routing_id, T.ERROR, error_header(
                    JobCancelled("stopped in the notebook while its result came down"), job_id))
            return
        if job.client == peer.routing_id:
            self.cancel(job, "cancelled by the notebook")

    def on_job_event(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        """STARTED, STREAM, DISPLAY, RESULT or ERROR from the worker running the job: on to its client."""
        job_id = msg.header["job"]
        job = self.fleet.jobs.get(job_id)
        if job is None or job.worker != peer.routing_id:
            log.debug("event for unknown job %r from %s", job_id, peer.name)
            return
        peer.usage.bytes_out += sum(len(frame) for frame in frames)
        job.journal.add(list(frames), ending=msg.type in (T.RESULT, T.ERROR))
        if msg.type is T.STARTED:
            job.lifecycle.move(JobState.RUNNING, f"on worker {peer.name!r}")
        elif msg.type in (T.RESULT, T.ERROR):
            stats = msg.header.get("stats")
            gpu_s = stats.get("gpu_time_s") if isinstance(stats, dict) else None
            if isinstance(gpu_s, (int, float)) and gpu_s > 0:
                peer.usage.gpu_s += float(gpu_s)
            self.fleet.finish(job_id, msg.header if msg.type is T.ERROR else None)
            self.delivery.ended(job)
            client = self.fleet.peers.get(job.client)
            if msg.type is T.RESULT and client is not None and client.cache is not None:
                client.cache.remember(msg.buffers)  # sending it back will cost nothing
        self.delivery.to_job_client(job, msg)
        if msg.type in (T.RESULT, T.ERROR):
            self.assign()

    def on_resume(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        """After a reconnect, the peer names the jobs it holds (what it sent before arrived first): what
        either side lacks is failed, or stopped, naming why, so nothing waits for what can't come."""
        held = msg.header["jobs"]
        if not isinstance(held, list) or not all(isinstance(j, str) for j in held):
            raise ValueError("resume needs `jobs`, a list of job ids")
        held_here = set(held)
        in_flight = self.sender.unacknowledged_jobs(peer.routing_id)  # on their way to it still
        if peer.role is Role.CLIENT:
            for job_id in held_here - in_flight - self.delivery.unacknowledged_jobs():
                job = self.fleet.jobs.get(job_id)
                if job is None or job.client != peer.routing_id:
                    self.sender.send(peer.routing_id, T.ERROR, error_header(ConnectionFailed(
                        "the hub has no record of this job after the connection came back: it never arrived, "
                        "or it ended and its end was lost. Run it again"), job_id))
            return
        # It names what it held once it had taken `received` of our messages: a job handed to it after that
        # is on its way, or held since.
        received = msg.header.get("received")
        for job in [j for j in self.fleet.jobs.values() if j.worker == peer.routing_id]:
            handed_before = job.submit_seq is not None and isinstance(received, int) and job.submit_seq <= received
            if handed_before and job.id not in held_here and job.id not in in_flight:
                self.end(job, WorkerLost(
                    f"worker {peer.name!r} has no record of this job after its connection came back, so its result "
                    "is lost. Run the cell again"))
        for job_id in held_here:
            job = self.fleet.jobs.get(job_id)
            if job is None or job.worker != peer.routing_id:
                self.sender.send(peer.routing_id, T.CANCEL, {"job": job_id,
                                                               "reason": "the hub no longer has this job"})

    def on_heartbeat(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        """A worker's heartbeat carries its counters, its battery among them: a change may free waiting jobs; and
        its libraries' versions, which a package installed while it runs changes."""
        if peer.role is Role.WORKER and isinstance(msg.header.get("versions"), dict):
            peer.versions = with_libraries(peer.versions, msg.header["versions"])
        if peer.role is Role.WORKER and isinstance(msg.header.get("stats"), dict):
            before = placement.power_hold(peer), placement.on_battery(peer)
            peer.stats = msg.header["stats"]
            if self.fleet.queue and (placement.power_hold(peer), placement.on_battery(peer)) != before:
                self.assign()  # plugged in, or charged past its --min-battery: waiting jobs may go there now

    # -- scheduling --------------------------------------------------------------------------------

    def assign(self) -> None:
        """Hand waiting jobs to idle workers that fit them; say once why a job waits for a worker on battery."""
        for job, worker in self.fleet.next_assignments():
            log.debug("job %s -> %s", job.id, worker.name)
            frames, job.frames = job.frames, []
            worker.usage.bytes_in += sum(len(frame) for frame in frames)
            job.submit_seq = self.sender.send_frames(worker.routing_id, frames)
        workers = self.fleet.workers()
        if not any(placement.power_hold(w) for w in workers):  # the usual case: no look at a long queue
            return
        for job in self.fleet.queue:  # say once why a job waits when it is not for a busy worker
            if not job.told_why and (why := placement.held_by_power(job, workers)) is not None:
                job.told_why = True
                self.delivery.journaled(job, Message(T.STREAM, {"job": job.id, "name": "stderr", "text": (
                    f"remote-magic: this job waits: {why}. It starts when a worker that matches may take it "
                    "(plugged in, or charged enough).\n")}))

    def cancel(self, job: JobRecord, reason: str) -> None:
        """Stop a job: a queued one ends here, a running one is its worker's to stop."""
        if job.worker is None:  # still queued: answer for the worker
            self.end(job, JobCancelled(reason))
        else:
            self.sender.send(job.worker, T.CANCEL, {"job": job.id, "reason": reason})

    def end(self, job: JobRecord, error: RemoteMagicError) -> None:
        """End a job here, for its worker, and tell its client why (or keep that for a client that collects it)."""
        self.fleet.finish(job.id, error)
        self.delivery.ended(job)
        self.delivery.journaled(job, Message(T.ERROR, error_header(error, job.id)))

    def check_timeouts(self, now: float) -> None:
        """End queued jobs past their timeout that wait only for workers held back by their battery."""
        for job in [j for j in self.fleet.queue if j.timeout is not None and now - j.queued_at > j.timeout]:
            why = placement.held_by_power(job, self.fleet.workers())
            if why is not None:  # waiting for a busy worker is not bounded by the job's timeout; this is
                self.end(job, JobTimeout(
                    f"no worker started this job within its {job.timeout:g} s timeout: {why}. Plug that worker "
                    "in, run the job without the requirements only it meets, or start it with another "
                    "--on-battery or --min-battery"))

    def worker_names(self) -> str:
        """The connected workers' names, for messages."""
        return ", ".join(sorted(w.name for w in self.fleet.workers())) or "none connected"

    # -- peers that left ---------------------------------------------------------------------------

    def worker_left(self, worker: Peer, why: str) -> None:
        """Its jobs are lost; jobs that could run only there fail now rather than wait forever."""
        host = worker.capabilities.get("hostname", "?")
        for job in [j for j in self.fleet.jobs.values() if j.worker == worker.routing_id]:
            self.end(job, WorkerLost(
                f"worker {worker.name!r} on {host} {why} while running this job; its result is lost. "
                "Run the cell again (another worker takes it if one is free)."))
        if self.fleet.worker_named(worker.name) is None:  # jobs waiting for it by name would wait forever
            known = self.worker_names()
            for job in [j for j in list(self.fleet.queue) if j.worker_name == worker.name]:
                self.end(job, NoSuchWorker(
                    f"worker {worker.name!r}, which this job was waiting for, {why} (workers now: {known}); "
                    "run it on another worker, or start that one again"))
        for job in [j for j in list(self.fleet.queue) if not self.fleet.could_run(j)]:
            self.end(job, NoMatchingWorker(
                f"worker {worker.name!r} {why}, and it was the one that matched: "
                + placement.unmatched(job.require, self.fleet.workers(), job.worker_name)))

    def client_left(self, client: Peer, why: str) -> None:
        """Its queued jobs are cancelled; its running ones run on, detached, for a client with its token to
        collect (the cancelled ones' ends too); its session ends on every worker not running one of them."""
        running = set()
        for job in self.fleet.jobs_of_client(client.routing_id):
            if job.worker is None:  # not started: it never will
                self.delivery.detach(job, client)
                self.cancel(job, "the notebook that submitted it went away before a worker took it: run it again")
                continue
            running.add(job.worker)
            self.delivery.detach(job, client)
        self.delivery.detach_unacknowledged_ends(client)  # ended, the client never heard
        for worker in self.fleet.workers():  # its interpreter state there goes with it, once its jobs end
            if worker.routing_id not in running:
                self.sender.send(worker.routing_id, T.SESSION_END, {"session": session_id(client.routing_id),
                                                                      "reason": why})
