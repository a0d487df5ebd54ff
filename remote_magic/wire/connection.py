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
import threading
import time
from typing import Any, Callable, Sequence

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
from .chunks import Inbox, OnProgress, Outbox, ack
from .failures import is_error
from .protocol import (
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

_LINK_EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
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
    sock.reconnect_ivl_max = 2000  # capped backoff while the hub or tunnel is away
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
    ``on_lost(reason)`` runs when the hub has been silent for ``HEARTBEAT_LIVENESS`` intervals with
    the connection down (libzmq's heartbeats, which need no GIL, keep it up while the hub's process
    runs), or for ``HEARTBEAT_STALL_LIVENESS`` intervals with it up; the socket keeps reconnecting
    and says HELLO again when the hub asks for it.
    ``watch`` adds another socket to the I/O thread's poll loop (a worker's executor link), and
    ``on_tick()`` runs after every poll, returning how many seconds the next poll may wait.
    """

    def __init__(self, context: zmq.Context[Any], sock: zmq.Socket[Any], welcome: Message, hello: dict[str, Any],
                 on_message: Callable[[Message], None], on_lost: Callable[[str], None],
                 heartbeat_header: Callable[[], dict[str, Any]] | None = None,
                 watch: dict[zmq.Socket[Any], Callable[[list[zmq.Frame]], None]] | None = None,
                 on_tick: Callable[[], float] | None = None, name: str = "remote-magic-io",
                 on_progress: OnProgress | None = None) -> None:
        self._context = context
        self._sock = sock
        self._hello = hello
        self._on_message = on_message
        self._on_lost = on_lost
        self._heartbeat_header = heartbeat_header or dict
        self._watched = dict(watch or {})
        self._on_tick = on_tick
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
        self.reconnects = 0  # how often the connection came back after it broke (what was in flight is gone)
        self._endpoint = f"inproc://remote-magic-outbox-{id(self)}"
        self._outbox_in = context.socket(zmq.PULL)
        self._outbox_in.bind(self._endpoint)
        self._outbox = context.socket(zmq.PUSH)
        self._outbox.linger = 0
        self._outbox.connect(self._endpoint)
        self._send_lock = threading.Lock()
        # What goes to the hub, in order: large messages in paced chunks, and what the socket's queue had
        # no room for yet. While any of it waits, the inproc outbox isn't read, so it fills and send()
        # blocks: backpressure to the caller instead of loss.
        inproc = sock.getsockopt_string(zmq.LAST_ENDPOINT).startswith("inproc://")
        self._queue = Outbox(self._try_send, chunked=not inproc, on_progress=on_progress)
        self._inbox = Inbox(on_progress=on_progress)
        self._closing = False
        self._last_hello = 0.0
        self._forgotten = False  # the hub said it doesn't know us, and hasn't welcomed us back yet
        self._link_events = sock.get_monitor_socket(_LINK_EVENTS, f"inproc://remote-magic-link-{id(self)}")
        self._link_up = True  # libzmq's view of the connection: dial() just completed its handshake
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)

    def start(self) -> "Connection":
        """Start the I/O thread; callbacks may run from now on, so keep a reference first."""
        self._thread.start()
        return self

    def send(self, msg_type: T, header: dict[str, Any] | None = None, buffers: Sequence[Any] = (),
             timeout: float | None = None) -> None:
        """Queue a message for the hub; safe from any thread.

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
            if not self.connected:  # it would wait unseen until the hub is back: say so now
                raise ConnectionFailed(f"{self.lost}, so nothing was sent. This connection keeps trying; "
                                       "run it again once the hub (or the tunnel in front of it) is back")
            if deadline is not None and not self._outbox.poll(max(0, deadline - time.monotonic()) * 1000,
                                                              zmq.POLLOUT):
                raise self._busy(timeout)
            self._outbox.send_multipart(encode(msg_type, header, buffers), copy=False)
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

    def close(self, timeout: float = 2.0) -> None:
        """Say goodbye, stop the I/O thread and close the socket; idempotent."""
        with self._send_lock:
            if self._closing:
                return
            self._outbox.send_multipart([b"close"])
            self._closing = True
        self._thread.join(timeout)
        self._outbox.close()

    def _serve(self) -> None:
        sock, outbox = self._sock, self._outbox_in
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(outbox, zmq.POLLIN)
        poller.register(self._link_events, zmq.POLLIN)
        for extra in self._watched:
            poller.register(extra, zmq.POLLIN)
        last_heard = last_sent = time.monotonic()
        wait_s = self.interval / 2
        waiting = (False, False)  # the queue waits for room in the socket; anything is queued (don't read the outbox)
        try:
            while True:
                if (self._queue.waiting_for_room, bool(self._queue)) != waiting:  # re-arm only on a change
                    waiting = (self._queue.waiting_for_room, bool(self._queue))
                    poller.modify(sock, zmq.POLLIN | (zmq.POLLOUT if waiting[0] else 0))
                    poller.modify(outbox, 0 if waiting[1] else zmq.POLLIN)
                ready = dict(poller.poll(int(wait_s * 1000)))
                now = time.monotonic()
                if self._link_events in ready:
                    event = recv_monitor_message(self._link_events)["event"]
                    self._link_up = event == zmq.EVENT_HANDSHAKE_SUCCEEDED
                    self.reconnects += self._link_up
                for extra, handler in self._watched.items():
                    if extra in ready:
                        self._guarded(handler, extra.recv_multipart(copy=False))
                if self._queue:  # room again, or time to send a chunk again
                    self._queue.pump()
                if ready.get(outbox, 0) & zmq.POLLIN:
                    frames = outbox.recv_multipart(copy=False)
                    if len(frames) == 1 and frames[0].bytes == b"close":
                        self._try_send(encode(T.BYE))
                        return
                    self._send(frames)
                    last_sent = now
                if ready.get(sock, 0) & zmq.POLLIN:
                    last_heard = now
                    if not self.connected:
                        self.connected = True
                        log.info("the hub answers again")
                    frames = sock.recv_multipart(copy=False)
                    self.received_bytes += nbytes(frames)
                    self._receive(frames)
                if now - last_sent >= self.interval and not self.refused:
                    self._try_send(encode(T.HEARTBEAT, self._heartbeat_header()))  # never behind queued data
                    last_sent = now
                silent = now - last_heard
                if self.connected and silent > self.expiry_s and (not self._link_up or silent > self.stall_s):
                    self.lost = (f"the hub stopped answering for {self.expiry_s:.0f} s" if not self._link_up else
                                 f"the hub said nothing for {self.stall_s:.0f} s though its connection is up")
                    self.connected = False
                    self._on_lost(self.lost)
                wait_s = min(self.interval / 2, self._on_tick()) if self._on_tick else self.interval / 2
        except Exception:  # the I/O thread must say why it died; everything waiting on it is failed
            log.exception("the connection's I/O thread failed")
            self.connected = False
            self.refused = "the connection's I/O thread failed (see the log): connect again"
            self._on_lost(self.refused)
        finally:
            outbox.close()
            sock.disable_monitor()
            self._link_events.close()
            sock.close()

    def _send(self, frames: list[Any]) -> None:
        """Send in order without ever blocking the I/O thread: what the link can't take now waits."""
        self._queue.put(frames)

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
            msg = decode(frames)
        except ProtocolError as exc:
            log.warning("dropped a malformed message from the hub: %s", exc)
            return
        if msg.type is T.HEARTBEAT:
            return
        if msg.type is T.CHUNK:
            self._take_chunk(msg)
            return
        if msg.type is T.CHUNK_ACK:
            self._queue.on_ack(msg.header)
            return
        if msg.type is T.BYE:  # the hub is stopping: what we wait for won't come. We reconnect when it's back
            self.connected = False
            self.lost = str(msg.header.get("reason") or "the hub shut down")
            self._on_lost(self.lost)
            return
        if msg.type is T.ERROR and is_error(msg.header, CredentialsRotated):
            self.connected = False
            self.refused = str(msg.header.get("message", "the hub's keys were rotated"))
            self._on_lost(self.refused)
            return
        if msg.type is T.ERROR and is_error(msg.header, NotConnected):
            if self.refused:
                return
            now = time.monotonic()
            if now - self._last_hello >= self.interval:  # one hello per interval, however many replies
                self._last_hello = now
                log.info("the hub doesn't know us (it restarted or timed us out); saying hello again")
                self._queue.clear()  # what waited was for the hub's memory of us, which is gone
                self._send(encode(T.HELLO, self._hello))
            if msg.header.get("job") is not None:
                self._guarded(self._on_message, msg)  # the job it refused ends with this error
            if not self._forgotten:  # whatever the hub held for us is gone with its memory of us
                self._forgotten = True
                self._on_lost("the hub forgot this connection (it restarted, or timed it out)")
            return
        if msg.type is T.WELCOME:
            self._forgotten = False
        self._guarded(self._on_message, msg)

    def _take_chunk(self, msg: Message) -> None:
        try:
            received, whole = self._inbox.add(msg)
        except ProtocolError as exc:
            log.warning("dropped a malformed chunk from the hub: %s", exc)
            return
        self._try_send(ack(msg, received))
        if whole is not None:
            self._receive(whole)
