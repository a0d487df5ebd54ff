"""Fuzzing a hub and the workers behind it (issue 4, item 5).

Hypothesis drives random, truncated, reordered and oversized multipart messages at a real hub
(a `remote-worker` process with its own worker, 'home') and at a second worker process
('joiner') that joined it:

- as an authenticated client (the client token's keys), and with SUBMITs whose headers and
  payload frames are random but which the hub forwards, so the supervisors and executors of both
  workers get them too;
- as an authenticated worker (the worker token's keys), sending random job events, some of them
  for jobs the hub really handed it;
- as strangers: raw TCP bytes (noise, or a ZMTP greeting followed by garbage), ZeroMQ sockets
  without CURVE, with CURVE keys the hub never issued, or with the wrong server key.

Every message type is fuzzed with the fields ``remote_magic/wire/schema.py`` knows for it, each
plausible or of a wrong JSON type (``1e400``, ``true`` for a count, a list for a name...), explicitly
chunks (compressed claims, garbage and bomb zstd, huge ``sizes``, negative, huge or infinite
offsets), chunk and link acknowledgements, ``resume``, ``attach``, ``jobs``, kernel messages and
SUBMITs with wrong-typed fields (issue 23, item 3). A phase of its own sends well-framed messages with
one field the schema refuses: each gets a ProtocolError reply naming the field. An executor is also
fed malformed SUBMITs directly, bypassing the hub's and its worker's checks: each ends its job with an
error, and the session keeps its state.

Afterwards no process has died, no log holds a traceback, every forwarded job got exactly one
answer, the hub's resident memory stayed under ``MAX_HUB_RSS_BYTES``, and the same hub runs a real
client's job on each worker. Sends never wait for replies (replies are drained with non-blocking
receives), examples are derandomized so a run repeats exactly, and a case counts only once its
message (or connection) left the test's socket.

The browser-tab server of ``remote-worker --browser`` (docs/tab-protocol.md) is fuzzed the same way, as
strangers at its door (``/hello``: every control message the page says, malformed, of wrong types,
oversized, binary) and as tabs that proved the secret (``/ws``: control messages and answers, well
formed or not): each refusal is a close with the protocol's code and words naming what was wrong, the
process's memory stays under ``MAX_TAB_SERVER_RSS_BYTES``, its log holds no traceback and a bounded
number of warnings, and a tab that proves the secret afterwards is welcomed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import pickle
import re
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import psutil
import pytest
import zmq
import zstandard
from browser_tabs import send_all
from hypothesis import HealthCheck, Phase, assume, given, settings, strategies as st

import remote_magic
from remote_magic.hub.broker import Hub
from remote_magic.wire import schema, serialization
from remote_magic.wire.displays import TEXT_FORMAT
from remote_magic.wire.keys import HubKeys
from remote_magic.wire.protocol import (
    MAX_HEADER_BYTES,
    MAX_HEADER_DEPTH,
    PROTOCOL_VERSION,
    Message,
    MessageType as T,
    Role,
    decode,
    encode,
    encode_header,
)
from remote_magic.wire.tokens import Token
from remote_magic.wire.versions import local_versions
from remote_magic.worker.executor_processes import ExecutorLink, ExecutorOptions
from support import WorkerProcess, start_worker, wait_for

MIN_CASES = 10_000
"""The issue's floor for one run: fuzzed messages from authenticated peers that left the test (strangers' raw
connections come on top)."""

MAX_MESSAGE_BYTES = 1 << 21
"""The fuzzed hub's --max-message-size: libzmq drops a larger frame, and its connection."""

OVERSIZED_BUDGET = 8
"""Megabyte-sized headers and frames each socket may send; they cost time, not coverage."""

STALL_S = 20.0
"""How long the fuzzed jobs' answers may stop coming before the test calls the workers stuck."""

MAX_HUB_RSS_BYTES = 600 << 20
"""The hub's process (with its own worker's supervisor, not its executors) stays under this, however it is fuzzed."""

WORKER_NAMES = ("home", "joiner")
FAKE_WORKER = "fuzz-worker"

_SETTINGS = settings(deadline=None, derandomize=True, database=None, print_blob=False,
                     phases=[Phase.generate], suppress_health_check=list(HealthCheck))


def _fuzz(examples: int) -> settings:
    """Fixed examples, no deadline, no example database, no shrinking (once a hub is broken every
    later example fails the same way): repeatable in CI, and quick to fail."""
    return settings(_SETTINGS, max_examples=examples)


# -- strategies ------------------------------------------------------------------------------

_scalars = (st.none() | st.booleans() | st.integers(min_value=-2, max_value=2 ** 40) | st.text(max_size=8)
            | st.sampled_from([10 ** 400, -(10 ** 30), 1e308, -0.0, 0.5, float("nan"), float("inf")]))
# Two levels at most, so it is cheap to draw; deep nesting is a header shape of its own below.
_json = _scalars | st.lists(_scalars, max_size=3) | st.dictionaries(st.text(max_size=6), _scalars, max_size=3)
_names = st.text(alphabet="abcxyz_", min_size=1, max_size=4)
_sometimes = st.sampled_from([False] * 7 + [True])

# Code the workers run: harmless however the fuzzer combines it (no files, no sleeps, no exits
# that bypass the executor's handlers).
_SNIPPETS = ("", "pass", "x = 1", "y = x", "1/0", "print('fuzz')", "import sys; sys.stderr.write('e')",
             "raise SystemExit(3)", "raise KeyboardInterrupt", "z = [i for i in range(100)]",
             "def f(:", "display(1)", "import numpy as np; a = np.ones(3)", "x", "del x", "a, b = 1")
_code = st.sampled_from(_SNIPPETS) | st.text(alphabet="0123456789+-/%() xyz=\n", max_size=40)  # no 9**9**9

# Values a field may never take: numbers JSON can't carry (1e400 reads as infinity), true for a count, a
# 70-character id, a list for a name, an object for a list... (wire/schema.py's table says what each field takes).
_WRONG = st.sampled_from([float("inf"), float("-inf"), float("nan"), 10 ** 400, 2 ** 64, True, False, -1, 0.5, "",
                          "x" * 70, "y" * 2000, "*", [1], [None], {"a": 1}, {"a": [1]}, None])
_IDS = st.sampled_from(["fuzz", "j1", "t1", "k1"]) | st.text(min_size=1, max_size=8) | st.text(min_size=64, max_size=70)
_COUNT = (st.integers(min_value=-2, max_value=2 ** 40)
          | st.sampled_from([2 ** 63, 10 ** 400, float("inf"), float("-inf"), float("nan"), True, 1.5]))

