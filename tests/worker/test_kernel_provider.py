"""A whole Jupyter kernel on a real worker, started by jupyter_client through the remote-magic provisioner.

Every kernel here is started by a real ``jupyter_client.KernelManager`` from a kernelspec installed by
``remote-worker kernelspec install`` into a temporary Jupyter data folder; its channels cross a real
hub (CurveZMQ on 127.0.0.1) to the shared real worker, which runs the ipykernel as its child.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from queue import Empty
from typing import Any, Iterator

import jupyter_kernel_test
import nbformat
import psutil
import pytest
from jupyter_client import BlockingKernelClient, KernelManager
from jupyter_kernel_test.msgspec_v5 import validate_message
from nbclient import NotebookClient

import remote_magic
from remote_magic.worker.cli import main as remote_worker
from support import WorkerProcess, start_worker, wait_for

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "remote_kernel.ipynb"
KERNEL = "remote-magic-test"
TIMEOUT = 30


@pytest.fixture(scope="module", autouse=True)
def kernelspecs(worker: WorkerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The test's Jupyter data folder, with kernelspecs installed by the CLI: one reading the shared
    worker's token file, one asking for a worker that doesn't exist."""
    data = tmp_path_factory.mktemp("jupyter")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JUPYTER_DATA_DIR", str(data))
        patch.setenv("JUPYTER_PATH", str(data))
        for name, extra in ((KERNEL, ["--token-file", str(worker.token_file)]),
                            ("remote-magic-nowhere", ["--token-file", str(worker.token_file), "--worker", "nowhere"]),
                            ("remote-magic-shared", ["--token-file", str(worker.token_file), "--share-token"])):
            install(name, *extra)
        shared = data / "kernels" / "remote-magic-shared" / "kernel.json"
        shared.write_text(json.dumps({**json.loads(shared.read_text()), "env": {"FROM_SPEC": "on the worker"}}))
        yield data


