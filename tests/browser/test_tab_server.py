"""The browser-tab server (worker/browser/server.py) at the protocol's level: a real TabServer on a free
port of 127.0.0.1, tabs that are raw WebSocket clients speaking docs/tab-protocol.md, and an executor that
is a real ZeroMQ socket on a tab's bridge. A joined tab here becomes no worker (``on_join`` only names it):
what is tested is the door, the cap on tabs, the watchdog and the log a misbehaving tab can cause.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, Iterator

import aiohttp
import pytest
import zmq
import zmq.asyncio

from remote_magic.worker import tab_protocol as tab
from remote_magic.worker.browser.bridge import SEQUENCE, TabBridge
from remote_magic.worker.browser.server import MAX_TABS, TabServer

STALL_S = 1.0
"""The watchdog's bound on a tab without progress, short for these tests (20 s in use)."""
COMPILE_STALL_S = 3.0
"""... and on a tab that says it is compiling a kernel (180 s in use)."""

SERVER_LOG = "remote_magic.worker.browser.server"


def joined_as(bridge: TabBridge) -> str:
    return bridge.name


def left(bridge: TabBridge, joined: str) -> None:
    """Nothing to take out: no worker was made."""


@pytest.fixture
def server() -> Iterator[TabServer]:
    made = TabServer("127.0.0.1", 0, joined_as, left, stall_s=STALL_S, compile_stall_s=COMPILE_STALL_S)
    made.start()
    yield made
    made.close()


def wait_until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)  # polling with a deadline


class Tabs:
    """Raw WebSocket tabs of ``server``: each proves the secret at /hello and opens /ws with its ticket."""

    def __init__(self, server: TabServer, session: aiohttp.ClientSession) -> None:
        self.base = f"ws://127.0.0.1:{server.port}"
        self.secret = server.secret
        self.session = session

    async def ticket(self, name: str) -> str:
        async with self.session.ws_connect(f"{self.base}/hello") as door:
            await door.send_str(json.dumps({"type": "hello", "secret": self.secret, "name": name}))
            answer = json.loads((await door.receive(timeout=20)).data)
            assert answer["type"] == "ticket", answer
            return str(answer["ticket"])

    async def open(self, name: str) -> aiohttp.ClientWebSocketResponse:
        """A tab with a ticket for ``name``: one that joins (read its :meth:`welcome`), or is closed at once."""
        socket = await self.session.ws_connect(f"{self.base}/ws?ticket={await self.ticket(name)}")
        return socket

    async def welcome(self, socket: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
        """The welcome that says the tab joined (the one before it, with its name only, read past)."""
        while True:
            message = await socket.receive(timeout=20)
            assert message.type == aiohttp.WSMsgType.TEXT, message
            welcome: dict[str, Any] = json.loads(message.data)
            assert welcome["type"] == "welcome", welcome
            if welcome["joined"]:
                return welcome


async def closing(socket: aiohttp.ClientWebSocketResponse) -> tuple[int | None, str]:
    """Read until the server closes ``socket`` (welcomes skipped): its close code and message."""
    while True:
        message = await socket.receive(timeout=20)
        if message.type == aiohttp.WSMsgType.CLOSE:
            return message.data, str(message.extra or "")
        assert message.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY), message


def test_a_tab_past_the_cap_is_refused_with_its_close_code_and_one_joins_once_another_left(
        server: TabServer) -> None:
    async def scenario() -> dict[str, Any]:
        async with aiohttp.ClientSession() as client:
            tabs = Tabs(server, client)
            sockets = [await tabs.open(f"tab{n}") for n in range(MAX_TABS)]
            names = [(await tabs.welcome(socket))["name"] for socket in sockets]
            one_more = await tabs.open("one-more")
            refused = await closing(one_more)
            await sockets[0].close(code=tab.CLOSED)
            await asyncio.to_thread(wait_until, lambda: len(server.tabs) < MAX_TABS, 10, "the closed tab to leave")
            again = await tabs.open("again")
            rejoined = (await tabs.welcome(again))["name"]
            for socket in [*sockets[1:], again]:
                await socket.close(code=tab.CLOSED)
            return {"names": names, "refused": refused, "rejoined": rejoined}

    seen = asyncio.run(scenario())
    assert seen["names"] == [f"tab{n}" for n in range(MAX_TABS)]
    assert seen["refused"] == (tab.TOO_MANY_TABS, f"this worker serves at most {MAX_TABS} tabs")
    assert seen["rejoined"] == "again"