# The fields messages carry: a plausible value, or (via _headers) any JSON value, mostly of the
# wrong type.
_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "job": st.text(max_size=70) | st.sampled_from(["fuzz", "j1"]),
    "kind": st.sampled_from(["code", "call"]),
    "code": _code,
    "outputs": st.none() | st.lists(_names, max_size=3),
    "worker": st.sampled_from([*WORKER_NAMES, FAKE_WORKER, "nobody", ""]),
    "timeout": st.floats(allow_nan=True, allow_infinity=True) | st.integers() | st.just(10 ** 400),
    "gpu": st.booleans() | st.lists(st.sampled_from(["matmul", "softmax", "nope"]), max_size=2),
    "kernels": st.dictionaries(_names, st.text(max_size=30), max_size=2),
    "names": st.lists(_names, max_size=4),
    "counts": st.lists(st.integers(min_value=-2, max_value=4) | st.just(10 ** 18), max_size=4),
    "role": st.sampled_from(["client", "worker", "admin"]),
    "name": st.text(max_size=80),
    "versions": st.just(local_versions()) | st.dictionaries(st.text(max_size=12), _json, max_size=3),
    "capabilities": st.dictionaries(st.text(max_size=12), _json, max_size=4),
    "request": st.text(max_size=20),
    "text": st.text(max_size=60),
    "data": st.dictionaries(st.sampled_from(["text/plain", "image/png", "x"]), _json, max_size=2),
    "metadata": st.dictionaries(st.text(max_size=8), _json, max_size=2),
    "error": st.sampled_from(["RemoteError", "WorkerLost", "NotConnected", "CredentialsRotated", "Nope"]),
    "message": st.text(max_size=60),
    "stats": st.dictionaries(st.text(max_size=8), _json, max_size=3),
    "duration_s": st.floats(),
    "reason": st.text(max_size=20),
    # SUBMIT's other fields, which the executor reads (a wrong type once killed it, and the session's state)
    "figure_formats": st.lists(st.sampled_from(["png", "retina", "svg", "bogus"]), max_size=3),
    "keep": st.lists(_names, max_size=2),
    "text_format": st.dictionaries(st.sampled_from(TEXT_FORMAT), _scalars, max_size=2),
    "refs": st.dictionaries(_names, st.fixed_dictionaries({}, optional={
        "same": _names, "input": _COUNT, "view": _names, "offset": _COUNT, "shape": st.lists(_COUNT, max_size=2),
        "strides": st.lists(_COUNT, max_size=2), "layout": _json, "recarray": st.booleans(),
        # Not "|O": a view of objects over another array's memory crashes the executor, as identity's
        # _rebuild_view doesn't refuse object dtypes yet.
        "dtype": st.sampled_from(["<f8", "|u1", "<i4", "|V16"])}), max_size=2),
    "max_result_bytes": _COUNT,
    "shared": st.text(max_size=40),
    "require": st.lists(st.sampled_from(["gpu", "memory>=1GB", "cpus>2", "zone==a", "x??"]), max_size=2),
    "prefer": st.sampled_from(["fastest", "slowest"]),
    "session": _IDS,
    "seq": st.integers(min_value=-1, max_value=5) | st.sampled_from([True, float("inf")]),
    "passes": st.integers(min_value=-1, max_value=5) | st.sampled_from([True, float("inf")]),
    # chunks, and delivery across reconnects
    "transfer": _IDS,
    "offset": _COUNT,
    "sizes": st.lists(st.integers(min_value=-1, max_value=1 << 20) | st.sampled_from([2 ** 62, 10 ** 30]), max_size=5),
    "raw": _COUNT,
    "received": _COUNT,
    "ack": _COUNT,
    "resend": st.booleans(),
    "jobs": st.lists(_IDS, max_size=3),
    "abandons": _IDS,
    # whole kernels
    "kernel": _IDS | st.just("*"),
    "channel": st.sampled_from(["shell", "control", "stdin", "hb", "iopub", "nope"]),
    "signum": st.integers(min_value=-1, max_value=300),
    "how": st.sampled_from(["terminate", "kill", "orphaned", "nope"]),
    "key": st.text(max_size=20),
    "env": st.dictionaries(st.text(max_size=6), st.text(max_size=10), max_size=2),
}
_SUBMIT_FIELDS = ("kind", "code", "outputs", "timeout", "gpu", "kernels", "names", "counts", "figure_formats", "keep",
                  "versions", "text_format", "refs", "max_result_bytes", "shared")


@st.composite
def _headers(draw: st.DrawFn, fields: tuple[str, ...] = tuple(_FIELDS)) -> dict[str, Any]:
    """A few of the fields, each plausible or of a wrong JSON type, and maybe a stray key."""
    names = draw(st.lists(st.sampled_from(fields), max_size=5, unique=True))
    header = {name: draw(_FIELDS[name] | _json) for name in names}
    if draw(st.booleans()):
        header[draw(st.text(max_size=8))] = draw(_json)
    return header


@st.composite
def _typed_headers(draw: st.DrawFn, msg_type: T) -> dict[str, Any]:
    """The fields wire/schema.py knows for ``msg_type``: those it needs (mostly) and a few others, each
    plausible, or now and then any JSON value or one the field never takes; and maybe a stray key."""
    row = schema.HEADERS.get(msg_type.value)
    known = [name for name in (row.fields if row is not None else {}) if name in _FIELDS]
    needed = [name for name in (row.required if row is not None else ()) if name in _FIELDS]
    names = set(draw(st.lists(st.sampled_from(known), max_size=4, unique=True))) if known else set()
    names.update(name for name in needed if draw(st.integers(0, 9)))
    header = {}
    for name in sorted(names):  # sorted: a set's order changes between runs, and the draws with it
        header[name] = draw(_json | _WRONG) if draw(_sometimes) else draw(_FIELDS[name])
    if draw(_sometimes):
        header[draw(st.text(max_size=8))] = draw(_json)
    return header


def _pickled(value: Any) -> bytes:
    return pickle.dumps(value, protocol=5)


# Payload frames: random bytes, pickles of plain values and harmless builtins, truncated pickles.
_PICKLES = [_pickled(v) for v in (None, 0, 10 ** 400, "text", b"bytes", [1, [2]], {"k": (1, 2)}, len, abs, str,
                                  np.arange(3.0), np.ones((2, 2), dtype=np.float32))]
_payloads = st.binary(max_size=64) | st.sampled_from(_PICKLES + [p[:-1] for p in _PICKLES] + [p[:5] for p in _PICKLES])

