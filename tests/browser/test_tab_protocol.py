"""The browser-tab protocol written once (worker/tab_protocol.py): tab.js speaks it, every check refuses
what a tab must not send with words naming it, and a tab bridge (a real one, on a real ZeroMQ socket)
holds a tab to answering its batches in order, each with its own id."""

from __future__ import annotations

import asyncio
import json
import re
import struct
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.asyncio

from remote_magic.errors import ProtocolError
from remote_magic.worker import tab_protocol as tab
from remote_magic.worker.browser.bridge import SEQUENCE, TabBridge

TAB_JS = (Path(__file__).resolve().parents[2] / "worker" / "browser" / "page" / "tab.js").read_text()


def test_tab_js_runs_exactly_the_operations_and_says_exactly_the_control_messages_the_protocol_names() -> None:
    assert set(re.findall(r'op === "(\w+)"', TAB_JS)) == set(tab.OPERATIONS)
    assert set(re.findall(r'\{ type: "(\w+)"', TAB_JS)) == set(tab.PAGE_SAYS)
    assert set(re.findall(r'message\.type === "(\w+)"', TAB_JS)) == set(tab.SERVER_SAYS)
    used = {int(code) for code in re.findall(r"close\((4\d\d\d)", TAB_JS)}
    assert used and used <= set(tab.CLOSE_CODES.values()), used
    # What the page reads as "refused, don't retry" is every refusal the server makes.
    low, high = (int(n) for n in re.search(r"event\.code >= (\d+) && event\.code < (\d+)", TAB_JS).groups())
    assert all(low <= code < high for code in (tab.REFUSED_MESSAGE, tab.REFUSED_SECRET, tab.TOO_MANY_TABS))


@pytest.mark.parametrize(("text", "why"), [
    ("not json", "not JSON"),
    ('["hello"]', "whose type is one of hello, alive, lost"),
    ('{"type": "shout"}', "whose type is one of hello, alive, lost"),
    ('{"type": "hello"}', "`secret`"),
    (json.dumps({"type": "hello", "secret": "s" * 101}), "`secret` is a string of 101 characters"),
    (json.dumps({"type": "hello", "secret": "s", "name": ["a list"]}), "`name`"),
    ('{"type": "alive", "done": -1}', "`done` is the integer -1"),
    ('{"type": "alive", "done": "many"}', "`done`"),
    (json.dumps({"type": "lost", "reason": "x" * 2000}), "`reason`"),
])
def test_a_control_message_a_page_must_not_send_is_refused_naming_what_is_wrong(text: str, why: str) -> None:
    with pytest.raises(ProtocolError, match=re.escape(why)):
        tab.check_control(text)


def test_the_control_messages_the_page_sends_pass() -> None:
    assert tab.check_control(json.dumps({"type": "hello", "secret": "abc", "name": "phone", "adapter": {},
                                         "limits": {}}))["type"] == "hello"
    assert tab.check_control('{"type": "alive", "done": 12}') == {"type": "alive", "done": 12}
    assert tab.check_control('{"type": "lost", "reason": "destroyed"}')["reason"] == "destroyed"


@pytest.mark.parametrize(("header", "blob_bytes", "why"), [
    ({"id": "one"}, 0, "`id` is"),
    ({"id": 1, "ms": -3}, 0, "`ms` is the integer -3"),
    ({"id": 1, "error": "no"}, 0, "`error` is"),
    ({"id": 1, "error": {"lost": True}}, 0, "`error.message`"),
    ({"id": 1, "reads": [[0, 16]]}, 8, "reads 16 bytes at 0, past its 8 bytes"),
    ({"id": 1, "reads": [[0]]}, 8, "each be [offset, size]"),
    ({"id": 1, "limits": {"maxBufferSize": "big"}}, 0, '`limits["maxBufferSize"]` is the string'),
])
def test_an_answer_a_tab_must_not_send_is_refused(header: dict[str, Any], blob_bytes: int, why: str) -> None:
    with pytest.raises(ProtocolError, match=re.escape(why)):
        tab.check_answer(header, memoryview(bytes(blob_bytes)))


