"""One tab's bridge: relays its executors' batches to the tab and the tab's answers back.

Executors connect a DEALER socket to the bridge's ROUTER (an ipc path in the worker's private
folder). Each batch goes to the tab with a sequence number in front; the answer with that number
goes back to the executor that sent it. The tab runs batches one after the other, so its answers
come in the order the batches went, each with its batch's id: an answer out of order, or with
another id, is the tab's fault. When the tab goes away (closed, reloaded, put in the background,
silent, stuck, or sending something malformed) every batch waiting for it, and every one sent
later, is answered with an error that names the tab and what happened.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import zmq
import zmq.asyncio

from remote_magic.errors import ProtocolError

from ..tab_protocol import MAX_MESSAGE_BYTES, check_answer, check_batch, decode, error_reply

log = logging.getLogger(__name__)

SEQUENCE = struct.Struct("<I")


class TabBridge:
    """The joined tab ``name``; ``send`` puts a binary message on its WebSocket."""

    def __init__(self, name: str, folder: Path, context: zmq.asyncio.Context,
                 send: Callable[[bytes], Awaitable[None]]) -> None:
        self.name = name
        self._send = send
        self._socket = context.socket(zmq.ROUTER)
        self._socket.linger = 0
        self._socket.maxmsgsize = MAX_MESSAGE_BYTES
        self._socket.bind(f"ipc://{folder / f'tab-{id(self):x}'}")
        self.endpoint = str(self._socket.getsockopt_string(zmq.LAST_ENDPOINT))
        # Sequence number -> the executor's routing id and its batch's id, in the order sent.
        self._pending: dict[int, tuple[bytes, Any]] = {}
        self._sequence = 0
        self.gone: str | None = None
        """Why the tab can't answer any more (None while it can)."""
        self.last_heard = time.monotonic()
        self.progressed_at = time.monotonic()
        """When the tab last answered a batch or ran a call of one (its ``alive`` says how many it has run)."""
        self._done = 0
        self.compiling = False
        """The tab said it is compiling a kernel (creating a pipeline), which may take far longer than a call."""
        self._relay: asyncio.Future[None] | None = None

    @property
    def waiting(self) -> bool:
        """True while a batch waits for the tab's answer."""
        return bool(self._pending)

    def start(self) -> None:
        """Start relaying executors' batches (on the running loop) until :meth:`close`."""
        self._relay = asyncio.ensure_future(self._relay_requests())

    async def _relay_requests(self) -> None:
        while True:
            routing_id, message = await self._socket.recv_multipart(copy=True)
            if self.gone is not None:
                await self._answer(routing_id, error_reply(self.gone, lost=True))
                continue
            try:
                header, _ = decode(message)
                check_batch(header)
            except ProtocolError as exc:  # the executor's own bug: it hears of it, the tab never sees it
                await self._answer(routing_id, error_reply(f"a batch the tab can't run: {exc}", lost=False))
                continue
            self._sequence += 1
            if not self._pending:  # the tab's silence and progress count from the first batch it owes
                self.last_heard = self.progressed_at = time.monotonic()
            self._pending[self._sequence] = (routing_id, header.get("id"))
            try:
                await self._send(SEQUENCE.pack(self._sequence) + message)
            except ConnectionError as exc:
                self.fail(f"the browser tab {self.name!r} can't be reached ({exc})")

    async def on_answer(self, data: bytes) -> None:
        """The tab's answer to a batch: back to the executor that sent it. One that is malformed, out of
        order or for another batch is a ProtocolError (the batch stays owed: ``fail`` answers it)."""
        self.last_heard = time.monotonic()
        if len(data) < SEQUENCE.size:
            raise ProtocolError("an answer without its sequence number")
        (sequence,) = SEQUENCE.unpack_from(data)
        owed = next(iter(self._pending), None)
        if sequence != owed:
            raise ProtocolError(f"an answer to batch {sequence}, when batch {owed} was the one owed")
        header, blobs = decode(data[SEQUENCE.size:])  # refuse a malformed one here, not in the executor
        check_answer(header, blobs)
        routing_id, batch_id = self._pending[sequence]
        if header.get("id") not in (batch_id, None):  # None: the tab couldn't read the batch, and says why
            raise ProtocolError(f"an answer to batch {sequence} carrying id {header.get('id')!r}, not {batch_id!r}")
        del self._pending[sequence]
        self.progressed_at = time.monotonic()
        await self._answer(routing_id, data[SEQUENCE.size:])

    def heard(self, done: int | None = None, compiling: bool = False) -> None:
        """The tab said it is alive, having run ``done`` calls in all, and whether it is compiling a kernel."""
        self.last_heard = time.monotonic()
        self.compiling = compiling
        if done is not None and done > self._done:
            self._done, self.progressed_at = done, self.last_heard

    def fail(self, reason: str) -> None:
        """The tab is gone for ``reason``: answer every waiting batch, and every later one, with it."""
        if self.gone is not None:
            return
        self.gone = reason
        pending, self._pending = self._pending, {}
        for routing_id, _ in pending.values():
            asyncio.ensure_future(self._answer(routing_id, error_reply(reason, lost=True)))
        # Work it held is lost: a warning. A tab closed while idle is routine (its worker's leaving is said).
        (log.warning if pending else log.info)("%s", reason)

    async def _answer(self, routing_id: bytes, message: bytes) -> None:
        try:
            await self._socket.send_multipart([routing_id, message])
        except zmq.ZMQError as exc:  # the executor is gone (killed mid-batch)
            log.debug("an answer for a gone executor of tab %s: %s", self.name, exc)

    def close(self) -> None:
        """Stop relaying; close the executors' socket and remove its file: an executor still waiting sees it gone."""
        if self._relay is not None:
            self._relay.cancel()
        self._socket.close(linger=0)
        Path(self.endpoint.removeprefix("ipc://")).unlink(missing_ok=True)
