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

Afterwards no process has died, no log holds a traceback, every forwarded job got exactly one
answer, and the same hub runs a real client's job on each worker. Sends never wait for replies
(replies are drained with non-blocking receives), examples are derandomized so a run repeats
exactly, and a case counts only once its message (or connection) left the test's socket.
"""

from __future__ import annotations

import itertools
import json
import os
import pickle
import socket
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

import remote_magic
from remote_magic.wire import serialization
from remote_magic.wire.protocol import (
    MAX_HEADER_BYTES,
    MAX_HEADER_DEPTH,
    PROTOCOL_VERSION,
    Message,
    MessageType as T,
    decode,
    encode,
    encode_header,
)
from remote_magic.wire.tokens import Token
from remote_magic.wire.versions import local_versions
from support import WorkerProcess, start_worker, wait_for

MIN_CASES = 10_000
"""The issue's floor for one run: fuzzed messages (or raw connections) that left the test."""

MAX_MESSAGE_BYTES = 1 << 21
"""The fuzzed hub's --max-message-size: libzmq drops a larger frame, and its connection."""

OVERSIZED_BUDGET = 8
"""Megabyte-sized headers and frames each socket may send; they cost time, not coverage."""

STALL_S = 20.0
"""How long the fuzzed jobs' answers may stop coming before the test calls the workers stuck."""

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
_code = st.sampled_from(_SNIPPETS) | st.text(alphabet="0123456789+-*/%() xyz=\n", max_size=40)

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
}
_SUBMIT_FIELDS = ("kind", "code", "outputs", "timeout", "gpu", "kernels", "names", "counts")


@st.composite
def _headers(draw: st.DrawFn, fields: tuple[str, ...] = tuple(_FIELDS)) -> dict[str, Any]:
    """A few of the fields, each plausible or of a wrong JSON type, and maybe a stray key."""
    names = draw(st.lists(st.sampled_from(fields), max_size=5, unique=True))
    header = {name: draw(_FIELDS[name] | _json) for name in names}
    if draw(st.booleans()):
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
             header: st.SearchStrategy[dict[str, Any]] = _headers()) -> Draft:
    """One multipart message: mostly well formed, else truncated, reordered, or worse."""
    version = draw(st.sampled_from(_VERSIONS))
    msg_type = draw(st.sampled_from(_BAD_TYPES)) or draw(types).value.encode()
    raw_header, oversized = draw(_header_bytes(draw(header)))
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
                self.replies.append(decode(frames))
            except remote_magic.ProtocolError as exc:
                raise AssertionError(f"the hub sent a malformed message: {exc}") from None

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
    @given(_sometimes, messages())
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
        fake.send(data.draw(messages() | messages(events, job_events)))
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


def _fuzz_the_workers(context: zmq.Context, token: Token, examples: int) -> int:
    """SUBMITs with random fields and frames that the hub forwards; each must get exactly one answer."""
    fuzzer = _fuzzer(context, token).welcomed("client", "fuzz-jobs")
    counter = itertools.count()
    jobs: set[str] = set()

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
        fuzzer.send(Draft(encode(T.SUBMIT, {**header, "job": job}, payloads)))
        if cancel:  # queued, running or done by now: whichever, the job still gets exactly one answer
            fuzzer.send_frames(encode(T.CANCEL, {"job": job, "reason": "fuzz"}))

    run()
    _wait_for_answers(fuzzer, jobs)
    started = {r.header.get("job") for r in fuzzer.replies if r.type is T.STARTED}
    assert len(started & jobs) > len(jobs) // 2, f"only {len(started)} of {len(jobs)} fuzzed jobs reached a worker"
    fuzzer.close()
    return fuzzer.sent


# -- tests -----------------------------------------------------------------------------------


def test_fuzzed_hub_and_workers_keep_serving(fleet: tuple[WorkerProcess, WorkerProcess]) -> None:
    hub = fleet[0]
    token = Token.decode(hub.token)
    context = zmq.Context()
    try:
        counts = {
            "as a client": _fuzz_as_client(context, token, 3_600),
            "as a worker": _fuzz_as_worker(context, token, _worker_token(hub), 2_600),
            "as a stranger": _fuzz_as_stranger(context, token, 1_500),
            "jobs for the workers": _fuzz_the_workers(context, token, 2_500),
        }
    finally:
        context.destroy(linger=0)
    assert sum(counts.values()) >= MIN_CASES, counts
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