# Most messages are well formed, so that most get past framing into the handlers.
_VERSIONS = [PROTOCOL_VERSION] * 20 + [b"", b"RM0", b"rm2", b"RM2\0", b"RM1", b"\xff" * 8]
_BAD_TYPES = [None] * 20 + [b"", b"HELLO", b"submit\0", b"launch", b"\xff\xfe"]
_HEADER_SHAPES = ["json"] * 10 + ["bytes", "truncated", "not-an-object", "nested", "oversized"]
_FRAME_SHAPES = ["as-is"] * 10 + ["truncated", "reordered", "dropped", "duplicated", "random", "oversized"]


@dataclass
class Draft:
    """A fuzzed message; ``oversized`` when it holds a megabyte-sized part (those are rationed)."""

    frames: list[bytes]
    oversized: bool = False


@st.composite
def _header_bytes(draw: st.DrawFn, header: dict[str, Any]) -> tuple[bytes, bool]:
    shape = draw(st.sampled_from(_HEADER_SHAPES))
    encoded = encode_header(header)
    if shape == "bytes":
        return draw(st.binary(max_size=64)), False
    if shape == "truncated":
        return encoded[:draw(st.integers(0, max(0, len(encoded) - 1)))], False
    if shape == "not-an-object":
        return json.dumps(draw(_json)).encode(), False
    if shape == "nested":  # at the depth limit, past it, around Python's recursion limit, far beyond
        depth = draw(st.sampled_from([MAX_HEADER_DEPTH - 1, MAX_HEADER_DEPTH, 990, 1_000, 100_000]))
        opener, closer = draw(st.sampled_from([(b"[", b"]"), (b'{"a":', b"}")]))
        key = draw(st.sampled_from(["capabilities", "stats", "data", "names", "job"]))
        nested = opener * depth + b"0" + closer * depth
        return encoded[:-1] + (b"," if header else b"") + f'"{key}":'.encode() + nested + b"}", False
    if shape == "oversized":
        return b'{"pad":"' + b"x" * MAX_HEADER_BYTES + b'"}', True
    return encoded, False


@st.composite
def messages(draw: st.DrawFn, types: st.SearchStrategy[T] = st.sampled_from(list(T)),
             header: st.SearchStrategy[dict[str, Any]] | None = None) -> Draft:
    """One multipart message: mostly well formed, else truncated, reordered, or worse. Its header has the
    fields its type carries (``_typed_headers``) unless ``header`` says otherwise."""
    version = draw(st.sampled_from(_VERSIONS))
    kind = draw(types)
    msg_type = draw(st.sampled_from(_BAD_TYPES)) or kind.value.encode()
    raw_header, oversized = draw(_header_bytes(draw(header if header is not None else _typed_headers(kind))))
    frames = [version, msg_type, raw_header, *draw(st.lists(_payloads, max_size=4))]
    shape = draw(st.sampled_from(_FRAME_SHAPES))
    if shape == "truncated":
        frames = frames[:draw(st.integers(1, len(frames)))]
    elif shape == "reordered":
        frames = draw(st.permutations(frames))
    elif shape == "dropped":
        del frames[draw(st.integers(0, len(frames) - 1))]
    elif shape == "duplicated":
        frames.insert(draw(st.integers(0, len(frames))), draw(st.sampled_from(frames)))
    elif shape == "random":
        frames = draw(st.lists(st.binary(max_size=40), min_size=1, max_size=6))
    elif shape == "oversized":
        frames.append(bytes(MAX_MESSAGE_BYTES + 1))
        oversized = True
    return Draft(frames or [b""], oversized)


# The message types a peer is most likely to get wrong, or that reach furthest: drawn as often again.
_PROBED = st.sampled_from([t for t in T if t.value in (
    "chunk", "chunk_ack", "link_ack", "resume", "attach", "jobs", "kernel_frames", "kernel_start", "submit")])


def _zeros_compressed(size: int, says_size: bool) -> bytes:
    """``size`` zero bytes as one zstd frame of a few kB, which says its size (``says_size``) or doesn't."""
    stream = zstandard.ZstdCompressor(write_content_size=says_size).compressobj(size=size if says_size else -1)
    block = bytes(1 << 20)
    return b"".join(stream.compress(block) for _ in range(size >> 20)) + stream.flush()


# What the issue found: a chunk of 32 kB whose zstd frame says it holds 1 GiB (a hub that believed it
# allocated that much per chunk); and the same without its size, which only a decompressor's bound stops.
_BOMB = _zeros_compressed(1 << 30, says_size=True)
_STREAMED_BOMB = _zeros_compressed(64 << 20, says_size=False)


@st.composite
def _chunks(draw: st.DrawFn) -> Draft:
    """A chunk: plausible or absurd claims (offset, frame sizes, ``raw``), with its piece raw, compressed
    right, garbage claiming to be zstd, or a zstd bomb; or one whole message in one chunk (a fuzzed one,
    so the hub checks what it puts together)."""
    shape = draw(st.sampled_from(["raw", "zstd", "garbage-zstd", "bomb", "streamed-bomb", "whole", "whole-zstd"]))
    header = draw(_typed_headers(T.CHUNK))
    piece = draw(st.binary(max_size=64))
    if shape.startswith("whole"):
        inner = draw(messages(_PROBED | st.sampled_from(list(T))))
        frames = [f if len(f) <= MAX_HEADER_BYTES else f[:64] for f in inner.frames]  # no megabyte ones here
        piece = b"".join(frames)
        header.update(offset=0, sizes=[len(f) for f in frames], transfer=f"whole-{draw(st.integers(0, 10 ** 9))}")
    if shape in ("zstd", "whole-zstd"):
        header["raw"], piece = len(piece), zstandard.ZstdCompressor().compress(piece)
    elif shape == "garbage-zstd":
        header["raw"] = draw(st.integers(0, 1 << 18))
        piece = draw(st.sampled_from([b"", b"\x28\xb5\x2f\xfd", _BOMB[:20]])) + piece  # zstd's magic, then noise
    elif shape == "bomb":
        header["raw"], piece = draw(st.integers(0, 1 << 18) | _COUNT), _BOMB
    elif shape == "streamed-bomb":
        header["raw"], piece = draw(st.integers(0, 1 << 18)), _STREAMED_BOMB
    return Draft([PROTOCOL_VERSION, T.CHUNK.value.encode(), encode_header(header), piece])


_ZMTP_SIGNATURE = b"\xff" + bytes(8) + b"\x7f"


