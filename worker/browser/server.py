"""The page a browser tab opens to become a GPU worker, and the WebSocket it joins through.

:class:`TabServer` runs aiohttp on a thread of its own. The link it prints carries a secret in
its fragment (``#…``), which a browser never puts in a request, so it reaches no log; the tab
proves it on a WebSocket of its own (``/hello``, one small message), whose one-time ticket opens the
WebSocket its work goes over (``/ws``): docs/tab-protocol.md. A tab that proves it joins: ``on_join`` makes it a
worker (in ``cli``), and ``on_leave`` takes that worker out once the tab is gone.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import secrets
import ssl
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from importlib import resources
from pathlib import Path
from socket import gethostname
from typing import Any, Awaitable, Callable

import zmq.asyncio
from aiohttp import WSCloseCode, WSMsgType, web

from remote_magic.errors import ProtocolError, RemoteMagicError
from remote_magic.wire.throttle import WarningThrottle

from ..tab_protocol import (
    BACKGROUND,
    CLOSED,
    MAX_MESSAGE_BYTES,
    REFUSED_MESSAGE,
    REFUSED_SECRET,
    TOO_MANY_TABS,
    check_control,
)
from .bridge import TabBridge

log = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 10.0
"""How long a new WebSocket has to prove the secret."""
SILENCE_S = 5.0
"""A tab that owes an answer and says nothing for this long has stopped answering (it says it is alive
every second)."""
STALL_S = 20.0
"""A tab that owes an answer and says it is alive, but has run no call of its batches for this long, is stuck."""
COMPILE_STALL_S = 180.0
"""... or for this long while it says it is compiling a kernel: a phone's GPU driver may take a minute for one."""
WATCH_INTERVAL_S = 0.5
MAX_NAME = 40
MAX_TABS = 16
"""How many tabs a worker serves at once (each is a worker with its executors): one more is refused."""
MAX_UNPROVEN = 4
"""How many WebSockets may be proving the secret at once; more wait."""
MAX_HELLO_BYTES = 64 * 1024
"""The secret is proven on a socket of its own (``/hello``) that takes no larger message: what a stranger
can make the server read."""
TICKET_S = 30.0
"""How long the one-time ticket a proven hello gets opens the work's socket (``/ws?ticket=…``)."""
MAX_TICKETS = 64
WRONG_SECRET_DELAY_S = 1.0
"""A wrong secret is answered this long after it came, while the next stranger waits: guessing is slow."""

_NAME = re.compile(r"[^A-Za-z0-9._-]+")


