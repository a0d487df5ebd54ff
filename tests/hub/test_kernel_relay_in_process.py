"""The hub's Jupyter kernel relay in one process, through a recording ``PeerSender`` (tests/hub_parts.py).

Which worker a kernel starts on, its messages passed between the client that started it and that worker (and
nobody else), and what a peer that leaves takes with it.
"""

from __future__ import annotations

from typing import Any

import pytest
from hub_parts import HubParts

from remote_magic.hub.records import Peer
from remote_magic.wire.protocol import Message, MessageType as T, encode


def _relay(hub: HubParts, peer: Peer, msg_type: T, kernel: str, buffers: list[bytes] | None = None,
           **header: Any) -> list[Any]:
    """Hand one kernel message from ``peer`` to the relay as the hub's table does; the frames it came in."""
    message = Message(msg_type, {"kernel": kernel, **header}, buffers or [])
    frames = encode(message.type, message.header, message.buffers)
    handler = {T.KERNEL_START: hub.kernels.on_start, T.KERNEL_SIGNAL: hub.kernels.to_worker,
               T.KERNEL_STOP: hub.kernels.to_worker, T.KERNEL_STARTED: hub.kernels.to_client,
               T.KERNEL_DIED: hub.kernels.to_client, T.KERNEL_FRAMES: hub.kernels.on_frames}[msg_type]
    handler(peer, message, frames)
    return frames


def test_a_kernel_starts_on_the_worker_running_the_fewest_and_its_start_passes_on_untouched() -> None:
    hub = HubParts()
    client = hub.client()
    first, second = hub.worker("first"), hub.worker("second")
    _relay(hub, client, T.KERNEL_START, "k1", key="secret")
    _relay(hub, client, T.KERNEL_START, "k2", key="secret")
    [start1] = hub.sender.to(first)
    [start2] = hub.sender.to(second)
    assert (start1.type, start1.header) == (T.KERNEL_START, {"kernel": "k1", "key": "secret"})
    assert start2.header["kernel"] == "k2"


def test_a_kernel_asked_for_by_worker_name_starts_there() -> None:
    hub = HubParts()
    client = hub.client()
    hub.worker("first")
    chosen = hub.worker("chosen")
    _relay(hub, client, T.KERNEL_START, "k1", worker="chosen")
    assert [m.header["kernel"] for m in hub.sender.to(chosen)] == ["k1"]


@pytest.mark.parametrize(("workers", "wanted", "error", "says"), [
    ([], None, "KernelError", "no connected worker runs kernels (workers: none connected)"),
    (["box"], "gone", "NoSuchWorker", "no worker is named 'gone' (workers: box)"),
    (["box"], "box", "KernelError", "worker 'box' does not run kernels"),
], ids=["no-worker", "unknown-name", "kernels-off"])
def test_a_kernel_no_worker_can_run_is_refused_to_its_client_saying_why(workers: list[str], wanted: str | None,
                                                                        error: str, says: str) -> None:
    hub = HubParts()
    client = hub.client()
    for name in workers:
        hub.worker(name, kernels=False)
    _relay(hub, client, T.KERNEL_START, "k1", **({"worker": wanted} if wanted else {}))
    [refused] = hub.sender.to(client)
    assert refused.type is T.ERROR and refused.header["kernel"] == "k1"
    assert refused.header["error"] == error and says in refused.header["message"]
    assert hub.kernels.routes.get("k1") is None


def test_a_hub_that_allows_no_kernels_refuses_to_start_one() -> None:
    hub = HubParts(kernels=False)
    client, worker = hub.client(), hub.worker("box")
    _relay(hub, client, T.KERNEL_START, "k1")
    [refused] = hub.sender.to(client)
    assert refused.header["error"] == "PermissionDenied" and "--jupyter-kernels off" in refused.header["message"]
    assert hub.sender.to(worker) == []