def test_a_batch_with_an_operation_the_page_does_not_run_is_refused() -> None:
    tab.check_batch({"id": 1, "calls": [["call", "a.1", "finish", [], "a.2"], ["drop", ["a.1"]]]})
    for call in (["shout", 1], ["read", "a.1", 0], "call"):
        with pytest.raises(ProtocolError, match="not one of the page's operations"):
            tab.check_batch({"id": 1, "calls": [call]})


def _answer(sequence: int, header: dict[str, Any], blobs: tuple[bytes, ...] = ()) -> bytes:
    return SEQUENCE.pack(sequence) + tab.encode(header, blobs)


def test_a_bridge_routes_answers_in_order_and_fails_every_owed_batch_on_an_answer_for_another(
        tmp_path: Path) -> None:
    """Before: an answer carrying another batch's number went to the wrong executor, or was dropped with its
    batch, and the cell waiting for it hung."""

    async def scenario() -> dict[str, Any]:
        context = zmq.asyncio.Context()
        sent: list[bytes] = []

        async def to_tab(message: bytes) -> None:
            sent.append(message)

        bridge = TabBridge("phone", tmp_path, context, to_tab)
        bridge.start()
        executors = [context.socket(zmq.DEALER) for _ in range(2)]
        for number, executor in enumerate(executors, 1):
            executor.connect(bridge.endpoint)
            await executor.send(tab.encode({"id": number * 10, "device": None, "calls": []}))
        while len(sent) < 2:
            await asyncio.sleep(0.01)  # polls the fake tab's inbox: the bridge relays on its own task
        seen: dict[str, Any] = {"sequences": [struct.unpack_from("<I", m)[0] for m in sent]}
        with pytest.raises(ProtocolError, match="an answer to batch 2, when batch 1 was the one owed"):
            await bridge.on_answer(_answer(2, {"id": 20}))
        await bridge.on_answer(_answer(1, {"id": 10, "ms": 1.0}))
        seen["first"] = tab.decode(await asyncio.wait_for(executors[0].recv(), 5))[0]
        with pytest.raises(ProtocolError, match="carrying id 99, not 20"):
            await bridge.on_answer(_answer(2, {"id": 99}))
        bridge.fail("the browser tab 'phone' sent a malformed answer")
        seen["second"] = tab.decode(await asyncio.wait_for(executors[1].recv(), 5))[0]
        await executors[0].send(tab.encode({"id": 11, "calls": []}))
        seen["later"] = tab.decode(await asyncio.wait_for(executors[0].recv(), 5))[0]
        await executors[0].send(tab.encode({"id": 12, "calls": [["shout"]]}))
        bridge.close()
        for executor in executors:
            executor.close(linger=0)
        context.term()
        return seen

    seen = asyncio.run(scenario())
    assert seen["sequences"] == [1, 2]
    assert seen["first"] == {"id": 10, "ms": 1.0}
    # The batch whose answer was wrong is answered, as every later one, with the tab's failure.
    assert seen["second"] == seen["later"] == {"error": {"message": "the browser tab 'phone' sent a malformed answer",
                                                         "lost": True}}


def test_a_misspelt_webgpu_method_fails_where_it_is_called_not_in_the_tab(tmp_path: Path) -> None:
    from remote_magic.worker.gpu.tab_device import RemoteObject, TabSession

    session = TabSession(f"ipc://{tmp_path / 'no-bridge'}")  # nothing is sent: calls are recorded
    try:
        encoder = RemoteObject(session, session.new_id())
        with pytest.raises(AttributeError, match="no method 'dispatch_workgroup': did you mean 'dispatch_workgroups'"):
            encoder.dispatch_workgroup(4)
        assert encoder.dispatch_workgroups(4) is None  # a WebGPU method: recorded for the next batch
    finally:
        session.close()