class TabServer:
    """Serves the page and the tabs' WebSocket on ``host:port`` (0: any free port).

    ``on_join(bridge)`` runs (on a helper thread) for each tab that joins and returns what
    ``on_leave(bridge, joined)`` gets when the tab is gone. ``job_of(joined)``, if given, is the id of the job
    the tab's worker is running (None while idle): the tab is told when it changes, so its page can say what it
    is doing. ``tls`` serves HTTPS instead of HTTP. A tab that owes an answer is failed after ``silence_s``
    without a word, or ``stall_s`` without progress.
    """

    def __init__(self, host: str, port: int, on_join: Callable[[TabBridge], Any],
                 on_leave: Callable[[TabBridge, Any], None], *, tls: ssl.SSLContext | None = None,
                 job_of: Callable[[Any], str | None] | None = None,
                 silence_s: float = SILENCE_S, stall_s: float = STALL_S,
                 compile_stall_s: float = COMPILE_STALL_S) -> None:
        self.host = host
        self.port = port
        self.secret = secrets.token_urlsafe(24)
        self.tls = tls
        self.silence_s = silence_s
        self.stall_s = stall_s
        self.compile_stall_s = compile_stall_s
        self._folder = tempfile.TemporaryDirectory(prefix="remote-magic-tabs-")  # the bridges' sockets, ours only
        self._on_join = on_join
        self._on_leave = on_leave
        self._job_of = job_of
        self.tabs: dict[str, TabBridge] = {}
        self._loop = asyncio.new_event_loop()
        self._context = zmq.asyncio.Context()
        self._runner: web.AppRunner | None = None
        self._joins = ThreadPoolExecutor(thread_name_prefix="browser-tab-join")  # a worker starts in seconds
        self._unproven = asyncio.Semaphore(MAX_UNPROVEN)
        self._tickets: dict[str, tuple[dict[str, Any], float]] = {}  # ticket -> its hello, and until when
        self._refusals = WarningThrottle(log)
        self._thread = threading.Thread(target=self._loop.run_forever, name="browser-tabs", daemon=True)
        self.public_url: str | None = None
        """Set when the page is reached through a tunnel (``--ngrok``): the link uses it."""

    @property
    def link(self) -> str:
        """The link to open: the page's address with the secret in its fragment."""
        base = self.public_url or f"{'https' if self.tls else 'http'}://{_link_host(self.host)}:{self.port}"
        return f"{base.rstrip('/')}/#{self.secret}"

    def start(self) -> None:
        """Listen; raises :class:`RemoteMagicError` naming the address if it can't."""
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._start(), self._loop).result()
        except OSError as exc:
            self.close()
            raise RemoteMagicError(f"can't serve the browser page on {self.host}:{self.port}: {exc.strerror}; "
                                   "choose another --browser HOST:PORT") from None

    async def _start(self) -> None:
        self._loop.set_exception_handler(self._on_loop_error)
        app = web.Application()
        app.router.add_get("/", _page_file("index.html", "text/html"))
        app.router.add_get("/tab.js", _page_file("tab.js", "text/javascript"))
        app.router.add_get("/favicon.ico", _page_file("", ""))
        app.router.add_get("/hello", self._door)
        app.router.add_get("/ws", self._tab_socket)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port, ssl_context=self.tls).start()
        self.port = self._runner.addresses[0][1]  # the one chosen, for port 0

    def close(self) -> None:
        """Stop serving; joined tabs leave."""
        if self._loop.is_running():
            if self._runner is not None:
                asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        self._joins.shutdown(wait=False)
        self._context.destroy(linger=0)
        self._folder.cleanup()

    # -- one tab ---------------------------------------------------------------------------
    async def _door(self, request: web.Request) -> web.WebSocketResponse:
        """Where a tab proves the secret, on a socket that takes one small message: a proven hello gets a
        one-time ticket to open the work's socket with."""
        socket = web.WebSocketResponse(max_msg_size=MAX_HELLO_BYTES)
        await socket.prepare(request)
        async with self._unproven:  # strangers one handful at a time, wrong secrets slowly
            try:
                hello = await self._hello(socket)
            except ProtocolError as exc:
                self._refusals.warning("refused", "a browser tab from %s was refused: %s",
                                       request.remote, exc)
                wrong_secret = "secret" in str(exc)
                if wrong_secret:
                    await asyncio.sleep(WRONG_SECRET_DELAY_S)  # the delay itself: what slows a guesser
                await socket.close(code=REFUSED_SECRET if wrong_secret else REFUSED_MESSAGE,
                                   message=str(exc).encode()[:120])
                return socket
        now = time.monotonic()
        self._tickets = {ticket: held for ticket, held in self._tickets.items() if held[1] >= now}
        while len(self._tickets) >= MAX_TICKETS:  # the oldest unused one goes
            self._tickets.pop(next(iter(self._tickets)))
        ticket = secrets.token_urlsafe(18)
        self._tickets[ticket] = (hello, now + TICKET_S)
        await socket.send_str(json.dumps({"type": "ticket", "ticket": ticket}))
        await socket.close()
        return socket

    async def _tab_socket(self, request: web.Request) -> web.StreamResponse:
        hello, until = self._tickets.pop(request.query.get("ticket", ""), ({}, 0.0))
        if until < time.monotonic():  # nothing of a socket without a valid ticket is read
            return web.Response(status=403, text="prove the secret at /hello first: its ticket opens this socket")
        socket = web.WebSocketResponse(max_msg_size=MAX_MESSAGE_BYTES + 16)
        await socket.prepare(request)
        if len(self.tabs) >= MAX_TABS:
            await socket.close(code=TOO_MANY_TABS, message=f"this worker serves at most {MAX_TABS} tabs".encode())
            return socket
        news = _JobNews(socket, self._job_of)
        bridge = TabBridge(self._name(hello), Path(self._folder.name), self._context, news.send_batch)
        self.tabs[bridge.name] = bridge
        log.info("browser tab %r joined from %s", bridge.name, request.remote)
        await socket.send_str(json.dumps({"type": "welcome", "name": bridge.name, "joined": False}))
        bridge.start()  # answers the tab's executors until the tab's worker has left, the tab gone or not
        joined = news.worker = self._joins.submit(self._on_join, bridge)
        watch = asyncio.ensure_future(self._watch(bridge, socket, news))
        welcome = asyncio.ensure_future(self._welcome(socket, bridge, joined))
        reason = await self._serve(socket, bridge)
        bridge.fail(reason)
        watch.cancel()
        welcome.cancel()
        del self.tabs[bridge.name]
        threading.Thread(target=self._leave, args=(bridge, joined), daemon=True).start()
        return socket

    async def _hello(self, socket: web.WebSocketResponse) -> dict[str, Any]:
        try:
            message = await socket.receive(timeout=HELLO_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise ProtocolError(f"no hello within {HELLO_TIMEOUT_S:g} s") from None
        if message.type != WSMsgType.TEXT:
            raise ProtocolError("the first message must be the page's hello")
        hello = check_control(message.data)
        if hello["type"] != "hello":
            raise ProtocolError("the first message must be the page's hello")
        if not hmac.compare_digest(str(hello.get("secret", "")).encode(), self.secret.encode()):
            raise ProtocolError("wrong secret: open the whole link remote-worker printed, with the part after #")
        return hello

    def _name(self, hello: dict[str, Any]) -> str:
        adapter = hello["adapter"] if isinstance(hello.get("adapter"), dict) else {}
        wanted = str(hello.get("name") or "") or f"tab-{adapter.get('architecture') or adapter.get('vendor') or 'gpu'}"
        base = _NAME.sub("-", wanted).strip("-")[:MAX_NAME] or "tab"
        name, n = base, 1
        while name in self.tabs:
            n += 1
            name = f"{base}-{n}"
        return name

    async def _welcome(self, socket: web.WebSocketResponse, bridge: TabBridge, joined: Future[Any]) -> None:
        try:
            worker = await asyncio.shield(asyncio.wrap_future(joined))  # cancelled: the join goes on, for _leave
        except Exception as exc:
            why = f"the worker could not take it: {exc}"
            await socket.close(code=REFUSED_MESSAGE, message=why[:120].encode())
            return
        name = getattr(worker, "name", bridge.name)  # the hub renames a worker whose name is taken
        await socket.send_str(json.dumps({"type": "welcome", "name": name, "joined": True}))

    async def _serve(self, socket: web.WebSocketResponse, bridge: TabBridge) -> str:
        """Read the tab's messages until it goes; why it went."""
        tab = f"the browser tab {bridge.name!r}"
        async for message in socket:
            if message.type == WSMsgType.BINARY:
                try:
                    await bridge.on_answer(message.data)
                except ProtocolError as exc:
                    await socket.close(code=REFUSED_MESSAGE, message=b"malformed answer")
                    return f"{tab} sent a malformed answer ({exc}) and was disconnected"
            elif message.type == WSMsgType.TEXT:
                try:
                    control = check_control(message.data)
                except ProtocolError as exc:
                    await socket.close(code=REFUSED_MESSAGE, message=b"malformed message")
                    return f"{tab} sent a malformed message ({exc}) and was disconnected"
                if control["type"] == "alive":
                    bridge.heard(control.get("done"), compiling=bool(control.get("compiling")))
                elif control["type"] == "lost":
                    self._refusals.warning(bridge.name, "%s lost a GPU device: %s", tab, control.get("reason"))
                else:
                    await socket.close(code=REFUSED_MESSAGE, message=b"a second hello")
                    return f"{tab} said hello twice and was disconnected"
            elif message.type == WSMsgType.ERROR:
                return f"{tab} sent a message the worker refused ({socket.exception()})"
        if bridge.gone is not None:
            return bridge.gone
        if socket.close_code == BACKGROUND:
            return f"{tab} went to the background (a phone that locks its screen does this)"
        if socket.close_code in (CLOSED, WSCloseCode.GOING_AWAY):
            return f"{tab} was closed or reloaded"
        if socket.close_code == WSCloseCode.MESSAGE_TOO_BIG:
            return f"{tab} sent a message over {MAX_MESSAGE_BYTES:,} bytes and was disconnected"
        return f"{tab} disconnected (WebSocket close code {socket.close_code})"

    async def _watch(self, bridge: TabBridge, socket: web.WebSocketResponse, news: _JobNews) -> None:
        """Fail the tab's work when it owes an answer and has said nothing for ``silence_s``, or has said it
        is alive but run nothing for ``stall_s``: progress, not chatter, keeps a batch alive. Tell the tab
        when its worker's job ends."""
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)  # a watchdog's period, not synchronisation
            try:
                await news.tell()
            except ConnectionError:  # the tab is going: _serve says why
                return
            now = time.monotonic()
            if not bridge.waiting:
                continue
            if now - bridge.last_heard > self.silence_s:
                said, why = "stopped answering", f"stopped answering (nothing for {self.silence_s:g} s)"
            elif bridge.compiling and now - bridge.progressed_at > self.compile_stall_s:
                said = "is stuck"
                why = f"is stuck: it says it is alive, but has compiled one kernel for {self.compile_stall_s:g} s"
            elif not bridge.compiling and now - bridge.progressed_at > self.stall_s:
                said = "is stuck"
                why = f"is stuck: it says it is alive, but ran nothing of its work for {self.stall_s:g} s"
            else:
                continue
            bridge.fail(f"the browser tab {bridge.name!r} {why}")
            await socket.close(code=WSCloseCode.GOING_AWAY, message=said.encode())  # what the page shows
            return

    def _on_loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """What the server's loop couldn't handle (a failed accept when file descriptors run out): logged once
        a minute per kind, not once per attempt."""
        self._refusals.warning(str(context.get("message")), "the browser page's server: %s (%s)",
                               context.get("message"), context.get("exception"))

    def _leave(self, bridge: TabBridge, joined: Future[Any]) -> None:
        try:
            handle = joined.result(timeout=60)
        except Exception as exc:  # it never joined: nothing to take out
            log.warning("browser tab %r could not join: %s", bridge.name, exc)
            handle = None
        try:
            if handle is not None:
                self._on_leave(bridge, handle)
        finally:
            self._loop.call_soon_threadsafe(bridge.close)