@st.composite
def _raw_streams(draw: st.DrawFn) -> bytes:
    """Bytes a stranger might send to the hub's port: noise, or a ZMTP greeting and then noise."""
    kind = draw(st.sampled_from(["noise", "greeting", "greeting+command", "huge-frame"]))
    if kind == "noise":
        return draw(st.binary(min_size=1, max_size=200))
    mechanism = draw(st.sampled_from([b"NULL", b"PLAIN", b"CURVE", b"GSSAPI", b"XYZ"]))
    greeting = (_ZMTP_SIGNATURE + bytes([draw(st.integers(1, 3)), draw(st.integers(0, 1))])
                + mechanism.ljust(20, b"\0") + bytes([draw(st.integers(0, 1))]) + bytes(31))
    if kind == "greeting":
        return greeting[:draw(st.integers(1, len(greeting)))]
    if kind == "huge-frame":  # a long frame announcing 2**62 bytes
        return greeting + b"\x06" + (1 << 62).to_bytes(8, "big")
    body = draw(st.sampled_from([b"\x05HELLO", b"\x08INITIATE", b"\x05READY", b"\x05ERROR"]))
    body += draw(st.binary(max_size=180))
    return greeting + b"\x04" + bytes([len(body)]) + body


# -- sockets ---------------------------------------------------------------------------------


@dataclass
class Fuzzer:
    """One socket: sends without waiting, drains replies, counts the fuzz cases that left it."""

    sock: zmq.Socket
    sent: int = 0
    oversized_left: int = OVERSIZED_BUDGET
    replies: list[Message] = field(default_factory=list)
    numbered: int = 0  # the highest `seq` the hub gave a reply (wire/link.py); acknowledged now and then
    acknowledged: int = 0

    def send(self, draft: Draft) -> None:
        """Send one fuzz case; it counts."""
        frames = draft.frames
        if draft.oversized:
            if self.oversized_left <= 0:  # rationed: the same message at a normal size
                frames = [f if len(f) <= MAX_HEADER_BYTES else f[:64] for f in frames]
            self.oversized_left -= 1
        self.send_frames(frames)
        self.sent += 1

    def send_frames(self, frames: list[bytes]) -> None:
        """Send without blocking (read replies while our queue is full); this alone doesn't count."""
        deadline = time.monotonic() + 5
        while True:
            try:
                self.sock.send_multipart(frames, zmq.NOBLOCK)
                break
            except zmq.Again:
                assert time.monotonic() < deadline, "the hub stopped taking messages"
                self.drain(0.05)
        self.drain()
        self.acknowledge()

    def drain(self, wait_s: float = 0.0) -> None:
        """Keep whatever the hub sent; it must be well formed."""
        if not self.sock.poll(wait_s * 1000):
            return
        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                reply = decode(frames)
            except remote_magic.ProtocolError as exc:
                raise AssertionError(f"the hub sent a malformed message: {exc}") from None
            self.replies.append(reply)
            if isinstance(seq := reply.header.get("seq"), int):
                self.numbered = max(self.numbered, seq)

    def acknowledge(self, every: int = 64) -> None:
        """Say which of the hub's numbered replies arrived, once ``every`` more did: it keeps them until then."""
        if self.numbered - self.acknowledged >= every:
            with contextlib.suppress(zmq.Again):  # no room now: the next one says it
                self.sock.send_multipart(encode(T.LINK_ACK, {"ack": self.numbered}), zmq.NOBLOCK)
                self.acknowledged = self.numbered

    def hello(self, role: str, name: str) -> None:
        self.send_frames(encode(T.HELLO, {"role": role, "name": name, "versions": local_versions(),
                                          "capabilities": {"hostname": "fuzz"}}))

    def welcomed(self, role: str, name: str) -> "Fuzzer":
        self.hello(role, name)
        wait_for(lambda: self.drain(0.05) or any(r.type is T.WELCOME for r in self.replies), 10,
                 f"the hub to welcome the fuzzing {role}")
        return self

    def close(self) -> None:
        """Say goodbye (the hub forgets us and cancels our jobs), and let that leave before closing."""
        self.sock.send_multipart(encode(T.BYE))
        self.sock.linger = 2000
        self.sock.close()


def _curve_socket(context: zmq.Context, address: str, server: bytes, public: bytes, secret: bytes,
                  reconnect: bool = True) -> zmq.Socket:
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.routing_id = os.urandom(16)
    if not reconnect:  # one handshake only: the hub blocks an address after repeated failed ones
        sock.reconnect_ivl = -1
    sock.curve_serverkey = server
    sock.curve_publickey, sock.curve_secretkey = public, secret
    sock.connect(address)
    return sock


def _fuzzer(context: zmq.Context, token: Token) -> Fuzzer:
    return Fuzzer(_curve_socket(context, token.address, token.server_public, token.public, token.secret))


def _worker_token(hub: WorkerProcess) -> Token:
    """The hub's worker token, pointing at the address its client token names."""
    text = subprocess.run(["remote-worker", "token", "--worker"], capture_output=True, text=True, check=True,
                          env={**os.environ, "REMOTE_MAGIC_HOME": str(hub.home)}).stdout.strip()
    return Token.decode(text).with_address(Token.decode(hub.token).address)


def _wait_for_answers(fuzzer: Fuzzer, jobs: set[str]) -> set[str]:
    """Drain until every job got its RESULT or ERROR, failing if answers stop for STALL_S."""
    answered: set[str] = set()
    seen, progress = 0, time.monotonic()
    beat = itertools.count()
    while not jobs <= answered:
        if next(beat) % 10 == 0:  # a silent client is forgotten, and its answers with it
            fuzzer.send_frames(encode(T.HEARTBEAT))
        fuzzer.drain(0.05)
        for reply in fuzzer.replies[seen:]:
            if reply.type in (T.RESULT, T.ERROR) and reply.header.get("job") in jobs:
                assert reply.header["job"] not in answered, f"job {reply.header['job']} was answered twice"
                answered.add(reply.header["job"])
                progress = time.monotonic()
        seen = len(fuzzer.replies)
        assert time.monotonic() - progress < STALL_S, (
            f"{len(jobs - answered)} of {len(jobs)} fuzzed jobs got no answer and none came for {STALL_S:g} s")
    return answered