def test_a_kernels_messages_go_between_its_client_and_its_worker_and_nobody_else() -> None:
    hub = HubParts()
    client, other = hub.client(), hub.client("other")
    worker, bystander = hub.worker("box"), hub.worker("bystander")
    _relay(hub, client, T.KERNEL_START, "k1", worker="box")
    hub.sender.clear()

    sent = _relay(hub, client, T.KERNEL_FRAMES, "k1", [b"shell", b"execute_request"], channel="shell")
    _relay(hub, client, T.KERNEL_SIGNAL, "k1", signal=2)
    back = _relay(hub, worker, T.KERNEL_FRAMES, "k1", [b"iopub", b"stream"], channel="iopub")
    _relay(hub, worker, T.KERNEL_STARTED, "k1", pid=1234)
    _relay(hub, other, T.KERNEL_FRAMES, "k1", [b"not yours"], channel="shell")  # another client: dropped
    _relay(hub, bystander, T.KERNEL_FRAMES, "k1", [b"not mine"], channel="iopub")  # another worker: dropped

    to_worker = hub.sender.to(worker)
    assert [m.type for m in to_worker] == [T.KERNEL_FRAMES, T.KERNEL_SIGNAL]
    assert encode(to_worker[0].type, to_worker[0].header, to_worker[0].buffers) == sent  # passed on untouched
    to_client = hub.sender.to(client)
    assert [m.type for m in to_client] == [T.KERNEL_FRAMES, T.KERNEL_STARTED]
    assert encode(to_client[0].type, to_client[0].header, to_client[0].buffers) == back
    assert hub.sender.to(other) == [] and hub.sender.to(bystander) == []


def test_a_kernel_id_is_its_clients_own() -> None:
    hub = HubParts()
    client, other = hub.client(), hub.client("other")
    hub.worker("box")
    _relay(hub, client, T.KERNEL_START, "k1")
    with pytest.raises(ValueError, match="another client uses this kernel id"):  # the hub answers ProtocolError
        _relay(hub, other, T.KERNEL_START, "k1")
    with pytest.raises(ValueError, match="kernel must be a string"):
        _relay(hub, client, T.KERNEL_START, "k" * 65)


def test_a_kernel_that_died_is_forgotten_and_its_client_told() -> None:
    hub = HubParts()
    client, worker = hub.client(), hub.worker("box")
    _relay(hub, client, T.KERNEL_START, "k1")
    _relay(hub, worker, T.KERNEL_DIED, "k1", reason="exit code 1")
    assert [m.header.get("reason") for m in hub.sender.to(client, T.KERNEL_DIED)] == ["exit code 1"]
    assert hub.kernels.routes.get("k1") is None
    hub.sender.clear()
    _relay(hub, client, T.KERNEL_FRAMES, "k1", [b"late"], channel="shell")
    assert hub.sender.to(worker) == []


def test_a_worker_that_leaves_takes_its_kernels_and_their_clients_are_told() -> None:
    hub = HubParts()
    client, worker, spare = hub.client(), hub.worker("box"), hub.worker("spare")
    _relay(hub, client, T.KERNEL_START, "k1", worker="box")
    _relay(hub, client, T.KERNEL_START, "k2", worker="spare")
    hub.leave(worker, "stopped answering")
    [died] = hub.sender.to(client, T.KERNEL_DIED)
    assert died.header["kernel"] == "k1"
    assert "its worker 'box' stopped answering; the kernel and its state are lost" in died.header["reason"]
    assert hub.kernels.routes.get("k1") is None and hub.kernels.routes.get("k2") is not None
    assert hub.sender.to(spare, T.KERNEL_STOP) == []


def test_a_client_that_leaves_has_its_kernels_stopped_as_orphans() -> None:
    hub = HubParts()
    client, other, worker = hub.client(), hub.client("other"), hub.worker("box")
    _relay(hub, client, T.KERNEL_START, "k1")
    _relay(hub, other, T.KERNEL_START, "k2")
    hub.leave(client, "disconnected")
    [stop] = hub.sender.to(worker, T.KERNEL_STOP)
    assert stop.header == {"kernel": "k1", "how": "orphaned", "reason": "the client that started it disconnected"}
    assert hub.kernels.routes.get("k2") is not None
    # The worker's last words about it go nowhere: its client is gone.
    hub.sender.clear()
    _relay(hub, worker, T.KERNEL_DIED, "k1", reason="stopped")
    assert hub.sender.sent == []
