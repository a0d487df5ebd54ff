"""The wire protocol shared by the hub, clients and workers.

Every message is one ZeroMQ multipart message::

    [routing id]  (added and removed by the hub's ROUTER socket)
    VERSION       b"RM3"
    type          one of the MessageType values, ASCII
    header        a JSON object, UTF-8
    buffers...    zero or more raw frames (pickled payloads and their out-of-band buffers)

This module only builds and checks frames; it owns no sockets. docs/protocol.md is the
human-readable description of the same thing.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Sequence

from ..errors import ProtocolError

PROTOCOL_VERSION = b"RM3"

HEARTBEAT_INTERVAL_S = 1.0
"""How often every peer sends a heartbeat when it has nothing else to say."""

HEARTBEAT_LIVENESS = 5
"""How many intervals of silence before a peer whose connection is down is declared gone."""

DEFAULT_OUTAGE_GRACE_S = 300.0
"""How long a peer whose connection went down is waited for: the hub keeps its record, jobs and session, and
its jobs wait, so a cell rides out a dropped Wi-Fi or a tunnel's restart. Longer, it is taken for gone."""

LINK_PING_INTERVAL_S = 1.0
"""How often a peer's libzmq pings the hub (ZMTP PING): traffic that tells the hub the peer's
connection is up even while the peer's Python reads nothing."""

HEARTBEAT_STALL_LIVENESS = 120
"""How many intervals a peer whose connection is up may say nothing before it is declared hung.

Whether a connection is up is libzmq's to say: its own heartbeats (ZMTP PING/PONG) are answered by
libzmq's I/O thread, without Python's GIL. So a notebook busy in one long call that holds the GIL
keeps its jobs, and its I/O thread catches up after; a peer that is stopped, killed or cut off
loses its connection within HEARTBEAT_LIVENESS intervals."""

MAX_HEADER_BYTES = 1 << 20
"""Headers are small JSON objects; anything larger is refused before parsing."""

MAX_HEADER_DEPTH = 100
"""How deeply a header's lists and objects may nest: far more than any real header needs, far
less than Python's recursion limit, so every peer can re-encode what it accepted."""

DEFAULT_MAX_MESSAGE_BYTES = 2 << 30
"""Default cap on one frame, enforced by libzmq (ZMQ_MAXMSGSIZE) on the hub's socket."""


class MessageType(str, Enum):
    """Every message type on the wire; the value is what travels."""

    HELLO = "hello"            # peer -> hub: who I am (role, name, versions, capabilities)
    WELCOME = "welcome"        # hub -> peer: accepted; hub versions, heartbeat interval
    HEARTBEAT = "heartbeat"    # both ways
    SUBMIT = "submit"          # client -> hub -> worker: a job
    STARTED = "started"        # worker -> hub -> client: the job began running
    STREAM = "stream"          # worker -> hub -> client: stdout/stderr text
    DISPLAY = "display"        # worker -> hub -> client: a rich output (mime bundle)
    RESULT = "result"          # worker -> hub -> client: the job's outputs
    ERROR = "error"            # any direction: something was refused or failed
    CANCEL = "cancel"          # client -> hub -> worker: stop a job
    WORKERS = "workers"        # client -> hub (request), hub -> client (listing)
    BYE = "bye"                # peer -> hub: leaving; hub -> peer: shutting down
    SESSION_END = "session_end"  # hub -> worker: a client is gone; stop its session's interpreter
    CHUNK = "chunk"            # any link: a piece of a large message (wire/chunks.py)
    CHUNK_ACK = "chunk_ack"    # any link: how much of a large message the receiver holds
    JOBS = "jobs"              # client -> hub (request), hub -> client: jobs whose client went away
    ATTACH = "attach"          # client -> hub: collect one of those; the hub replays what it sent
    LINK_ACK = "link_ack"      # any link: every numbered message up to this seq arrived; or send again (wire/link.py)
    RESUME = "resume"          # peer -> hub, after a reconnect: the jobs it holds, to reconcile (wire/link.py)
    # A whole Jupyter kernel on a worker (kernel_provider/, worker/jupyter_kernels.py); the hub only routes these.
    KERNEL_START = "kernel_start"      # client -> hub -> worker: start an ipykernel with this key
    KERNEL_STARTED = "kernel_started"  # worker -> hub -> client: it runs (pid, worker, python)
    KERNEL_FRAMES = "kernel_frames"    # both ways: one ZeroMQ message on one of the kernel's channels
    KERNEL_SIGNAL = "kernel_signal"    # client -> hub -> worker: deliver a signal (SIGINT: interrupt)
    KERNEL_STOP = "kernel_stop"        # client or hub -> worker: end the kernel (terminate or kill)
    KERNEL_DIED = "kernel_died"        # worker or hub -> client: the kernel is gone, and why


