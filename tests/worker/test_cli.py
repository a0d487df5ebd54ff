"""The remote-worker command line: the token file, `token`, --join checks, bad options."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

import remote_magic
from remote_magic.wire.addresses import who_can_reach
from remote_magic.wire.tokens import Token
from support import WorkerProcess, start_worker


def _remote_worker(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["remote-worker", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "REMOTE_MAGIC_HOME": str(home), **(env or {})})


def test_token_file_is_one_owner_only_line_matching_the_printed_token(worker: WorkerProcess) -> None:
    mode = stat.S_IMODE(worker.token_file.stat().st_mode)
    assert mode == 0o600
    text = worker.token_file.read_text()
    assert text.count("\n") == 1 and text.startswith("rmc1.")
    assert f"%offload_connect {text.strip()}" in worker.log()
    keys = worker.home / "hub-keys.json"
    assert stat.S_IMODE(keys.stat().st_mode) == 0o600


def test_the_worker_says_which_notebooks_can_reach_the_tokens_address(worker: WorkerProcess) -> None:
    address = Token.decode(worker.token).address.removeprefix("tcp://")
    assert (f"the token's address, {address}, is this machine's own: only notebooks on this machine reach it. For "
            "another machine: --listen 0.0.0.0:PORT (your network), or --ngrok (anywhere, Colab included)"
            ) in worker.log()
    # and how it words the others (only words: nothing is dialed): a LAN address (the default --listen 0.0.0.0),
    # a public one, a tunnel's
    assert "local network: notebooks on that network reach it; Colab and Kaggle, outside it, don't: start " \
           "remote-worker with --ngrok" in who_can_reach("tcp://192.168.1.20:5587")
    assert "is public: notebooks anywhere reach it unless a firewall" in who_can_reach("tcp://93.184.216.34:5587")
    assert "ngrok tunnel's: notebooks anywhere reach it" in who_can_reach("tcp://4.tcp.ngrok.io:1234", tunnel=True)


def test_token_command_shows_the_same_client_token(worker: WorkerProcess) -> None:
    shown = _remote_worker(worker.home, "token")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == worker.token
    worker_token = _remote_worker(worker.home, "token", "--worker").stdout.strip()
    assert worker_token.startswith("rmw1.") and worker_token != worker.token


def test_token_names_the_running_hub_or_says_several_share_the_home(tmp_path: Path) -> None:
    first = start_worker(tmp_path / "first", "--listen", "127.0.0.1:0", "--gpu", "off", home=tmp_path / "home")
    try:
        second = start_worker(tmp_path / "second", "--listen", "127.0.0.1:0", "--gpu", "off", home=tmp_path / "home")
        try:  # the second rewrote the home's address: a token for one of them would be a guess
            shown = _remote_worker(tmp_path / "home", "token")
            assert shown.returncode == 1 and "several hubs run with this home" in shown.stderr
            assert all(Token.decode(w.token).address in shown.stderr for w in (first, second))
        finally:
            second.stop()
        shown = _remote_worker(tmp_path / "home", "token")  # the one still running, not the last started
        assert shown.returncode == 0 and shown.stdout.strip() == first.token
    finally:
        first.stop()


def test_an_install_command_names_the_copy_it_installs_into() -> None:
    """remote-magic isn't on the package index: `pip install "remote-magic[worker]"` fails. The suite runs
    from scripts/setup.sh's editable install of this clone, so that is what the command names."""
    from remote_magic.wire.install import install_command

    repo = Path(__file__).resolve().parents[2]
    assert install_command("worker") == f'pip install -e "{repo}[worker]"'
    assert install_command("lan") == f'pip install -e "{repo}[lan]"'


def test_tokens_are_never_logged_whole(worker: WorkerProcess) -> None:
    secret_part = worker.token[5:]
    log_without_connect_line = "\n".join(line for line in worker.log().splitlines() if "%offload_connect" not in line)
    assert secret_part[:40] not in log_without_connect_line


def test_join_with_a_client_token_says_which_token_to_use(worker: WorkerProcess, tmp_path: Path) -> None:
    result = _remote_worker(tmp_path, "--join", "--gpu", "off", env={"REMOTE_MAGIC_JOIN_TOKEN": worker.token})
    assert result.returncode == 1
    assert "this is a client token" in result.stderr and "remote-worker token --worker" in result.stderr