def kernelspec(*args: str) -> tuple[int, str, str]:
    """`remote-worker kernelspec ARGS` (its real main, in this process: the same as the console script, faster);
    its exit status, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = remote_worker(["kernelspec", *args])
    return code, out.getvalue(), err.getvalue()


def install(name: str, *args: str) -> None:
    code, out, err = kernelspec("install", "--name", name, *args)
    assert code == 0 and f"installed kernelspec {name!r}" in out, err


def _start(name: str = KERNEL) -> tuple[KernelManager, BlockingKernelClient]:
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


@pytest.fixture
def kernel() -> Iterator[tuple[KernelManager, BlockingKernelClient]]:
    km, kc = _start()
    yield km, kc
    _stop(km, kc)


@pytest.fixture(scope="module")
def shared_kernel() -> Iterator[tuple[KernelManager, BlockingKernelClient]]:
    """One kernel for the tests that leave it as they found it (fewer starts: the file stays fast)."""
    km, kc = _start()
    yield km, kc
    _stop(km, kc)


def run(kc: BlockingKernelClient, code: str, **options: Any) -> tuple[dict[str, Any], str]:
    """Execute ``code``; its execute_reply content and everything it printed."""
    printed: list[str] = []

    def output(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            printed.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            printed.append(msg["content"]["ename"])

    reply = kc.execute_interactive(code, timeout=TIMEOUT, output_hook=output, **options)
    return reply["content"], "".join(printed)


def _pids(kc: BlockingKernelClient) -> tuple[int, int]:
    content, printed = run(kc, "import os; print(os.getpid(), os.getppid())")
    assert content["status"] == "ok", printed
    pid, parent = printed.split()
    return int(pid), int(parent)


def test_the_kernel_runs_on_the_worker_as_its_child_not_the_notebooks(
        worker: WorkerProcess, shared_kernel: tuple[KernelManager, BlockingKernelClient]) -> None:
    km, kc = shared_kernel
    pid, parent = _pids(kc)
    assert parent == worker.process.pid
    assert pid == km.provisioner.remote["pid"]  # type: ignore[union-attr]
    # This test process is the worker's parent too (it started it): what the notebook's side started
    # is the relay, which holds no kernel.
    relay = km.provisioner.process  # type: ignore[union-attr]
    assert relay is not None and psutil.Process(relay.pid).ppid() == os.getpid()
    assert psutil.Process(relay.pid).cmdline()[1:3] == ["-m", "remote_magic.kernel_provider.relay"]
    assert psutil.Process(relay.pid).children(recursive=True) == []
    assert [p.pid for p in psutil.Process(pid).parents()][:2] == [worker.process.pid, os.getpid()]


@pytest.mark.parametrize("mode", ["signal", "message"])
def test_an_interrupt_stops_a_busy_loop_within_two_seconds_and_the_kernel_lives_on(
        shared_kernel: tuple[KernelManager, BlockingKernelClient], mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    km, kc = shared_kernel
    assert km.kernel_spec is not None
    monkeypatch.setattr(km.kernel_spec, "interrupt_mode", mode)
    run(kc, "counter = 41")
    # Pressed once the loop runs: ipykernel drops a request (no reply ever) whose handler an interrupt cuts short
    # before the cell's code starts, which its execute_input doesn't rule out on a loaded machine.
    msg_id = kc.execute("print('looping', flush=True)\nwhile True: pass")
    wait_for(lambda: _printed_by(kc, msg_id), TIMEOUT, "the loop to start")
    pressed = time.monotonic()
    km.interrupt_kernel()
    reply = kc.get_shell_msg(timeout=TIMEOUT)
    stopped = time.monotonic() - pressed
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
    assert stopped < 2.0
    # A front end's next request waits for the idle status: ipykernel aborts requests that reach it
    # before it is done with the failed one (its stop_on_error), and a loaded machine can make that so.
    wait_for(lambda: _idle_after(kc, msg_id), TIMEOUT, "the interrupted cell's idle status")
    content, printed = run(kc, "print(counter + 1)")
    assert content["status"] == "ok" and printed == "42\n"


def _idle_after(kc: BlockingKernelClient, msg_id: str) -> bool:
    try:
        msg = kc.get_iopub_msg(timeout=0.1)
    except Empty:
        return False
    return bool(msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status"
                and msg["content"]["execution_state"] == "idle")


def _busy_with(kc: BlockingKernelClient, msg_id: str) -> bool:
    return _next_iopub_is(kc, msg_id, "execute_input")


def _printed_by(kc: BlockingKernelClient, msg_id: str) -> bool:
    return _next_iopub_is(kc, msg_id, "stream")


def _next_iopub_is(kc: BlockingKernelClient, msg_id: str, msg_type: str) -> bool:
    try:
        msg = kc.get_iopub_msg(timeout=0.1)
    except Empty:
        return False
    return bool(msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == msg_type)


def test_input_is_answered_over_stdin(shared_kernel: tuple[KernelManager, BlockingKernelClient]) -> None:
    _, kc = shared_kernel
    asked: list[str] = []

    def answer(msg: dict[str, Any]) -> None:
        asked.append(msg["content"]["prompt"])
        kc.input("Ada")

    content, printed = run(kc, "name = input('who? '); print('hello', name)", allow_stdin=True, stdin_hook=answer)
    assert content["status"] == "ok"
    assert asked == ["who? "] and printed.endswith("hello Ada\n")


def test_the_worker_lists_its_kernels(
        worker: WorkerProcess, shared_kernel: tuple[KernelManager, BlockingKernelClient]) -> None:
    km, kc = shared_kernel
    for n in range(20):
        assert run(kc, f"print({n})")[1] == f"{n}\n"
    kernel_id = km.kernel_id

    def listed() -> dict[str, int] | None:
        with remote_magic.connect(worker.token, timeout=10) as client:
            (shared,) = [w for w in client.workers() if w["name"] == "shared"]
        found: dict[str, int] | None = shared["stats"].get("kernels", {}).get(kernel_id)
        return found

    found = wait_for(listed, TIMEOUT, "the worker to list the kernel")
    assert found["pid"] == _pids(kc)[0]  # type: ignore[index]


def test_comms_pass_both_ways(shared_kernel: tuple[KernelManager, BlockingKernelClient]) -> None:
    """Comms (what ipywidgets speaks) are messages on shell and iopub like any other."""
    _, kc = shared_kernel
    setup = ("from ipykernel.comm import Comm\nheard = []\n"
             "widget = Comm(target_name='remote-test', data={'value': 1})\n"
             "widget.on_msg(lambda msg: heard.append(msg['content']['data']))")
    (opened,) = _comm_messages(kc, setup)
    assert opened["msg_type"] == "comm_open" and opened["content"]["target_name"] == "remote-test"
    assert opened["content"]["data"] == {"value": 1}
    comm_id = opened["content"]["comm_id"]
    kc.shell_channel.send(kc.session.msg("comm_msg", {"comm_id": comm_id, "data": {"value": 2}}))
    wait_for(lambda: "[{'value': 2}]" in run(kc, "print(heard)")[1], TIMEOUT, "the front end's comm_msg to arrive")
    (sent,) = _comm_messages(kc, "widget.send({'value': 3})")
    assert sent["msg_type"] == "comm_msg" and sent["content"] == {"comm_id": comm_id, "data": {"value": 3}}


def _comm_messages(kc: BlockingKernelClient, code: str) -> list[dict[str, Any]]:
    """Run ``code``; the comm messages it sent on iopub."""
    seen: list[dict[str, Any]] = []
    reply = kc.execute_interactive(code, timeout=TIMEOUT, output_hook=seen.append)
    assert reply["content"]["status"] == "ok"
    return [m for m in seen if m["msg_type"].startswith("comm_")]


def test_a_restart_gives_a_fresh_kernel_on_the_same_worker(
        worker: WorkerProcess, kernel: tuple[KernelManager, BlockingKernelClient]) -> None:
    km, kc = kernel
    before, _ = _pids(kc)
    run(kc, "kept = 1")
    km.restart_kernel()
    kc.wait_for_ready(timeout=TIMEOUT)
    after, parent = _pids(kc)
    assert after != before and parent == worker.process.pid
    assert not psutil.pid_exists(before) or psutil.Process(before).status() == psutil.STATUS_ZOMBIE
    content, printed = run(kc, "kept")
    assert content["status"] == "error" and content["ename"] == "NameError"


def test_shutdown_leaves_nothing_running_on_the_worker(worker: WorkerProcess) -> None:
    km, kc = _start()
    content, printed = run(kc, "import subprocess, os\nchild = subprocess.Popen(['sleep', '600'])\n"
                               "print(os.getpid(), child.pid)")
    assert content["status"] == "ok"
    kernel_pid, child_pid = (int(p) for p in printed.split())
    relay = km.provisioner.process  # type: ignore[union-attr]
    assert relay is not None
    kc.stop_channels()
    km.shutdown_kernel()
    assert not km.is_alive() and relay.poll() is not None
    gone = lambda pid: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # noqa: E731
    wait_for(lambda: gone(kernel_pid) and gone(child_pid), 10, "the kernel and what it started to end")
    assert [p.pid for p in psutil.Process(worker.process.pid).children(recursive=True)
            if p.pid in (kernel_pid, child_pid)] == []


def test_a_kernel_that_dies_is_reported_dead_and_the_worker_stays_usable(worker: WorkerProcess) -> None:
    km, kc = _start()
    try:
        kernel_pid, _ = _pids(kc)
        kc.execute("import os; os._exit(3)")
        wait_for(lambda: not km.is_alive(), 10, "the kernel to be reported dead")
        relay = km.provisioner.process  # type: ignore[union-attr]
        assert relay is not None and relay.poll() == 3  # the relay ends with the kernel's exit status
        assert not psutil.pid_exists(kernel_pid) or psutil.Process(kernel_pid).status() == psutil.STATUS_ZOMBIE
    finally:
        _stop(km, kc)
    with remote_magic.connect(worker.token, timeout=10) as client:
        assert client.run("x = 6 * 7")["x"] == 42
    km, kc = _start()
    try:
        assert _pids(kc)[1] == worker.process.pid
    finally:
        _stop(km, kc)


def test_offload_inside_a_remote_kernel_reaches_the_hub_with_the_shared_token(worker: WorkerProcess) -> None:
    km, kc = _start("remote-magic-shared")
    try:
        content, printed = run(kc, "import os\n%load_ext remote_magic\n%offload_connect\n"
                                   "print(os.environ['FROM_SPEC'], os.getpid())")
        assert content["status"] == "ok", printed
        assert "Connected to tcp://127.0.0.1" in printed and "on the worker" in printed
        kernel_pid = int(printed.split()[-1])
        content, printed = run(kc, "%%offload\nimport os\nwhere = os.getpid()")
        assert content["status"] == "ok", printed
        content, printed = run(kc, "print(where, os.getppid())")
        where, parent = (int(p) for p in printed.split())
        assert parent == worker.process.pid and where not in (kernel_pid, worker.process.pid)
        assert psutil.Process(where).ppid() == worker.process.pid  # the worker's executor ran the cell
    finally:
        _stop(km, kc)


def test_a_kernel_without_a_token_fails_saying_where_it_looked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_TOKEN_VAR", raising=False)
    install("remote-magic-tokenless", "--token-env", "NO_SUCH_TOKEN_VAR")
    km = KernelManager(kernel_name="remote-magic-tokenless")
    with pytest.raises(remote_magic.TokenError, match=r"set \$NO_SUCH_TOKEN_VAR to the line remote-worker printed"):
        km.start_kernel()
    assert not km.has_kernel


def test_a_kernel_for_a_worker_that_isnt_there_fails_naming_it() -> None:
    km = KernelManager(kernel_name="remote-magic-nowhere")
    with pytest.raises(remote_magic.KernelError, match="no worker is named 'nowhere'.*shared"):
        km.start_kernel()
    assert not km.has_kernel


def test_a_hub_with_kernels_off_refuses_them_saying_how_to_allow_them(tmp_path: Path, kernelspecs: Path) -> None:
    off = start_worker(tmp_path / "off", "--listen", "127.0.0.1:0", "--gpu", "off", "--jupyter-kernels", "off")
    try:
        install("remote-magic-off", "--token-file", str(off.token_file))
        km = KernelManager(kernel_name="remote-magic-off")
        with pytest.raises(remote_magic.KernelError, match="does not allow kernels.*--jupyter-kernels on"):
            km.start_kernel()
    finally:
        off.stop()


def test_the_kernelspec_cli_installs_lists_and_removes_without_the_token_in_clear(
        worker: WorkerProcess, kernelspecs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def cli(*args: str) -> str:
        code, out, err = kernelspec(*args)
        assert code == 0, err
        return out

    cli("install", "--name", "rm-env", "--display-name", "On the GPU box", "--worker", "shared",
        "--token-env", "MY_TOKEN")
    spec = json.loads((kernelspecs / "kernels" / "rm-env" / "kernel.json").read_text())
    config = spec["metadata"]["kernel_provisioner"]["config"]
    assert spec["display_name"] == "On the GPU box"
    assert config == {"token_env": "MY_TOKEN", "worker": "shared"}
    assert "token" not in json.loads((kernelspecs / "kernels" / "remote-magic-shared" / "kernel.json").read_text())[
        "metadata"]["kernel_provisioner"]["config"]  # --share-token reads it at each start, as without
    assert worker.token not in json.dumps(spec)
    monkeypatch.setenv("REMOTE_MAGIC_TOKEN", worker.token)
    cli("install", "--name", "rm-stored", "--store-token")
    monkeypatch.delenv("REMOTE_MAGIC_TOKEN")
    stored = kernelspecs / "kernels" / "rm-stored" / "kernel.json"
    assert json.loads(stored.read_text())["metadata"]["kernel_provisioner"]["config"]["token"] == worker.token
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    listing = cli("list")
    assert "rm-env\tshared\ttoken from $MY_TOKEN" in listing and "rm-stored\tany worker\ttoken stored" in listing
    assert f"{KERNEL}\tany worker\ttoken from {worker.token_file}" in listing
    prefixed = cli("install", "--name", "rm-prefix", "--prefix", str(kernelspecs / "env"))
    assert (kernelspecs / "env" / "share" / "jupyter" / "kernels" / "rm-prefix" / "kernel.json").exists()
    assert str(kernelspecs / "env") in prefixed
    for name in ("rm-env", "rm-stored"):
        assert "removed kernelspec" in cli("remove", name)
    listed = subprocess.run(["remote-worker", "kernelspec", "list"], capture_output=True, text=True)  # the script
    assert listed.returncode == 0 and "rm-env" not in listed.stdout and KERNEL in listed.stdout
    missing = subprocess.run(["remote-worker", "kernelspec", "remove", "rm-env"], capture_output=True, text=True)
    assert missing.returncode == 1 and "no remote-magic kernelspec is named 'rm-env'" in missing.stderr


def test_the_example_notebook_runs_on_the_worker_through_nbclient(worker: WorkerProcess, tmp_path: Path) -> None:
    nb = nbformat.read(EXAMPLE, as_version=4)
    NotebookClient(nb, kernel_name=KERNEL, timeout=60, resources={"metadata": {"path": str(tmp_path)}}).execute()
    where, total, shown = [c for c in nb.cells if c.cell_type == "code"]
    assert f"started by pid {worker.process.pid} (the remote-worker)" in where.outputs[0]["text"]
    assert total.outputs[0]["data"]["text/plain"] == "285"
    assert "<b>10 squares</b>" in shown.outputs[0]["data"]["text/html"]


class TestTheKernelMessageProtocol(jupyter_kernel_test.KernelTests):
    """jupyter_kernel_test's standard message-protocol checks, against the kernel on the worker."""

    kernel_name = KERNEL
    language_name = "python"
    file_extension = ".py"
    code_hello_world = "print('hello, world')"
    code_stderr = "import sys; print('oops', file=sys.stderr)"
    completion_samples = [{"text": "zi", "matches": {"zip"}}]
    complete_code_samples = ["1", "print('hello, world')", "def f(x):\n  return x*2\n\n"]
    incomplete_code_samples = ["print('''hello", "def f(x):\n  x*2"]
    invalid_code_samples = ["import = 7q"]
    code_page_something = "zip?"
    code_generate_error = "raise ValueError('from the worker')"
    code_execute_result = [{"code": "6*7", "result": "42"}]
    code_display_data = [{"code": "from IPython.display import HTML, display; display(HTML('<b>hi</b>'))",
                          "mime": "text/html"}]
    code_history_pattern = "6?7"
    supported_history_operations = ("tail", "search")
    code_inspect_sample = "zip"
    code_clear_output = "from IPython.display import clear_output; clear_output()"

    def execute_helper(self, code: str, timeout: int = TIMEOUT, silent: bool = False, store_history: bool = True,
                       stop_on_error: bool = True) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """jupyter_kernel_test's own, but each iopub message after the reply may take up to TIMEOUT, not 0.1 s: they
        come through the hub on a channel of their own, and on a loaded machine the idle status came later."""
        msg_id = self.kc.execute(code=code, silent=silent, store_history=store_history, stop_on_error=stop_on_error)
        reply = self.get_non_kernel_info_reply(timeout=timeout)
        assert reply is not None
        validate_message(reply, "execute_reply", msg_id)
        busy = self.kc.get_iopub_msg(timeout=timeout)
        validate_message(busy, "status", msg_id)
        self.assertEqual(busy["content"]["execution_state"], "busy")
        outputs = []
        while (msg := self.kc.get_iopub_msg(timeout=timeout))["msg_type"] != "status":
            validate_message(msg, msg["msg_type"], msg_id)
            if msg["msg_type"] == "execute_input":
                self.assertEqual(msg["content"]["code"], code)
            else:
                outputs.append(msg)
        validate_message(msg, "status", msg_id)
        self.assertEqual(msg["content"]["execution_state"], "idle")
        return reply, outputs


