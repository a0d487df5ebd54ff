"""Files: the notice after a cell that wrote some, and %offload_get / %offload_put, against a real
remote-worker running in a folder of its own and a real IPython shell."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Iterator

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

import remote_magic
from support import WorkerProcess, connected_shell, run, start_worker

BIG = 20 * 2**20 + 12345  # more than two chunks, and not a whole number of them


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The worker's working directory, where its cells run."""
    return tmp_path_factory.mktemp("worker-folder")


@pytest.fixture(scope="module")
def files_worker(tmp_path_factory: pytest.TempPathFactory, folder: Path) -> Iterator[WorkerProcess]:
    w = start_worker(tmp_path_factory.mktemp("files-worker"), "--listen", "127.0.0.1:0", "--gpu", "off",
                     "--name", "box", cwd=folder)
    yield w
    w.stop()


@pytest.fixture
def shell(files_worker: WorkerProcess) -> Iterator[InteractiveShell]:
    with connected_shell(files_worker.token) as (ip, _):
        yield ip


@pytest.fixture
def client(files_worker: WorkerProcess) -> Iterator[remote_magic.Client]:
    with remote_magic.connect(files_worker.token, timeout=10) as c:
        yield c


def notices(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("remote-magic:")]


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def leftovers(root: Path) -> list[str]:
    return [p.name for p in root.rglob("*") if ".rmpart-" in p.name]


# -- the notice ------------------------------------------------------------------------------

def test_a_cell_that_writes_files_says_so_in_one_line(shell: InteractiveShell, folder: Path) -> None:
    result, out = run(shell, "%%offload\nimport os\nopen('out.csv', 'w').write('a,b\\n1,2\\n')\n"
                             "open('model.pt', 'wb').write(os.urandom(2_500_000))\nx = 1")
    assert result.success, result.error_in_exec
    assert notices(out.stderr) == ["remote-magic: files written on worker 'box' while the cell ran: model.pt (2.5 MB), "
                                   "out.csv — they are there, not here: %offload_get model.pt copies one here"]
    assert (folder / "out.csv").read_text() == "a,b\n1,2\n"


def test_a_cell_that_writes_nothing_says_nothing(shell: InteractiveShell, folder: Path) -> None:
    (folder / "kept.txt").write_text("already there")
    result, out = run(shell, "%%offload\ntext = open('kept.txt').read()")
    assert result.success and shell.user_ns["text"] == "already there"
    assert notices(out.stderr) == []


def test_changing_and_deleting_files_is_noticed(shell: InteractiveShell, folder: Path) -> None:
    (folder / "log.txt").write_text("one\n")
    (folder / "old.tmp").write_text("x")
    result, out = run(shell, "%%offload\nopen('log.txt', 'a').write('two\\n')\nimport os\nos.remove('old.tmp')")
    assert result.success, result.error_in_exec
    assert notices(out.stderr) == ["remote-magic: files written on worker 'box' while the cell ran: log.txt; deleted: "
                                   "old.tmp — they are there, not here: %offload_get log.txt copies one here"]


def test_many_files_are_counted_and_subfolders_named(shell: InteractiveShell) -> None:
    result, out = run(shell, "%%offload\nimport os\nos.makedirs('many', exist_ok=True)\n"
                             "for i in range(12):\n    open(f'many/f{i:02}.txt', 'w').write(str(i))")
    assert result.success, result.error_in_exec
    [line] = notices(out.stderr)
    assert "on worker 'box' while the cell ran: many/f00.txt, many/f01.txt, many/f02.txt and 9 more —" in line


def test_a_cell_that_wrote_a_file_then_raised_still_says_so(shell: InteractiveShell) -> None:
    result, out = run(shell, "%%offload\nopen('partial.txt', 'w').write('half')\nraise ValueError('then failed')")
    assert isinstance(result.error_in_exec, remote_magic.RemoteError)
    assert notices(out.stderr) == ["remote-magic: files written on worker 'box' while the cell ran: partial.txt — they "
                                   "are there, not here: %offload_get partial.txt copies one here"]


def test_files_are_compared_in_the_folder_the_cell_started_in(client: remote_magic.Client, folder: Path) -> None:
    result = client.execute("import os\nos.makedirs('sub', exist_ok=True)\nos.chdir('sub')\n"
                            "open('inside.txt', 'w').write('x')\nos.chdir('..')")
    assert result.files is not None and result.files.folder == str(folder)
    assert result.files.written == {"sub/inside.txt": 1} and result.files.worker == "box"
    assert client.execute("y = 2").files is None


# -- copying ---------------------------------------------------------------------------------

def test_put_and_get_a_folder_tree_byte_for_byte(shell: InteractiveShell, folder: Path, tmp_path: Path) -> None:
    source = tmp_path / "data"
    (source / "nested" / "deeper").mkdir(parents=True)
    (source / "empty-folder").mkdir()
    (source / "big.bin").write_bytes(os.urandom(BIG))
    (source / "empty.txt").write_bytes(b"")
    (source / "nested" / "small.csv").write_text("a,b\n")
    (source / "nested" / "deeper" / "z.bin").write_bytes(os.urandom(1000))
    result, out = run(shell, f"%offload_put {source} uploaded")
    assert result.success, result.error_in_exec
    assert "Copied data (4 files, 21.0 MB) to worker 'box' at " + str(folder / "uploaded") in out.stdout
    assert tree(folder / "uploaded") == tree(source) and (folder / "uploaded" / "empty-folder").is_dir()
    result, out = run(shell, f"%offload_get uploaded {tmp_path / 'back'}")
    assert result.success, result.error_in_exec
    assert tree(tmp_path / "back") == tree(source) and (tmp_path / "back" / "empty-folder").is_dir()
    assert leftovers(folder) == [] and leftovers(tmp_path) == []


