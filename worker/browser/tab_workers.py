"""``remote-worker --browser``: each tab that joins becomes a worker of the fleet, until it goes.

A tab's worker is a :class:`~remote_magic.worker.supervisor.Supervisor` like the machine's own,
named after the tab, labelled ``browser=tab``, whose executors run the cells' Python here and
take their GPU from the tab (``ExecutorOptions.tab``). When the tab goes, the job it was running
fails with what happened (the bridge answers for it), then the worker leaves the fleet.
"""

from __future__ import annotations

import dataclasses
import ssl
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from remote_magic.errors import RemoteMagicError

if TYPE_CHECKING:  # aiohttp (the server's) is imported only when --browser asks for it
    from ..executor_processes import ExecutorOptions
    from ..supervisor import Supervisor
    from .bridge import TabBridge
    from .server import TabServer


LEAVE_GRACE_S = 10.0
"""After its tab goes, how long a tab's worker has to report its failed job before it leaves."""
LEAVE_POLL_S = 0.05

MakeWorker = Callable[[str, "ExecutorOptions", dict[str, Any]], "Supervisor"]
"""Makes a (not yet started) worker from a name, executor options and placement."""


def tls_context(cert: Path | None, key: Path | None) -> ssl.SSLContext | None:
    """The page's HTTPS from ``--browser-cert``/``--browser-key`` (both or neither)."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise RemoteMagicError("--browser-cert and --browser-key go together: the certificate and its private key")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise RemoteMagicError(f"can't use {cert} and {key} for HTTPS: {exc}; give a PEM certificate and its "
                               "key, e.g. `mkcert -cert-file cert.pem -key-file key.pem HOSTNAME`") from None
    return context


class TabWorkers:
    """The tabs' workers: started as each tab joins, stopped once it has gone (both said on remote-worker's
    output, as the routine events they are)."""

    def __init__(self, make_worker: MakeWorker, options: ExecutorOptions, placement: dict[str, Any]) -> None:
        self._make_worker = make_worker
        self._options = options
        self._placement = placement

    def join(self, bridge: TabBridge) -> Supervisor:
        """Start the worker of the tab behind ``bridge``; returns once it accepts jobs."""
        options = dataclasses.replace(self._options, gpu="on", tab=bridge.endpoint)
        labels = {**self._placement.get("labels", {}), "browser": "tab"}
        worker = self._make_worker(bridge.name, options, {**self._placement, "labels": labels})
        try:
            worker.start()
        except BaseException:  # the tab went while its worker started: its executors go too
            worker.stop()
            raise
        print(f"remote-worker: browser tab {bridge.name!r} joined as worker {worker.name!r}", flush=True)
        return worker

    @staticmethod
    def running(worker: Supervisor) -> str | None:
        """The id of the job ``worker`` is running, or None while it is idle: what its tab's page shows."""
        job = worker.job
        return job.id if job is not None else None

    def leave(self, bridge: TabBridge, worker: Supervisor) -> None:
        """Take out the worker of a tab that has gone, once its job (failed by the bridge) is reported."""
        deadline = time.monotonic() + LEAVE_GRACE_S
        while worker.job is not None and time.monotonic() < deadline:
            time.sleep(LEAVE_POLL_S)  # polling with a deadline: the job ends on the worker's own thread
        worker.stop()
        print(f"remote-worker: browser tab worker {worker.name!r} left: {bridge.gone}", flush=True)


def serve_tabs(host: str, port: int, workers: TabWorkers, *, tls: ssl.SSLContext | None = None) -> TabServer:
    """Serve the page on ``host:port``; each tab that opens the link joins through ``workers``."""
    from .server import TabServer

    server = TabServer(host, port, workers.join, workers.leave, tls=tls, job_of=workers.running)
    server.start()
    return server