def test_a_worker_token_cannot_be_used_from_a_notebook(worker: WorkerProcess) -> None:
    worker_token = _remote_worker(worker.home, "token", "--worker").stdout.strip()
    try:
        remote_magic.connect(worker_token, timeout=2)
    except remote_magic.TokenError as exc:
        assert "this is a worker token" in str(exc)
    else:
        raise AssertionError("a worker token connected as a client")


def test_help_names_no_path_of_the_repository(tmp_path: Path) -> None:
    """A wheel's user has no docs/ folder to open: the help says what it means in place."""
    shown = _remote_worker(tmp_path, "--help")
    assert shown.returncode == 0 and "--ngrok" in shown.stdout and "docs/" not in shown.stdout, shown.stdout


def test_bad_options_are_explained(tmp_path: Path) -> None:
    result = _remote_worker(tmp_path, "--listen", "nonsense")
    assert result.returncode == 2 and "is not HOST:PORT" in result.stderr
    result = _remote_worker(tmp_path, "--max-memory", "lots")
    assert result.returncode == 2 and "is not a size like 512M" in result.stderr


def test_a_port_in_use_is_reported(worker: WorkerProcess, tmp_path: Path) -> None:
    port = remote_magic.wire.tokens.Token.decode(worker.token).address.rsplit(":", 1)[1]
    result = _remote_worker(tmp_path, "--listen", f"127.0.0.1:{port}", "--gpu", "off")
    assert result.returncode == 1 and f"can't listen on tcp://127.0.0.1:{port}" in result.stderr
    assert "something listens on that port already (another remote-worker?)" in result.stderr


def test_an_address_that_is_not_this_machines_or_ipv6_is_named_as_the_cause(tmp_path: Path) -> None:
    # 192.0.2.1 (TEST-NET-1) is no machine's: binding it fails at once, and sends nothing.
    result = _remote_worker(tmp_path, "--listen", "192.0.2.1:5587", "--gpu", "off")
    assert result.returncode == 1 and "can't listen on tcp://192.0.2.1:5587" in result.stderr
    assert "not one of this machine's" in result.stderr and "another remote-worker" not in result.stderr
    result = _remote_worker(tmp_path, "--listen", "[::1]:0", "--gpu", "off")
    assert result.returncode == 2 and "a hub listens on IPv4 only: use 0.0.0.0:0" in result.stderr


def test_rotating_keys_locks_out_old_tokens_and_drops_their_peers(tmp_path: Path) -> None:
    from support import start_worker, wait_for

    w = start_worker(tmp_path, "--listen", "127.0.0.1:0", "--gpu", "off", "--heartbeat-interval", "0.2")
    try:
        old = w.token
        client = remote_magic.connect(old, timeout=5)
        assert client.run("x = 1") == {"x": 1}
        rotated = _remote_worker(w.home, "token", "--rotate")
        assert rotated.returncode == 0 and rotated.stdout.strip() != old and "old tokens" in rotated.stderr
        new = rotated.stdout.strip()
        wait_for(lambda: w.token == new, 20, "the worker to write the new token file")
        with pytest.raises(remote_magic.ConnectionFailed, match="rotated"):
            client.run("x = 2")  # the connected peer with old credentials was dropped
        client.close()
        with pytest.raises(remote_magic.ConnectionFailed, match="refused these credentials"):
            remote_magic.connect(old, timeout=3)
        with remote_magic.connect(new, timeout=5) as fresh:
            wait_for(lambda: fresh.workers(), 20, "the worker to rejoin with the new keys")
            assert fresh.run("y = 2") == {"y": 2}
    finally:
        w.stop()


@pytest.mark.gpu
def test_adapter_and_backend_pick_the_workers_gpu(tmp_path: Path) -> None:
    probe = start_worker(tmp_path / "probe", "--listen", "127.0.0.1:0", "--gpu", "on")
    try:
        with remote_magic.connect(probe.token, timeout=10) as client:
            [info] = client.workers()
    finally:
        probe.stop()
    if not info["gpu"].get("active"):
        if os.environ.get("REMOTE_MAGIC_REQUIRE_GPU") == "1":
            pytest.fail(f"no wgpu adapter: {info['gpu']}")
        pytest.skip(f"no wgpu adapter: {info['gpu']}")
    word, backend = info["gpu"]["adapter"].split()[0], info["gpu"]["backend"].lower()
    chosen = start_worker(tmp_path / "chosen", "--listen", "127.0.0.1:0", "--gpu", "on",
                          "--adapter", word.upper(), "--backend", backend)
    try:
        with remote_magic.connect(chosen.token, timeout=10) as client:
            [picked] = client.workers()
    finally:
        chosen.stop()
    assert picked["gpu"]["adapter"] == info["gpu"]["adapter"] and picked["gpu"]["backend"].lower() == backend
    failed = subprocess.run(["remote-worker", "--listen", "127.0.0.1:0", "--gpu", "on", "--adapter", "no-such-gpu"],
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "REMOTE_MAGIC_HOME": str(tmp_path / "none")})
    assert failed.returncode != 0 and "no-such-gpu" in failed.stdout + failed.stderr


