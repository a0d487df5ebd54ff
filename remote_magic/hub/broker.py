"""The hub: one ROUTER socket where clients and workers meet.

Clients and workers both dial the hub's one TCP port (so one tunnel serves everyone),
authenticate with CurveZMQ, and say who they are in a HELLO. The hub queues jobs, hands each
to an idle worker, relays what the worker says back to the job's client, and watches
heartbeats: a worker that is gone fails its job with WorkerLost, a client that is gone has its
jobs cancelled and its session on every worker ended (SESSION_END). Gone means silent with its
connection down (libzmq's own heartbeats, which need no GIL, say whether it is up), or silent for
much longer with it up: a hung process.
The hub never unpickles anything; payload frames pass through untouched.

This module only routes: the socket loop, the peers (one record each, with its link: ``records.Peer``)
and the table that hands each message type to what acts on it. Jobs are ``scheduler``'s, their way
to their client and the jobs that outlive their notebook ``delivery``'s, whole Jupyter kernels
``jupyter_kernels``'s; who may connect is ``authenticator``'s.
"""

from __future__ import annotations

import errno
import logging
import math
import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Sequence

import zmq
from zmq.utils.monitor import recv_monitor_message

from ..errors import (
    CredentialsRotated,
    InvalidTransition,
    NotConnected,
    PermissionDenied,
    ProtocolError,
    VersionMismatch,
)
from ..wire import schema
from ..wire.chunks import HeldBytes
from ..wire.failures import error_header
from ..wire.frame_cache import DEFAULT_CACHE_BYTES
from ..wire.keys import HubKeys
from ..wire.link import ACK_EVERY_S, Link
from ..wire.protocol import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_OUTAGE_GRACE_S,
    HEARTBEAT_INTERVAL_S,
    HEARTBEAT_LIVENESS,
    HEARTBEAT_STALL_LIVENESS,
    LINK_PING_INTERVAL_S,
    Message,
    MessageType as T,
    Role,
    decode,
    encode,
)
from ..wire.sizes import human_size
from ..wire.throttle import WarningThrottle
from ..wire.versions import describe_differences, local_versions
from .authenticator import HubAuthenticator
from .delivery import JobDelivery
from .fleet import Fleet
from .jupyter_kernels import KernelRelay
from .records import Peer
from .scheduler import Scheduler

log = logging.getLogger(__name__)

_LOCAL_KEY = b"in-process"

MAX_HELD_BYTES = 1 << 30
"""How much may wait for one peer that isn't reading (a notebook busy holding the GIL while its job
prints, a peer reconnecting) before the hub takes it for gone; one larger message still waits alone."""

GOODBYE_LINGER_MS = 1000
"""At shutdown, how long the hub's socket may take to deliver its goodbyes."""

HELD_RETRY_MS = 10
"""While messages wait for a peer's queue to have room: how often the hub tries to send them."""

ROUTE_CHECKS_S = (0.0, 0.02, 0.1, 0.5, 2.0, 5.0)
"""After a connection closed, when the hub looks for peers left without a route. libzmq tells of the close before it
drops the route (that takes a few commands between its threads, slow on a busy machine), so it looks more than once."""

Handler = Callable[[Peer, Message, list[Any]], None]
"""Acts on one message from a peer: the peer, the message (whole, once, in order) and its frames."""

FROM_CLIENTS = frozenset({Role.CLIENT})
FROM_WORKERS = frozenset({Role.WORKER})
FROM_ANYONE = FROM_CLIENTS | FROM_WORKERS


@dataclass(frozen=True)
class Route:
    """How the hub takes one message type: who may send it, and the handler that acts on it (None for
    what the sender's link takes itself: chunks and acknowledgements, wire/link.py)."""

    senders: frozenset[Role]
    handler: Handler | None = None


ARRIVING_MESSAGES = 2
"""How many of the largest messages it takes (``max_message_bytes``) the hub holds part-received at once, all
peers together, and of each notebook's jobs waiting for a worker: what a peer holding a token can make it hold."""


class Hub:
    """A broker between clients and workers, served by a background thread.

    ``listen`` is a ZeroMQ TCP endpoint; port 0 picks a free port (see ``port`` after
    ``start``). ``keys`` decides who may connect and with which role. A worker in the same
    process dials ``local_endpoint`` on ``context`` instead: inproc, without copies or
    encryption, and trusted as a worker because only this process can reach it. ``jupyter_kernels``: whether
    clients may start whole Jupyter kernels on workers (``kernel_*`` messages, routed by ``jupyter_kernels``).
    ``outage_grace``: how long a peer whose connection went down keeps its record, jobs and session.
    """

    def __init__(self, keys: HubKeys, listen: str = "tcp://127.0.0.1:0", *,
                 heartbeat_interval: float = HEARTBEAT_INTERVAL_S, outage_grace: float = DEFAULT_OUTAGE_GRACE_S,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, cache_bytes: int = DEFAULT_CACHE_BYTES,
                 jupyter_kernels: bool = True) -> None:
        self.keys = keys
        self.cache_bytes = cache_bytes
        self.listen = listen
        self.heartbeat_interval = heartbeat_interval
        self.expiry_s = heartbeat_interval * HEARTBEAT_LIVENESS
        self.stall_s = heartbeat_interval * HEARTBEAT_STALL_LIVENESS
        self.outage_grace = max(outage_grace, self.expiry_s)
        self.max_message_bytes = max_message_bytes
        # Large messages still arriving, on every link together: a peer can make the hub hold this much at most.
        self.arriving = HeldBytes(ARRIVING_MESSAGES * max_message_bytes)
        self.port = 0  # the bound TCP port, once started
        self.context = zmq.Context()
        self.local_endpoint = f"inproc://remote-magic-hub-{id(self)}"
        self._auth: HubAuthenticator | None = None
        self._socket: zmq.Socket[Any] | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._assign_due = False  # a worker came back in reach: waiting jobs may go to it
        self._route_checks_due: list[float] = []  # when to look for peers whose connection closed (ROUTE_CHECKS_S)
        self._wake_endpoint = f"inproc://hub-wake-{id(self)}"
        # Keyed by credential (a handful), so an authenticated peer can't flood the log with garbage.
        self._peer_warnings = WarningThrottle(log)
        self.fleet = Fleet()  # every peer, by routing id, with its link: forgotten in one place, _forget
        self.delivery = JobDelivery(self.fleet, self)
        self.scheduler = Scheduler(self.fleet, self, self.delivery, self._peer_warnings, cache_bytes=cache_bytes,
                                   max_queued_bytes=ARRIVING_MESSAGES * max_message_bytes)
        self.jupyter_kernels = KernelRelay(self.fleet, self, allowed=jupyter_kernels)
        # What a peer may send once it said HELLO (which comes first, read by _on_hello), and what acts on it.
        self.routes: dict[T, Route] = {
            T.HEARTBEAT: Route(FROM_ANYONE, self.scheduler.on_heartbeat),
            T.BYE: Route(FROM_ANYONE, self._on_bye),
            T.RESUME: Route(FROM_ANYONE, self.scheduler.on_resume),
            T.CHUNK: Route(FROM_ANYONE),
            T.CHUNK_ACK: Route(FROM_ANYONE),
            T.LINK_ACK: Route(FROM_ANYONE),
            T.WORKERS: Route(FROM_CLIENTS, self._on_workers),
            T.SUBMIT: Route(FROM_CLIENTS, self.scheduler.on_submit),
            T.CANCEL: Route(FROM_CLIENTS, self.scheduler.on_cancel),
            T.JOBS: Route(FROM_CLIENTS, self.delivery.on_jobs),
            T.ATTACH: Route(FROM_CLIENTS, self.delivery.on_attach),
            T.STARTED: Route(FROM_WORKERS, self.scheduler.on_job_event),
            T.STREAM: Route(FROM_WORKERS, self.scheduler.on_job_event),
            T.DISPLAY: Route(FROM_WORKERS, self.scheduler.on_job_event),
            T.RESULT: Route(FROM_WORKERS, self.scheduler.on_job_event),
            T.ERROR: Route(FROM_WORKERS, self.scheduler.on_job_event),
            T.KERNEL_START: Route(FROM_CLIENTS, self.jupyter_kernels.on_start),
            T.KERNEL_SIGNAL: Route(FROM_CLIENTS, self.jupyter_kernels.to_worker),
            T.KERNEL_STOP: Route(FROM_CLIENTS, self.jupyter_kernels.to_worker),
            T.KERNEL_STARTED: Route(FROM_WORKERS, self.jupyter_kernels.to_client),
            T.KERNEL_DIED: Route(FROM_WORKERS, self.jupyter_kernels.to_client),
            T.KERNEL_FRAMES: Route(FROM_ANYONE, self.jupyter_kernels.on_frames),
        }

    def accepts(self, role: Role) -> frozenset[T]:
        """The message types a peer of this role may send once it said HELLO (HELLO aside)."""
        return frozenset(msg_type for msg_type, route in self.routes.items() if role in route.senders)

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
        sock.router_handover = True  # a peer that reconnects keeps its routing id
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
            raise OSError(f"can't listen on {self.listen}: {_why_not_bound(exc)}") from exc
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
        # libzmq says at once when a connection closes (a killed process, a reset), though not whose: see _disconnected
        disconnects = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(wake, zmq.POLLIN)
        poller.register(disconnects, zmq.POLLIN)
        next_tick = time.monotonic()
        try:
            while not self._stopping.is_set():
                timeout_ms = _ms_until(next_tick)
                if self._send_held():  # the socket can't say when a peer's queue has room again: look often
                    timeout_ms = min(timeout_ms, HELD_RETRY_MS)
                if (acks_due_ms := self._send_acks()) is not None:
                    timeout_ms = min(timeout_ms, acks_due_ms)
                if self._route_checks_due:
                    timeout_ms = min(timeout_ms, _ms_until(self._route_checks_due[0]))
                events = dict(poller.poll(timeout_ms))
                if wake in events:
                    command = wake.recv()
                    if command == b"drop-stale":
                        self._drop_stale_keys()
                if disconnects in events:
                    recv_monitor_message(disconnects)
                    closed_at = time.monotonic()
                    self._route_checks_due = [closed_at + delay for delay in ROUTE_CHECKS_S]
                if self._route_checks_due and time.monotonic() >= self._route_checks_due[0]:
                    self._route_checks_due = [due for due in self._route_checks_due if due > time.monotonic()]
                    self._disconnected()
                if sock in events:
                    for _ in range(1000):  # drain what is queued, but keep heartbeats on time
                        frames = sock.recv_multipart(copy=False)
                        try:
                            self._handle(frames)
                        except Exception:  # a bug must cost one message, not the hub: log it whole
                            log.exception("dropped a message the hub failed to handle")
                        if not int(sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                            break
                if self._assign_due:
                    self._assign_due = False
                    self.scheduler.assign()
                if time.monotonic() >= next_tick:
                    try:
                        self._tick()
                    except Exception:  # a bug must cost one tick, not the hub: log it whole
                        log.exception("the hub's periodic checks failed")
                    next_tick = time.monotonic() + self.heartbeat_interval / 2
            self._say_goodbye()
        finally:
            sock.disable_monitor()
            disconnects.close()
            wake.close()
            sock.close()

    def _say_goodbye(self) -> None:
        """Tell every peer the hub is stopping, so their jobs fail now, saying why, not at the heartbeat bound."""
        assert self._socket is not None
        for peer in list(self.fleet.peers.values()):
            self._try_send(peer.routing_id, encode(T.BYE, {"reason": "the hub shut down"}))
        self._socket.linger = GOODBYE_LINGER_MS

    # -- sending (sender.PeerSender) -------------------------------------------------------

    def send(self, routing_id: bytes, msg_type: T, header: dict[str, Any] | None = None,
             buffers: Sequence[Any] = ()) -> None:
        """Send one message to a peer, behind what waits for it."""
        self.send_frames(routing_id, encode(msg_type, header, buffers))

    def abandon(self, routing_id: bytes, job: str) -> bool:
        peer = self.fleet.peers.get(routing_id)
        return peer is not None and peer.link.outbox.abort(job)

    def unacknowledged_jobs(self, routing_id: bytes) -> set[str]:
        peer = self.fleet.peers.get(routing_id)
        return peer.link.outbox.jobs() if peer is not None else set()

    def acknowledged_seq(self, routing_id: bytes) -> int:
        peer = self.fleet.peers.get(routing_id)
        return peer.link.outbox.acked_seq if peer is not None else 0

    def send_frames(self, routing_id: bytes, frames: list[Any]) -> int | None:
        """Send without ever blocking the hub: what a peer can't take now waits for it, in order. The
        message's seq on the peer's link (None when it isn't numbered, or the routing id is no peer's)."""
        peer = self.fleet.peers.get(routing_id)
        if peer is None:  # not (or no longer) a peer: nothing to keep it for
            if not self._try_send(routing_id, frames):
                log.debug("dropped a message to %r, which is not reading and not a peer", routing_id)
            return None
        outbox = peer.link.outbox
        reading = not outbox.waiting_for_room
        seq = outbox.put(frames)
        if reading and outbox.waiting_for_room:
            log.info("%s %r is not reading what the hub sends, or is reconnecting; keeping its messages "
                     "until it reads", peer.role.value, peer.name)
        if len(outbox) > 1 and outbox.pending_bytes > MAX_HELD_BYTES:
            held = human_size(outbox.pending_bytes)
            log.warning("%s %r stopped reading while %s waited for it; dropping it and what waited",
                        peer.role.value, peer.name, held)
            self._forget(peer, f"stopped reading while {held} waited for it")
        return seq

    def _new_link(self, routing_id: bytes, local: bool) -> Link:
        """A peer's link (wire/link.py): what goes to it, in order and numbered, large messages in paced chunks,
        kept until it acknowledges them; and what it sends, taken once each, in order."""
        # In-process workers need no chunks: inproc carries no heartbeats to starve.
        return Link(partial(self._try_send, routing_id), chunked=not local, max_bytes=self.max_message_bytes,
                    held=self.arriving)

    def _send_acks(self) -> int | None:
        """Acknowledge what peers sent (wire/link.py); how many milliseconds until more acknowledgements are
        due, or None when no peer was owed one."""
        owed = [peer for peer in self.fleet.peers.values() if peer.owes_ack]
        if not owed:
            return None
        due_s = ACK_EVERY_S
        for peer in owed:
            wait = peer.link.tick()
            if wait is None:
                peer.owes_ack = False
            else:
                due_s = min(due_s, wait)
        return max(1, int(due_s * 1000))

    def _try_send(self, routing_id: bytes, frames: list[Any]) -> bool:
        """Send one message if the peer's queue has room; False if it has none (nothing was sent)."""
        assert self._socket is not None
        try:
            self._socket.send_multipart([routing_id, *frames], zmq.NOBLOCK, copy=False)
        except zmq.ZMQError:  # Again: its queue is full; EHOSTUNREACH: its connection is down for now
            return False
        peer = self.fleet.peers.get(routing_id)
        if peer is not None:
            peer.last_sent = time.monotonic()
        return True

    def _send_held(self) -> bool:
        """Send what waits for peers (they read again, or a chunk is due); True while any waits for room."""
        waiting = False
        for peer in list(self.fleet.peers.values()):
            outbox = peer.link.outbox
            if outbox:
                outbox.pump()
                waiting = waiting or outbox.waiting_for_room
        return waiting

    # -- receiving and the table of handlers --------------------------------------------------

    def _handle(self, frames: list[zmq.Frame]) -> None:
        routing_id = frames[0].bytes
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
        self._handle_message(routing_id, role, key, user_id, frames[1:])

    def _handle_message(self, routing_id: bytes, role: Role, key: str, user_id: str, frames: list[Any]) -> None:
        try:
            msg = decode(frames)
        except ProtocolError as exc:
            self._peer_warnings.warning(user_id, "malformed message from a %s: %s", role.value, exc)
            self.send(routing_id, T.ERROR, error_header(ProtocolError(str(exc))))
            return
        peer = self.fleet.peers.get(routing_id)
        if peer is not None:
            peer.last_seen = time.monotonic()
            if peer.out_of_reach:
                self._back_in_reach(peer)
        if msg.type is T.HELLO:
            try:
                schema.check(msg)  # as every message, before anything reads a field
            except ProtocolError as exc:
                self._peer_warnings.warning(user_id, "bad hello from a %s: %s", role.value, exc)
                self.send(routing_id, T.ERROR, error_header(exc))
                return
            self._on_hello(routing_id, role, key.encode(), msg)
            return
        if peer is None:
            job = _job_id(msg)  # a job sent to a hub that restarted: fail it now, don't leave it waiting
            self.send(routing_id, T.ERROR, error_header(NotConnected(
                "the hub forgot this connection (it restarted, or timed it out) and has no record of this job: "
                "if it ran before, its result is lost. Run it again" if job else
                "send hello first: this hub doesn't know you (it may have restarted)"), job))
            return
        route = self.routes.get(msg.type)
        if route is None or role not in route.senders:
            what = "a client token can't act as a worker" if role is Role.CLIENT else "a worker token can't submit jobs"
            self.send(routing_id, T.ERROR, error_header(
                PermissionDenied(f"{msg.type.value} is not allowed here: {what}"), msg.header.get("job")))
            return
        try:
            schema.check(msg)  # every field's type and range (wire/schema.py), before anything reads one
            taken = peer.link.receive(msg)  # chunks put together, acknowledgements, each numbered message once
            if peer.link.owes_ack:
                peer.owes_ack = True
            if taken is None:
                return
            if taken is not msg:  # it came in chunks: check what it is now
                schema.check(taken)
                route = self.routes.get(taken.type)
                if route is None or role not in route.senders:
                    raise ValueError(f"a chunked {taken.type.value} is not allowed here")
                frames = encode(taken.type, taken.header, taken.buffers)
            if route.handler is not None:
                route.handler(peer, taken, frames)
        except ProtocolError as exc:
            self._peer_warnings.warning(user_id, "bad %s from %s: %s", msg.type.value, peer.name, exc)
            self.send(routing_id, T.ERROR, error_header(exc, schema.job_of(msg.header)))  # not a 10 MB "job" echoed
        except (KeyError, TypeError, ValueError, OverflowError, InvalidTransition) as exc:
            self._peer_warnings.warning(user_id, "bad %s from %s: %s", msg.type.value, peer.name, exc)
            self.send(routing_id, T.ERROR, error_header(
                ProtocolError(f"bad {msg.type.value} message: {exc}"), _job_id(msg)))

    # -- the peers' own messages -----------------------------------------------------------

    def _on_hello(self, routing_id: bytes, role: Role, key: bytes, msg: Message) -> None:
        if key != _LOCAL_KEY and self.keys.role_of(key) is not role:
            self.send(routing_id, T.ERROR, error_header(
                PermissionDenied(f"these credentials were rotated out: {new_token_advice(role)}")))
            return
        claimed = msg.header.get("role")
        if claimed != role.value:
            self.send(routing_id, T.ERROR, error_header(
                PermissionDenied(f"this token is for a {role.value}, not a {claimed}")))
            return
        versions = msg.header.get("versions")
        ours = local_versions()
        if not isinstance(versions, dict) or versions.get("protocol") != ours["protocol"]:
            self.send(routing_id, T.ERROR, error_header(VersionMismatch(
                f"this hub speaks protocol {ours['protocol']} (remote-magic "
                f"{ours['remote_magic']}); install the same remote-magic version on both sides")))
            return
        old = self.fleet.peers.get(routing_id)
        name = str(msg.header.get("name") or routing_id.hex()[:8])[:64]
        if role is Role.WORKER:
            name = self.fleet.unique_name(name, routing_id)
        caps = msg.header.get("capabilities") if role is Role.WORKER else {}
        local = key == _LOCAL_KEY
        # A hello starts the link's numbering again both ways, as the WELCOME makes the peer expect: a new link.
        peer = Peer(routing_id, role, name, {k: str(v) for k, v in versions.items()},
                    caps if isinstance(caps, dict) else {}, local=local, key=key,
                    link=self._new_link(routing_id, local))
        peer.link.far_side(versions)
        if old is not None:  # a reconnect: keep what it was doing
            old.link.close()
            peer.job, peer.jobs_done, peer.usage, peer.cache = old.job, old.jobs_done, old.usage, old.cache
            # What it had not acknowledged won't reach it now: jobs that ended meanwhile wait for collection.
            self.delivery.detach_unacknowledged_ends(old)
        self.fleet.join(peer)
        log.info("%s %r joined (%s)", role.value, name, ", ".join(f"{k} {v}" for k, v in versions.items()))
        notes = describe_differences(ours, peer.versions, f"this {role.value}")
        if notes:
            log.info("version differences with %s %r: %s", role.value, name, "; ".join(notes))
        self.send(routing_id, T.WELCOME, {
            "name": name, "versions": ours, "heartbeat_interval": self.heartbeat_interval,
            "outage_grace": self.outage_grace,
            "max_message_bytes": self.max_message_bytes, "cache_bytes": self.cache_bytes if role is Role.CLIENT else 0,
            "workers": self.fleet.listing(),
        })
        self.scheduler.assign()

    def _on_bye(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        self._forget(peer, "shut down" if peer.role is Role.WORKER else "disconnected")

    def _on_workers(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        cache = peer.cache
        self.send(peer.routing_id, T.WORKERS, {
            "request": msg.header.get("request"), "workers": self.fleet.listing(),
            "cache": {"bytes": cache.bytes if cache else 0, "max_bytes": self.cache_bytes}})

    # -- liveness ----------------------------------------------------------------------------

    def _tick(self) -> None:
        now = time.monotonic()
        self.scheduler.check_timeouts(now)
        for peer in self.fleet.silent(now, self.expiry_s):
            if not peer.out_of_reach:
                peer.out_of_reach = True
                log.info("%s %r is out of reach: it said nothing for %.1f s", peer.role.value, peer.name,
                         now - peer.last_seen)
            if now - peer.last_seen > self.stall_s:
                self._forget(peer, f"said nothing for {self.stall_s:.0f} s though its connection is up (hung?)")
            elif now - peer.last_seen > self.outage_grace and not self._connected(peer):
                self._forget(peer, f"stopped answering for {self.outage_grace:.1f} s")
        for peer in list(self.fleet.peers.values()):
            if now - peer.last_sent >= self.heartbeat_interval:
                self._try_send(peer.routing_id, encode(T.HEARTBEAT))  # never behind what is queued for it
        for peer in self.fleet.peers.values():
            peer.link.drop_stalled(self.stall_s)
        self.delivery.forget_acknowledged_ends()
        self.delivery.expire()

    def _disconnected(self) -> None:
        """A connection closed: a peer it was is out of reach now, not at the liveness expiry, so no job is handed to a
        worker that is gone (its record, jobs and session wait for it as long as before)."""
        assert self._socket is not None
        self._socket.getsockopt(zmq.EVENTS)  # takes in libzmq's pending commands (a route's end) now, unthrottled
        for peer in self.fleet.peers.values():
            if not peer.local and not peer.out_of_reach and not self._connected(peer):
                peer.out_of_reach = True
                log.info("%s %r is out of reach: its connection closed", peer.role.value, peer.name)

    def _back_in_reach(self, peer: Peer) -> None:
        """A peer out of reach was heard again: jobs waiting for it (or any worker) may go to it now."""
        peer.out_of_reach = False
        log.info("%s %r is back in reach", peer.role.value, peer.name)
        if peer.role is Role.WORKER:
            self._assign_due = True  # once what came with it is handled (a BYE must not be handed a job first)

    def _connected(self, peer: Peer) -> bool:
        """Is the peer's connection up? The socket has no route to a peer once libzmq closed it."""
        assert self._socket is not None
        try:
            self._socket.send_multipart([peer.routing_id, *encode(T.HEARTBEAT)], zmq.NOBLOCK)
        except zmq.Again:
            return True  # connected, only not reading
        except zmq.ZMQError:  # EHOSTUNREACH
            return False
        return True

    def _forget(self, peer: Peer, why: str) -> None:
        """The one place a peer leaves: its record goes, with its link, cache and what it owed; its jobs,
        detached jobs and kernels follow (scheduler, delivery, jupyter_kernels)."""
        self.delivery.forget_acknowledged_ends()  # before its link goes: what it acknowledged last, it has
        self.fleet.forget(peer)
        log.info("%s %r left: %s", peer.role.value, peer.name, why)
        if peer.role is Role.WORKER:
            self.scheduler.worker_left(peer, why)
            self.jupyter_kernels.worker_left(peer, why)
        else:
            self.scheduler.client_left(peer, why)
            self.jupyter_kernels.client_left(peer, why)
        self.scheduler.assign()

    def _drop_stale_keys(self) -> None:
        # After rotation libzmq keeps established sessions; forget peers so they must HELLO
        # again, which fails the new ZAP check on their next reconnect.
        for peer in list(self.fleet.peers.values()):
            if peer.local:
                continue
            self.send(peer.routing_id, T.ERROR, error_header(
                CredentialsRotated(f"the hub's keys were rotated: {new_token_advice(peer.role)}")))
            self._forget(peer, "holds rotated-out credentials")


def _ms_until(when: float) -> int:
    """Milliseconds from now until a time.monotonic() moment, rounded up: not 0 until it is due."""
    return max(0, math.ceil((when - time.monotonic()) * 1000))


def new_token_advice(role: Role) -> str:
    """What a peer holding rotated-out credentials does next, by its role."""
    if role is Role.WORKER:
        return ("get the new worker token with `remote-worker token --worker` on the hub's machine and "
                "start this worker again with it")
    return "get the new token with `remote-worker token` on the hub's machine and connect again"


def _why_not_bound(exc: zmq.ZMQError) -> str:
    """Why the hub's port couldn't be bound, and what to do, by the cause."""
    if exc.errno == errno.EADDRINUSE:
        return "something listens on that port already (another remote-worker?): pick another port with --listen"
    if exc.errno == errno.EADDRNOTAVAIL:
        return ("that address is not one of this machine's: listen on one of its own (0.0.0.0 for all of them, "
                "127.0.0.1 for this machine only), and give peers another with --advertise")
    return f"{exc.strerror}; pick another address or port with --listen"


def _job_id(msg: Message) -> str | None:
    job = msg.header.get("job")
    return job if isinstance(job, str) else None