class PeakMemory:
    """A process's largest resident memory while a ``with`` block runs, sampled every 50 ms by a thread."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="rss-sampler", daemon=True)

    def _sample(self) -> None:
        while True:
            try:
                self.peak = max(self.peak, self.process.memory_info().rss)
            except psutil.Error:  # it died: the test says so
                return
            if self._done.wait(0.05):  # a sampling period, not synchronisation
                return

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


# -- the fleet under fuzz --------------------------------------------------------------------


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[WorkerProcess, WorkerProcess]]:
    """A hub with its worker 'home', and a worker process 'joiner' that joined it."""
    tmp = tmp_path_factory.mktemp("fuzz")
    hub = start_worker(tmp / "hub", "--listen", "127.0.0.1:0", "--gpu", "off", "--name", "home",
                       "--max-message-size", str(MAX_MESSAGE_BYTES))
    try:
        joiner = start_worker(tmp / "joiner", "--join", "--gpu", "off", "--name", "joiner", token_file=False,
                              env={"REMOTE_MAGIC_JOIN_TOKEN": _worker_token(hub).encode()})
    except BaseException:
        hub.stop()
        raise
    yield hub, joiner
    joiner.stop()
    hub.stop()


def _assert_still_serving(fleet: tuple[WorkerProcess, WorkerProcess]) -> None:
    """Both processes alive, no traceback in their logs, and a real client's job right on each worker."""
    for process in fleet:
        assert process.process.poll() is None, f"remote-worker died:\n{process.log()[-4000:]}"
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((64, 32)), rng.standard_normal((32, 16))
    with remote_magic.connect(fleet[0].token, timeout=10) as client:
        wait_for(lambda: sorted(w["name"] for w in client.workers()) == sorted(WORKER_NAMES), 20,
                 "the fuzzing worker to leave the fleet")
        wait_for(lambda: all(w["state"] == "idle" for w in client.workers()), STALL_S,
                 "the workers to finish the fuzzed jobs")
        for name in WORKER_NAMES:
            out = client.run("c = a @ b", {"a": a, "b": b}, worker=name)
            np.testing.assert_allclose(out["c"], a @ b)
    for process in fleet:
        log = process.log()
        where = log.find("Traceback")
        assert where < 0, f"a traceback in {process.log_file}:\n{log[max(0, where - 400):where + 3000]}"


# -- the phases ------------------------------------------------------------------------------


def _fuzz_as_client(context: zmq.Context, token: Token, examples: int) -> int:
    """Random messages from an authenticated client; the well-formed SUBMITs reach the workers."""
    fuzzer = _fuzzer(context, token).welcomed("client", "fuzz-client")

    @_fuzz(examples)
    @given(_sometimes, messages() | messages(_PROBED) | _chunks())
    def run(hello_first: bool, draft: Draft) -> None:
        if hello_first:  # a fuzzed BYE makes the hub forget us: say hello again now and then
            fuzzer.hello("client", "fuzz-client")
        fuzzer.send(draft)

    run()
    fuzzer.close()  # the hub cancels what is still queued
    return fuzzer.sent


def _fuzz_as_worker(context: zmq.Context, token: Token, worker_token: Token, examples: int) -> int:
    """A fake worker: random messages and job events, some for jobs the hub really gave it."""
    fake = _fuzzer(context, worker_token).welcomed("worker", FAKE_WORKER)
    feeder = _fuzzer(context, token).welcomed("client", "feeder")  # keeps jobs coming to the fake worker
    given_jobs: list[str] = ["none yet"]
    seen = 0
    counter = itertools.count()

    @_fuzz(examples)
    @given(_sometimes, st.data())
    def run(hello_first: bool, data: st.DataObject) -> None:
        nonlocal seen
        n = next(counter)
        if n % 10 == 0:
            feeder.send_frames(encode(T.SUBMIT, {"job": f"feed-{n}", "kind": "code", "code": "x = 1",
                                                 "outputs": None, "worker": FAKE_WORKER, "names": [], "counts": []}))
        if hello_first:
            fake.hello("worker", FAKE_WORKER)
        given_jobs.extend(r.header.get("job") for r in fake.replies[seen:] if r.type is T.SUBMIT)
        seen = len(fake.replies)
        jobs = list(given_jobs)  # draws must not depend on it (hypothesis replays them): pick by index
        job_ids = st.integers(min_value=0).map(lambda i: jobs[i % len(jobs)]) | _FIELDS["job"]
        events = st.sampled_from([T.STARTED, T.STREAM, T.DISPLAY, T.RESULT, T.ERROR])
        job_events = st.builds(lambda job, rest: {**rest, "job": job}, job_ids, _headers())
        fake.send(data.draw(messages() | messages(events, job_events) | messages(_PROBED) | _chunks()))
        feeder.drain()

    run()
    fake.close()
    feeder.close()
    return fake.sent


def _fuzz_as_stranger(context: zmq.Context, token: Token, examples: int) -> int:
    """Raw TCP noise and greetings, then ZeroMQ sockets that can't authenticate queueing messages."""
    host, port = token.address[len("tcp://"):].rsplit(":", 1)
    sent = 0

    @_fuzz(examples)
    @given(_raw_streams())
    def run(data: bytes) -> None:
        nonlocal sent
        with socket.create_connection((host, int(port)), timeout=5) as conn:
            conn.sendall(data)
        sent += 1

    run()
    # Each makes one handshake attempt, which fails: no CURVE, keys the hub never issued, the real
    # client keys with the wrong server key. What they queue must never get through.
    strangers = []
    for _ in range(2):
        plain = context.socket(zmq.DEALER)
        plain.linger, plain.reconnect_ivl = 0, -1
        plain.connect(token.address)
        strangers.append(plain)
    for _ in range(3):
        strangers.append(_curve_socket(context, token.address, token.server_public, *zmq.curve_keypair(),
                                       reconnect=False))
    strangers.append(_curve_socket(context, token.address, zmq.curve_keypair()[0], token.public, token.secret,
                                   reconnect=False))

    @_fuzz(200)
    @given(st.sampled_from(strangers), messages())
    def queue(sock: zmq.Socket, draft: Draft) -> None:
        if not draft.oversized:
            try:
                sock.send_multipart(draft.frames, zmq.NOBLOCK)
            except zmq.Again:
                pass  # nothing leaves an unauthenticated socket, so its queue may fill: expected

    queue()
    poller = zmq.Poller()
    for sock in strangers:
        poller.register(sock, zmq.POLLIN)
    assert not poller.poll(300), "the hub answered a peer that never authenticated"
    for sock in strangers:
        sock.close()
    return sent


# What each type needs, well formed: the rest of a malformed message is, but for the one field it gets wrong.
_WELL_FORMED: dict[str, Any] = {"job": "j1", "session": "s1", "transfer": "t1", "offset": 0, "sizes": [3, 1, 2],
                                "received": 0, "ack": 0, "jobs": [], "kernel": "k1"}


def _refused(msg_type: T, header: dict[str, Any]) -> bool:
    """Does wire/schema.py refuse this header (as the hub, the worker and the executor do)?"""
    try:
        schema.check(Message(msg_type, header))
    except remote_magic.ProtocolError:
        return True
    return False