def test_put_and_get_a_file_with_a_progress_bar(shell: InteractiveShell, folder: Path, tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(BIG))
    result, out = run(shell, f"%offload_put {big}")  # an absolute path goes to its name in the worker's folder
    assert result.success, result.error_in_exec
    assert (folder / "big.bin").read_bytes() == big.read_bytes()
    assert "big.bin: 100%" in out.stderr and "21.0M/21.0M" in out.stderr and "B/s]" in out.stderr
    result, out = run(shell, f"%offload_get big.bin {tmp_path / 'copy.bin'}")
    assert result.success, result.error_in_exec
    assert (tmp_path / "copy.bin").read_bytes() == big.read_bytes()
    assert "copy.bin: 100%" in out.stderr and "Copied big.bin (21.0 MB) from worker 'box'" in out.stdout


def test_a_small_copy_shows_no_progress_bar(client: remote_magic.Client, folder: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    (folder / "tiny.txt").write_text("tiny")
    copied = client.get_file("tiny.txt", tmp_path / "tiny.txt")
    assert (tmp_path / "tiny.txt").read_text() == "tiny"
    assert copied.bytes == 4 and copied.files == 1 and copied.worker == "box"
    assert copied.source == str(folder / "tiny.txt") and copied.destination == str(tmp_path / "tiny.txt")
    assert "%|" not in capsys.readouterr().err


def test_a_relative_path_keeps_its_name_on_the_other_side(client: remote_magic.Client, folder: Path,
                                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("from the notebook")
    client.put_file("notes/a.txt")
    assert (folder / "notes" / "a.txt").read_text() == "from the notebook"
    (folder / "notes" / "a.txt").write_text("changed on the worker")
    client.get_file("notes/a.txt", overwrite=True)
    assert (tmp_path / "notes" / "a.txt").read_text() == "changed on the worker"


def test_mistakes_say_what_to_do(shell: InteractiveShell, folder: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=f"{folder / 'no-such.csv'} does not exist on the worker .*check the name"):
        shell.run_line_magic("offload_get", "no-such.csv")
    with pytest.raises(UsageError, match=f"{tmp_path / 'missing.txt'} does not exist here"):
        shell.run_line_magic("offload_put", str(tmp_path / "missing.txt"))
    (folder / "there.txt").write_text("on the worker")
    (tmp_path / "there.txt").write_text("here")
    with pytest.raises(UsageError, match=f"{tmp_path / 'there.txt'} already exists here .*--force"):
        shell.run_line_magic("offload_get", f"there.txt {tmp_path / 'there.txt'}")
    with pytest.raises(UsageError, match=f"{folder / 'there.txt'} already exists on the worker .*--force"):
        shell.run_line_magic("offload_put", str(tmp_path / "there.txt"))
    assert (folder / "there.txt").read_text() == "on the worker" and (tmp_path / "there.txt").read_text() == "here"
    with capture_output():
        shell.run_line_magic("offload_put", f"{tmp_path / 'there.txt'} --force")
    assert (folder / "there.txt").read_text() == "here"
    with pytest.raises(remote_magic.NoSuchWorker, match="no worker is named 'nobody'"):
        shell.run_line_magic("offload_get", "there.txt --worker nobody")


def test_a_failed_get_leaves_nothing_under_the_final_name(client: remote_magic.Client, folder: Path,
                                                          tmp_path: Path) -> None:
    """The folder's second file says it is empty but reads as text (a /proc file): its digest differs."""
    (folder / "mixed").mkdir()
    (folder / "mixed" / "a.bin").write_bytes(os.urandom(3 * 2**20))
    (folder / "mixed" / "z_status").symlink_to("/proc/self/status")
    with pytest.raises(remote_magic.FileTransferError, match="z_status arrived with different contents"):
        client.get_file("mixed", tmp_path / "mixed")
    assert not (tmp_path / "mixed").exists() and leftovers(tmp_path) == []


def test_a_failed_put_leaves_nothing_under_the_final_name(client: remote_magic.Client, folder: Path,
                                                          tmp_path: Path) -> None:
    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "a.bin").write_bytes(os.urandom(3 * 2**20))
    (tmp_path / "mixed" / "z_status").symlink_to("/proc/self/status")
    with pytest.raises(remote_magic.FileTransferError, match="z_status changed while it was being copied"):
        client.put_file(tmp_path / "mixed", "mixed-put")
    assert not (folder / "mixed-put").exists() and leftovers(folder) == []


def test_ctrl_c_during_a_put_leaves_nothing_under_the_final_name(client: remote_magic.Client, folder: Path,
                                                                 tmp_path: Path) -> None:
    """A real SIGINT once the progress bar shows part of the copy done."""
    (tmp_path / "large.bin").write_bytes(os.urandom(64 * 2**20))

    class InterruptMidway:
        def __init__(self) -> None:
            self.text = ""
            self.sent = False

        def write(self, text: str) -> int:
            self.text += text
            if not self.sent and any(f" {p}%|" in text for p in range(1, 100)):
                self.sent = True
                os.kill(os.getpid(), signal.SIGINT)
            return len(text)

        def flush(self) -> None:
            pass

    trigger = InterruptMidway()
    saved, sys.stderr = sys.stderr, trigger  # type: ignore[assignment]
    try:
        with pytest.raises(KeyboardInterrupt):
            client.put_file(tmp_path / "large.bin", "large.bin", progress=True)
    finally:
        sys.stderr = saved
    assert trigger.sent
    assert not (folder / "large.bin").exists() and leftovers(folder) == []
    client.put_file(tmp_path / "large.bin", "large.bin", progress=False)  # the next copy works
    assert (folder / "large.bin").stat().st_size == 64 * 2**20