def test_verbose_logs_what_happens(tmp_path: Path) -> None:
    worker = start_worker(tmp_path, "--listen", "127.0.0.1:0", "--gpu", "off", "--name", "chatty", "--verbose")
    try:
        with remote_magic.connect(worker.token, timeout=10) as client:
            assert client.run("x = 1")["x"] == 1
    finally:
        worker.stop()
    log = worker.log()
    assert "INFO" in log and "worker 'chatty' joined" in log


def test_a_join_token_never_goes_on_the_command_line(worker: WorkerProcess, tmp_path: Path) -> None:
    worker_token = _remote_worker(worker.home, "token", "--worker").stdout.strip()
    refused = _remote_worker(tmp_path, "--join", worker_token, "--gpu", "off")
    assert refused.returncode == 2
    assert "can be read by every user of this machine" in refused.stderr
    assert "REMOTE_MAGIC_JOIN_TOKEN=rmw1.… remote-worker --join" in refused.stderr and "--join-file" in refused.stderr
    missing = _remote_worker(tmp_path, "--join", "--gpu", "off", env={"REMOTE_MAGIC_JOIN_TOKEN": ""})
    assert missing.returncode == 2 and "--join needs the worker token in $REMOTE_MAGIC_JOIN_TOKEN" in missing.stderr


def test_a_worker_joins_with_its_token_in_a_file(worker: WorkerProcess, tmp_path: Path) -> None:
    token_file = tmp_path / "worker-token"
    token_file.write_text(_remote_worker(worker.home, "token", "--worker").stdout)
    token_file.chmod(0o600)
    joined = start_worker(tmp_path / "w", "--join-file", str(token_file), "--gpu", "off", "--name", "from-file",
                          token_file=False)
    try:
        with remote_magic.connect(worker.token, timeout=10) as client:
            assert "from-file" in [w["name"] for w in client.workers()]
            assert client.run("x = 6 * 7", worker="from-file") == {"x": 42}
    finally:
        joined.stop()
    assert str(token_file) in " ".join(joined.process.args)  # the path is on the command line, not the token


def test_a_killed_workers_temporary_folder_is_removed_by_the_next_worker(tmp_path: Path) -> None:
    def folders_of(process: subprocess.Popen[str]) -> list[Path]:
        return list(Path(tempfile.gettempdir()).glob(f"remote-magic-{process.pid}-*"))

    killed = start_worker(tmp_path / "killed", "--listen", "127.0.0.1:0", "--gpu", "off")
    left = folders_of(killed.process)
    assert len(left) == 1
    killed.process.kill()
    killed.process.wait()
    assert left[0].exists()  # a SIGKILL cleans nothing up
    second = start_worker(tmp_path / "second", "--listen", "127.0.0.1:0", "--gpu", "off")
    try:
        assert not left[0].exists()
        assert len(folders_of(second.process)) == 1
    finally:
        second.stop()
    assert folders_of(second.process) == []  # a clean exit removes its own


def test_token_rotate_on_a_full_disk_says_so_and_changes_nothing(tmp_path: Path) -> None:
    """Before: a traceback. The home is a 64 kB tmpfs, filled, in a mount namespace of the test's own."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("fills a disk of its own in a mount namespace, which takes root and unshare (util-linux)")
    home = tmp_path / "home"
    home.mkdir()
    fill = f"mount -t tmpfs -o size=64k tmpfs {home} && (dd if=/dev/zero of={home}/fill bs=4k 2>/dev/null || true)"
    result = subprocess.run(["unshare", "-m", "sh", "-c", f"{fill} && exec remote-worker token --rotate"],
                            capture_output=True, text=True, timeout=60,
                            env={**os.environ, "REMOTE_MAGIC_HOME": str(home)})
    assert result.returncode == 1, result.stderr
    assert "can't write the keys in" in result.stderr and "No space left on device" in result.stderr, result.stderr
    assert "the tokens you have still work" in result.stderr and "Traceback" not in result.stderr