def _fuzz_malformed(context: zmq.Context, token: Token, worker_token: Token, examples: int) -> int:
    """Well-framed messages of each type a client or a worker may send, with one field wrong (of a type or
    a value it never takes, or missing): each gets an ERROR reply, a ProtocolError naming that field."""
    peers = {Role.CLIENT: _fuzzer(context, token).welcomed("client", "fuzz-malformed"),
             Role.WORKER: _fuzzer(context, worker_token).welcomed("worker", "fuzz-malformed-worker")}
    # The hub's table of routes (not HELLO: the hub reads it before the peer has a role there, with checks
    # of its own). A hub that never starts, for its table only.
    table = Hub(HubKeys.generate())
    accepted = {role: table.accepts(role) for role in peers}
    table.context.term()
    kinds = [(role, kind) for role in peers for kind in sorted(accepted[role], key=lambda t: t.value)]
    expected: dict[str, tuple[Role, str]] = {}  # the job each names -> who sent it, and the field it got wrong
    counter = itertools.count()

    @_fuzz(examples)
    @given(st.sampled_from(kinds), st.data())
    def run(kind: tuple[Role, T], data: st.DataObject) -> None:
        role, msg_type = kind
        row = schema.HEADERS[msg_type.value]
        header = {name: _WELL_FORMED[name] for name in row.required}
        wrong = data.draw(st.sampled_from(sorted(name for name in row.fields if name != "job")))
        if wrong in row.required and data.draw(_sometimes):
            del header[wrong]
        else:
            header[wrong] = data.draw(_WRONG | _json)
        marker = header["job"] = f"bad-{next(counter)}"  # the reply names it: a job id, or a field nobody reads
        assume(_refused(msg_type, header))  # (some wrong values are right for some fields: a string for a name)
        expected[marker] = (role, wrong)
        peers[role].send(Draft(encode(msg_type, header)))

    run()
    answers: dict[str, Message] = {}
    for role, peer in peers.items():
        mine = {marker for marker, (sender, _) in expected.items() if sender is role}
        _wait_for_answers(peer, mine)
        answers.update((r.header["job"], r) for r in peer.replies if r.type is T.ERROR and r.header.get("job") in mine)
    for marker, (_, wrong) in expected.items():
        reply = answers[marker].header
        assert reply["error"] == "ProtocolError" and f"`{wrong}" in reply["message"], (marker, wrong, reply)
    for peer in peers.values():
        peer.close()
    return sum(peer.sent for peer in peers.values())


def _fuzz_the_workers(context: zmq.Context, token: Token, examples: int) -> int:
    """SUBMITs with random fields and frames: the hub refuses those with a field of the wrong type or range,
    naming it, and forwards the others; each must get exactly one answer."""
    fuzzer = _fuzzer(context, token).welcomed("client", "fuzz-jobs")
    counter = itertools.count()
    jobs: set[str] = set()
    refused: set[str] = set()

    @_fuzz(examples)
    @given(st.sampled_from([None, *WORKER_NAMES]), _headers(_SUBMIT_FIELDS), st.lists(_payloads, max_size=3),
           st.booleans(), _sometimes)
    def run(worker: str | None, header: dict[str, Any], payloads: list[bytes], coherent: bool,
            cancel: bool) -> None:
        job = f"fuzz-{next(counter)}"
        if worker is not None:
            header["worker"] = worker
        if coherent:  # names and counts that match the frames, so the executor gets to unpickle them
            header["names"] = [f"v{i}" for i in range(len(payloads))]
            header["counts"] = [1] * len(payloads)
        jobs.add(job)
        if _refused(T.SUBMIT, {**header, "job": job}):
            refused.add(job)
        fuzzer.send(Draft(encode(T.SUBMIT, {**header, "job": job}, payloads)))
        if cancel:  # queued, running or done by now: whichever, the job still gets exactly one answer
            fuzzer.send_frames(encode(T.CANCEL, {"job": job, "reason": "fuzz"}))

    run()
    _wait_for_answers(fuzzer, jobs)
    started = {r.header.get("job") for r in fuzzer.replies if r.type is T.STARTED}
    forwarded = jobs - refused
    assert len(started & forwarded) > len(forwarded) // 2, (
        f"only {len(started & forwarded)} of {len(forwarded)} well-formed fuzzed jobs reached a worker")
    assert not started & refused, f"{len(started & refused)} jobs with a malformed header reached a worker"
    ends = {r.header["job"]: r.header for r in fuzzer.replies if r.type is T.ERROR and r.header.get("job") in refused}
    assert set(ends) == refused and all(end["error"] == "ProtocolError" for end in ends.values()), [
        end for end in ends.values() if end["error"] != "ProtocolError"][:3]
    assert 0 < len(refused) < len(jobs), (len(refused), len(jobs))  # both kinds were tried
    fuzzer.close()
    return fuzzer.sent


# -- tests -----------------------------------------------------------------------------------


@pytest.mark.timeout(600)  # a backstop: about a minute on 2 idle cores, three times that with both busy
def test_fuzzed_hub_and_workers_keep_serving(fleet: tuple[WorkerProcess, WorkerProcess],
                                             record_property: Any) -> None:
    hub = fleet[0]
    token = Token.decode(hub.token)
    context = zmq.Context()
    started = time.monotonic()
    try:
        with PeakMemory(hub.process.pid) as memory:
            counts = {
                "as a client": _fuzz_as_client(context, token, 3_000),
                "as a worker": _fuzz_as_worker(context, token, _worker_token(hub), 2_400),
                "malformed": _fuzz_malformed(context, token, _worker_token(hub), 2_400),
                "jobs for the workers": _fuzz_the_workers(context, token, 2_500),
            }
            authenticated = sum(counts.values())
            counts["as a stranger"] = _fuzz_as_stranger(context, token, 1_000)
    finally:
        context.destroy(linger=0)
    record_property("hub_peak_rss_mb", round(memory.peak / 2**20))
    record_property("fuzz_cases", counts)
    print(f"fuzz: {counts} in {time.monotonic() - started:.0f} s; the hub's peak RSS {memory.peak / 2**20:.0f} MiB")
    assert authenticated >= MIN_CASES, counts
    assert memory.peak < MAX_HUB_RSS_BYTES, f"the hub's RSS reached {memory.peak / 2**20:.0f} MiB"
    _assert_still_serving(fleet)


def test_deeply_nested_headers_are_refused_without_recursing() -> None:
    for depth in (MAX_HEADER_DEPTH, 100_000):
        header = b'{"a":' + b"[" * depth + b"]" * depth + b"}"
        with pytest.raises(remote_magic.ProtocolError, match=f"nests more than {MAX_HEADER_DEPTH} levels"):
            decode([PROTOCOL_VERSION, b"hello", header])
    legal = b'{"a":' + b"[" * (MAX_HEADER_DEPTH - 1) + b"]" * (MAX_HEADER_DEPTH - 1) + b"}"
    assert decode([PROTOCOL_VERSION, b"hello", legal]).type is T.HELLO