def test_kernels_run_in_the_python_the_worker_names(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nREMOTE_MAGIC_TEST_PYTHON=wrapped exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    named = start_worker(tmp_path / "named", "--listen", "127.0.0.1:0", "--gpu", "off",
                         "--jupyter-kernel-python", str(python))
    try:
        install("remote-magic-named", "--token-file", str(named.token_file))
        km, kc = _start("remote-magic-named")
        try:
            content, printed = run(kc, "import os; print(os.environ.get('REMOTE_MAGIC_TEST_PYTHON'), os.getpid())")
            wrapped, kernel_pid = printed.split()
            assert wrapped == "wrapped"
            assert km.provisioner.remote["python"] == str(python)  # type: ignore[union-attr]
            named.stop()  # a worker that stops takes its kernels with it, and the client hears of it
            assert not psutil.pid_exists(int(kernel_pid)) or psutil.Process(int(kernel_pid)).status() == "zombie"
            wait_for(lambda: not km.is_alive(), 15, "the kernel to be reported dead")
        finally:
            _stop(km, kc)
    finally:
        named.stop()



def test_a_short_network_drop_loses_no_output_and_a_long_one_ends_the_kernel_saying_why(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    from tcp_relay import Relay, listening_port

    tunnel = Relay()
    remote = start_worker(tmp_path / "far", "--listen", "127.0.0.1:0", "--advertise", tunnel.address, "--gpu", "off",
                          "--heartbeat-interval", "0.25", "--outage-grace", "1", "--jupyter-kernel-grace", "2", "-v")
    try:
        tunnel.target = listening_port(remote.process.pid)
        install("remote-magic-far", "--token-file", str(remote.token_file))
        km, kc = _start("remote-magic-far")
        try:
            assert tunnel.connections == 1
            msg_id = kc.execute("import time\nfor i in range(400):\n    print(i, flush=True)\n    time.sleep(0.005)")
            wait_for(lambda: _busy_with(kc, msg_id), TIMEOUT, "the cell to start")
            tunnel.stop()  # cut while it prints, for less than the heartbeat bound (5 × 0.25 s)
            time.sleep(0.5)  # the length of the drop, not a wait for anything
            tunnel.start()
            printed = []
            while (msg := kc.get_iopub_msg(timeout=TIMEOUT))["msg_type"] != "status" or \
                    msg["content"]["execution_state"] != "idle":
                if msg["msg_type"] == "stream":
                    printed.append(msg["content"]["text"])
            assert "".join(printed).split() == [str(i) for i in range(400)]
            assert km.is_alive() and tunnel.connections >= 2
            kernel_pid, _ = _pids(kc)
            assert km.provisioner.remote["orphan_grace_s"] == 2.0  # type: ignore[union-attr]  # told at start

            tunnel.stop()  # for good: past the bound the kernel is dead here, and killed there
            wait_for(lambda: not km.is_alive(), 15, "the kernel to be reported dead")
            assert "the kernel is out of reach: the hub stayed out of reach for 1 s" in capfd.readouterr().err
            wait_for(lambda: "it is killed in 2 s unless it ends first" in remote.log(), 15, "the worker to say when")
            orphaned = time.monotonic()
            wait_for(lambda: not psutil.pid_exists(kernel_pid) or psutil.Process(kernel_pid).status() == "zombie",
                     15, "the worker to kill the kernel nobody can reach, after its grace period")
            assert time.monotonic() - orphaned > 1.0  # it lived on for the grace period, not a moment less
        finally:
            _stop(km, kc)
    finally:
        tunnel.stop()
        remote.stop()
