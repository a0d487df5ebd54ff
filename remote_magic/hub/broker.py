"""The hub: one ROUTER socket where clients and workers meet.

Clients and workers both dial the hub's one TCP port (so one tunnel serves everyone),
authenticate with CurveZMQ, and say who they are in a HELLO. The hub queues jobs, hands each
to an idle worker, relays what the worker says back to the job's client, and watches
heartbeats: a worker that is gone fails its job with WorkerLost, a client that is gone has its
jobs cancelled and its session on every worker ended (SESSION_END). Gone means silent with its
connection down (libzmq's own heartbeats, which need no GIL, say whether it is up), or silent for
much longer with it up: a hung process.
The hub never unpickles anything; payload frames pass through untouched.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import OrderedDict
from functools import partial
from typing import Any, Sequence

import zmq

from ..errors import (
    ConnectionFailed,
    CredentialsRotated,
    InvalidTransition,
    JobCancelled,
    JobTimeout,
    KernelError,
    NoMatchingWorker,
    NoSuchJob,
    NoSuchWorker,
    NotConnected,
    PermissionDenied,
    ProtocolError,
    RemoteMagicError,
    VersionMismatch,
    WorkerLost,
)
from ..wire import schema
from ..wire.auth import HubAuthenticator
from ..wire.failures import error_header
from ..wire.frame_cache import DEFAULT_CACHE_BYTES, FrameCache
from ..wire.keys import HubKeys
from ..wire.lifecycle import JobState
from ..wire.link import ACK_EVERY_S, Link
from ..wire.protocol import (
    DEFAULT_MAX_MESSAGE_BYTES,
    HEARTBEAT_INTERVAL_S,
    HEARTBEAT_LIVENESS,
    HEARTBEAT_STALL_LIVENESS,
    LINK_PING_INTERVAL_S,
    Message,
    MessageType as T,
    Role,
    decode,
    encode,
    session_id,
)
from ..wire.requirements import check_prefer, parse_all
from ..wire.versions import describe_differences, local_versions
from . import placement
from .detached import DetachedJob, DetachedJobs
from .fleet import Fleet, Job, Peer
from .kernels import MAX_KERNEL_ID, KernelRoutes
from .throttle import WarningThrottle

log = logging.getLogger(__name__)

# What each role may send once it said HELLO.
_ALLOWED = {
    Role.CLIENT: {T.HEARTBEAT, T.SUBMIT, T.CANCEL, T.WORKERS, T.BYE, T.HELLO, T.CHUNK, T.CHUNK_ACK, T.LINK_ACK,
                  T.RESUME, T.JOBS, T.ATTACH, T.KERNEL_START, T.KERNEL_FRAMES, T.KERNEL_SIGNAL, T.KERNEL_STOP},
    Role.WORKER: {T.HEARTBEAT, T.STARTED, T.STREAM, T.DISPLAY, T.RESULT, T.ERROR, T.BYE, T.HELLO, T.CHUNK,
                  T.CHUNK_ACK, T.LINK_ACK, T.RESUME, T.KERNEL_STARTED, T.KERNEL_FRAMES, T.KERNEL_DIED},
}
_LOCAL_KEY = b"in-process"

MAX_HELD_BYTES = 1 << 30
"""How much may wait for one peer that isn't reading (a notebook busy holding the GIL while its job
prints, a peer reconnecting) before the hub takes it for gone; one larger message still waits alone."""

GOODBYE_LINGER_MS = 1000
"""At shutdown, how long the hub's socket may take to deliver its goodbyes."""

HELD_RETRY_MS = 10
"""While messages wait for a peer's queue to have room: how often the hub tries to send them."""

RECENT_JOBS = 100_000
"""How many job ids the hub remembers having taken, so a SUBMIT that comes twice never runs twice."""