def test_a_peer_that_never_reads_cannot_stall_the_hub(fleet: tuple[WorkerProcess, WorkerProcess]) -> None:
    token = Token.decode(fleet[0].token)
    context = zmq.Context()
    try:
        flooder = _fuzzer(context, token).welcomed("client", "flooder").sock
        flooder.rcvhwm, flooder.rcvbuf = 1, 4096  # fill the hub's queue to it sooner
        hello = encode(T.HELLO, {"role": "client", "name": "flooder", "versions": local_versions()})
        for _ in range(40_000):  # each earns a WELCOME that the flooder never reads
            assert flooder.poll(5000, zmq.POLLOUT), "the hub stopped reading"
            flooder.send_multipart(hello, zmq.NOBLOCK)
        with remote_magic.connect(fleet[0].token, timeout=10) as client:
            assert client.run("x = 6 * 7") == {"x": 42}
    finally:
        context.destroy(linger=0)


def test_an_absurd_timeout_is_no_timeout(fleet: tuple[WorkerProcess, WorkerProcess]) -> None:
    token = Token.decode(fleet[0].token)
    context = zmq.Context()
    try:
        sender = _fuzzer(context, token).welcomed("client", "timeouts")
        for job, timeout in [("huge", 10 ** 400), ("nan", float("nan")), ("inf", float("inf"))]:
            sender.send_frames(encode(T.SUBMIT, {"job": job, "kind": "code", "code": "x = 1", "outputs": None,
                                                 "worker": "joiner", "timeout": timeout, "names": [], "counts": []}))
        _wait_for_answers(sender, {"huge", "nan", "inf"})
        results = [r for r in sender.replies if r.type is T.RESULT]
        assert sorted(r.header["job"] for r in results) == ["huge", "inf", "nan"]
        assert all(serialization.unpack(r.header, r.buffers) == {"x": 1} for r in results)
    finally:
        context.destroy(linger=0)
    _assert_still_serving(fleet)


# -- an executor, past the hub's and its worker's checks ------------------------------------

EXECUTOR_CASES = 300
"""Fuzzed SUBMITs handed to one executor directly, as if the hub and the worker had let them by."""

# A wrong type or range in each field the executor reads (each once killed it, or could have).
_MALFORMED_SUBMITS: list[dict[str, Any]] = [
    {"figure_formats": "png"}, {"figure_formats": 5}, {"figure_formats": ["png", None]}, {"keep": {"a": 1}},
    {"keep": 5}, {"versions": [1]}, {"versions": "3.11"}, {"versions": {"pandas": 2}}, {"outputs": 5},
    {"outputs": "x"}, {"text_format": [1]}, {"text_format": {"max_width": [1]}}, {"gpu": "x"}, {"gpu": 1},
    {"kernels": [1]}, {"kernels": {"k": 1}}, {"refs": 1}, {"refs": {"a": 5}},
    {"refs": {"a": {"view": "b", "offset": -1}}},
    {"kind": 5}, {"code": 5}, {"timeout": "x"}, {"max_result_bytes": "x"}, {"max_result_bytes": float("inf")},
    {"names": "a"}, {"counts": [True]}, {"shared": 7}, {"one_memo": "yes"}, {"about": []}, {"seq": 0},
]


class _Executor:
    """An executor process of the test's own, fed SUBMITs directly."""

    def __init__(self, context: zmq.Context) -> None:
        self.link = ExecutorLink(context, ExecutorOptions(gpu="off"))
        self.process = self.link.spawn()
        self.link.wait_ready(self.process, 60)

    def run(self, header: dict[str, Any], frames: list[bytes] | tuple[()] = ()) -> Message:
        """Send a SUBMIT; its RESULT or ERROR (what the job shows meanwhile is dropped)."""
        self.process.send(encode(T.SUBMIT, header, frames))
        deadline = time.monotonic() + STALL_S
        while time.monotonic() < deadline:
            assert self.process.died() is None, f"the executor {self.process.died()}"
            if not self.link.socket.poll(100):
                continue
            received = self.link.receive(self.link.socket.recv_multipart(copy=False))
            if received is not None and (msg := received[1]) is not None and msg.type in (T.RESULT, T.ERROR):
                assert msg.header.get("job") == header.get("job"), (header.get("job"), msg.header)
                return msg
        raise AssertionError(f"job {header.get('job')!r} got no answer within {STALL_S:g} s")