async def _one_batch_owed(server: TabServer, tabs: Tabs, name: str, context: zmq.asyncio.Context
                          ) -> tuple[aiohttp.ClientWebSocketResponse, zmq.asyncio.Socket]:
    """A tab joined as ``name`` that has been sent one batch by an executor (the returned socket)."""
    socket = await tabs.open(name)
    await tabs.welcome(socket)
    executor = context.socket(zmq.DEALER)
    executor.linger = 0
    executor.connect(server.tabs[name].endpoint)
    await executor.send(tab.encode({"id": 7, "device": None, "calls": [["device", "d.1"]]}))
    batch = await socket.receive(timeout=20)
    assert batch.type == aiohttp.WSMsgType.BINARY, batch
    assert tab.decode(batch.data[SEQUENCE.size:])[0]["id"] == 7
    return socket, executor


async def _say_alive(socket: aiohttp.ClientWebSocketResponse, progress: bool, until: float,
                     compiling: bool = False) -> None:
    """What a tab says every so often (tab.js: every second) until ``until`` (monotonic) or its socket closes:
    that it is alive, with how many calls it has run (more each time with ``progress``), and whether it is
    compiling a kernel."""
    done = 0
    while time.monotonic() < until and not socket.closed:
        done += progress
        try:
            await socket.send_str(json.dumps({"type": "alive", "done": done, "compiling": compiling}))
        except ConnectionError:  # the server closed it while this was saying so (aiohttp's reset error is one)
            return
        await asyncio.sleep(0.2)  # the tab's own period, as tab.js's timer


@pytest.mark.parametrize("compiling, bound, doing", [
    (False, STALL_S, "ran nothing of its work"),
    # A phone's driver may take far longer to compile one kernel than 20 s without progress allows.
    (True, COMPILE_STALL_S, "has compiled one kernel"),
])
def test_a_tab_that_says_it_is_alive_but_makes_no_progress_is_closed_and_its_batch_fails_naming_it(
        server: TabServer, compiling: bool, bound: float, doing: str) -> None:
    name = "compiling" if compiling else "stuck"

    async def scenario() -> dict[str, Any]:
        context = zmq.asyncio.Context()
        try:
            async with aiohttp.ClientSession() as client:
                socket, executor = await _one_batch_owed(server, Tabs(server, client), name, context)
                owed_at = time.monotonic()
                chatter = asyncio.ensure_future(_say_alive(socket, False, owed_at + 30, compiling=compiling))
                reply = tab.decode(await asyncio.wait_for(executor.recv(), 20))[0]
                failed_after = time.monotonic() - owed_at
                closed = await closing(socket)
                await chatter
                executor.close()
                return {"reply": reply, "failed_after": failed_after, "closed": closed}
        finally:
            context.destroy(linger=0)

    seen = asyncio.run(scenario())
    assert seen["reply"] == {"error": {"message": f"the browser tab {name!r} is stuck: it says it is alive, but "
                                                  f"{doing} for {bound:g} s", "lost": True}}
    assert bound - 0.2 < seen["failed_after"] < bound + 3, seen["failed_after"]
    assert seen["closed"] == (aiohttp.WSCloseCode.GOING_AWAY, "is stuck")  # what the page shows
    wait_until(lambda: name not in server.tabs, 10, "the stuck tab to leave")


