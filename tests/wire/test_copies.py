"""Large values are not copied needlessly (issue 21): frames put back together from chunks start aligned,
so arrays load over them without a copy; the supervisor hands an executor its job's large frames through
a shared file the executor maps (worker/shared_frames.py), and results come back the same way; and what
the cells compute is what the notebook computes, bit for bit."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import zmq

import remote_magic
from remote_magic.wire import serialization
from remote_magic.wire.chunks import FRAME_ALIGNMENT, Inbox, Outbox
from remote_magic.wire.protocol import Message, MessageType as T, decode, encode
from remote_magic.worker import shared_frames
from remote_magic.worker.executor_processes import (
    TEMP_PREFIX,
    ExecutorLink,
    ExecutorOptions,
    ExecutorProcess,
    remove_abandoned_dirs,
)
from support import WorkerProcess

ANSWER_S = 60.0
NOTE_S = 10.0


def _address(buffer: Any) -> int:
    return int(np.frombuffer(buffer, np.uint8).ctypes.data)


def _through_chunks(frames: list[Any]) -> list[memoryview]:
    """``frames`` sent through an Outbox in chunks and put back together by an Inbox."""
    sent: list[Message] = []
    outbox, inbox = Outbox(lambda f: sent.append(decode(f)) is None), Inbox()
    outbox.put(frames)
    while True:
        chunk = sent.pop(0)
        assert chunk.type is T.CHUNK
        received, whole = inbox.add(chunk)
        if whole is not None:
            return whole
        outbox.on_ack({"transfer": chunk.header["transfer"], "received": received})


def test_frames_put_back_together_start_aligned_and_arrays_load_over_them_without_a_copy() -> None:
    arrays = {"odd": np.arange(300_001, dtype=np.float64), "small": np.arange(3, dtype=np.int8),
              "b": np.random.default_rng(1).standard_normal((700, 301)).astype(np.float32)}
    packed = serialization.pack(arrays)
    frames = encode(T.RESULT, {"job": "j", **packed.header()}, packed.frames)
    whole = _through_chunks(frames)
    same = [0, 1, *range(3, len(frames))]  # (the header got its number)
    assert [bytes(whole[i]) for i in same] == [bytes(memoryview(frames[i]).cast("B")) for i in same]
    base = _address(whole[0].obj)  # the one buffer they are views of
    assert all((_address(frame) - base) % FRAME_ALIGNMENT == 0 for frame in whole if frame.nbytes)
    assert all(_address(frame) % serialization.BUFFER_ALIGNMENT == 0 for frame in whole if frame.nbytes)
    msg = decode(whole)
    values = serialization.unpack(msg.header, msg.buffers)
    for name, value in arrays.items():
        assert np.array_equal(values[name], value) and values[name].dtype == value.dtype
    for name in ("odd", "b"):  # out of band: arrays over the reassembled buffer itself
        assert any(np.shares_memory(values[name], np.frombuffer(frame, np.uint8)) for frame in msg.buffers)


def test_a_misaligned_frame_is_still_copied_before_loading() -> None:
    packed = serialization.pack({"a": np.arange(1000, dtype=np.float64)})
    stream, buffer = packed.frames
    size = memoryview(buffer).nbytes
    room = bytearray(size + 32)
    skip = (1 - _address(room)) % serialization.BUFFER_ALIGNMENT  # the copy starts 1 byte past an aligned address
    misaligned = memoryview(room)[skip:skip + size]
    misaligned[:] = memoryview(buffer).cast("B")
    value = serialization.unpack(packed.header(), [stream, misaligned])["a"]
    assert np.array_equal(value, np.arange(1000, dtype=np.float64))
    assert value.ctypes.data % serialization.BUFFER_ALIGNMENT == 0
    assert not np.shares_memory(value, np.frombuffer(room, np.uint8))


def test_shared_frames_are_page_aligned_copy_on_write_and_stay_in_their_folder(tmp_path: Path) -> None:
    large = np.arange(shared_frames.SHARED_OVER // 8 + 3, dtype=np.float64)
    frames = [b"v", b"t", b"{}", b"small", large]
    sent, path = shared_frames.pack(frames, str(tmp_path), first=3)
    assert path is not None and path.parent == tmp_path
    assert sent[0] == shared_frames.MARK and sent[2:6] == frames[:4] and sent[6] == b""  # it left the socket
    released = shared_frames.Released()
    message, note = shared_frames.unpack(sent, str(tmp_path), remove=False, released=released)
    assert note == shared_frames.Note([]) and bytes(message[3]) == b"small"
    assert _address(message[4]) % shared_frames.PAGE_BYTES == 0
    view = np.frombuffer(message[4], np.float64)
    assert np.array_equal(view, large)
    view[0] = -1.0  # the cell's own pages: the file is unchanged
    assert np.fromfile(path, np.float64, count=1)[0] == 0.0
    del view, message
    assert released.take() == [path.name]  # no array over it is left: the pool may write over it
    with pytest.raises(ValueError, match="must be in"):
        shared_frames.unpack(sent, str(tmp_path / "elsewhere"), remove=True)
    assert path.exists()


def test_a_pool_reuses_released_files_and_keeps_few(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pool = shared_frames.FramePool(str(tmp_path))
    large = bytes(shared_frames.SHARED_OVER)

    def file_of(sent: list[Any]) -> str:
        return Path(str(decode_description(sent)["path"])).name

    first = file_of(pool.pack([b"v", b"t", b"{}", large], first=3))
    second = file_of(pool.pack([b"v", b"t", b"{}", large], first=3))
    assert first != second  # the first one is still lent
    pool.released([first, "not-ours"])
    assert file_of(pool.pack([b"v", b"t", b"{}", large], first=3)) == first
    assert pool.pack([b"v", b"t", b"{}", b"small"], first=3) == [b"v", b"t", b"{}", b"small"]
    monkeypatch.setattr(shared_frames, "FREE_FILES_KEPT", 1)
    pool.released([first, second])
    assert len(list(tmp_path.iterdir())) == 1
    pool.close()
    assert list(tmp_path.iterdir()) == []


def decode_description(sent: list[Any]) -> dict[str, Any]:
    import json

    assert sent[0] == shared_frames.MARK
    description: dict[str, Any] = json.loads(sent[1])
    return description


def test_without_a_usable_folder_large_frames_go_through_the_socket(tmp_path: Path) -> None:
    frames = [b"v", b"t", b"{}", bytes(shared_frames.SHARED_OVER)]
    sent, path = shared_frames.pack(frames, str(tmp_path / "missing"), first=3)
    assert path is None
    message, _ = shared_frames.unpack(sent, str(tmp_path / "missing"), remove=True)
    assert message == frames


@pytest.fixture
def executor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ExecutorLink, ExecutorProcess]]:
    monkeypatch.chdir(tmp_path)  # where its cells run
    context = zmq.Context()
    link = ExecutorLink(context, ExecutorOptions(gpu="off"))
    try:
        process = link.spawn()
        link.wait_ready(process, ANSWER_S)
        yield link, process
    finally:
        link.close()
        context.term()


_jobs = itertools.count()


def _run(link: ExecutorLink, process: ExecutorProcess, code: str, values: dict[str, Any],
         outputs: list[str]) -> dict[str, Any]:
    """Hand the executor a cell as the supervisor does; the values it returns."""
    job = f"copies-{next(_jobs)}"
    packed = serialization.pack(values)
    process.send(encode(T.SUBMIT, {"job": job, "kind": "code", "code": code, "outputs": outputs,
                                   **packed.header()}, packed.frames))
    deadline = time.monotonic() + ANSWER_S
    while time.monotonic() < deadline:
        assert process.died() is None, f"the executor {process.died()}"
        if not link.socket.poll(100):
            continue
        received = link.receive(link.socket.recv_multipart(copy=False))
        if received is None or (msg := received[1]) is None or msg.header.get("job") != job:
            continue
        assert msg.type is T.RESULT, msg.header
        if link.socket.poll(NOTE_S * 1000):  # which files it let go of and holds, once the job's inputs are gone
            assert link.receive(link.socket.recv_multipart(copy=False)) in (None, (process, None))
        return serialization.unpack(msg.header, msg.buffers)
    raise AssertionError(f"no answer within {ANSWER_S:g} s")


WHERE_IS_A = """
import mmap
start = A.ctypes.data
maps = open("/proc/self/maps").read().splitlines()
where = [line.split()[-1] for line in maps
         if int(line.split()[0].split("-")[0], 16) <= start < int(line.split()[0].split("-")[1], 16)]
where = where[0] if where else ""
aligned = start % 4096
total = float(A.sum())
"""


NO_SHARED_MEMORY = shared_frames.shared_memory_root() is None


@pytest.mark.skipif(NO_SHARED_MEMORY or not Path("/proc/self/maps").exists(),
                    reason="needs /dev/shm and reads /proc/self/maps (Linux)")
def test_the_executor_computes_over_the_shared_file_and_reuses_it(
        executor: tuple[ExecutorLink, ExecutorProcess]) -> None:
    link, process = executor
    array = np.random.default_rng(3).standard_normal(1_000_003)
    files = set()
    for _ in range(3):
        got = _run(link, process, WHERE_IS_A, {"A": array}, ["where", "aligned", "total"])
        assert got["aligned"] == 0
        assert Path(got["where"].removesuffix(" (deleted)")).parent == Path(str(link.frames_folder)), got["where"]
        assert got["total"] == float(array.sum())  # bit for bit
        files.add(got["where"])
    assert len(files) <= 2  # the pool writes the next job's frames over a file the executor let go of


@pytest.mark.skipif(NO_SHARED_MEMORY, reason="large frames go through shared memory only where /dev/shm is")
def test_large_results_come_back_through_shared_memory_and_their_files_go(
        executor: tuple[ExecutorLink, ExecutorProcess]) -> None:
    link, process = executor
    assert link.frames_folder is not None
    array = np.arange(400_000, dtype=np.float64)
    got = _run(link, process, "B = A * 2\nA[0] = 7.0", {"A": array}, ["A", "B"])
    assert np.array_equal(got["B"], array * 2) and got["A"][0] == 7.0 and array[0] == 0.0
    assert [name.name for name in Path(link.frames_folder).iterdir()
            if name.name.startswith(f"frames-{process.process.pid}-")] == []  # results' files are removed


def test_a_cached_input_through_a_real_worker_is_the_notebooks_bit_for_bit(worker: WorkerProcess) -> None:
    array = np.random.default_rng(4).standard_normal(2_000_001).astype(np.float32)
    with remote_magic.connect(worker.token) as client:
        for _ in range(3):  # the second and third cross the link as digests
            got = client.run("s = float(A.sum())\nB = A[::-1].copy()", {"A": array}, ["s", "B"])
            assert got["s"] == float(array.sum())
            assert np.array_equal(got["B"], array[::-1])
            assert got["B"].ctypes.data % serialization.BUFFER_ALIGNMENT == 0


def test_a_killed_workers_shared_folder_is_removed(tmp_path: Path) -> None:
    root = shared_frames.shared_memory_root()
    if root is None:
        pytest.skip("no shared-memory folder here")

    left = root / f"{TEMP_PREFIX}{2**22 + 12345}-x"  # a pid above the default pid_max: no such process
    left.mkdir()
    assert left in remove_abandoned_dirs()
    assert not left.exists()
