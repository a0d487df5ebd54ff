"""Whole Jupyter kernels through the hub: which client started each, on which worker, and their messages.

The hub routes a kernel's messages (``kernel_*`` types) between the client that started it and the
worker that runs it, and nothing else: it never reads a kernel's frames. ``KernelRoutes`` is the table
(no sockets); ``KernelRelay`` handles the messages and what a peer that leaves takes with it, sending
through the hub (``sender.PeerSender``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ..errors import KernelError, NoSuchWorker, PermissionDenied
from ..wire.failures import error_header
from ..wire.protocol import Message, MessageType as T, Role
from .fleet import Fleet
from .records import Peer
from .sender import PeerSender

log = logging.getLogger(__name__)

MAX_KERNEL_ID = 64
"""The longest kernel id a client may choose (jupyter_client's are 36-character UUIDs)."""


@dataclass
class KernelRoute:
    """One kernel: the client that started it and the worker it runs on (their routing ids)."""

    id: str
    client: bytes
    worker: bytes
    worker_name: str


class KernelRoutes:
    """Every kernel the hub knows, by id."""

    def __init__(self) -> None:
        self.routes: dict[str, KernelRoute] = {}

    def get(self, kernel_id: Any) -> KernelRoute | None:
        return self.routes.get(kernel_id) if isinstance(kernel_id, str) else None

    def choose_worker(self, wanted: str | None, workers: list[Peer]) -> Peer:
        """The worker a new kernel goes to: the one named, else the one that allows kernels and
        runs the fewest. Raises NoSuchWorker or KernelError, saying what to do."""
        names = ", ".join(sorted(w.name for w in workers)) or "none connected"
        if wanted:
            named = next((w for w in workers if w.name == wanted), None)
            if named is None:
                raise NoSuchWorker(f"no worker is named {wanted!r} (workers: {names}); pick one of them in the "
                                   "kernelspec (remote-worker kernelspec install --worker NAME)")
            if not named.capabilities.get("kernels"):
                raise KernelError(f"worker {wanted!r} does not run kernels (it was started with --jupyter-kernels off, "
                                  "or is an older remote-worker); start it with --jupyter-kernels on")
            return named
        hosts = [w for w in workers if w.capabilities.get("kernels")]
        if not hosts:
            raise KernelError(f"no connected worker runs kernels (workers: {names}); start remote-worker "
                              "(with --jupyter-kernels on, the default) where the kernel should run")
        return min(hosts, key=lambda w: sum(1 for r in self.routes.values() if r.worker == w.routing_id))

    def add(self, kernel_id: str, client: bytes, worker: Peer) -> KernelRoute:
        route = KernelRoute(kernel_id, client, worker.routing_id, worker.name)
        self.routes[kernel_id] = route
        return route

    def remove(self, kernel_id: str) -> None:
        self.routes.pop(kernel_id, None)

    def of_client(self, routing_id: bytes) -> list[KernelRoute]:
        return [r for r in self.routes.values() if r.client == routing_id]

    def of_worker(self, routing_id: bytes) -> list[KernelRoute]:
        return [r for r in self.routes.values() if r.worker == routing_id]


class KernelRelay:
    """Routes ``kernel_*`` messages between the client that started a kernel and the worker that runs it.

    ``allowed``: whether clients may start kernels here (``remote-worker --jupyter-kernels``).
    """

    def __init__(self, fleet: Fleet, sender: PeerSender, *, allowed: bool = True) -> None:
        self.fleet = fleet
        self.sender = sender
        self.allowed = allowed
        self.routes = KernelRoutes()

    def on_start(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        """KERNEL_START from a client: pick its worker, remember the route, pass the message on."""
        kernel_id = msg.header["kernel"]
        if not isinstance(kernel_id, str) or not kernel_id or len(kernel_id) > MAX_KERNEL_ID:
            raise ValueError(f"kernel must be a string of 1 to {MAX_KERNEL_ID} characters")
        if not self.allowed:
            self.sender.send(peer.routing_id, T.ERROR, error_header(PermissionDenied(
                "this hub does not allow kernels: its remote-worker runs with --jupyter-kernels off. Start it with "
                "--jupyter-kernels on (the default) to run whole kernels there"), kernel=kernel_id))
            return
        if (route := self.routes.get(kernel_id)) is not None and route.client != peer.routing_id:
            raise ValueError("another client uses this kernel id")
        wanted = msg.header.get("worker")
        try:
            worker = self.routes.choose_worker(str(wanted) if wanted else None, self.fleet.workers())
        except (KernelError, NoSuchWorker) as exc:
            self.sender.send(peer.routing_id, T.ERROR, error_header(exc, kernel=kernel_id))
            return
        self.routes.add(kernel_id, peer.routing_id, worker)
        log.info("kernel %s of client %r starts on worker %r", kernel_id, peer.name, worker.name)
        self.sender.send_frames(worker.routing_id, list(frames))

    def to_worker(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        """A kernel's message from the client that started it (KERNEL_SIGNAL, KERNEL_STOP, KERNEL_FRAMES)."""
        route = self.routes.get(msg.header["kernel"])
        if route is not None and route.client == peer.routing_id:
            self.sender.send_frames(route.worker, list(frames))

    def to_client(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        """A kernel's message from the worker that runs it (KERNEL_STARTED, KERNEL_DIED, KERNEL_FRAMES)."""
        route = self.routes.get(msg.header["kernel"])
        if route is None or route.worker != peer.routing_id:
            return
        if msg.type is T.KERNEL_DIED:
            self.routes.remove(route.id)
        if route.client in self.fleet.peers:
            self.sender.send_frames(route.client, list(frames))

    def on_frames(self, peer: Peer, msg: Message, frames: list[Any]) -> None:
        """KERNEL_FRAMES, which both ends send."""
        if peer.role is Role.CLIENT:
            self.to_worker(peer, msg, frames)
        else:
            self.to_client(peer, msg, frames)

    def worker_left(self, worker: Peer, why: str) -> None:
        """Its kernels are gone: tell the clients that started them."""
        for route in self.routes.of_worker(worker.routing_id):
            self.routes.remove(route.id)
            if route.client in self.fleet.peers:
                self.sender.send(route.client, T.KERNEL_DIED, {"kernel": route.id, "reason": (
                    f"its worker {worker.name!r} {why}; the kernel and its state are lost. Restart the kernel "
                    "once a worker is back")})

    def client_left(self, client: Peer, why: str) -> None:
        """Nobody can reach its kernels any more: stop them."""
        for route in self.routes.of_client(client.routing_id):
            self.routes.remove(route.id)
            self.sender.send(route.worker, T.KERNEL_STOP, {"kernel": route.id, "how": "orphaned",
                                                            "reason": f"the client that started it {why}"})
