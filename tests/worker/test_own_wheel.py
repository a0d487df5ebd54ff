"""remote-worker serves the notebook side's wheel of exactly the copy it runs, and prints the line that
installs it (issue 32, newcomer item 4: remote-magic isn't on the package index, so Colab installs it from
the worker after each runtime reset)."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import Iterator

import pytest
from tcp_relay import Relay

import remote_magic
import remote_magic.wire.versions
from remote_magic.hub.tunnel import Tunnel
from remote_magic.wire.tokens import Token
from remote_magic.wire.versions import describe_differences, local_versions
from remote_magic.worker.own_wheel import MAX_CONNECTIONS, ServedWheel
from support import REPO, WorkerProcess, run_command, start_worker

INSTALL_LINE = re.compile(r"^%pip install (?P<url>(?P<base>https?://\S+)/(?P<name>[^/#\s]+)#sha256=(?P<sha>[0-9a-f]{64}))$",
                          re.MULTILINE)
# Files whose content the installed copy must share with the worker's: a module of each folder that an editable
# install maps apart (remote_magic/, worker/, shaders/), as the worker runs them from this clone.
SAME_AS_THE_WORKERS = {"remote_magic/wire/versions.py": Path(remote_magic.wire.versions.__file__),
                       "remote_magic/worker/own_wheel.py": REPO / "worker" / "own_wheel.py",
                       "remote_magic/shaders/matmul.wgsl": REPO / "shaders" / "matmul.wgsl"}

# install.py alone (the package's __init__ would import the dependencies --no-deps left out), as the copy in the venv.
LOAD_INSTALL_COMMAND = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('install', "
                        "sys.argv[1]); module = importlib.util.module_from_spec(spec); "
                        "spec.loader.exec_module(module); print(module.install_command('lan'))")


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    worker = start_worker(tmp_path_factory.mktemp("own-wheel"), "--listen", "127.0.0.1:0", "--gpu", "off")
    yield worker
    worker.stop()


@pytest.fixture(scope="module")
def pip_into_a_fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuple[str, ...]]:
    """A fresh venv's python (nothing of this environment's in it) and the pip command that installs into it:
    this environment's pip, told its --python, which saves the venv a pip of its own."""
    folder = tmp_path_factory.mktemp("fresh")
    run_command(sys.executable, "-m", "venv", "--without-pip", folder / "venv", cwd=folder)
    python = folder / "venv" / "bin" / "python"
    return python, (sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index")


def _printed_line(worker: WorkerProcess) -> re.Match[str]:
    found = INSTALL_LINE.search(worker.log())
    assert found, worker.log()
    return found


def _download(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as answer:
        return bytes(answer.read())


def test_the_worker_prints_one_install_line_above_the_token(worker: WorkerProcess) -> None:
    log = worker.log()
    line = _printed_line(worker)
    cell = log[log.index("In your notebook run:\n\n") + len("In your notebook run:\n\n"):].split("\n\n")[0]
    assert cell.splitlines() == [line.group(0), "%load_ext remote_magic", f"%offload_connect {worker.token}"]
    # Without --ngrok: the token's host (here loopback), and who can reach it.
    token_host = Token.decode(worker.token).address.removeprefix("tcp://").rsplit(":", 1)[0]
    port = int(line["base"].rsplit(":", 1)[1])
    assert line["base"] == f"http://{token_host}:{port}"
    assert re.fullmatch(re.escape(f"remote_magic-{remote_magic.__version__}+") + "[0-9a-f]{12}-py3-none-any.whl",
                        line["name"]), line["name"]
    assert (f"`%pip install` fetches the remote-magic this worker runs ({remote_magic.__version__}) from port "
            f"{port} of the token's host: notebooks that reach the token's address reach it") in log
    # IPython hands %pip the whole line, the hash included, and runs `python -m pip install URL` in a shell,
    # where a `#` inside a word starts no comment.
    from IPython.core.inputtransformer2 import TransformerManager

    assert TransformerManager().transform_cell(cell).splitlines()[0] == \
        f"get_ipython().run_line_magic('pip', 'install {line['url']}')"


def test_a_notebook_of_another_version_is_told_to_run_that_line() -> None:
    ours = local_versions()
    [note] = describe_differences(ours, {**ours, "remote_magic": "0.0.1"}, "worker 'box'")
    assert note.startswith(f"remote-magic is {remote_magic.__version__} here and 0.0.1 on worker 'box'")
    assert "the `%pip install` line remote-worker prints above its token" in note


def test_the_served_wheel_is_the_workers_copy_and_installs(worker: WorkerProcess, tmp_path: Path,
                                                           pip_into_a_fresh_venv: tuple[Path, tuple[str, ...]]) -> None:
    line = _printed_line(worker)
    data = _download(line["url"])
    assert hashlib.sha256(data).hexdigest() == line["sha"]
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        files = {name: archive.read(name) for name in archive.namelist()}
    version = line["name"].removeprefix("remote_magic-").removesuffix("-py3-none-any.whl")
    dist_info = f"remote_magic-{version}.dist-info"
    record = list(csv.reader(io.StringIO(files[f"{dist_info}/RECORD"].decode())))
    assert {row[0] for row in record} == set(files)
    for path, digest, size in record:
        if path != f"{dist_info}/RECORD":
            expected = base64.urlsafe_b64encode(hashlib.sha256(files[path]).digest()).rstrip(b"=").decode()
            assert (digest, int(size)) == (f"sha256={expected}", len(files[path])), path
    assert f"Version: {version}\n" in files[f"{dist_info}/METADATA"].decode()
    assert "remote-worker = remote_magic.worker.cli:main" in files[f"{dist_info}/entry_points.txt"].decode()

    # Installed as the notebook installs it: pip fetches the printed URL and checks its hash. Over another build
    # of the same version, which pip would keep if the versions were equal.
    python, pip_install = pip_into_a_fresh_venv
    run_command(*pip_install, _another_build_of_this_version(tmp_path), cwd=tmp_path)
    run_command(*pip_install, line["url"], cwd=tmp_path)
    site = Path(run_command(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                            cwd=tmp_path).stdout.strip())
    assert run_command(python, "-c", "import importlib.metadata as m; print(m.version('remote-magic'))",
                       cwd=tmp_path).stdout.strip() == version
    assert (site / "remote_magic/__init__.py").read_bytes() == Path(remote_magic.__file__).read_bytes()
    for inside, workers in SAME_AS_THE_WORKERS.items():
        assert (site / inside).read_bytes() == workers.read_bytes(), inside
    assert (python.parent / "remote-worker").exists()  # the entry points came along
    # The copy installed from a worker names the extra's own requirements (its URL ends with the worker).
    command = run_command(python, "-c", LOAD_INSTALL_COMMAND, site / "remote_magic/wire/install.py",
                          cwd=tmp_path).stdout.strip()
    assert command == 'pip install "zeroconf>=0.100"'


def _another_build_of_this_version(folder: Path) -> Path:
    """A wheel of remote-magic at this version (no local label) with other code, as a notebook may have."""
    version = remote_magic.__version__
    dist_info = f"remote_magic-{version}.dist-info"
    files = {"remote_magic/__init__.py": b"# another build\n",
             f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: remote-magic\nVersion: {version}\n".encode(),
             f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: a test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
                     f"{len(data)}\n" for name, data in files.items()) + f"{dist_info}/RECORD,,\n"
    path = folder / f"remote_magic-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in {**files, f"{dist_info}/RECORD": record.encode()}.items():
            archive.writestr(name, data)
    return path


def test_pip_refuses_a_wheel_that_is_not_the_printed_one(worker: WorkerProcess, tmp_path: Path,
                                                         pip_into_a_fresh_venv: tuple[Path, tuple[str, ...]]) -> None:
    """The hash in the line is what makes it match the worker: pip checks the file against it."""
    line = _printed_line(worker)
    _, pip_install = pip_into_a_fresh_venv
    other = line["url"].replace(line["sha"], hashlib.sha256(b"another build").hexdigest())
    result = subprocess.run([*pip_install, "--force-reinstall", other],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode != 0 and "DO NOT MATCH THE HASHES" in result.stdout + result.stderr, result.stdout


def test_only_the_wheel_is_served(worker: WorkerProcess) -> None:
    base = _printed_line(worker)["base"]
    for path in ("/", "/remote_magic-0.0.0-py3-none-any.whl", "/../pyproject.toml"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            _download(base + path)
        assert refused.value.code == 404


def test_the_wheels_server_serves_a_bounded_number_of_connections_at_once(worker: WorkerProcess) -> None:
    """Each connection holds a thread of the worker: one more than MAX_CONNECTIONS is closed unanswered, and a
    connection that ends frees its place."""
    line = _printed_line(worker)
    port = int(line["base"].rsplit(":", 1)[1])
    # Idle, each holds its place (until the server's idle timeout); the server accepts them in order.
    held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(MAX_CONNECTIONS)]
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as one_more:
            assert one_more.recv(1) == b""  # closed, unanswered
        held.pop().close()
        deadline = time.monotonic() + 10
        while True:  # its place is free once the server has seen it close
            try:
                data = _download(line["url"].split("#")[0])
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, "no place came free"
                time.sleep(0.05)  # polling with a deadline
        assert hashlib.sha256(data).hexdigest() == line["sha"]
    finally:
        for connection in held:
            connection.close()


class _TunnelStandIn:
    """Stands in for the hub's ngrok tunnel, as tests/hub/test_tunnel.py does for ngrok's service, which can't
    be reached from the test machines: its ``https_endpoint`` forwards a loopback relay (tests/tcp_relay.py, the
    stand-in for an ngrok public address) to the local port, where ngrok would forward its HTTPS address."""

    def __init__(self) -> None:
        self.relay = Relay()
        self.closed = threading.Event()

    def https_endpoint(self, local_port: int) -> _TunnelStandIn:
        self.relay.target = local_port
        return self

    @property
    def public_address(self) -> str:
        return f"http://127.0.0.1:{self.relay.port}"

    def close(self) -> None:
        self.closed.set()
        self.relay.stop()


def test_with_ngrok_the_line_names_the_tunnels_address() -> None:
    tunnel = _TunnelStandIn()
    served = ServedWheel("127.0.0.1", "0.tcp.ngrok.io")
    try:
        served.expose_through(tunnel)  # type: ignore[arg-type]
        line = INSTALL_LINE.fullmatch(served.install_line())
        assert line and line["base"] == tunnel.public_address
        assert hashlib.sha256(_download(line["url"])).hexdigest() == line["sha"]  # through the relay
        assert served.reach() == (f"`%pip install` fetches the remote-magic this worker runs "
                                  f"({remote_magic.__version__}) through the ngrok tunnel's HTTPS: notebooks "
                                  "anywhere reach it")
    finally:
        served.close()
    assert tunnel.closed.is_set()


def test_when_ngrok_wont_open_the_https_endpoint_it_says_how_to_install_otherwise() -> None:
    """A real Tunnel whose session is gone: https_endpoint raises the TunnelError it raises for any refusal."""
    hub_tunnel = Tunnel("tcp://0.tcp.ngrok.io:12345", 5587, None, None, threading.Event())
    served = ServedWheel("127.0.0.1", "0.tcp.ngrok.io")
    try:
        served.expose_through(hub_tunnel)
        assert served.install_line() == ""
        assert served.reach().startswith("the notebook side's wheel can't be served through ngrok (the ngrok "
                                         "tunnel is closed; open a new one)")
        assert "`pip wheel --no-deps -w dist .`" in served.reach()
    finally:
        served.close()


def test_with_advertise_it_says_to_forward_the_wheels_port_too() -> None:
    served = ServedWheel("127.0.0.1", "hub.example.net", advertised=True)
    try:
        assert served.install_line().startswith(f"%pip install http://hub.example.net:{served.server.port}/")
        assert f"from port {served.server.port} of this machine: forward it too" in served.reach()
    finally:
        served.close()