def test_malformed_submits_cost_their_job_not_the_executor_or_its_state(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # where its cells run
    context = zmq.Context()
    executor = _Executor(context)
    pid = executor.process.process.pid
    cell = {"kind": "code", "code": "x = 1", "outputs": [], "names": [], "counts": []}
    counter = itertools.count()
    try:
        assert executor.run({**cell, "job": "mark", "code": "import json\njson.fuzz_mark = 42"}).type is T.RESULT
        for n, wrong in enumerate(_MALFORMED_SUBMITS):
            end = executor.run({**cell, **wrong, "job": f"bad-{n}"})
            assert end.type is T.ERROR and end.header["error"] == "ProtocolError", (wrong, end.header)
            assert f"`{next(iter(wrong))}" in end.header["message"], (wrong, end.header)
        # Well-typed, but names and counts that don't match the frames, or frames that don't unpickle.
        for n, (names, counts, frames) in enumerate([(["a"], [2], [b"x"]), (["a", "b"], [1, 0], [b"x"]),
                                                     (["a"], [1], [b"\x80\x05garbage"]), ([], [], [b"x"])]):
            end = executor.run({**cell, "job": f"frames-{n}", "names": names, "counts": counts}, frames)
            assert end.type is T.ERROR and end.header["error"] == "InputError", end.header

        @_fuzz(EXECUTOR_CASES)
        @given(_headers(_SUBMIT_FIELDS), st.lists(_payloads, max_size=3), st.booleans())
        def run(header: dict[str, Any], payloads: list[bytes], coherent: bool) -> None:
            if coherent:
                header.update(names=[f"v{i}" for i in range(len(payloads))], counts=[1] * len(payloads))
            header["job"] = f"fuzz-{next(counter)}"
            end = executor.run(header, payloads)
            if _refused(T.SUBMIT, header):
                assert end.type is T.ERROR and end.header["error"] == "ProtocolError", end.header

        run()
        end = executor.run({**cell, "job": "read", "code": "import json\nmark = json.fuzz_mark", "outputs": ["mark"]})
        assert end.type is T.RESULT, end.header
        assert serialization.unpack(end.header, [frame.bytes for frame in end.buffers]) == {"mark": 42}
        assert executor.process.died() is None and executor.process.process.pid == pid
    finally:
        executor.link.close()
        context.destroy(linger=0)
    output = capfd.readouterr()
    assert "Traceback" not in output.err + output.out, (output.err + output.out)[-3000:]


# -- the browser-tab server --------------------------------------------------------------------

MAX_TAB_SERVER_RSS_BYTES = 200 << 20
"""A `remote-worker --browser` process (with its own worker's supervisor and the tabs' workers, not their
executors) stays under this, however its page is fuzzed (before: 8 hellos of 36 MB took it to 515 MB)."""

TAB_LINK = re.compile(r"http://(127\.0\.0\.1:\d+)/#(\S+)")


def _control(kind: str, secret: str) -> st.SearchStrategy[str | bytes]:
    """A control message of ``kind`` (one the page says: tab_protocol.PAGE_SAYS), its fields plausible or not,
    as text, or not JSON, or oversized, or binary."""
    field = _json | st.text(max_size=200) | st.integers(min_value=-5, max_value=2 ** 70)
    fields = {"hello": {"name": field, "adapter": field, "limits": field}, "alive": {"done": field},
              "lost": {"reason": field}}[kind]
    proven = {"secret": st.just(secret)} if kind == "hello" else {}  # a wrong one is answered a second later
    message = st.fixed_dictionaries({"type": st.just(kind), **proven}, optional=fields)
    as_text = message.map(json.dumps) | message.map(lambda m: json.dumps(m)[:-1])  # cut short: not JSON
    return (as_text | st.just(json.dumps([kind])) | st.binary(max_size=64)
            | st.sampled_from([b"x" * (100 << 10), "y" * (100 << 10)]))  # over the door's 64 KiB


class TabDoor:
    """A `remote-worker --browser` page's two WebSockets, spoken to as raw WebSocket clients."""

    def __init__(self, hub: WorkerProcess) -> None:
        found = wait_for(lambda: TAB_LINK.search(hub.log()), 20, "remote-worker to print the tab link")
        address, self.secret = found.groups()  # type: ignore[attr-defined]
        self.door, self.work = f"ws://{address}/hello", f"ws://{address}/ws"

    def exchange(self, url: str, messages: list[str | bytes]) -> tuple[int | None, str, list[str]]:
        """Send ``messages`` on a new WebSocket to ``url``; how the server closed it (None: it didn't, or it
        dropped the connection), its words, and the text messages it sent before."""
        import aiohttp

        async def run() -> tuple[int | None, str, list[str]]:
            said: list[str] = []
            async with aiohttp.ClientSession() as session, session.ws_connect(url, max_msg_size=0) as socket:
                if not await send_all(socket, messages):
                    return None, "dropped", said
                # A tab that is still joined half a second after what it sent was fine: it answers no batch.
                deadline = time.monotonic() + (0.5 if url.startswith(self.work) else 20)
                while True:
                    try:
                        reply = await socket.receive(timeout=max(0.01, deadline - time.monotonic()))
                    except asyncio.TimeoutError:
                        await socket.close(code=4001)
                        return None, "open", said
                    if reply.type == aiohttp.WSMsgType.TEXT:
                        said.append(reply.data)
                    elif reply.type == aiohttp.WSMsgType.CLOSE:
                        return reply.data, str(reply.extra or ""), said
                    elif reply.type != aiohttp.WSMsgType.BINARY:  # a batch for the tab's worker: not answered
                        return None, str(reply.type), said

        result: tuple[int | None, str, list[str]] = asyncio.run(run())
        return result

    def ticket(self, hello: dict[str, Any]) -> str | None:
        code, why, said = self.exchange(self.door, [json.dumps(hello)])
        tickets = [json.loads(text)["ticket"] for text in said if json.loads(text).get("type") == "ticket"]
        return tickets[0] if tickets else None


@pytest.fixture(scope="module")
def tab_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    worker = start_worker(tmp_path_factory.mktemp("fuzz-tabs"), "--listen", "127.0.0.1:0", "--gpu", "off",
                          "--name", "machine", "--browser", "127.0.0.1:0")
    yield worker
    worker.stop()


def test_fuzzed_tab_server_answers_each_refusal_by_name_and_keeps_serving(tab_server: WorkerProcess) -> None:
    from remote_magic.worker import tab_protocol as tab

    door = TabDoor(tab_server)
    outcomes: dict[str, int] = {}
    refusals = (tab.REFUSED_MESSAGE, tab.REFUSED_SECRET, 1009)  # 1009: over the socket's size

    def count(code: int | None, why: str) -> None:
        key = "ticket" if why == "" and code == 1000 else f"{code} {why.split(':')[0][:40]}"
        outcomes[key] = outcomes.get(key, 0) + 1

    @_fuzz(300)
    @given(st.sampled_from(tab.PAGE_SAYS).flatmap(lambda kind: _control(kind, door.secret)))
    def at_the_door(message: str | bytes) -> None:
        code, why, said = door.exchange(door.door, [message])
        count(code, why)
        if said:  # a proven hello: its one-time ticket, and a plain close
            assert code == 1000 and json.loads(said[0])["type"] == "ticket", (code, why, said)
        else:
            assert code in refusals or why == "dropped", (code, why, message[:200])
            assert code != tab.REFUSED_MESSAGE or why, "a refusal names what was wrong"

    @_fuzz(8)
    @given(st.lists(st.sampled_from(["alive", "lost", "hello"]).flatmap(lambda kind: _control(kind, door.secret))
                    | st.binary(max_size=64), min_size=1, max_size=12))
    def as_a_tab(messages: list[str | bytes]) -> None:
        ticket = door.ticket({"type": "hello", "secret": door.secret, "name": "fuzz"})
        assert ticket is not None
        code, why, said = door.exchange(f"{door.work}?ticket={ticket}", messages)
        count(code, why)
        assert json.loads(said[0])["type"] == "welcome", said
        assert code in (*refusals, None), (code, why)
        assert code != tab.REFUSED_MESSAGE or why, "a refusal names what was wrong"

    started = time.monotonic()
    with PeakMemory(tab_server.process.pid) as memory:
        at_the_door()
        as_a_tab()
    minutes = (time.monotonic() - started) / 60
    print(f"tab fuzz: {outcomes}; the server's peak RSS {memory.peak / 2**20:.0f} MiB")
    assert memory.peak < MAX_TAB_SERVER_RSS_BYTES, f"the server's RSS reached {memory.peak / 2**20:.0f} MiB"
    assert tab_server.process.poll() is None, tab_server.log()[-3000:]
    log = tab_server.log()
    assert "Traceback" not in log, log[log.find("Traceback") - 400:][:4000]
    assert log.count("was refused") <= 5 * (minutes + 1), log[-3000:]  # 5 a minute (WarningThrottle)
    # The server still welcomes a tab that proves the secret.
    code, why, said = door.exchange(door.work + "?ticket=" + str(door.ticket(
        {"type": "hello", "secret": door.secret, "name": "after-fuzz"})), [json.dumps({"type": "alive", "done": 0})])
    assert code is None and json.loads(said[0]) == {"type": "welcome", "name": "after-fuzz", "joined": False}, said