class Hub:
    """A broker between clients and workers, served by a background thread.

    ``listen`` is a ZeroMQ TCP endpoint; port 0 picks a free port (see ``port`` after
    ``start``). ``keys`` decides who may connect and with which role. A worker in the same
    process dials ``local_endpoint`` on ``context`` instead: inproc, without copies or
    encryption, and trusted as a worker because only this process can reach it. ``kernels``: whether
    clients may start whole Jupyter kernels on workers (``kernel_*`` messages, routed by ``kernels.py``).
    """

    def __init__(self, keys: HubKeys, listen: str = "tcp://127.0.0.1:0", *,
                 heartbeat_interval: float = HEARTBEAT_INTERVAL_S,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, cache_bytes: int = DEFAULT_CACHE_BYTES,
                 kernels: bool = True) -> None:
        self.keys = keys
        self.cache_bytes = cache_bytes
        self.listen = listen
        self.heartbeat_interval = heartbeat_interval
        self.expiry_s = heartbeat_interval * HEARTBEAT_LIVENESS
        self.stall_s = heartbeat_interval * HEARTBEAT_STALL_LIVENESS
        self.max_message_bytes = max_message_bytes
        self.fleet = Fleet()
        self.kernels_allowed = kernels
        self.kernels = KernelRoutes()
        self.port = 0  # the bound TCP port, once started
        self.context = zmq.Context()
        self.local_endpoint = f"inproc://remote-magic-hub-{id(self)}"
        self._auth: HubAuthenticator | None = None
        self._socket: zmq.Socket[Any] | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        # Per peer: its link (wire/link.py): what goes to it, in order and numbered, large messages in paced
        # chunks, kept until it acknowledges them; and what it sends us, taken once each, in order.
        self._links: dict[bytes, Link] = {}
        self._owing_acks: set[bytes] = set()  # peers whose link has something to acknowledge
        self._caches: dict[bytes, FrameCache] = {}  # per client: its large frames, so they cross once
        self.detached = DetachedJobs()  # jobs whose client went away, until one with its token collects them
        # Per job whose RESULT or ERROR its client hasn't acknowledged: that message's seq on the client's
        # link, and the job as it would wait for collection if the client went away before acknowledging.
        self._unacknowledged_ends: dict[str, tuple[int, bytes, DetachedJob]] = {}
        self._recent_jobs: OrderedDict[str, None] = OrderedDict()  # job ids taken lately: none runs twice
        # Keyed by credential (a handful), so an authenticated peer can't flood the log with garbage.
        self._peer_warnings = WarningThrottle(log)
        self._wake_endpoint = f"inproc://hub-wake-{id(self)}"

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> "Hub":
        """Bind the port and start serving in a background thread."""
        self._auth = HubAuthenticator(self.context, self.keys)
        self._auth.start()
        sock = self.context.socket(zmq.ROUTER)
        sock.linger = 0
        sock.curve_server = True
        sock.curve_publickey = self.keys.server_public
        sock.curve_secretkey = self.keys.server_secret
        sock.router_handover = True  # a peer that reconnects keeps its identity
        sock.router_mandatory = True  # sending to a vanished peer raises instead of vanishing
        sock.maxmsgsize = self.max_message_bytes
        # libzmq's heartbeats, on its own I/O thread: a peer's connection closes once it stops
        # answering them (peers time out the hub with their own). One interval short of the expiry,
        # so a connection that died is down by the time its silence counts; but never shorter than
        # two of the peers' own pings, which are all a peer that isn't reading sends.
        sock.heartbeat_ivl = int(self.heartbeat_interval * 1000)
        sock.heartbeat_timeout = int(max(self.expiry_s - self.heartbeat_interval, 2 * LINK_PING_INTERVAL_S) * 1000)
        sock.rcvhwm = 0  # never stop reading a peer: see the same line in wire/connection.py
        try:
            sock.bind(self.listen)
        except zmq.ZMQError as exc:
            sock.close()
            self._auth.stop()
            raise OSError(f"can't listen on {self.listen}: {exc.strerror}. "
                          "Is another remote-worker running there? Pick another port with --listen.") from exc
        endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        sock.bind(self.local_endpoint)
        self.port = int(endpoint.rsplit(":", 1)[1])
        self._socket = sock
        wake = self.context.socket(zmq.PULL)
        wake.linger = 0
        wake.bind(self._wake_endpoint)
        self._thread = threading.Thread(target=self._serve, args=(wake,), name="remote-magic-hub", daemon=True)
        self._thread.start()
        log.info("hub listening on %s", endpoint)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving and close the socket; idempotent."""
        if self._thread is None:
            return
        self._stopping.set()
        self._call_soon("stop")
        thread, self._thread = self._thread, None
        thread.join(timeout)
        if self._auth is not None:
            self._auth.stop()
        if thread.is_alive():  # terminating the context would wait for its sockets forever
            log.warning("the hub's thread did not stop within %g s; leaving it to process exit", timeout)
        else:
            self.context.term()

    def __enter__(self) -> "Hub":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def set_keys(self, keys: HubKeys) -> None:
        """Accept new credentials from now on (rotation); peers on old keys are dropped."""
        self.keys = keys
        if self._auth is not None:
            self._auth.keys = keys
        self._call_soon("drop-stale")

    def _call_soon(self, command: str) -> None:
        waker = self.context.socket(zmq.PUSH)
        waker.linger = 0
        waker.connect(self._wake_endpoint)
        try:
            waker.send(command.encode(), zmq.NOBLOCK)
        except zmq.Again:  # the hub's thread has ended (it saw _stopping first): nothing left to wake
            pass
        waker.close()

    # -- the loop --------------------------------------------------------------------------

    def _serve(self, wake: zmq.Socket[Any]) -> None:
        sock = self._socket
        assert sock is not None
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(wake, zmq.POLLIN)
        next_tick = time.monotonic()
        try:
            while not self._stopping.is_set():
                timeout_ms = max(0, int((next_tick - time.monotonic()) * 1000))
                if self._send_held():  # the socket can't say when a peer's queue has room again: look often
                    timeout_ms = min(timeout_ms, HELD_RETRY_MS)
                if self._owing_acks:
                    timeout_ms = min(timeout_ms, self._send_acks())
                events = dict(poller.poll(timeout_ms))
                if wake in events:
                    command = wake.recv()
                    if command == b"drop-stale":
                        self._drop_stale_keys()
                if sock in events:
                    for _ in range(1000):  # drain what is queued, but keep heartbeats on time
                        frames = sock.recv_multipart(copy=False)
                        try:
                            self._handle(frames)
                        except Exception:  # a bug must cost one message, not the hub: log it whole
                            log.exception("dropped a message the hub failed to handle")
                        if not int(sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                            break
                if time.monotonic() >= next_tick:
                    try:
                        self._tick()
                    except Exception:  # a bug must cost one tick, not the hub: log it whole
                        log.exception("the hub's periodic checks failed")
                    next_tick = time.monotonic() + self.heartbeat_interval / 2
            self._say_goodbye()
        finally:
            wake.close()
            sock.close()

    def _say_goodbye(self) -> None:
        """Tell every peer the hub is stopping, so their jobs fail now, saying why, not at the heartbeat bound."""
        assert self._socket is not None
        for peer in list(self.fleet.peers.values()):
            self._try_send(peer.identity, encode(T.BYE, {"reason": "the hub shut down"}))
        self._socket.linger = GOODBYE_LINGER_MS

    def _send(self, identity: bytes, msg_type: T, header: dict[str, Any] | None = None,
              buffers: Sequence[Any] = ()) -> None:
        self._send_frames(identity, encode(msg_type, header, buffers))

    def _send_frames(self, identity: bytes, frames: list[Any]) -> int | None:
        """Send without ever blocking the hub: what a peer can't take now waits for it, in order. The
        message's seq on the peer's link (None when it isn't numbered, or the peer is unknown)."""
        peer = self.fleet.peers.get(identity)
        if peer is None:  # not (or no longer) a peer: nothing to keep it for
            if not self._try_send(identity, frames):
                log.debug("dropped a message to %r, which is not reading and not a peer", identity)
            return None
        outbox = self._link(peer).outbox
        reading = not outbox.waiting_for_room
        seq = outbox.put(frames)
        if reading and outbox.waiting_for_room:
            log.info("%s %r is not reading what the hub sends, or is reconnecting; keeping its messages "
                     "until it reads", peer.role.value, peer.name)
        if len(outbox) > 1 and outbox.pending_bytes > MAX_HELD_BYTES:
            log.warning("%s %r stopped reading while %.0f MiB waited for it; dropping it and what waited",
                        peer.role.value, peer.name, outbox.pending_bytes / 2**20)
            self._forget(peer, f"stopped reading while {outbox.pending_bytes / 2**20:.0f} MiB waited for it")
        return seq

    def _link(self, peer: Peer) -> Link:
        link = self._links.get(peer.identity)
        if link is None:  # in-process workers need no chunks: inproc carries no heartbeats to starve
            link = self._links[peer.identity] = Link(partial(self._try_send, peer.identity), chunked=not peer.local,
                                                     max_bytes=self.max_message_bytes)
        return link

    def _send_acks(self) -> int:
        """Acknowledge what peers sent (wire/link.py); how many milliseconds until more acknowledgements are due."""
        due_s = ACK_EVERY_S
        for identity in list(self._owing_acks):
            link = self._links.get(identity)
            wait = link.tick() if link is not None else None
            if wait is None:
                self._owing_acks.discard(identity)
            else:
                due_s = min(due_s, wait)
        return max(1, int(due_s * 1000))

    def _try_send(self, identity: bytes, frames: list[Any]) -> bool:
        """Send one message if the peer's queue has room; False if it has none (nothing was sent)."""
        assert self._socket is not None
        try:
            self._socket.send_multipart([identity, *frames], zmq.NOBLOCK, copy=False)
        except zmq.ZMQError:  # Again: its queue is full; EHOSTUNREACH: its connection is down for now
            return False
        peer = self.fleet.peers.get(identity)
        if peer is not None:
            peer.last_sent = time.monotonic()
        return True

    def _send_held(self) -> bool:
        """Send what waits for peers (they read again, or a chunk is due); True while any waits for room."""
        waiting = False
        for link in self._links.values():
            if link.outbox:
                link.outbox.pump()
                waiting = waiting or link.outbox.waiting_for_room
        return waiting

    def _handle(self, frames: list[zmq.Frame]) -> None:
        identity = frames[0].bytes
        try:
            user_id = str(frames[1].get("User-Id")) if len(frames) > 1 else ""
        except zmq.ZMQError:  # inproc carries no security metadata: the in-process worker
            user_id = f"{Role.WORKER.value}:{_LOCAL_KEY.decode()}"
        role_name, _, key = user_id.partition(":")
        try:
            role = Role(role_name)
        except ValueError:
            self._peer_warnings.warning(user_id, "dropped a message from a peer with no role")
            return
        self._handle_message(identity, role, key, user_id, frames[1:])

    def _handle_message(self, identity: bytes, role: Role, key: str, user_id: str, frames: Sequence[Any]) -> None:
        try:
            msg = decode(frames)
        except ProtocolError as exc:
            self._peer_warnings.warning(user_id, "malformed message from a %s: %s", role.value, exc)
            self._send(identity, T.ERROR, error_header(ProtocolError(str(exc))))
            return
        peer = self.fleet.peers.get(identity)
        if peer is not None:
            peer.last_seen = time.monotonic()
        if msg.type is T.HELLO:
            self._on_hello(identity, role, key.encode(), msg)
            return
        if peer is None:
            job = _job_id(msg)  # a job sent to a hub that restarted: fail it now, don't leave it waiting
            self._send(identity, T.ERROR, error_header(NotConnected(
                "the hub forgot this connection (it restarted, or timed it out) and has no record of this job: "
                "if it ran before, its result is lost. Run it again" if job else
                "send hello first: this hub doesn't know you (it may have restarted)"), job))
            return
        if msg.type not in _ALLOWED[role]:
            what = "a client token can't act as a worker" if role is Role.CLIENT else "a worker token can't submit jobs"
            self._send(identity, T.ERROR, error_header(
                PermissionDenied(f"{msg.type.value} is not allowed here: {what}"), msg.header.get("job")))
            return
        try:
            schema.check(msg)  # every field's type and range (wire/schema.py), before anything reads one
            link = self._link(peer)
            taken = link.receive(msg)  # chunks put together, acknowledgements, each numbered message once
            if link.owes_ack:
                self._owing_acks.add(identity)
            if taken is None:
                return
            if taken is not msg:  # it came in chunks: check what it is now
                schema.check(taken)
                if taken.type not in _ALLOWED[role] or taken.type is T.HELLO:
                    raise ValueError(f"a chunked {taken.type.value} is not allowed here")
                frames = encode(taken.type, taken.header, taken.buffers)
            getattr(self, f"_on_{taken.type.value}")(peer, taken, frames)
        except ProtocolError as exc:
            self._peer_warnings.warning(user_id, "bad %s from %s: %s", msg.type.value, peer.name, exc)
            self._send(identity, T.ERROR, error_header(exc, schema.job_of(msg.header)))  # not a 10 MB "job" echoed
        except (KeyError, TypeError, ValueError, OverflowError, InvalidTransition) as exc:
            self._peer_warnings.warning(user_id, "bad %s from %s: %s", msg.type.value, peer.name, exc)
            self._send(identity, T.ERROR, error_header(
                ProtocolError(f"bad {msg.type.value} message: {exc}"), _job_id(msg)))

    # -- handlers --------------------------------------------------------------------------

    def _on_hello(self, identity: bytes, role: Role, key: bytes, msg: Message) -> None:
        if key != _LOCAL_KEY and self.keys.role_of(key) is not role:
            self._send(identity, T.ERROR, error_header(
                PermissionDenied(f"these credentials were rotated out: {new_token_advice(role)}")))
            return
        claimed = msg.header.get("role")
        if claimed != role.value:
            self._send(identity, T.ERROR, error_header(
                PermissionDenied(f"this token is for a {role.value}, not a {claimed}")))
            return
        versions = msg.header.get("versions")
        ours = local_versions()
        if not isinstance(versions, dict) or versions.get("protocol") != ours["protocol"]:
            self._send(identity, T.ERROR, error_header(VersionMismatch(
                f"this hub speaks protocol {ours['protocol']} (remote-magic "
                f"{ours['remote_magic']}); install the same remote-magic version on both sides")))
            return
        old = self.fleet.peers.get(identity)
        name = str(msg.header.get("name") or identity.hex()[:8])[:64]
        if role is Role.WORKER:
            name = self.fleet.unique_name(name, identity)
        caps = msg.header.get("capabilities") if role is Role.WORKER else {}
        peer = Peer(identity, role, name, {k: str(v) for k, v in versions.items()},
                    caps if isinstance(caps, dict) else {}, local=key == _LOCAL_KEY, key=key)
        if old is not None:  # a reconnect: keep what it was doing
            peer.job, peer.jobs_done, peer.usage = old.job, old.jobs_done, old.usage
        self.fleet.peers[identity] = peer
        # A hello starts the link's numbering again both ways, as the WELCOME makes the peer expect. What
        # it had not acknowledged won't reach it now: jobs that ended meanwhile wait for collection.
        self._links.pop(identity, None)
        self._detach_unacknowledged_ends(identity)
        log.info("%s %r joined (%s)", role.value, name, ", ".join(f"{k} {v}" for k, v in versions.items()))
        notes = describe_differences(ours, peer.versions, f"this {role.value}")
        if notes:
            log.warning("version differences with %s %r: %s", role.value, name, "; ".join(notes))
        self._send(identity, T.WELCOME, {
            "name": name, "versions": ours, "heartbeat_interval": self.heartbeat_interval,
            "max_message_bytes": self.max_message_bytes, "cache_bytes": self.cache_bytes if role is Role.CLIENT else 0,
            "workers": [w.describe() for w in self.fleet.workers()],
        })
        self._dispatch()

    def _on_heartbeat(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        if peer.role is Role.WORKER and isinstance(msg.header.get("stats"), dict):
            before = placement.power_hold(peer), placement.on_battery(peer)
            peer.stats = msg.header["stats"]
            if self.fleet.queue and (placement.power_hold(peer), placement.on_battery(peer)) != before:
                self._dispatch()  # plugged in, or charged past its --min-battery: waiting jobs may go there now

    def _on_bye(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        self._forget(peer, "shut down" if peer.role is Role.WORKER else "disconnected")

    def _on_workers(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        cache = self._caches.get(peer.identity)
        self._send(peer.identity, T.WORKERS, {
            "request": msg.header.get("request"), "workers": [w.describe() for w in self.fleet.workers()],
            "cache": {"bytes": cache.bytes if cache else 0, "max_bytes": self.cache_bytes}})

    def _on_submit(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        job_id = msg.header["job"]
        if not isinstance(job_id, str) or not job_id or len(job_id) > 64:
            raise ValueError("job must be a short string")
        if job_id in self._recent_jobs:  # a job runs once, whatever its SUBMIT went through
            self._peer_warnings.warning(f"{peer.role.value}:{peer.key.decode()}", "dropped a second SUBMIT of "
                                        "job %s from %s: the first one runs, or ran", job_id, peer.name)
            return
        wanted = msg.header.get("worker")
        wanted = None if wanted is None else str(wanted)  # as the fleet will compare it with names
        if wanted is not None and self.fleet.worker_named(wanted) is None:
            self._send(peer.identity, T.ERROR, error_header(NoSuchWorker(
                f"no worker is named {wanted!r} (workers: {self._worker_names()}); see %offload_workers"), job_id))
            return
        require = parse_all(msg.header.get("require"))  # a malformed one: ValueError, answered as ProtocolError
        timeout = msg.header.get("timeout")
        cache = self._caches.setdefault(peer.identity, FrameCache(self.cache_bytes))
        buffers, missing = cache.fill(msg.header, msg.buffers)
        if missing:  # the client sends the job again, whole
            self._send(peer.identity, T.ERROR, error_header(ProtocolError(
                f"the hub no longer holds {len(missing)} of the values this job refers to"), job_id, missing=missing))
            return
        header = {key: value for key, value in msg.header.items() if key not in ("cached", "digests")}
        # The worker runs it in the client's session; the hub says which, whatever the client wrote.
        submit = encode(T.SUBMIT, {**header, "session": session_id(peer.identity)}, buffers)
        code = str(msg.header.get("code") or "").strip()
        job = Job(job_id, peer.identity, wanted, submit, require=require, prefer=check_prefer(msg.header.get("prefer")),
                  summary=(code.splitlines()[0][:80] if code else str(msg.header.get("kind", "job"))),
                  timeout=float(timeout) if isinstance(timeout, (int, float)) and 0 < timeout <= sys.float_info.max
                  else None)  # not NaN, inf or 10**400 (which float() can't take)
        if not self.fleet.could_run(job):
            self._send(peer.identity, T.ERROR, error_header(NoMatchingWorker(
                placement.unmatched(require, self.fleet.workers(), wanted)), job_id))
            return
        self._recent_jobs[job_id] = None
        if len(self._recent_jobs) > RECENT_JOBS:
            self._recent_jobs.popitem(last=False)
        self.fleet.enqueue(job)
        self._dispatch()

    def _on_resume(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        """After a reconnect, the peer names the jobs it holds (what it sent before arrived first): what
        either side lacks is failed, or stopped, naming why, so nothing waits for what can't come."""
        held = msg.header["jobs"]
        if not isinstance(held, list) or not all(isinstance(j, str) for j in held):
            raise ValueError("resume needs `jobs`, a list of job ids")
        held_here = set(held)
        in_flight = self._link(peer).outbox.jobs()  # on their way to it still
        if peer.role is Role.CLIENT:
            for job_id in held_here - in_flight - set(self._unacknowledged_ends):
                job = self.fleet.jobs.get(job_id)
                if job is None or job.client != peer.identity:
                    self._send(peer.identity, T.ERROR, error_header(ConnectionFailed(
                        "the hub has no record of this job after the connection came back: it never arrived, "
                        "or it ended and its end was lost. Run it again"), job_id))
            return
        # It names what it held once it had taken `received` of our messages: a job handed to it after that
        # is on its way, or held since.
        received = msg.header.get("received")
        for job in [j for j in self.fleet.jobs.values() if j.worker == peer.identity]:
            handed_before = job.submit_seq is not None and isinstance(received, int) and job.submit_seq <= received
            if handed_before and job.id not in held_here and job.id not in in_flight:
                self._end(job, WorkerLost(
                    f"worker {peer.name!r} has no record of this job after its connection came back, so its result "
                    "is lost. Run the cell again"))
        for job_id in held_here:
            job = self.fleet.jobs.get(job_id)
            if job is None or job.worker != peer.identity:
                self._send(peer.identity, T.CANCEL, {"job": job_id, "reason": "the hub no longer has this job"})

    def _on_cancel(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        job = self.fleet.jobs.get(msg.header["job"])
        if job is None or job.client != peer.identity:
            return  # already finished: the result or error is on its way
        self._cancel(job, "cancelled by the notebook")

    def _on_job_event(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        job_id = msg.header["job"]
        job = self.fleet.jobs.get(job_id)
        if job is None or job.worker != peer.identity:
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
            self._ended_detached(job)
            if msg.type is T.RESULT and job.client in self._caches:  # sending it back will cost nothing
                self._caches[job.client].remember(msg.buffers)
        self._to_job_client(job, msg)
        if msg.type in (T.RESULT, T.ERROR):
            self._dispatch()

    _on_started = _on_stream = _on_display = _on_result = _on_error = _on_job_event

    # -- whole kernels: routed between the client that started one and its worker, never read ---------

    def _on_kernel_start(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        kernel_id = msg.header["kernel"]
        if not isinstance(kernel_id, str) or not kernel_id or len(kernel_id) > MAX_KERNEL_ID:
            raise ValueError(f"kernel must be a string of 1 to {MAX_KERNEL_ID} characters")
        if not self.kernels_allowed:
            self._send(peer.identity, T.ERROR, error_header(PermissionDenied(
                "this hub does not allow kernels: its remote-worker runs with --kernels off. Start it with "
                "--kernels on (the default) to run whole kernels there"), kernel=kernel_id))
            return
        if (route := self.kernels.get(kernel_id)) is not None and route.client != peer.identity:
            raise ValueError("another client uses this kernel id")
        wanted = msg.header.get("worker")
        try:
            worker = self.kernels.choose_worker(str(wanted) if wanted else None, self.fleet.workers())
        except (KernelError, NoSuchWorker) as exc:
            self._send(peer.identity, T.ERROR, error_header(exc, kernel=kernel_id))
            return
        self.kernels.add(kernel_id, peer.identity, worker)
        log.info("kernel %s of client %r starts on worker %r", kernel_id, peer.name, worker.name)
        self._send_frames(worker.identity, list(frames))

    def _on_kernel_to_worker(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        route = self.kernels.get(msg.header["kernel"])
        if route is not None and route.client == peer.identity:
            self._send_frames(route.worker, list(frames))

    def _on_kernel_to_client(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        route = self.kernels.get(msg.header["kernel"])
        if route is None or route.worker != peer.identity:
            return
        if msg.type is T.KERNEL_DIED:
            self.kernels.remove(route.id)
        if route.client in self.fleet.peers:
            self._send_frames(route.client, list(frames))

    def _on_kernel_frames(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        if peer.role is Role.CLIENT:
            self._on_kernel_to_worker(peer, msg, frames)
        else:
            self._on_kernel_to_client(peer, msg, frames)

    _on_kernel_signal = _on_kernel_stop = _on_kernel_to_worker
    _on_kernel_started = _on_kernel_died = _on_kernel_to_client

    # -- scheduling and liveness -----------------------------------------------------------

    def _dispatch(self) -> None:
        for job, worker in self.fleet.next_assignments():
            log.debug("job %s -> %s", job.id, worker.name)
            frames, job.frames = job.frames, []
            worker.usage.bytes_in += sum(len(frame) for frame in frames)
            job.submit_seq = self._send_frames(worker.identity, frames)
        workers = self.fleet.workers()
        if not any(placement.power_hold(w) for w in workers):  # the usual case: no look at a long queue
            return
        for job in self.fleet.queue:  # say once why a job waits when it is not for a busy worker
            if not job.told_why and (why := placement.held_by_power(job, workers)) is not None:
                job.told_why = True
                self._send(job.client, T.STREAM, {"job": job.id, "name": "stderr", "text": (
                    f"remote-magic: this job waits: {why}. It starts when a worker that matches may take it "
                    "(plugged in, or charged enough).\n")})

    def _cancel(self, job: Job, reason: str) -> None:
        if job.worker is None:  # still queued: answer for the worker
            self._end(job, JobCancelled(reason))
        else:
            self._send(job.worker, T.CANCEL, {"job": job.id, "reason": reason})

    def _end(self, job: Job, error: RemoteMagicError) -> None:
        """End a job here, for its worker, and tell its client why (or keep that for a client that collects it)."""
        self.fleet.finish(job.id, error)
        msg = Message(T.ERROR, error_header(error, job.id))
        job.journal.add(encode(msg.type, msg.header), ending=True)
        self._ended_detached(job)
        self._to_job_client(job, msg)

    def _to_job_client(self, job: Job, msg: Message) -> None:
        """Send one of a job's messages to its client, unless it went away: then the message waits in the job's
        journal for whoever collects it (even when the same notebook comes back, until it collects it)."""
        if job.id not in self.detached:
            self._to_client(job.client, msg, self._ending(job) if msg.type in (T.RESULT, T.ERROR) else None)

    def _ending(self, job: Job) -> DetachedJob | None:
        """An ended job as it waits for collection if its client goes away before hearing of its end."""
        client = self.fleet.peers.get(job.client)
        if client is None:
            return None
        worker = self.fleet.peers.get(job.worker) if job.worker else None
        return DetachedJob(job.id, client.key, job.summary, worker.name if worker else "?", job.journal,
                           ended_at=time.monotonic(), state=job.lifecycle.state.value)

    def _to_client(self, identity: bytes, msg: Message, ending: DetachedJob | None = None) -> None:
        """Send one of a job's messages to its client, on its link (numbered, kept until acknowledged). The job
        a RESULT or ERROR ends (``ending``) is kept too until then: if the client goes away first, the job
        waits for collection, ended, as one that ended after it went."""
        seq = self._send_frames(identity, encode(msg.type, msg.header, msg.buffers))
        if ending is not None and seq is not None:
            self._unacknowledged_ends[ending.id] = (seq, identity, ending)

    def _detach_unacknowledged_ends(self, client: bytes) -> None:
        """The client won't hear of these jobs' ends on this link: they wait for collection instead."""
        for job_id, (_, identity, ending) in list(self._unacknowledged_ends.items()):
            if identity == client:
                del self._unacknowledged_ends[job_id]
                self.detached.detach(ending)
                self.detached.ended(job_id, ending.state)

    def _ended_detached(self, job: Job) -> None:
        """A job whose client went away ended: its result waits for collection, and its session can end."""
        if job.id in self.detached:
            self.detached.ended(job.id, job.lifecycle.state.value)
            worker = self.fleet.peers.get(job.worker) if job.worker else None
            if worker is not None and not any(j.client == job.client for j in self.fleet.jobs.values()):
                self._send(worker.identity, T.SESSION_END, {"session": session_id(job.client),
                                                            "reason": "its notebook went away"})

    # -- jobs that outlive their notebook (hub/detached.py) ---------------------------------

    def _on_jobs(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        self._send(peer.identity, T.JOBS, {"request": msg.header.get("request"),
                                           "jobs": self.detached.listing(peer.key)})

    def _on_attach(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        job_id = str(msg.header["job"])
        detached = self.detached.take(job_id, peer.key)
        if detached is None:
            self._send(peer.identity, T.ERROR, error_header(NoSuchJob(
                f"no job {job_id!r} waits to be collected here: it was collected already, ended more than "
                f"{self.detached.keep_s / 60:.0f} minutes ago, or was never submitted with this token "
                "(%offload_jobs lists those that wait)"), job_id))
            return
        if detached.journal.dropped:
            self._to_client(peer.identity, Message(T.STREAM, {"job": job_id, "name": "stderr", "text": (
                f"remote-magic: {detached.journal.dropped:,} bytes of this job's output came while no notebook "
                "was there to show them, past what the hub keeps; they are not shown.\n")}))
        for index, frames in enumerate(detached.journal.messages):  # as they came, then what comes next
            last = index == len(detached.journal.messages) - 1
            # Collected once it is acknowledged: a collector gone before that leaves it waiting again.
            self._to_client(peer.identity, decode(frames), detached if last and detached.ended_at else None)
        job = self.fleet.jobs.get(job_id)
        if job is not None:  # still running: it is this client's now
            job.client = peer.identity
        log.info("client %r collected job %s (%s)", peer.name, job_id, detached.state)

    def _tick(self) -> None:
        now = time.monotonic()
        for job in [j for j in self.fleet.queue if j.timeout is not None and now - j.queued_at > j.timeout]:
            why = placement.held_by_power(job, self.fleet.workers())
            if why is not None:  # waiting for a busy worker is not bounded by the job's timeout; this is
                self._end(job, JobTimeout(
                    f"no worker started this job within its {job.timeout:g} s timeout: {why}. Plug that worker "
                    "in, run the job without the requirements only it meets, or start it with another "
                    "--on-battery or --min-battery"))
        for peer in self.fleet.silent(now, self.expiry_s):
            if now - peer.last_seen > self.stall_s:
                self._forget(peer, f"said nothing for {self.stall_s:.0f} s though its connection is up (hung?)")
            elif not self._connected(peer):
                self._forget(peer, f"stopped answering for {self.expiry_s:.1f} s")
        for peer in list(self.fleet.peers.values()):
            if now - peer.last_sent >= self.heartbeat_interval:
                self._try_send(peer.identity, encode(T.HEARTBEAT))  # never behind what is queued for it
        for link in self._links.values():
            link.drop_stalled(self.stall_s)
        self._forget_acknowledged_ends()
        self.detached.expire()

    def _forget_acknowledged_ends(self) -> None:
        """Jobs whose end their client acknowledged need not wait for collection any more."""
        for job_id, (seq, identity, _) in list(self._unacknowledged_ends.items()):
            link = self._links.get(identity)
            if link is None or seq <= link.outbox.acked_seq:
                del self._unacknowledged_ends[job_id]

    def _connected(self, peer: Peer) -> bool:
        """Is the peer's connection up? The socket has no route to a peer once libzmq closed it."""
        assert self._socket is not None
        try:
            self._socket.send_multipart([peer.identity, *encode(T.HEARTBEAT)], zmq.NOBLOCK)
        except zmq.Again:
            return True  # connected, only not reading
        except zmq.ZMQError:  # EHOSTUNREACH
            return False
        return True

    def _forget(self, peer: Peer, why: str) -> None:
        self._forget_acknowledged_ends()  # before its link goes: what it acknowledged last, it has
        self.fleet.peers.pop(peer.identity, None)
        self._links.pop(peer.identity, None)
        self._owing_acks.discard(peer.identity)
        self._caches.pop(peer.identity, None)
        log.info("%s %r left: %s", peer.role.value, peer.name, why)
        if peer.role is Role.WORKER:
            host = peer.capabilities.get("hostname", "?")
            for job in [j for j in self.fleet.jobs.values() if j.worker == peer.identity]:
                self._end(job, WorkerLost(
                    f"worker {peer.name!r} on {host} {why} while running this job; its result is lost. "
                    "Run the cell again (another worker takes it if one is free)."))
            if self.fleet.worker_named(peer.name) is None:  # jobs waiting for it by name would wait forever
                known = self._worker_names()
                for job in [j for j in list(self.fleet.queue) if j.worker_name == peer.name]:
                    self._end(job, NoSuchWorker(
                        f"worker {peer.name!r}, which this job was waiting for, {why} (workers now: {known}); "
                        "run it on another worker, or start that one again"))
            for job in [j for j in list(self.fleet.queue) if not self.fleet.could_run(j)]:
                self._end(job, NoMatchingWorker(
                    f"worker {peer.name!r} {why}, and it was the one that matched: "
                    + placement.unmatched(job.require, self.fleet.workers(), job.worker_name)))
            for route in self.kernels.of_worker(peer.identity):
                self.kernels.remove(route.id)
                if route.client in self.fleet.peers:
                    self._send(route.client, T.KERNEL_DIED, {"kernel": route.id, "reason": (
                        f"its worker {peer.name!r} {why}; the kernel and its state are lost. Restart the kernel "
                        "once a worker is back")})
        else:
            running = set()
            for job in self.fleet.jobs_of_client(peer.identity):
                if job.worker is None:  # not started: it never will
                    self._cancel(job, "the notebook that submitted it went away")
                    continue
                worker = self.fleet.peers.get(job.worker)  # it runs on, for a notebook with this token to collect
                running.add(job.worker)
                self.detached.detach(DetachedJob(job.id, peer.key, job.summary, worker.name if worker else "?",
                                                 job.journal))
                log.info("job %s runs on without its notebook; a notebook with the same token may collect it", job.id)
            self._detach_unacknowledged_ends(peer.identity)  # ended, the client never heard
            for worker in self.fleet.workers():  # its interpreter state there goes with it, once its jobs end
                if worker.identity not in running:
                    self._send(worker.identity, T.SESSION_END, {"session": session_id(peer.identity),
                                                                "reason": why})
            for route in self.kernels.of_client(peer.identity):  # nobody can reach these kernels any more
                self.kernels.remove(route.id)
                self._send(route.worker, T.KERNEL_STOP, {"kernel": route.id, "how": "orphaned",
                                                         "reason": f"the client that started it {why}"})
        self._dispatch()

    def _worker_names(self) -> str:
        return ", ".join(sorted(w.name for w in self.fleet.workers())) or "none connected"

    def _drop_stale_keys(self) -> None:
        # After rotation libzmq keeps established sessions; forget peers so they must HELLO
        # again, which fails the new ZAP check on their next reconnect.
        for peer in list(self.fleet.peers.values()):
            if peer.local:
                continue
            self._send(peer.identity, T.ERROR, error_header(
                CredentialsRotated(f"the hub's keys were rotated: {new_token_advice(peer.role)}")))
            self._forget(peer, "holds rotated-out credentials")


def new_token_advice(role: Role) -> str:
    """What a peer holding rotated-out credentials does next, by its role."""
    if role is Role.WORKER:
        return ("get the new worker token with `remote-worker token --worker` on the hub's machine and "
                "start this worker again with it")
    return "get the new token with `remote-worker token` on the hub's machine and connect again"


def _job_id(msg: Message) -> str | None:
    job = msg.header.get("job")
    return job if isinstance(job, str) else None
