"""Roles hold: no credential of the worker's reaches a job or a kernel, the ngrok auth token stays off the
command line, a worker's folder listing writes nothing outside the destination, kernels are bounded.

Real `remote-worker` processes on 127.0.0.1; kernels are started by a real ``jupyter_client.KernelManager``
from a kernelspec installed by `remote-worker kernelspec install`, as in test_kernel_provider.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any, Iterator

import psutil
import pytest
from jupyter_client import BlockingKernelClient, KernelManager

import remote_magic
from remote_magic import file_copy
from remote_magic.errors import FileTransferError
from remote_magic.wire.filetree import checked_listing, inside
from support import WorkerProcess, start_worker, wait_for

SECRETS = {"REMOTE_MAGIC_JOIN_TOKEN": "rmw1.join-secret", "NGROK_AUTHTOKEN": "ngrok-secret",
           "REMOTE_MAGIC_TOKEN": "rmc1.client-secret"}
KERNEL = "remote-magic-roles"
TIMEOUT = 30
HOG = "import time; x = bytes(range(256)) * (1 << 21); time.sleep(600)"
"""512 MiB, resident, then waits."""


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    """A worker with credentials in its environment, at most one kernel and 300 MiB for jobs and kernels."""
    w = start_worker(tmp_path_factory.mktemp("guarded"), "--listen", "127.0.0.1:0", "--gpu", "off",
                     "--max-memory", "300M", "--max-jupyter-kernels", "1", "--name", "guarded", env=SECRETS)
    yield w
    w.stop()


@pytest.fixture(scope="module")
def kernelspec(guarded: WorkerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data = tmp_path_factory.mktemp("jupyter")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JUPYTER_DATA_DIR", str(data))
        patch.setenv("JUPYTER_PATH", str(data))
        subprocess.run(["remote-worker", "kernelspec", "install", "--name", KERNEL, "--token-file",
                        str(guarded.token_file)], check=True, capture_output=True, timeout=60)
        yield KERNEL


def _start(name: str) -> tuple[KernelManager, BlockingKernelClient]:
    km = KernelManager(kernel_name=name)
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=TIMEOUT)
    return km, kc


def _stop(km: KernelManager, kc: BlockingKernelClient) -> None:
    kc.stop_channels()
    if km.has_kernel:
        km.shutdown_kernel(now=True)


def _printed(kc: BlockingKernelClient, code: str) -> str:
    printed: list[str] = []

    def output(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            printed.append(msg["content"]["text"])

    reply = kc.execute_interactive(code, timeout=TIMEOUT, output_hook=output)
    assert reply["content"]["status"] == "ok", printed
    return "".join(printed)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# -- credentials ---------------------------------------------------------------------------------

CREDENTIALS_SEEN = ("import os, subprocess\n"
                    "seen = sorted(k for k in os.environ if k in NAMES or any(v in os.environ[k] for v in VALUES))\n"
                    "child = subprocess.run(['env'], capture_output=True, text=True).stdout\n"
                    "in_child = sorted(v for v in VALUES if v in child)\n")


def test_a_job_sees_none_of_the_workers_credentials(guarded: WorkerProcess) -> None:
    with remote_magic.connect(guarded.token, timeout=10) as client:
        found = client.run(CREDENTIALS_SEEN, {"NAMES": list(SECRETS), "VALUES": list(SECRETS.values())},
                           ["seen", "in_child"])
    assert found == {"seen": [], "in_child": []}


def test_a_kernel_sees_none_of_the_workers_credentials(kernelspec: str) -> None:
    km, kc = _start(kernelspec)
    try:
        printed = _printed(kc, f"import os\nprint(sorted(k for k in os.environ if k in {list(SECRETS)!r} "
                               f"or any(v in os.environ[k] for v in {list(SECRETS.values())!r})))")
    finally:
        _stop(km, kc)
    assert printed.strip() == "[]"


def test_the_ngrok_auth_token_is_refused_on_the_command_line(tmp_path: Path) -> None:
    refused = subprocess.run(["remote-worker", "--ngrok", "--ngrok-authtoken", "ngrok-secret-on-argv", "--gpu", "off"],
                             capture_output=True, text=True, timeout=60,
                             env={**os.environ, "REMOTE_MAGIC_HOME": str(tmp_path)})
    assert refused.returncode == 2
    assert "every user of this machine can read it (ps)" in refused.stderr
    assert "NGROK_AUTHTOKEN=… remote-worker --ngrok" in refused.stderr
    assert "ngrok-secret-on-argv" not in refused.stderr + refused.stdout
    assert not (tmp_path / "hub-keys.json").exists()  # refused before anything started


# -- files from a worker -------------------------------------------------------------------------

@pytest.mark.parametrize("entry", ["../x", "/abs/x", "a/../../x", "a//x", "."])
def test_a_hostile_listing_is_refused_and_nothing_is_written_outside(tmp_path: Path, entry: str) -> None:
    destination = tmp_path / "inbox" / "copy"
    asked: list[dict[str, Any]] = []

    def hostile_worker(op: dict[str, Any], frames: Any, worker: str | None) -> file_copy.Reply:
        asked.append(op)
        if op["op"] == "stat":
            listing = {"files": [["fine.txt", 2], [entry, 5]], "dirs": []}
            return file_copy.Reply({"kind": "dir", "path": "/remote/src"}, [json.dumps(listing).encode()], "evil")
        return file_copy.Reply({"digest": "none"}, [b"owned"[:op["length"]]], "evil")

    with pytest.raises(FileTransferError, match="absolute or leaves the folder") as refused:
        file_copy.get(hostile_worker, "src", destination, worker=None, overwrite=False, progress=False)
    assert refused.value.path == entry and repr(entry) in str(refused.value)
    assert [op["op"] for op in asked] == ["stat"]  # refused before a byte was read
    assert list(tmp_path.rglob("*")) == []  # nothing written, inside the destination or out
    assert not Path("/abs/x").exists()


def test_a_malformed_listing_is_refused() -> None:
    for tree in (None, {"files": [["a", -1]], "dirs": []}, {"files": [[1, 2]], "dirs": []}, {"files": []},
                 {"files": [], "dirs": [["a"]]}):
        with pytest.raises(FileTransferError, match="malformed listing of /remote/src"):
            checked_listing(tree, "/remote/src")


def test_a_symbolic_link_in_the_destination_leads_no_write_out(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside)
    with pytest.raises(FileTransferError, match=r"outside .*root \(through a symbolic link\): refused") as refused:
        inside(root, "link/evil", "/remote/src")
    assert refused.value.path == "link/evil"
    assert inside(root, "sub/ok.txt", "/remote/src") == root / "sub" / "ok.txt"


def test_a_real_folder_still_comes_back_whole(worker: WorkerProcess, tmp_path: Path) -> None:
    source = tmp_path / "source"
    (source / "sub" / "deeper").mkdir(parents=True)
    (source / "top.txt").write_text("top")
    (source / "sub" / "deeper" / "leaf.bin").write_bytes(bytes(range(256)) * 9)
    with remote_magic.connect(worker.token, timeout=10) as client:
        copied = client.get_file(str(source), tmp_path / "back", progress=False)
    assert copied.files == 2
    assert (tmp_path / "back" / "top.txt").read_text() == "top"
    assert (tmp_path / "back" / "sub" / "deeper" / "leaf.bin").read_bytes() == bytes(range(256)) * 9


# -- kernels -------------------------------------------------------------------------------------

def test_max_kernels_refuses_one_more_saying_how_many_run_and_what_raises_it(kernelspec: str) -> None:
    km, kc = _start(kernelspec)
    try:
        second = KernelManager(kernel_name=kernelspec)
        with pytest.raises(remote_magic.KernelError, match=r"runs 1 kernel\(s\) already.*larger --max-jupyter-kernels"):
            second.start_kernel()
        assert not second.has_kernel
    finally:
        _stop(km, kc)
    km, kc = _start(kernelspec)  # the first one ended: there is room again
    _stop(km, kc)


def test_kernels_count_against_max_memory_with_what_they_start(guarded: WorkerProcess, kernelspec: str) -> None:
    km, kc = _start(kernelspec)
    try:
        printed = _printed(kc, "import subprocess, sys\nprint(int(subprocess.run(['sh', '-c', 'setsid \"$0\" -c "
                               f"\"$1\" >/dev/null 2>&1 & echo $!', sys.executable, {HOG!r}], capture_output=True, "
                               "text=True).stdout))")
        hog = int(printed)
        wait_for(lambda: not km.is_alive(), 30, "the kernel over --max-memory to be killed")
        wait_for(lambda: gone(hog), 10, "what the kernel started to end")
        assert "over the 300.0 MB limit (--max-memory)" in guarded.log()
    finally:
        _stop(km, kc)
