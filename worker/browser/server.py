"""The page a browser tab opens to become a GPU worker, and the WebSocket it joins through.

:class:`TabServer` runs aiohttp on a thread of its own. The link it prints carries a secret in
its fragment (``#…``), which a browser never puts in a request, so it reaches no log; the tab
proves it in its first WebSocket message. A tab that proves it joins: ``on_join`` makes it a
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

from .bridge import TabBridge
from .messages import MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 10.0
"""How long a new WebSocket has to prove the secret."""
SILENCE_S = 5.0
"""A tab that owes an answer and says nothing for this long has stopped answering (it says it is alive
every second)."""
WATCH_INTERVAL_S = 0.5
MAX_NAME = 40

# Close codes the page reads: 44xx means "refused, don't retry".
REFUSED_SECRET = 4401
REFUSED_MESSAGE = 4400
BACKGROUND = 4000
"""The page closes with this code when it goes to the background..."""
CLOSED = 4001
"""...and with this one when it is closed or reloaded."""

_NAME = re.compile(r"[^A-Za-z0-9._-]+")


class TabServer:
    """Serves the page and the tabs' WebSocket on ``host:port`` (0: any free port).

    ``on_join(bridge)`` runs (on a helper thread) for each tab that joins and returns what
    ``on_leave(bridge, joined)`` gets when the tab is gone. ``tls`` serves HTTPS instead of HTTP.
    """

    def __init__(self, host: str, port: int, on_join: Callable[[TabBridge], Any],
                 on_leave: Callable[[TabBridge, Any], None], *, tls: ssl.SSLContext | None = None,
                 silence_s: float = SILENCE_S) -> None:
        self.host = host
        self.port = port
        self.secret = secrets.token_urlsafe(24)
        self.tls = tls
        self.silence_s = silence_s
        self._folder = tempfile.TemporaryDirectory(prefix="remote-magic-tabs-")  # the bridges' sockets, ours only
        self._on_join = on_join
        self._on_leave = on_leave
        self.tabs: dict[str, TabBridge] = {}
        self._loop = asyncio.new_event_loop()
        self._context = zmq.asyncio.Context()
        self._runner: web.AppRunner | None = None
        self._joins = ThreadPoolExecutor(thread_name_prefix="browser-tab-join")  # a worker starts in seconds
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
        app = web.Application()
        app.router.add_get("/", _page_file("index.html", "text/html"))
        app.router.add_get("/tab.js", _page_file("tab.js", "text/javascript"))
        app.router.add_get("/favicon.ico", _page_file("", ""))
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
    async def _tab_socket(self, request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse(max_msg_size=MAX_MESSAGE_BYTES + 16)
        await socket.prepare(request)
        try:
            hello = await self._hello(socket)
        except ProtocolError as exc:
            log.warning("a browser tab from %s was refused: %s", request.remote, exc)
            code = REFUSED_SECRET if "secret" in str(exc) else REFUSED_MESSAGE
            await socket.close(code=code, message=str(exc).encode()[:120])
            return socket
        bridge = TabBridge(self._name(hello), Path(self._folder.name), self._context, socket.send_bytes)
        self.tabs[bridge.name] = bridge
        log.warning("browser tab %r joined from %s", bridge.name, request.remote)
        await socket.send_str(json.dumps({"type": "welcome", "name": bridge.name, "joined": False}))
        bridge.start()  # answers the tab's executors until the tab's worker has left, the tab gone or not
        watch = asyncio.ensure_future(self._watch(bridge, socket))
        joined = self._joins.submit(self._on_join, bridge)
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
        try:
            hello = json.loads(message.data)
        except ValueError:
            raise ProtocolError("the hello is not JSON") from None
        if not isinstance(hello, dict) or hello.get("type") != "hello":
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
                kind = _control(message.data)
                if kind == "alive":
                    bridge.heard()
                elif kind == "lost":
                    log.warning("%s lost a GPU device: %s", tab, message.data[:200])
                else:
                    await socket.close(code=REFUSED_MESSAGE, message=b"malformed message")
                    return f"{tab} sent a malformed message and was disconnected"
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

    async def _watch(self, bridge: TabBridge, socket: web.WebSocketResponse) -> None:
        """Fail the tab's work when it owes an answer and has said nothing for ``silence_s``."""
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)  # a watchdog's period, not synchronisation
            if bridge.waiting and time.monotonic() - bridge.last_heard > self.silence_s:
                bridge.fail(f"the browser tab {bridge.name!r} stopped answering (nothing for "
                            f"{self.silence_s:g} s)")
                await socket.close(code=WSCloseCode.GOING_AWAY, message=b"stopped answering")
                return

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


def _page_file(name: str, content_type: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """A handler that serves ``page/NAME`` (none: an empty answer)."""
    text = (resources.files(__package__) / "page" / name).read_text() if name else ""

    async def handler(_: web.Request) -> web.StreamResponse:
        return web.Response(text=text, content_type=content_type) if name else web.Response(status=204)

    return handler


def _control(text: str) -> str:
    try:
        message = json.loads(text)
    except ValueError:
        return ""
    return str(message.get("type", "")) if isinstance(message, dict) else ""


def _link_host(host: str) -> str:
    return gethostname() if host in ("0.0.0.0", "") else host
