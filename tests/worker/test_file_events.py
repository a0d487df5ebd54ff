"""The files a cell writes, found from file events (worker/workdir.py, worker/inotify.py): the same
report as scanning the folder before and after the cell, at a cost that doesn't grow with the folder;
and scanning where the folder can't be watched."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

import remote_magic
from remote_magic.worker import inotify, workdir
from support import WorkerProcess, start_worker

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The working directory, with a few files (and tmp_path/outside beside it, for what leaves it)."""
    root = tmp_path / "cwd"
    (root / "data").mkdir(parents=True)
    (root / "kept.txt").write_text("kept")
    (root / "old.txt").write_text("old")
    (root / "data" / "a.csv").write_text("1,2")
    (root / ".git").mkdir()
    monkeypatch.chdir(root)
    return root


def write(path: str, text: str = "x") -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)


STEPS: list[Callable[[], Any]] = [
    lambda: None,
    lambda: write("new.txt", "hello"),
    lambda: (write("kept.txt", "changed, longer"), os.remove("old.txt")),
    lambda: write("deep/er/still/f.bin", "123"),
    lambda: shutil.rmtree("deep"),
    lambda: os.rename("data", "moved"),
    lambda: os.rename("moved/a.csv", "b.csv"),
    lambda: (write("gone.tmp"), os.remove("gone.tmp")),  # made and removed: nothing
    lambda: (write(".git/objects/x"), write("__pycache__/m.pyc")),  # never looked at
    lambda: os.utime("kept.txt", ns=(1, 1)),  # touched: written, as a scan sees it
    lambda: os.chmod("kept.txt", 0o600),  # mode only: nothing
    lambda: subprocess.run([sys.executable, "-c", "open('moved/by_child.txt', 'w').write('child')"], check=True),
    lambda: os.symlink("kept.txt", "link"),  # not a regular file: nothing
    lambda: [write(f"tree/{i}/{j}/f.txt") for i in range(3) for j in range(3)],
    lambda: (shutil.rmtree("tree"), write("tree/0/again.txt")),  # removed, and made again
    lambda: os.rename("tree", "../outside"),  # moved out: its files are gone from here
    lambda: write("../outside/0/later.txt"),  # and what is written there since is not seen
]


@pytest.mark.parametrize("events", [True, False], ids=["inotify", "without"])
def test_each_step_is_reported_as_scanning_before_and_after_says(folder: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 events: bool) -> None:
    if not events:
        def no_inotify(self: inotify.Inotify) -> None:
            raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))
        monkeypatch.setattr(inotify.Inotify, "__init__", no_inotify)
    watched = workdir.WorkingDirectory()
    try:
        for step in STEPS:
            before = workdir.scan(str(folder))
            watched.cell_starts()
            step()
            assert watched.cell_ended() == workdir.changes(before, workdir.scan(str(folder))), step
        assert watched._watch is not None and watched._watch.watching is events
    finally:
        watched.close()


