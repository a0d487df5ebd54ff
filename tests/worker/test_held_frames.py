"""A large input sent again unchanged is not handed to the executor again (issue 21, "a cached input"): the
executor keeps its last job's large inputs mapped (worker/held_frames.py), the supervisor names them by
digest (worker/shared_frames.py); and never does a cell get a stale or shared value from that: an input
changed in the notebook, changed in place by a cell, or kept by one, is handed over afresh."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import remote_magic
from remote_magic.wire.frame_cache import digest
from remote_magic.worker import held_frames, shared_frames
from remote_magic.worker.held_frames import HeldFrames
from support import WorkerProcess

HEADER = [b"v", b"t", b"{}"]  # an encoded message's first frames: the large ones follow
LARGE = shared_frames.SHARED_OVER // 8 + 5  # float64 elements: a frame that goes through a shared file
NO_PAGEMAP = not Path(held_frames.PAGEMAP).exists()


class Executor:
    """The two ends of a supervisor's pool and an executor's frames, in this process."""

    def __init__(self, folder: Path) -> None:
        self.folder = str(folder)
        self.pool = shared_frames.FramePool(self.folder)
        self.held = HeldFrames()
        self.released = shared_frames.Released()

    def hand(self, *arrays: np.ndarray) -> tuple[dict[str, Any], list[Any]]:
        """A job with these large frames, as the supervisor sends it: (its description, the frames as the
        executor gets them)."""
        frames = [*HEADER, *arrays]
        sent = self.pool.pack(frames, 3, {3 + i: digest(array) for i, array in enumerate(arrays)})
        assert sent[0] == shared_frames.MARK
        description = json.loads(sent[1])
        message, _ = shared_frames.unpack(sent, self.folder, remove=False, released=self.released, held=self.held)
        return description, message[3:]

    def settle(self) -> list[tuple[str, str]] | None:
        """After the job, its objects gone: what the executor tells the supervisor."""
        held = self.held.settle()
        self.pool.told(shared_frames.Note(self.released.take(), held))
        return held


def _array(frame: Any) -> np.ndarray:
    return np.frombuffer(frame, np.float64)


def test_a_frame_sent_again_unchanged_is_named_by_its_digest_and_read_from_the_same_pages(tmp_path: Path) -> None:
    executor = Executor(tmp_path)
    a = np.random.default_rng(1).standard_normal(LARGE)
    description, (frame,) = executor.hand(a)
    assert "path" in description and "held" not in description
    address = _array(frame).ctypes.data
    del frame
    assert not executor.pool.settled  # it gets no job until it says what it holds
    assert executor.settle() == [(digest(a), Path(description["path"]).name)]
    assert executor.pool.settled
    description, (frame,) = executor.hand(a)
    assert description == {"released": [], "held": {"3": digest(a)}}  # nothing written, nothing to map
    again = _array(frame)
    assert again.ctypes.data == address and np.array_equal(again, a)
    again[0] = 7.0  # the job's own pages, as for any input
    del again, frame
    assert executor.settle() == []  # changed: not held, and its file released
    assert "path" in executor.hand(a)[0]  # so the next job gets it written


@pytest.mark.skipif(NO_PAGEMAP, reason="reads /proc/self/pagemap (Linux)")
def test_a_frame_whose_page_a_cell_wrote_back_as_it_was_is_not_held_where_pages_are_read(tmp_path: Path) -> None:
    executor = Executor(tmp_path)
    a = np.arange(LARGE, dtype=np.float64)
    _, (frame,) = executor.hand(a)
    array = _array(frame)
    array[-1] = array[-1]  # the same bytes, on a page of the job's own now
    del array, frame
    assert executor.settle() == []


def test_without_pagemap_frames_are_held_when_their_bytes_hash_to_their_digest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(held_frames.Pages, "unchanged", lambda self, address, length: None)
    executor = Executor(tmp_path)
    a, b = np.arange(LARGE, dtype=np.float64), np.ones(LARGE)
    _, (kept, changed) = executor.hand(a, b)
    _array(kept)[-1] = _array(kept)[-1]
    _array(changed)[0] = 3.0
    del kept, changed
    assert [key for key, _ in executor.settle() or []] == [digest(a)]
    assert executor.hand(a, b)[0]["held"] == {"3": digest(a)}


def test_an_input_a_cell_kept_is_not_held_and_shares_no_pages_with_the_next_jobs(tmp_path: Path) -> None:
    executor = Executor(tmp_path)
    a = np.random.default_rng(2).standard_normal(LARGE)
    description, (frame,) = executor.hand(a)
    kept = _array(frame)[10:20]  # a view the session keeps (a module global, a --keep value)
    del frame
    assert executor.settle() == []
    _, (frame,) = executor.hand(a)
    _array(frame)[10] = -1.0
    assert kept[0] == a[10]  # the next job's input is its own
    del frame
    executor.settle()
    del kept
    assert executor.released.take() == [Path(description["path"]).name]  # its file goes once the view does


def test_a_held_file_the_next_job_does_not_use_is_written_over_and_released_once_unmapped(tmp_path: Path) -> None:
    executor = Executor(tmp_path)
    a, b = np.zeros(LARGE), np.ones(LARGE)
    first, (frame,) = executor.hand(a)
    del frame
    executor.settle()
    second, (frame,) = executor.hand(b)  # no free file: the one held for `a`, which this job doesn't use
    assert second["path"] == first["path"]
    assert np.array_equal(_array(frame), b)
    assert executor.released.take() == []  # the held mapping went, this job's maps the file still
    del frame
    assert executor.settle() == [(digest(b), Path(first["path"]).name)]
    assert "held" not in executor.hand(a)[0]  # `a` is no longer held: written again


def test_a_job_without_large_frames_leaves_what_is_held(tmp_path: Path) -> None:
    executor = Executor(tmp_path)
    a = np.zeros(LARGE)
    _, (frame,) = executor.hand(a)
    del frame
    executor.settle()
    sent = executor.pool.pack([*HEADER, b"small"], 3, {})
    assert sent == [*HEADER, b"small"]  # as it is: nothing to say, and nothing to wait for after
    assert executor.pool.settled and executor.held.settle() is None
    assert executor.hand(a)[0]["held"] == {"3": digest(a)}


def test_a_job_naming_a_frame_not_held_gets_an_empty_frame_and_is_refused(tmp_path: Path) -> None:
    executor = Executor(tmp_path)
    a = np.zeros(LARGE)
    sent = [shared_frames.MARK, json.dumps({"released": [], "held": {"3": digest(a)}}).encode(),
            *HEADER, b""]
    message, _ = shared_frames.unpack(sent, executor.folder, remove=False, released=executor.released,
                                      held=executor.held)
    assert message[3] == b"" and executor.held.missing == [digest(a)]
    assert executor.held.settle() == [] and executor.held.missing == []  # said after it, as after any such job


@pytest.mark.skipif(NO_PAGEMAP, reason="reads /proc/self/pagemap (Linux)")
def test_an_inputs_stand_in_is_the_same_until_the_cell_writes_its_pages(tmp_path: Path) -> None:
    executor = Executor(tmp_path)
    _, (frame,) = executor.hand(np.arange(LARGE, dtype=np.float64))
    array = _array(frame)
    before = executor.held.stand_in(memoryview(array).cast("B"))
    assert before is not None and executor.held.stand_in(memoryview(array).cast("B")) == before
    assert executor.held.stand_in(memoryview(np.arange(LARGE, dtype=np.float64)).cast("B")) is None  # not an input
    array[5] = 0.5
    assert executor.held.stand_in(memoryview(array).cast("B")) is None  # its bytes are hashed then


# -- through a real worker -------------------------------------------------------------------

def test_an_input_changed_in_the_notebook_between_cells_arrives_changed(worker: WorkerProcess) -> None:
    a = np.random.default_rng(5).standard_normal(LARGE)
    with remote_magic.connect(worker.token) as client:
        for _ in range(3):  # the later ones: the hub and the executor hold it
            assert client.run("s = float(A.sum())", {"A": a}, ["s"])["s"] == float(a.sum())
        a[7] += 1.0  # in the notebook
        got = client.run("s = float(A.sum())\nfirst = A[:10].copy()", {"A": a}, ["s", "first"])
        assert got["s"] == float(a.sum()) and np.array_equal(got["first"], a[:10])


@pytest.mark.skipif(NO_PAGEMAP, reason="counts page faults (Linux)")
def test_an_input_sent_again_unchanged_is_read_from_pages_the_executor_has_mapped(worker: WorkerProcess) -> None:
    a = np.random.default_rng(7).standard_normal(2_000_000)  # 16 MB: 256 faults at least to map it anew
    cell = ("import resource\nbefore = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\ns = float(A.sum())\n"
            "faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before")
    with remote_magic.connect(worker.token) as client:
        first = client.run(cell, {"A": a}, ["s", "faults"])
        again = [client.run(cell, {"A": a}, ["s", "faults"]) for _ in range(2)]
    assert first["faults"] >= 200, first
    assert [got["faults"] < 50 for got in again] == [True, True], again
    assert all(got["s"] == float(a.sum()) for got in [first, *again])


def test_an_input_a_cell_changed_in_place_without_saying_is_handed_over_again(worker: WorkerProcess) -> None:
    a = np.arange(LARGE, dtype=np.float64)
    with remote_magic.connect(worker.token) as client:
        client.run("s = float(A.sum())", {"A": a}, ["s"])
        client.run("A[:100] = -1.0\ns = 0", {"A": a}, ["s"])  # not asked for: the notebook's `a` stays
        assert client.run("s = float(A.sum())", {"A": a}, ["s"])["s"] == float(a.sum())


def test_a_cell_that_keeps_its_input_shares_no_memory_with_later_cells_inputs(worker: WorkerProcess) -> None:
    a = np.ones(LARGE)
    with remote_magic.connect(worker.token) as client:
        client.run("import builtins\nbuiltins.kept_input = A\ns = 0", {"A": a}, ["s"])
        client.run("A[0] = 99.0\ns = 0", {"A": a}, ["s"])
        assert client.run("import builtins\nfirst = float(builtins.kept_input[0])", {}, ["first"])["first"] == 1.0
        client.run("import builtins\ndel builtins.kept_input", {}, [])


def test_a_cell_that_changes_a_held_input_in_place_sends_it_back(worker: WorkerProcess) -> None:
    a = np.zeros(LARGE)
    with remote_magic.connect(worker.token) as client:
        assert client.run("s = float(A.sum())", {"A": a}) == {"s": 0.0}  # tracked: A unchanged, not sent back
        assert client.run("s = float(A.sum())", {"A": a}) == {"s": 0.0}  # (held now)
        got = client.run("A[3] = 2.0", {"A": a})
        assert list(got) == ["A"] and got["A"][3] == 2.0


def test_jobs_sent_together_with_the_same_input_each_get_it(worker: WorkerProcess) -> None:
    a = np.random.default_rng(6).standard_normal(LARGE)
    with remote_magic.connect(worker.token) as client:
        futures = [client.submit(np.sum, a) for _ in range(6)]  # queued at the worker behind each other
        assert [future.result(timeout=60) for future in futures] == [np.sum(a)] * 6
