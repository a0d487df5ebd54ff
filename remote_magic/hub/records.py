"""What the hub knows of each peer and each job: plain records, below the modules that use them.

``fleet`` keeps them, ``placement`` reads them, the handlers change them; none of those import each
other for these. No sockets here (a peer's ``Link`` sends through a callable the hub gives it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..wire.frame_cache import FrameCache
from ..wire.lifecycle import Lifecycle
from ..wire.link import Link
from ..wire.protocol import Role
from ..wire.requirements import Requirement, traits
from .detached import DetachedJob, Journal


@dataclass
class Usage:
    """What a worker did for the fleet, as the hub counts it."""

    busy_s: float = 0.0   # from a job's hand-over to the worker until it ended, summed
    gpu_s: float = 0.0    # GPU time its results report (stats.gpu_time_s)
    bytes_in: int = 0     # SUBMIT frames the hub sent it
    bytes_out: int = 0    # what it sent back about jobs: results, errors, output

    def as_dict(self, running_s: float = 0.0) -> dict[str, Any]:
        """The counters as a worker listing shows them, ``running_s`` of a running job included."""
        return {"busy_s": round(self.busy_s + running_s, 3), "gpu_s": round(self.gpu_s, 6),
                "bytes_in": self.bytes_in, "bytes_out": self.bytes_out}


@dataclass
class UnacknowledgedEnd:
    """A job's RESULT or ERROR sent on a client's link that the client hasn't acknowledged yet."""

    seq: int             # the message's number on the client's link
    ending: DetachedJob  # the job as it waits for collection if the client goes away before acknowledging


@dataclass
class Peer:
    """A client or worker that said HELLO, and everything the hub holds for it.

    Who it is (``routing_id``, role, name, credentials, capabilities), when it was last heard and sent
    to, its link (``wire/link.py``: what waits for it, numbered, and what it sends, taken once each),
    and per role: a client's frame cache and the job ends it owes an acknowledgement for; a worker's
    running job, counters and usage. Forgetting the peer (``Fleet.forget``) forgets all of it.
    """

    routing_id: bytes
    role: Role
    name: str
    versions: dict[str, str]
    capabilities: dict[str, Any] = field(default_factory=dict)
    local: bool = False          # the hub's in-process worker (inproc, no CURVE keys)
    key: bytes = b""             # the public key it authenticated with: clients sharing it share their jobs
    last_seen: float = field(default_factory=time.monotonic)
    out_of_reach: bool = False   # said nothing past the liveness expiry (its link down?): no job goes to it
    last_sent: float = 0.0
    link: Link = field(kw_only=True, repr=False)
    owes_ack: bool = False       # its link took something it hasn't acknowledged yet
    cache: FrameCache | None = None  # clients: their large frames, so they cross once
    # Clients: per job, the end it hasn't acknowledged (hub/delivery.py).
    unacknowledged_ends: dict[str, UnacknowledgedEnd] = field(default_factory=dict, repr=False)
    job: JobRecord | None = None  # workers: the job running there
    jobs_done: int = 0           # workers: finished jobs, any outcome
    stats: dict[str, Any] = field(default_factory=dict)  # workers: counters from the last heartbeat
    usage: Usage = field(default_factory=Usage)  # workers: what the hub counted
    traits: dict[str, Any] = field(init=False)  # workers: what requirements match against

    def __post_init__(self) -> None:
        self.traits = traits(self.capabilities)


@dataclass
class JobRecord:
    """The hub's record of a submitted job: where it came from, what it asks for, its frames while it waits
    (the notebook's side of a job is ``client_jobs.ClientJob``, or ``dask_jobs.DaskJob``)."""

    id: str
    client: bytes  # its client's routing id
    worker_name: str | None
    frames: list[Any]
    worker: bytes | None = None  # the routing id of the worker it was handed to
    require: list[Requirement] = field(default_factory=list)
    prefer: str | None = None
    timeout: float | None = None  # the job's own; also how long it may wait for a worker held back by battery
    queued_at: float = field(default_factory=time.monotonic)
    sent_at: float = 0.0
    submit_seq: int | None = None  # its SUBMIT's number on its worker's link
    told_why: bool = False  # its client was told why it waits
    summary: str = ""  # the first line of its code, or its kind: what a listing of detached jobs shows
    journal: Journal = field(default_factory=Journal)  # what it sent its client, for a client that collects it
    session_owner: bytes = b""  # the notebook whose session runs it: its client until another one collects it
    lifecycle: Lifecycle = field(init=False)

    def __post_init__(self) -> None:
        self.lifecycle = Lifecycle(self.id, "hub")
        self.session_owner = self.session_owner or self.client