def test_the_folder_is_scanned_once_not_per_cell(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scans = []
    real_scan = workdir.scan
    monkeypatch.setattr(workdir, "scan", lambda *args, **kwargs: scans.append(args) or real_scan(*args, **kwargs))
    watched = workdir.WorkingDirectory()
    try:
        for i in range(5):
            watched.cell_starts()
            write(f"f{i}")
            assert watched.cell_ended() == {"root": str(folder), "written": [[f"f{i}", 1]], "written_count": 1,
                                            "deleted": [], "deleted_count": 0, "complete": True}
        assert len(scans) == 1
        os.mkdir("sub")
        os.chdir("sub")  # a cell that starts elsewhere: that folder is watched instead
        watched.cell_starts()
        write("inside")
        assert watched.cell_ended()["written"] == [["inside", 1]]  # type: ignore[index]
        assert len(scans) == 2 and watched._watch is not None and watched._watch.root == str(folder / "sub")
    finally:
        watched.close()


def test_what_is_written_between_cells_by_a_copy_or_another_program_is_not_the_next_cells(folder: Path) -> None:
    watched = workdir.WorkingDirectory()
    try:
        watched.cell_starts()
        assert watched.cell_ended() is None
        write("put.txt")  # as %offload_put does, between two cells
        # Another program writes there between two cells (before: taken for the next cell's).
        subprocess.run([sys.executable, "-c", "open('theirs.txt', 'w').write('x')"], check=True)
        watched.cell_starts()
        assert watched.cell_ended() is None
        watched.cell_starts()
        write("mine.txt")
        assert watched.cell_ended()["written"] == [["mine.txt", 1]]  # type: ignore[index]
    finally:
        watched.close()


def test_lost_events_mean_one_scan_and_the_same_report(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    watched = workdir.WorkingDirectory()
    try:
        watched.cell_starts()
        write("one.txt")
        os.remove("old.txt")
        real_read = inotify.Inotify.read
        overflowed = [[inotify.Event(-1, inotify.IN_Q_OVERFLOW, "")]]  # the kernel dropped events
        monkeypatch.setattr(inotify.Inotify, "read", lambda self: overflowed.pop() if overflowed else real_read(self))
        assert watched.cell_ended() == {"root": str(folder), "written": [["one.txt", 1]], "written_count": 1,
                                        "deleted": ["old.txt"], "deleted_count": 1, "complete": True}
        watched.cell_starts()
        write("two.txt")
        assert watched.cell_ended()["written"] == [["two.txt", 1]]  # type: ignore[index]
    finally:
        watched.close()


def test_a_folder_past_the_watch_limit_is_scanned_and_said_once(folder: Path, monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    def no_watches_left(self: inotify.Inotify, path: str, mask: int = 0) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    monkeypatch.setattr(inotify.Inotify, "add_watch", no_watches_left)
    watched = workdir.WorkingDirectory()
    with caplog.at_level(logging.WARNING, logger=workdir.__name__):
        for name in ("a.txt", "b.txt"):
            watched.cell_starts()
            write(f"data/{name}")
            assert watched.cell_ended()["written"] == [[f"data/{name}", 1]]  # type: ignore[index]
    assert watched._watch is not None and not watched._watch.watching
    [warning] = [record.getMessage() for record in caplog.records]
    assert "scans" in warning and "max_user_watches" in warning


def test_a_folder_a_cell_makes_past_the_watch_limit_is_found_by_a_scan(
        folder: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    watched = workdir.WorkingDirectory()
    try:
        watched.cell_starts()
        assert watched.cell_ended() is None

        def no_watches_left(self: inotify.Inotify, path: str, mask: int = 0) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

        monkeypatch.setattr(inotify.Inotify, "add_watch", no_watches_left)
        with caplog.at_level(logging.WARNING, logger=workdir.__name__):
            watched.cell_starts()
            write("made/here.txt")
            assert watched.cell_ended()["written"] == [["made/here.txt", 1]]  # type: ignore[index]
            watched.cell_starts()
            os.remove("made/here.txt")
            assert watched.cell_ended()["deleted"] == ["made/here.txt"]  # type: ignore[index]
        assert watched._watch is not None and not watched._watch.watching  # scanned from then on
        [warning] = [record.getMessage() for record in caplog.records]
        assert "scans" in warning and "max_user_watches" in warning
    finally:
        watched.close()


# -- through a real worker -------------------------------------------------------------------

@pytest.fixture(scope="module")
def worker_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("watched-folder")
    (folder / "old.txt").write_text("old")
    return folder


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory, worker_folder: Path) -> Iterator[remote_magic.Client]:
    w: WorkerProcess = start_worker(tmp_path_factory.mktemp("events-worker"), "--listen", "127.0.0.1:0",
                                    "--gpu", "off", "--name", "box", cwd=worker_folder)
    try:
        with remote_magic.connect(w.token, timeout=10) as c:
            yield c
    finally:
        w.stop()


def test_a_cells_files_reach_the_notebook(client: remote_magic.Client, worker_folder: Path) -> None:
    assert client.execute("x = 1").files is None
    result = client.execute(
        "import os, subprocess, sys\n"
        "open('top.txt', 'w').write('top')\n"
        "os.makedirs('nested/deeper')\n"
        "open('nested/deeper/inner.bin', 'wb').write(b'12345')\n"
        "subprocess.run([sys.executable, '-c', \"open('nested/child.txt', 'w').write('from a child')\"], check=True)\n"
        "os.remove('old.txt')")
    files = result.files
    assert files is not None and files.folder == str(worker_folder) and files.worker == "box"
    assert files.written == {"nested/child.txt": 12, "nested/deeper/inner.bin": 5, "top.txt": 3}
    assert files.deleted == ["old.txt"] and (files.written_count, files.deleted_count) == (3, 1) and files.complete
    moved = client.execute("import os\nos.chdir('nested')\nopen('here.txt', 'w').write('h')\nos.chdir('..')").files
    assert moved is not None and moved.written == {"nested/here.txt": 1}
    assert client.execute("y = 2").files is None
