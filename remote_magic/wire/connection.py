"""A peer's authenticated link to a hub: handshake, heartbeats and one I/O thread.

Clients and workers both dial the hub with a DEALER socket. ``dial`` does the CurveZMQ
handshake and the HELLO/WELCOME exchange in the calling thread, turning every way that can fail
into a ConnectionFailed that says what to check. ``Connection`` then owns the socket from its
I/O thread; other threads send through ``send`` (an inproc queue), and incoming messages go to
the ``on_message`` callback, called on the I/O thread.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Sequence, TypeVar

import zmq
from zmq.utils.monitor import recv_monitor_message

from ..errors import (
    Busy,
    ConnectionFailed,
    CredentialsRotated,
    NotConnected,
    ProtocolError,
    VersionMismatch,
)
from .chunks import OnProgress
from .failures import is_error
from .link import Link
from .protocol import (
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
from .serialization import nbytes
from .tokens import Token

log = logging.getLogger(__name__)

Result = TypeVar("Result")

RECONNECT_MAX_S = 0.2
"""The longest pause between two attempts to reach the hub again."""

CONNECT_ATTEMPT_S = 2.0
"""How long one attempt waits for the hub's TCP answer before a fresh one starts: within it the kernel sends
its SYN again after 1 s, so while the network is away a SYN leaves at least every 1.2 s, and the link is back
about that soon after it returns. Long enough for a round trip of up to 2 s."""

HUB_RESTART_GRACE_S = 3.0
"""After the hub said goodbye, how long a send waits for a hub on the same address to welcome this
connection back (one restarting: a worker started again on its port) before it says the hub is gone:
libzmq's longest reconnect interval (``reconnect_ivl_max``) and a hello's round trip."""

OUTBOX_MESSAGES = 100
"""Messages the caller's thread may queue for the I/O thread on each side of their pipe, beyond what the link's
socket holds (its 1,000): so a full link makes ``send`` wait (or raise Busy past ``send_timeout``) after about
1,200 messages, whatever their size."""

RECONNECT_ADVICE = ("This connection keeps trying: run it again once the hub (or the tunnel in front of it) "
                    "answers again.")

HUB_STOPPED_ADVICE = ("Start its remote-worker again, then run this again: on the same address this connection "
                      "finds it by itself; on another, connect with the token it prints (%offload_connect TOKEN, or "
                      "remote_magic.connect(TOKEN)).")

_LINK_EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                | zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED)
_MONITORED = (zmq.EVENT_CONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
              | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
              | zmq.EVENT_DISCONNECTED)


def _open_socket(context: zmq.Context[Any], token: Token) -> zmq.Socket[Any]:
    sock: zmq.Socket[Any] = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.routing_id = os.urandom(16)  # stable across reconnects, so the hub keeps our jobs
    sock.curve_serverkey = token.server_public
    sock.curve_publickey = token.public
    sock.curve_secretkey = token.secret
    sock.reconnect_ivl = 100
    sock.reconnect_ivl_max = int(RECONNECT_MAX_S * 1000)  # capped backoff while the hub or tunnel is away
    # Each attempt gives up on its SYN soon and a new one starts: the kernel's own SYN retries back off to
    # 16 s and more during an outage, so the link would come back that long after the network does.
    sock.connect_timeout = int(CONNECT_ATTEMPT_S * 1000)
    sock.heartbeat_ivl = int(LINK_PING_INTERVAL_S * 1000)  # ZMTP pings notice a dead TCP connection under NAT/tunnels
    sock.heartbeat_timeout = int(LINK_PING_INTERVAL_S * HEARTBEAT_LIVENESS * 1000)
    sock.rcvhwm = 0  # never stop reading: libzmq aborts when a heartbeat times out on a connection it stopped
    # reading for a full queue (zeromq/libzmq#3937), as it would while the notebook holds the GIL
    return sock


def _explain_failure(token: Token, timeout: float, events: set[int], refusal: Message | None) -> str:
    where = token.address
    if refusal is not None:
        return f"the hub at {where} refused us: {refusal.header.get('message', 'no reason given')}"
    if zmq.EVENT_HANDSHAKE_FAILED_AUTH in events:
        command = "remote-worker token --worker" if token.role is Role.WORKER else "remote-worker token"
        return (f"the hub at {where} refused these credentials: the token is wrong or its keys were "
                f"rotated. Get the current one with `{command}` on the hub's machine.")
    if zmq.EVENT_HANDSHAKE_SUCCEEDED in events:
        return (f"connected securely to {where}, but no answer to hello within {timeout:g} s: "
                "the hub may be overloaded or an older version")
    if zmq.EVENT_CONNECTED in events:
        return (f"something answers at {where}, but the secure handshake did not complete within "
                f"{timeout:g} s: the token doesn't match that hub (was it printed by another "
                "remote-worker, or by a run before `token --rotate`?), or the port belongs to something else")
    return (f"nothing answered at {where} within {timeout:g} s. Check that remote-worker is running "
            "there, that the address and port in the token are right (a tunnel's address changes when it "
            "restarts), and that no firewall blocks the port.")


def dial(context: zmq.Context[Any], token: Token, hello: dict[str, Any],
         timeout: float) -> tuple[zmq.Socket[Any], Message]:
    """Connect, authenticate and exchange HELLO/WELCOME; returns the socket and the WELCOME."""
    sock = _open_socket(context, token)
    monitor = sock.get_monitor_socket(_MONITORED)
    events: set[int] = set()
    refusal: Message | None = None
    try:
        sock.connect(token.address)
        sock.send_multipart(encode(T.HELLO, hello))
        deadline = time.monotonic() + timeout
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        while (remaining := deadline - time.monotonic()) > 0:
            ready = dict(poller.poll(int(remaining * 1000)))
            if monitor in ready:
                events.add(recv_monitor_message(monitor)["event"])
                if zmq.EVENT_HANDSHAKE_FAILED_AUTH in events:
                    break
            if sock in ready:
                try:
                    reply = decode(sock.recv_multipart())
                except ProtocolError as exc:
                    raise ConnectionFailed(f"the hub at {token.address} answered with something that "
                                           f"isn't remote-magic's protocol: {exc}") from None
                if reply.type is T.WELCOME:
                    return sock, reply
                if reply.type is T.ERROR:
                    refusal = reply
                    break
        message = _explain_failure(token, timeout, events, refusal)
        error = VersionMismatch if refusal and is_error(refusal.header, VersionMismatch) else ConnectionFailed
        raise error(message)
    except BaseException:
        sock.close()
        raise
    finally:
        if not sock.closed:
            sock.disable_monitor()
        monitor.close()


class Connection:
    """Owns a dialed socket from a background thread (once ``start``-ed); thread-safe ``send``.

    ``on_message(msg)`` runs on the I/O thread for every message except heartbeats.
    An outage begins when the hub has been silent for ``HEARTBEAT_LIVENESS`` intervals with the
    connection down (libzmq's heartbeats, which need no GIL, keep it up while the hub's process runs):
    ``on_outage(notice)`` says so, and says so again when the hub answers, while what was in flight
    waits to go again. ``on_lost(reason)`` runs when the outage outlasts ``outage_grace`` seconds (by
    default the hub's, from its WELCOME), or when the hub says nothing for ``HEARTBEAT_STALL_LIVENESS``
    intervals with the connection up; the socket keeps reconnecting and says HELLO again when the hub
    asks for it.
    ``watch`` adds another socket to the I/O thread's poll loop (a worker's executor link), and
    ``on_tick()`` runs after every poll, returning how many seconds the next poll may wait.
    ``on_reconnect()`` runs after the connection broke and came back, once what it had in flight is
    on its way again (wire/link.py): the place to say which jobs this peer holds (RESUME).
    ``on_forgotten(reason)`` (by default ``on_lost``) runs when the hub answers that it doesn't know this peer
    (it timed it out, or restarted): the connection says HELLO again, and the hub's WELCOME goes to
    ``on_message`` as usual.
    """

    def __init__(self, context: zmq.Context[Any], sock: zmq.Socket[Any], welcome: Message, hello: dict[str, Any],
                 on_message: Callable[[Message], None], on_lost: Callable[[str], None],
                 heartbeat_header: Callable[[], dict[str, Any]] | None = None,
                 watch: dict[zmq.Socket[Any], Callable[[list[zmq.Frame]], None]] | None = None,
                 on_tick: Callable[[], float] | None = None, name: str = "remote-magic-io",
                 on_progress: OnProgress | None = None, on_reconnect: Callable[[], None] | None = None,
                 on_outage: Callable[[str], None] | None = None, outage_grace: float | None = None,
                 on_forgotten: Callable[[str], None] | None = None) -> None:
        self._context = context
        self._sock = sock
        self._hello = hello
        self._on_message = on_message
        self._on_lost = on_lost
        self._on_forgotten = on_forgotten or on_lost
        self._heartbeat_header = heartbeat_header or dict
        self._watched = dict(watch or {})
        self._on_tick = on_tick
        self._on_reconnect = on_reconnect
        self._on_outage = on_outage or (lambda notice: log.warning("%s", notice))
        self.outage_grace = float(welcome.header.get("outage_grace", DEFAULT_OUTAGE_GRACE_S)
                                  if outage_grace is None else outage_grace)
        self._outage_since: float | None = None  # when the hub was last heard, while an outage lasts
        self.interval = float(welcome.header.get("heartbeat_interval", HEARTBEAT_INTERVAL_S))
        self.expiry_s = self.interval * HEARTBEAT_LIVENESS
        self.stall_s = self.interval * HEARTBEAT_STALL_LIVENESS
        self.connected = True
        self.lost = ""  # why the hub is out of reach, while it is
        self.refused: str | None = None  # set when this can't work again (keys rotated, I/O thread died)
        # Bytes of messages sent to and received from the hub (compressed, and values it held sent as
        # digests, as they crossed; without the encryption's and TCP's own few percent).
        self.sent_bytes = 0
        self.received_bytes = 0
        self.reconnects = 0  # how often the connection came back after it broke (what was in flight went again)
        self._endpoint = f"inproc://remote-magic-outbox-{id(self)}"
        self._outbox_in = context.socket(zmq.PULL)
        self._outbox_in.rcvhwm = OUTBOX_MESSAGES
        self._outbox_in.bind(self._endpoint)
        self._outbox = context.socket(zmq.PUSH)
        self._outbox.sndhwm = OUTBOX_MESSAGES
        self._outbox.linger = 0
        self._outbox.connect(self._endpoint)
        self._send_lock = threading.Lock()
        self._tickets = 0  # messages send() queued for the I/O thread
        self.taken = 0  # of those, how many the I/O thread has put on the link (in the same order)
        # What goes to the hub, in order and numbered: large messages in paced chunks, and what the socket's
        # queue had no room for yet. While any of it waits, the inproc outbox isn't read, so it fills and
        # send() blocks: backpressure to the caller instead of loss.
        inproc = sock.getsockopt_string(zmq.LAST_ENDPOINT).startswith("inproc://")
        self._link = Link(self._try_send, chunked=not inproc, on_progress=on_progress)
        self._link.far_side(welcome.header.get("versions") or {})
        # Calls other threads make on the I/O thread at once, even while queued data waits (an abort).
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._calls_endpoint = f"inproc://remote-magic-calls-{id(self)}"
        self._calls_in = context.socket(zmq.PULL)
        self._calls_in.bind(self._calls_endpoint)
        self._closing = False
        self._last_hello = 0.0
        self._forgotten = False  # the hub said it doesn't know us, and hasn't welcomed us back yet
        self._hub_stopped = False  # the hub said goodbye: one that answers on its address next is a new hub
        self._welcomed = threading.Event()  # set while the hub has welcomed us, cleared by its goodbye
        self._welcomed.set()  # dial() was welcomed
        self._link_events = sock.get_monitor_socket(_LINK_EVENTS, f"inproc://remote-magic-link-{id(self)}")
        self._link_up = True  # libzmq's view of the connection: dial() just completed its handshake
        self._refused_since: float | None = None  # since when the hub's address refuses connections
        self._gone = False  # it has refused them past the heartbeat bound: ``lost`` says what to do
        self._address = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)

    def _next_step(self) -> str:
        """What to do while the hub is out of reach, unless ``lost`` says it already (nothing listens there
        for a while: its remote-worker stopped, or moved)."""
        if self._gone:
            return ""
        return HUB_STOPPED_ADVICE if self._hub_stopped or self._refused_since is not None else RECONNECT_ADVICE

    def start(self) -> "Connection":
        """Start the I/O thread; callbacks may run from now on, so keep a reference first."""
        self._thread.start()
        return self

    def send(self, msg_type: T, header: dict[str, Any] | None = None, buffers: Sequence[Any] = (),
             timeout: float | None = None) -> int:
        """Queue a message for the hub; safe from any thread. Its ticket: once ``taken`` reaches it, the
        message is on the link, ahead of whatever the I/O thread sends from then on.

        Waits while the queue to the hub is full: forever, or at most ``timeout`` seconds, then
        raises Busy and sends nothing.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._send_lock.acquire(timeout=-1 if timeout is None else timeout):
            raise self._busy(timeout)
        try:
            if self._closing:
                raise ConnectionFailed("this connection is closed: connect again")
            if self.refused:
                raise ConnectionFailed(self.refused)
            if not self.connected and self._hub_stopped:  # a hub restarting on its address welcomes us back soon
                self._welcomed.wait(HUB_RESTART_GRACE_S)
            if not self.connected:  # it would wait unseen until the hub is back: say so now
                raise ConnectionFailed(f"{self.lost}, so nothing was sent. {self._next_step()}".rstrip())
            if self._forgotten:
                raise ConnectionFailed("the hub forgot this connection (it restarted, or timed it out) and hasn't "
                                       "welcomed it back yet, so nothing was sent: run it again in a moment")
            if deadline is not None and not self._outbox.poll(max(0, deadline - time.monotonic()) * 1000,
                                                              zmq.POLLOUT):
                raise self._busy(timeout)
            self._outbox.send_multipart(encode(msg_type, header, buffers), copy=False)
            self._tickets += 1
            return self._tickets
        finally:
            self._send_lock.release()

    @staticmethod
    def _busy(timeout: float | None) -> Busy:
        return Busy(f"the queue to the hub stayed full for {timeout:g} s (a slow link, or more jobs at once "
                    "than it carries), so this one was not sent: submit it again later, or wait longer "
                    "(send_timeout)")

    def send_now(self, frames: list[Any]) -> None:
        """Send already-encoded frames to the hub; only from the I/O thread (watch/tick callbacks)."""
        self._send(frames)

    def on_io_thread(self, call: Callable[[], Result]) -> "Future[Result]":
        """Run ``call`` on the I/O thread soon, even while data waits to be sent; its future."""
        future: Future[Result] = Future()
        self._calls.put((call, future))
        waker = self._context.socket(zmq.PUSH)
        waker.linger = 0
        try:
            waker.connect(self._calls_endpoint)
            waker.send(b"", zmq.NOBLOCK)
        except zmq.ZMQError:  # the I/O thread is gone
            future.set_exception(ConnectionFailed("this connection is closed: connect again"))
        finally:
            waker.close()
        return future

    def abort(self, job: str, timeout: float = 2.0) -> bool:
        """Send nothing more of ``job``'s messages that haven't wholly left (a Ctrl-C during an upload);
        True when some hadn't, so the hub never got all of them."""
        return self.on_io_thread(lambda: self._link.outbox.abort(job)).result(timeout)

    @property
    def hub_stopped(self) -> bool:
        """The hub said goodbye (it shut down) and hasn't welcomed this connection back since."""
        return self._hub_stopped

    @property
    def received(self) -> int:
        """How many of the hub's numbered messages arrived (in order) since the last welcome."""
        return self._link.expected - 1

    def close(self, timeout: float = 2.0) -> None:
        """Say goodbye, stop the I/O thread and close the socket; idempotent."""
        with self._send_lock:
            if self._closing:
                return
            self._outbox.send_multipart([b"close"])
            self._closing = True
        self._thread.join(timeout)
        self._outbox.close()
        self._calls_in.close()

    def _serve(self) -> None:
        sock, outbox = self._sock, self._outbox_in
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(outbox, zmq.POLLIN)
        poller.register(self._link_events, zmq.POLLIN)
        poller.register(self._calls_in, zmq.POLLIN)
        for extra in self._watched:
            poller.register(extra, zmq.POLLIN)
        last_heard = last_sent = time.monotonic()
        wait_s = self.interval / 2
        waiting = (False, False)  # the queue waits for room in the socket; anything is queued (don't read the outbox)
        link = self._link
        try:
            while True:
                if (link.outbox.waiting_for_room, bool(link.outbox)) != waiting:  # re-arm only on a change
                    waiting = (link.outbox.waiting_for_room, bool(link.outbox))
                    poller.modify(sock, zmq.POLLIN | (zmq.POLLOUT if waiting[0] else 0))
                    poller.modify(outbox, 0 if waiting[1] else zmq.POLLIN)
                ready = dict(poller.poll(int(wait_s * 1000)))
                now = time.monotonic()
                if self._link_events in ready:
                    event = recv_monitor_message(self._link_events)["event"]
                    if event == zmq.EVENT_CONNECT_RETRIED:  # the address refused the connection: nothing listens
                        self._refused_since = self._refused_since or now
                    elif event == zmq.EVENT_CONNECTED:
                        self._refused_since, self._gone = None, False
                    else:
                        self._link_up = event == zmq.EVENT_HANDSHAKE_SUCCEEDED
                        if self._link_up:
                            self._reconnected()
                if self._calls_in in ready:
                    self._calls_in.recv()
                    self._run_calls()
                for extra, handler in self._watched.items():
                    if extra in ready:
                        self._guarded(handler, extra.recv_multipart(copy=False))
                if link.outbox:  # room again
                    link.outbox.pump()
                if ready.get(outbox, 0) & zmq.POLLIN:
                    frames = outbox.recv_multipart(copy=False)
                    if len(frames) == 1 and frames[0].bytes == b"close":
                        link.tick(force=True)  # what arrived is acknowledged: nothing waits at the hub for us
                        self._try_send(encode(T.BYE))
                        return
                    self._send(frames)
                    self.taken += 1
                    last_sent = now
                if ready.get(sock, 0) & zmq.POLLIN:
                    last_heard = now
                    if not self.connected:
                        self.connected = True
                        log.info("the hub answers again")
                    if self._outage_since is not None:
                        self._on_outage(f"the link to the hub is back after {now - self._outage_since:.0f} s")
                        self._outage_since = None
                    frames = sock.recv_multipart(copy=False)
                    self.received_bytes += nbytes(frames)
                    self._receive(frames)
                # After a goodbye, nothing until a hub answers there (it would be sent to the new hub before
                # the hello, and come back refused): its handshake says hello (_reconnected).
                if now - last_sent >= self.interval and not self.refused and not self._hub_stopped:
                    self._try_send(encode(T.HEARTBEAT, self._heartbeat_header()))  # never behind queued data
                    last_sent = now
                silent = now - last_heard
                if self.connected and silent > self.expiry_s and (not self._link_up or silent > self.stall_s):
                    self.connected = False
                    if self._link_up:
                        self.lost = f"the hub said nothing for {self.stall_s:.0f} s though its connection is up"
                        self._on_lost(self.lost)
                    else:
                        self.lost = "the hub stopped answering"
                        self._outage_since = last_heard
                        self._on_outage(f"the link to the hub is down ({silent:.0f} s so far): waiting up to "
                                        f"{self.outage_grace:.0f} s for it to come back (outage_grace)")
                if self._outage_since is not None and now - self._outage_since > self.outage_grace:
                    self._outage_since = None
                    self.lost = f"the hub stayed out of reach for {self.outage_grace:.0f} s (outage_grace)"
                    self._on_lost(self.lost)
                if not self.connected and self._refused_since is not None and now - self._refused_since > self.expiry_s:
                    self._gone = True
                    self.lost = (f"nothing listens at {self._address} any more: its remote-worker (or the tunnel in "
                                 "front of it) stopped, or started again on another port or address (an ngrok "
                                 "address changes with each start). "
                                 "Once it runs, connect with the token it printed then (%offload_connect NEW_TOKEN, "
                                 "or remote_magic.connect(NEW_TOKEN)); this connection keeps trying the old address")
                wait_s = min(self.interval / 2, self._on_tick()) if self._on_tick else self.interval / 2
                if (ack_in := link.tick()) is not None:
                    wait_s = min(wait_s, ack_in)
        except Exception:  # the I/O thread must say why it died; everything waiting on it is failed
            log.exception("the connection's I/O thread failed")
            self.connected = False
            self.refused = "the connection's I/O thread failed (see the log): connect again"
            self._on_lost(self.refused)
        finally:
            self._run_calls()  # nothing waits forever on a call the loop won't run
            outbox.close()
            sock.disable_monitor()
            self._link_events.close()
            sock.close()

    def _reconnected(self) -> None:
        """The connection broke and came back: what it had in flight both ways goes again. After the hub
        said goodbye it is a new hub there, which knows nothing of us: say hello at once."""
        self.reconnects += 1
        if self._hub_stopped:
            log.info("a hub answers where the one that said goodbye was; saying hello")
            self._last_hello = time.monotonic()
            self._link.restart_sending()
            self._send(encode(T.HELLO, self._hello))
            return
        log.info("the connection to the hub came back; sending again what it had in flight")
        self._link.reconnected()
        on_reconnect = self._on_reconnect
        if on_reconnect is not None and not self._forgotten:
            self._guarded(lambda _: on_reconnect(), None)

    def _run_calls(self) -> None:
        while True:
            try:
                call, future = self._calls.get_nowait()
            except queue.Empty:
                return
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(call())
                except Exception as exc:  # the caller's to see
                    future.set_exception(exc)

    def _send(self, frames: list[Any]) -> None:
        """Send in order without ever blocking the I/O thread: what the link can't take now waits."""
        self._link.put(frames)

    def _try_send(self, frames: list[Any]) -> bool:
        try:
            self._sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:  # the queue to the hub is full (a slow link, or the hub is away)
            return False
        self.sent_bytes += nbytes(frames)
        return True

    def _guarded(self, handler: Callable[[Any], None], argument: Any) -> None:
        try:
            handler(argument)
        except Exception:  # one bad message must not end the connection: log it whole
            log.exception("failed to handle a message; dropped it")

    def _receive(self, frames: Sequence[Any]) -> None:
        try:
            taken = self._link.receive(decode(frames))
        except ProtocolError as exc:
            log.warning("dropped a malformed message from the hub: %s", exc)
            return
        if taken is None or taken.type is T.HEARTBEAT:
            return
        msg = taken
        if msg.type is T.ERROR and isinstance(job := msg.header.get("job"), str):
            self._link.outbox.abort(job)  # the hub ended the job: what is still to go for it can't matter
        if msg.type is T.BYE:  # the hub is stopping: what we wait for won't come. We reconnect when it's back
            self.connected = False
            self._hub_stopped = True
            self._welcomed.clear()
            self.lost = str(msg.header.get("reason") or "the hub shut down")
            self._on_lost(self.lost)
            return
        if msg.type is T.ERROR and is_error(msg.header, CredentialsRotated):
            self.connected = False
            self.refused = str(msg.header.get("message", "the hub's keys were rotated"))
            self._on_lost(self.refused)
            return
        if msg.type is T.ERROR and is_error(msg.header, NotConnected):
            if self.refused or self._hub_stopped:  # after a goodbye our hello is on its way already
                return
            now = time.monotonic()
            # One hello per interval, however many replies: a reply to what we sent before our hello
            # comes before the welcome.
            if not self._forgotten or now - self._last_hello >= self.interval:
                self._last_hello = now
                log.info("the hub doesn't know us (it restarted or timed us out); saying hello again")
                self._link.restart_sending()  # what waited was for the hub's memory of us, which is gone
                self._send(encode(T.HELLO, self._hello))
            if not self._forgotten:  # whatever the hub held for us is gone with its memory of us
                self._forgotten = True
                self._on_forgotten("the hub forgot this connection (it restarted, or timed it out)")
            if msg.header.get("job") is not None:
                self._guarded(self._on_message, msg)  # the job it refused ends with this error
            return
        if msg.type is T.WELCOME:
            self._forgotten = self._hub_stopped = False
            self._link.restart_receiving()
            self._link.far_side(msg.header.get("versions") or {})
            self._welcomed.set()
        self._guarded(self._on_message, msg)