class _JobNews:
    """Tells one tab the id of the job its worker runs (null: none) whenever that changes, for its page to say:
    before each batch the tab is sent, so a job's first batch comes after the news of it, and on the watchdog's
    beat, so the tab hears that a job ended. ``job_of`` maps the tab's worker (``worker``, once joined) to its
    job's id."""

    def __init__(self, socket: web.WebSocketResponse, job_of: Callable[[Any], str | None] | None) -> None:
        self._socket = socket
        self._job_of = job_of
        self.worker: Future[Any] | None = None
        self._told: str | None = None

    def running(self) -> str | None:
        """The id of the job the tab's worker is running; None while idle, not yet joined, or not known."""
        worker = self.worker
        if self._job_of is None or worker is None or not worker.done() or worker.exception() is not None:
            return None
        return self._job_of(worker.result())

    async def tell(self) -> None:
        """Send the tab the job's id if it changed since it was last told."""
        job = self.running()
        if job != self._told:
            self._told = job
            await self._socket.send_str(json.dumps({"type": "job", "id": job}))

    async def send_batch(self, data: bytes) -> None:
        """Send the tab a batch, after the news of the job it is for."""
        await self.tell()
        await self._socket.send_bytes(data)


def _page_file(name: str, content_type: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """A handler that serves ``page/NAME`` (none: an empty answer)."""
    text = (resources.files(__package__) / "page" / name).read_text() if name else ""

    async def handler(_: web.Request) -> web.StreamResponse:
        return web.Response(text=text, content_type=content_type) if name else web.Response(status=204)

    return handler


def _link_host(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):
        return gethostname()
    return f"[{host}]" if ":" in host else host
