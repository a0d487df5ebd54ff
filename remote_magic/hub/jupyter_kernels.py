"""The hub's table of whole Jupyter kernels: which client started each, on which worker.

The hub routes a kernel's messages (``kernel_*`` types) between the client that started it and the
worker that runs it, and nothing else: it never reads a kernel's frames. No sockets here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import KernelError, NoSuchWorker
from .fleet import Peer

MAX_KERNEL_ID = 64
"""The longest kernel id a client may choose (jupyter_client's are 36-character UUIDs)."""


@dataclass
class KernelRoute:
    """One kernel: the client that started it and the worker it runs on."""

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
                raise KernelError(f"worker {wanted!r} does not run kernels (it was started with --kernels off, "
                                  "or is an older remote-worker); start it with --kernels on")
            return named
        hosts = [w for w in workers if w.capabilities.get("kernels")]
        if not hosts:
            raise KernelError(f"no connected worker runs kernels (workers: {names}); start remote-worker "
                              "(with --kernels on, the default) where the kernel should run")
        return min(hosts, key=lambda w: sum(1 for r in self.routes.values() if r.worker == w.identity))

    def add(self, kernel_id: str, client: bytes, worker: Peer) -> KernelRoute:
        route = KernelRoute(kernel_id, client, worker.identity, worker.name)
        self.routes[kernel_id] = route
        return route

    def remove(self, kernel_id: str) -> None:
        self.routes.pop(kernel_id, None)

    def of_client(self, identity: bytes) -> list[KernelRoute]:
        return [r for r in self.routes.values() if r.client == identity]

    def of_worker(self, identity: bytes) -> list[KernelRoute]:
        return [r for r in self.routes.values() if r.worker == identity]