_TYPES_BY_WIRE = {t.value.encode(): t for t in MessageType}


class Role(str, Enum):
    """What a peer is allowed to do, fixed by the credentials it authenticated with."""

    CLIENT = "client"
    WORKER = "worker"


@dataclass
class Message:
    """One decoded message: its type, its JSON header and its raw buffer frames."""

    type: MessageType
    header: dict[str, Any]
    buffers: list[Any] = field(default_factory=list)


def session_id(routing_id: bytes) -> str:
    """The session a client's jobs run in on every worker, from its routing id (which survives its
    reconnects). Hashed: the listing every client sees shows sessions, and a routing id would let a
    peer with a client token take over that client's connection (ROUTER_HANDOVER)."""
    return hashlib.sha256(b"remote-magic session " + routing_id).hexdigest()[:16]


def encode_header(header: dict[str, Any]) -> bytes:
    """Serialise a header the way every peer expects it."""
    return json.dumps(header, separators=(",", ":")).encode()


def encode(msg_type: MessageType, header: dict[str, Any] | None = None,
           buffers: Sequence[Any] = ()) -> list[Any]:
    """Build the frames of one message (without a routing id)."""
    return [PROTOCOL_VERSION, msg_type.value.encode(), encode_header(header or {}), *buffers]


def _as_bytes(frame: Any) -> bytes:
    return frame.bytes if hasattr(frame, "bytes") else bytes(frame)


def decode(frames: Sequence[Any]) -> Message:
    """Check and decode frames (without a routing id) into a Message.

    Raises ProtocolError with a reason a peer can act on; never anything else.
    """
    if len(frames) < 3:
        raise ProtocolError(f"a message needs at least 3 frames (version, type, header), got {len(frames)}")
    version = _as_bytes(frames[0])
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"protocol version {version[:16]!r} is not {PROTOCOL_VERSION!r}: "
            "install the same remote-magic version on the notebook and the worker"
        )
    msg_type = _TYPES_BY_WIRE.get(_as_bytes(frames[1]))
    if msg_type is None:
        raise ProtocolError(f"unknown message type {_as_bytes(frames[1])[:32]!r}")
    raw_header = frames[2]
    size = len(raw_header.buffer) if hasattr(raw_header, "buffer") else len(raw_header)
    if size > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {size} bytes is over the {MAX_HEADER_BYTES}-byte limit")
    raw = _as_bytes(raw_header)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"header is not valid JSON: {exc}") from None
    except RecursionError:  # "[[[[...": json recurses once per level and gives up deep inside
        raise ProtocolError(f"header nests more than {MAX_HEADER_DEPTH} levels deep") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"header must be a JSON object, got {type(header).__name__}")
    # Fewer brackets than the limit can't nest past it: most headers skip the walk.
    if raw.count(b"[") + raw.count(b"{") > MAX_HEADER_DEPTH and _nesting(header) > MAX_HEADER_DEPTH:
        raise ProtocolError(f"header nests more than {MAX_HEADER_DEPTH} levels deep")
    return Message(msg_type, header, list(frames[3:]))


def _nesting(value: Any) -> int:
    """How many levels of lists and objects a decoded JSON value has; iterative, never recursive."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest
