"""A browser tab's WebGPU device, driven from the executor as if it were a wgpu device.

wgpu-py mirrors WebGPU, so the GPU code above (``context``, ``memory``, ``pipelines``, ``custom``)
runs unchanged on a :class:`TabDevice`: each call it makes is recorded into a batch instead of
run, and the batch goes to the tab (through the worker's tab bridge, ``worker/browser/bridge.py``)
only when the host needs an answer: values read back, a shader's compile errors, a new device.
A cell of many GPU operations therefore costs one round trip per readback, not one per call.

Objects live in the tab under ids this process picks; when a proxy is collected here, its id is
dropped there with the next batch. Errors the tab reports (validation, out of memory, a closed
tab) are raised as :class:`TabCallError` from the call that waited for the answer.
"""

from __future__ import annotations

import difflib
import functools
import logging
import secrets
import weakref
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import wgpu
import zmq

from remote_magic.errors import GpuError
from remote_magic.worker.tab_protocol import MAX_BATCH_BYTES, MAX_MESSAGE_BYTES, decode, encode, padded

from .device import ADAPTER_TYPES, AdapterInfo, DeviceCallError, GpuDevice

log = logging.getLogger(__name__)

RETURNS_OBJECT = ("create_", "begin_", "get_", "finish")
"""Methods whose result the tab keeps under a new id (the rest return nothing)."""

BRIDGE_CHECK_INTERVAL_MS = 1000
"""While waiting for an answer, how often to check that the bridge is still there (its socket's file)."""

KEPT_KEYS = frozenset({"constants"})
"""Descriptor keys whose own keys are user names (override constants), not to be camel-cased."""

WEBGPU_METHODS = frozenset(
    name for cls in vars(wgpu).values() if isinstance(cls, type) and cls.__name__.startswith("GPU")
    for name in dir(cls) if not name.startswith("_") and callable(getattr(cls, name, None)))
"""Every method of wgpu-py's WebGPU classes: a name that is none of them fails where it is called, not in the tab."""


class TabCallError(DeviceCallError):
    """The tab refused or could not run a batch. ``lost``: the tab or its device is gone for good;
    ``line``/``column``: where a shader failed to compile."""

    def __init__(self, message: str, *, lost: bool = False, line: int | None = None,
                 column: int | None = None) -> None:
        super().__init__(message, lost=lost)
        self.line = line
        self.column = column


@functools.cache  # (a handful of names, each recorded thousands of times a step)
def camel(name: str) -> str:
    """wgpu-py's snake_case name as WebGPU's camelCase one: ``entry_point`` -> ``entryPoint``."""
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


class TabSession:
    """The executor's line to one tab: the batch being recorded and the socket to the bridge."""

    def __init__(self, endpoint: str, context: zmq.Context[Any] | None = None) -> None:
        self._socket = (context or zmq.Context.instance()).socket(zmq.DEALER)
        self._socket.linger = 0
        self._socket.maxmsgsize = MAX_MESSAGE_BYTES
        self._socket.connect(endpoint)
        self._bridge_path = Path(endpoint.removeprefix("ipc://"))
        self._space = secrets.token_hex(4)  # ids of this process, apart from other executors' in the same tab
        self._next = 0
        self._request = 0
        self._calls: list[list[Any]] = []
        self._blobs: list[bytes] = []
        self._blob_bytes = 0
        self._dropped: list[str] = []
        self.device: str | None = None
        self.round_trips = 0
        """Batches sent and answered: what a cell's GPU work cost in waits for the tab."""
        self.tab_ms = 0.0
        """Milliseconds the tab says it spent on the batches answered (GPU waits included)."""

    def new_id(self) -> str:
        """A fresh id for an object the tab will hold."""
        self._next += 1
        return f"{self._space}.{self._next}"

    def drop(self, object_id: str) -> None:
        """Let the tab forget ``object_id`` (with the next batch); called when its proxy is collected."""
        self._dropped.append(object_id)

    def record(self, call: list[Any]) -> None:
        """Add ``call`` to the batch."""
        self._calls.append(call)

    def blob(self, data: Any) -> dict[str, list[int]]:
        """A reference to ``data`` (copied now: the caller may reuse its memory) in the batch's blobs."""
        raw = bytes(memoryview(data).cast("B"))
        if self._blob_bytes + len(raw) > MAX_BATCH_BYTES and self._blobs:
            self.flush()
        at = self._blob_bytes
        self._blobs.append(raw)
        self._blob_bytes = padded(at + len(raw))
        return {"$b": [at, len(raw)]}

    def call(self, target: "RemoteObject", method: str, *args: Any, **kwargs: Any) -> "RemoteObject | None":
        """Record ``target.method(*args, **kwargs)``; a proxy for its result if it returns an object."""
        result = self.new_id() if method.startswith(RETURNS_OBJECT) else None
        encoded = [self.argument(a) for a in args] + ([self.argument(kwargs)] if kwargs else [])
        self.record(["call", target.object_id, camel(method), encoded, result])
        return RemoteObject(self, result) if result is not None else None

    def argument(self, value: Any, *, keep_keys: bool = False) -> Any:
        """``value`` in the batch's JSON: proxies by id, descriptors camel-cased, enums as strings."""
        if type(value) is int:  # (most of a dispatch's arguments: first)
            return value
        if isinstance(value, RemoteObject):
            return {"$": value.object_id}
        if isinstance(value, dict):
            return {(k if keep_keys else camel(k)): self.argument(v, keep_keys=k in KEPT_KEYS)
                    for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.argument(v) for v in value]
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        if isinstance(value, (int, np.integer)):
            return int(value)
        if isinstance(value, (float, np.floating)):
            return float(value)
        if value is None:
            return None
        if isinstance(value, str):  # wgpu's enums are str subclasses
            return str(value)
        raise TypeError(f"can't send {type(value).__name__} to a browser tab")

    def flush(self) -> tuple[dict[str, Any], memoryview]:
        """Send the batch and wait for the tab's answer: its header and blobs."""
        calls = self._calls
        if self._dropped:
            calls.append(["drop", self._dropped])
        self._calls, self._dropped = [], []
        blobs, self._blobs, self._blob_bytes = self._blobs, [], 0
        self._request += 1
        self.round_trips += 1
        self._socket.send(encode({"id": self._request, "device": self.device, "calls": calls}, blobs), copy=False)
        while True:
            while not self._socket.poll(BRIDGE_CHECK_INTERVAL_MS):
                if not self._bridge_path.exists():  # the bridge answers every batch while it lives
                    raise TabCallError("the browser tab's worker has left the fleet", lost=True)
            header, data = decode(self._socket.recv(copy=False).buffer)
            if header.get("id") in (self._request, None):
                break
            if not isinstance(header.get("id"), int) or header["id"] > self._request:  # the bridge checks this too
                raise TabCallError(f"the browser tab answered batch {header.get('id')!r} for batch {self._request}",
                                   lost=True)
            # An earlier id: the answer to a batch cut short by Ctrl-C.
        self.tab_ms += float(header.get("ms") or 0.0)
        error = header.get("error")
        if error:
            raise TabCallError(str(error.get("message", "the tab failed")), lost=bool(error.get("lost")),
                               line=error.get("line"), column=error.get("column"))
        return header, data

    def close(self) -> None:
        """Close the socket to the bridge."""
        self._socket.close(linger=0)


class RemoteObject:
    """A WebGPU object held by the tab; its methods are recorded into the batch."""

    def __init__(self, session: TabSession, object_id: str) -> None:
        self._session = session
        self.object_id = object_id
        weakref.finalize(self, session.drop, object_id)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in WEBGPU_METHODS:
            close = difflib.get_close_matches(name, WEBGPU_METHODS, n=1)
            raise AttributeError(f"WebGPU objects have no method {name!r}" + (f": did you mean {close[0]!r}?"
                                                                               if close else ""))
        return functools.partial(self._session.call, self, name)


class TabBuffer(RemoteObject):
    """A GPU buffer in the tab; mapping it for reading fetches its bytes."""

    def __init__(self, session: TabSession, object_id: str, size: int, usage: int) -> None:
        super().__init__(session, object_id)
        self.size = size
        self.usage = usage
        self._mapped: memoryview | None = None

    def map_sync(self, mode: int, offset: int = 0, size: int | None = None) -> None:
        """Read ``size`` bytes at ``offset`` from the tab (in pieces of at most a batch's size)."""
        size = self.size - offset if size is None else size
        pieces = []
        for start in range(offset, offset + size, MAX_BATCH_BYTES):
            length = min(MAX_BATCH_BYTES, offset + size - start)
            self._session.record(["read", self.object_id, start, length])
            header, data = self._session.flush()
            at, nbytes = header["reads"][-1]
            pieces.append(data[at:at + nbytes])
        self._mapped = memoryview(b"".join(pieces)) if len(pieces) != 1 else pieces[0]

    def read_mapped(self, offset: int = 0, size: int | None = None, copy: bool = True) -> memoryview:
        """The bytes :meth:`map_sync` read (``offset`` relative to what was mapped)."""
        if self._mapped is None:
            raise RuntimeError("read_mapped before map_sync")
        end = None if size is None else offset + size
        return self._mapped[offset:end]

    def unmap(self) -> None:
        """Forget the bytes read."""
        self._mapped = None


class TabQueue(RemoteObject):
    """The device's queue: writes carry their bytes in the batch."""

    def write_buffer(self, buffer: RemoteObject, offset: int, data: Any) -> None:
        """Write ``data`` into ``buffer`` at ``offset`` (large data in pieces of a batch's size)."""
        raw = np.ascontiguousarray(data).data.cast("B")
        for start in range(0, max(raw.nbytes, 1), MAX_BATCH_BYTES):
            piece = raw[start:start + MAX_BATCH_BYTES]
            self._session.record(["call", self.object_id, "writeBuffer",
                                  [{"$": buffer.object_id}, offset + start, self._session.blob(piece)], None])