def test_a_tab_that_makes_progress_keeps_its_batch_alive_past_the_stall_bound(server: TabServer) -> None:
    async def scenario() -> dict[str, Any]:
        context = zmq.asyncio.Context()
        try:
            async with aiohttp.ClientSession() as client:
                socket, executor = await _one_batch_owed(server, Tabs(server, client), "busy", context)
                await _say_alive(socket, True, time.monotonic() + 3 * STALL_S)  # a long batch, running calls
                await socket.send_bytes(SEQUENCE.pack(1) + tab.encode({"id": 7, "ms": 3000.0}))
                reply = tab.decode(await asyncio.wait_for(executor.recv(), 20))[0]
                executor.close()
                await socket.close(code=tab.CLOSED)
                return reply
        finally:
            context.destroy(linger=0)

    assert asyncio.run(scenario()) == {"id": 7, "ms": 3000.0}


def test_a_tab_repeating_what_the_server_refuses_or_warns_of_writes_a_bounded_log(
        server: TabServer, caplog: pytest.LogCaptureFixture) -> None:
    """Before: every refused hello, and every ``lost`` a tab sent, was a line of the log (3,000 lost: 3,000 lines)."""
    refusals, losses = 40, 3000

    async def scenario() -> tuple[list[tuple[int | None, str]], tuple[int | None, str]]:
        async with aiohttp.ClientSession() as client:
            tabs = Tabs(server, client)
            refused = []
            for _ in range(refusals):
                async with client.ws_connect(f"{tabs.base}/hello") as door:
                    await door.send_str("not json")
                    refused.append(await closing(door))
            socket = await tabs.open("lossy")
            await tabs.welcome(socket)
            for n in range(losses):
                await socket.send_str(json.dumps({"type": "lost", "reason": f"destroyed {n}"}))
            await socket.send_str("not json")  # answered after every `lost` before it was read
            return refused, await closing(socket)

    with caplog.at_level(logging.WARNING, logger=SERVER_LOG):
        refused, last = asyncio.run(scenario())
    assert refused == [(tab.REFUSED_MESSAGE, "a control message that is not JSON")] * refusals
    assert last == (tab.REFUSED_MESSAGE, "malformed message")
    said = [record.getMessage() for record in caplog.records if record.name == SERVER_LOG]
    assert sum("was refused: a control message that is not JSON" in line for line in said) <= 5, said
    assert 1 <= sum("'lossy' lost a GPU device" in line for line in said) <= 5, said


def test_a_tab_hears_of_its_workers_job_before_the_jobs_first_batch_and_hears_when_it_ends() -> None:
    """What lets the page say what it is doing: a ``job`` message with the job's id ahead of its GPU work, and
    one with none once the worker is idle again."""
    jobs: dict[str, str | None] = {"running": None}
    server = TabServer("127.0.0.1", 0, joined_as, left, job_of=lambda _: jobs["running"])
    server.start()

    async def scenario() -> list[aiohttp.WSMessage]:
        context = zmq.asyncio.Context()
        try:
            async with aiohttp.ClientSession() as client:
                tabs = Tabs(server, client)
                socket = await tabs.open("phone")
                await tabs.welcome(socket)
                executor = context.socket(zmq.DEALER)
                executor.linger = 0
                executor.connect(server.tabs["phone"].endpoint)
                jobs["running"] = "job-1"
                await executor.send(tab.encode({"id": 7, "device": None, "calls": [["device", "d.1"]]}))
                heard = [await socket.receive(timeout=20), await socket.receive(timeout=20)]
                jobs["running"] = None
                heard.append(await socket.receive(timeout=20))
                executor.close()
                await socket.close(code=tab.CLOSED)
                return heard
        finally:
            context.destroy(linger=0)

    try:
        news, batch, idle = asyncio.run(scenario())
    finally:
        server.close()
    assert news.type == aiohttp.WSMsgType.TEXT and json.loads(news.data) == {"type": "job", "id": "job-1"}
    assert batch.type == aiohttp.WSMsgType.BINARY and tab.decode(batch.data[SEQUENCE.size:])[0]["id"] == 7
    assert idle.type == aiohttp.WSMsgType.TEXT and json.loads(idle.data) == {"type": "job", "id": None}