class TabDevice(RemoteObject):
    """A WebGPU device in the tab, with wgpu-py's device methods that the GPU code uses."""

    def __init__(self, session: TabSession) -> None:
        object_id = session.new_id()
        session.record(["device", object_id])
        session.device = object_id
        header, _ = session.flush()
        super().__init__(session, object_id)
        self.tab: str = str(header.get("tab", "the tab"))
        adapter = header.get("adapter") or {}
        self.adapter: dict[str, Any] = adapter
        self.limits: dict[str, int] = {_kebab(k): int(v) for k, v in (header.get("limits") or {}).items()}
        self.features: set[str] = set()
        self.session = session
        queue_id = session.new_id()
        session.record(["get", object_id, "queue", queue_id])
        self.queue = TabQueue(session, queue_id)

    def create_buffer(self, *, size: int, usage: int, label: str = "") -> TabBuffer:
        """A buffer of ``size`` bytes in the tab."""
        buffer = TabBuffer(self._session, self._session.new_id(), size, int(usage))
        self._session.record(["call", self.object_id, "createBuffer",
                              [{"size": int(size), "usage": int(usage)}], buffer.object_id])
        return buffer

    def create_shader_module(self, *, code: str, label: str = "") -> RemoteObject:
        """Compile ``code`` in the tab now: a compile error comes back with its line and column."""
        module = RemoteObject(self._session, self._session.new_id())
        self._session.record(["compile", module.object_id, label, code])
        try:
            self._session.flush()
        except TabCallError as exc:
            if exc.line is None:
                raise
            raise TabCallError(f"Shader '{label}' error: {exc}\n   ┌─ wgsl:{exc.line}:{exc.column}",
                               line=exc.line, column=exc.column) from None
        return module

    def create_compute_pipeline(self, **descriptor: Any) -> Any:
        """A compute pipeline; made now, so a wrong entry point or layout is reported by this call."""
        pipeline = self._session.call(self, "create_compute_pipeline", **descriptor)
        self._session.flush()
        return pipeline

    def destroy(self) -> None:
        """Destroy the device in the tab, and close the line to it."""
        self._session.record(["call", self.object_id, "destroy", [], None])
        try:
            self._session.flush()
        except TabCallError as exc:  # the tab is gone already
            log.debug("destroying a tab device: %s", exc)
        self._session.close()


SOFTWARE_ADAPTERS = ("swiftshader", "llvmpipe", "lavapipe", "softpipe", "microsoft basic render")
"""Names of CPU rasterisers a browser may offer without calling them its fallback adapter."""


def record_dispatches(compute_pass: Any, runs: Iterable[tuple[Any, Any, tuple[int, ...]]]) -> None:
    """Record ``runs`` (a pipeline, its bind group 0 and its workgroups) into ``compute_pass``: a browser tab's as one
    call (the tab decodes each call it is sent, and a jitted step replays dozens of kernels), a wgpu pass's call by
    call."""
    if isinstance(compute_pass, RemoteObject):
        encoded = [[pipeline.object_id, group.object_id, *groups] for pipeline, group, groups in runs]
        compute_pass._session.record(["dispatches", compute_pass.object_id, encoded])
        return
    for pipeline, group, groups in runs:
        compute_pass.set_pipeline(pipeline)
        compute_pass.set_bind_group(0, group)
        compute_pass.dispatch_workgroups(*groups)


def _kebab(name: str) -> str:
    return "".join(f"-{c.lower()}" if c.isupper() else c for c in name)


def adapter_info(device: TabDevice) -> AdapterInfo:
    """What the worker reports about the tab's adapter."""
    adapter = device.adapter
    vendor, architecture = str(adapter.get("vendor", "")), str(adapter.get("architecture", ""))
    said = " ".join(str(adapter.get(key, "")) for key in ("vendor", "architecture", "description")).lower()
    software = bool(adapter.get("fallback")) or any(name in said for name in SOFTWARE_ADAPTERS)
    name = " ".join(filter(None, [vendor, architecture])) or str(adapter.get("description") or "WebGPU adapter")
    return AdapterInfo(name=name, backend="WebGPU", adapter_type="software" if software else ADAPTER_TYPES["Unknown"],
                       vendor=vendor, description=str(adapter.get("description", "")),
                       limits={k.replace("-", "_"): v for k, v in device.limits.items()}, browser_tab=device.tab)


def open_tab_device(endpoint: str) -> GpuDevice:
    """A new device in the tab whose bridge listens at ``endpoint``."""
    try:
        handle = TabDevice(TabSession(endpoint))
    except TabCallError as exc:
        raise GpuError(f"no GPU device in the browser tab: {exc}") from None
    return GpuDevice(handle, adapter_info(handle))
