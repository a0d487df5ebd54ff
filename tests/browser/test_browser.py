"""Browser tabs as GPU workers, end to end: a real `remote-worker --browser`, Debian's Chromium
driven by Playwright opening the link it prints, and cells whose GPU work runs in the tab's WebGPU
(SwiftShader on a machine without a GPU)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
from browser_tabs import RECORD_DOING, batches_run, chromium, chromium_path, doing, open_tab, send_all

import remote_magic
from remote_magic.errors import RemoteMagicError, ShaderError
from remote_magic.notebook.tables import rows
from support import WorkerProcess, connected_shell, in_thread, run, start_worker, wait_for

pytestmark = pytest.mark.gpu

LINK = re.compile(r"(https?://127\.0\.0\.1:\d+)/#(\S+)")
DOUBLING = """
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < arrayLength(&y)) { y[id.x] = 2.0 * x[id.x] + 1.0; }
}
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    """remote-worker with its own GPU off, serving the tab page on a free port, logging what it does (-v)."""
    chromium_path()
    worker = start_worker(tmp_path_factory.mktemp("browser"), "--listen", "127.0.0.1:0", "--gpu", "off",
                          "--name", "machine", "--browser", "127.0.0.1:0", "--heartbeat-interval", "0.25", "-v",
                          cwd=tmp_path_factory.mktemp("browser-cwd"))
    yield worker
    worker.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


def link_parts(hub: WorkerProcess) -> tuple[str, str]:
    """The page's address and the secret of the link remote-worker printed (just after it said it is ready)."""
    found = wait_for(lambda: LINK.search(hub.log()), 10, "remote-worker to print the link")
    base, secret = found.groups()  # type: ignore[attr-defined]
    return base, secret


def link_of(hub: WorkerProcess) -> str:
    return "/#".join(link_parts(hub))


def tab_workers(client: remote_magic.Client) -> dict[str, dict[str, Any]]:
    return {w["name"]: w for w in client.workers() if (w.get("gpu") or {}).get("browser_tab")}


@pytest.fixture
def client(hub: WorkerProcess) -> Iterator[remote_magic.Client]:
    with remote_magic.connect(hub.token, timeout=10) as c:
        yield c


def join(browser: Any, hub: WorkerProcess, client: remote_magic.Client, name: str, *,
         init_script: str | None = None) -> Any:
    """A tab that opened the link with ?name=NAME, once the hub lists its worker."""
    base, secret = link_parts(hub)
    page = open_tab(browser, f"{base}/?name={name}#{secret}", init_script=init_script)
    wait_for(lambda: name in tab_workers(client), 30, f"tab {name} in the fleet")
    return page


def endless_gpu_job(client: remote_magic.Client, worker: str) -> Future[Any]:
    """A cell on ``worker`` that keeps its tab busy with matmuls until something stops it."""
    x = np.ones((128, 128), np.float32)
    code = "while True:\n    s = float((x @ x).sum())"
    return in_thread(lambda: client.execute(code, {"x": x}, worker=worker, gpu=True), f"job on {worker}")


def wait_for_gpu_work(page: Any) -> None:
    """Until a job's GPU work is running in the tab (its worker's own start ran a batch or two)."""
    before = batches_run(page)
    wait_for(lambda: batches_run(page) > before + 5, 30, "the job's GPU work to reach the tab")


def test_the_printed_link_makes_a_tab_a_worker_that_runs_a_matmul_cell(hub: WorkerProcess, browser: Any,
                                                                       client: remote_magic.Client) -> None:
    link = link_of(hub)
    # A link on 127.0.0.1 opens only on this machine: no QR code for a phone's camera, but what a phone needs
    said = wait_for(lambda: re.search(r"remote-worker: this link opens only in a browser on this machine "
                                      r"\(127\.0\.0\.1\); for a phone or another device, (.*)", hub.log()), 10,
                    "what a phone needs, under the link").group(1)  # type: ignore[attr-defined]
    assert "--ngrok" in said and "--browser-cert" in said, said
    log = hub.log()
    assert not {"█", "▀", "▄"} & set(log), log
    assert link.split("#")[1] not in re.sub(re.escape(link), "", log), "the secret appears only in the link"
    page = join(browser, hub, client, "phone")
    try:
        tab = tab_workers(client)["phone"]
        assert tab["gpu"]["backend"] == "WebGPU" and tab["gpu"]["active"] is True
        assert tab["gpu"]["adapter"] and tab["gpu"]["limits"]["max_storage_buffer_binding_size"] > 0
        assert tab["labels"] == {"browser": "tab"}
        assert "Joined the fleet as worker “phone”" in page.inner_text("#state")
        # The tab's worker describes the tab: its cells' Python runs on this host, but this host's CPUs, memory,
        # speed and battery aren't the tab's, so it claims none; placement ranks a software adapter as no GPU.
        assert not {"cpu_count", "memory_bytes", "speed"} & set(tab) and tab["battery"] is None
        assert tab["python"] and tab["hostname"]
        [(_, _, _, _, cpus, memory, _, power, *_)] = rows([tab])
        assert (cpus, memory, power) == ("unknown", "unknown", "unknown")
        software = tab["gpu"]["adapter_type"] == "software"  # SwiftShader, on a machine without a GPU
        assert client.execute("x = 1", prefer="fastest").worker == ("machine" if software else "phone")

        # Before any work, the page says it waits for some
        assert doing(page) == "Waiting for work: the GPU work of the cells placed on worker “phone” will run here."
        assert batches_run(page) >= 1  # its worker's start opened the tab's device: no work of a job
        page.evaluate(RECORD_DOING)
        with connected_shell(hub.token) as (shell, _):
            result, out = run(shell, "%offload_workers --all")
            table = str(result.result)
            assert "phone" in table and "WebGPU in a browser tab" in table and "browser=tab" in table, table
            shell.user_ns["A"] = np.random.default_rng(1).standard_normal((96, 130), dtype=np.float32)
            shell.user_ns["B"] = np.random.default_rng(2).standard_normal((130, 70), dtype=np.float32)
            result, out = run(shell, "%%offload --worker phone --gpu --stats\nC = A @ B\ntotal = float(C.sum())")
            assert result.success, out.stderr
            C = shell.user_ns["C"]
            assert isinstance(C, np.ndarray) and C.shape == (96, 70)
            expected = shell.user_ns["A"].astype(np.float64) @ shell.user_ns["B"].astype(np.float64)
            assert np.linalg.norm(C - expected) / np.linalg.norm(expected) < 1e-5
            assert "matmul" in out.stderr, out.stderr  # the stats name the kernel that ran in the tab
        # While the first job compiled its kernels the page said so, then what the job did once it ended
        said = page.evaluate("saidDoing")
        assert any(re.fullmatch(r"Running job 1 \(since .+\): compiling kernel 1 \(matmul\.wgsl\): the first use "
                                r"of each kernel takes a few seconds here\.", line) for line in said), said
        ended = wait_for(lambda: re.fullmatch(r"Idle since (.+), waiting for work\. Ran 1 job: (\d+) batches of GPU "
                                              r"work, (\d+) kernels? compiled\.", doing(page)), 10,
                         "the page to say the job ended")
        assert int(ended.group(2)) >= 2 and int(ended.group(3)) >= 1, doing(page)  # type: ignore[attr-defined]
        assert not [line for line in said if re.search(r"\b1 (batches|kernels|jobs)\b", line)], said
    finally:
        page.close()
    wait_for(lambda: "phone" not in tab_workers(client), 20, "the closed tab to leave the fleet")
    # Routine events, said as the command's own lines, and logged as INFO, not as warnings
    log = hub.log()
    assert "remote-worker: browser tab 'phone' joined as worker 'phone'" in log
    assert "remote-worker: INFO remote_magic.worker.browser.server: browser tab 'phone' joined from 127.0.0.1" in log
    wait_for(lambda: "remote-worker: browser tab worker 'phone' left: " in hub.log(), 10, "the tab's leaving said")
    left = wait_for(lambda: re.search(r"remote-worker: (\w+) remote_magic\.worker\.browser\.bridge: the browser tab "
                                      r"'phone' was closed or reloaded", hub.log()), 10, "the tab's closing logged")
    assert left.group(1) == "INFO", left.group(0)  # type: ignore[attr-defined]
    log = hub.log()
    assert not [line for line in log.splitlines() if "WARNING" in line and "'phone'" in line], log


def test_a_custom_kernel_runs_in_the_tab_and_a_compile_error_has_its_position(
        hub: WorkerProcess, browser: Any, client: remote_magic.Client) -> None:
    page = join(browser, hub, client, "tablet")
    try:
        x = np.linspace(-3, 3, 1000, dtype=np.float32)
        result = client.execute("y = gpu.doubled(x)", {"x": x}, worker="tablet", gpu=True,
                                gpu_kernels={"doubled": DOUBLING})
        np.testing.assert_allclose(result.values["y"], 2 * x + 1, rtol=1e-6)
        broken = DOUBLING.replace("2.0 * x[id.x]", "2.0 * z[id.x]")
        with pytest.raises(ShaderError, match="line 6, column 51: error: unresolved value 'z'") as failure:
            client.execute("y = gpu.broken(x)", {"x": x}, worker="tablet", gpu=True, gpu_kernels={"broken": broken})
        assert (failure.value.line, failure.value.column) == (6, 51)
    finally:
        page.close()


def test_a_tab_closed_mid_job_fails_it_within_seconds_naming_the_tab(hub: WorkerProcess, browser: Any,
                                                                    client: remote_magic.Client) -> None:
    page = join(browser, hub, client, "laptop")
    job = endless_gpu_job(client, "laptop")
    wait_for_gpu_work(page)
    closed_at = time.monotonic()
    page.close()
    with pytest.raises(RemoteMagicError) as failure:
        job.result(timeout=30)
    took = time.monotonic() - closed_at
    message = str(failure.value)
    assert "laptop" in message and "closed" in message, message
    assert took < 10, f"the job failed {took:.1f} s after its tab closed"
    wait_for(lambda: "laptop" not in tab_workers(client), 20, "the closed tab to leave the fleet")
    assert client.execute("z = 1 + 1", worker="machine").values["z"] == 2, "the worker's other work goes on"


COUNT_WAKE_LOCKS = """
    window.wakeLocksAsked = 0;
    if (navigator.wakeLock) {
        const request = navigator.wakeLock.request.bind(navigator.wakeLock);
        navigator.wakeLock.request = type => { window.wakeLocksAsked++; return request(type); };
    }
"""
"""Counts the page's requests for a screen wake lock, passing each on to the browser."""
WAKE_LOCK_SAID = (r"Keeping the screen on while this tab is in the fleet\.|The browser refused to keep the screen on "
                  r"\(\w+: .*\): set the screen to stay on \(auto-lock: never\) while this tab works, or it leaves "
                  r"the fleet when the screen locks\.")
"""What the page says of its wake lock, granted or refused (headless Chromium may do either)."""


def test_a_tab_in_the_background_fails_its_job_and_joins_again_when_shown(
        hub: WorkerProcess, browser: Any, client: remote_magic.Client) -> None:
    page = join(browser, hub, client, "ipad", init_script=COUNT_WAKE_LOCKS)
    try:
        # Joined, it asks to keep the screen on (a locked screen takes it out), and says how that went
        assert page.evaluate("wakeLocksAsked") == 1
        wait_for(lambda: re.fullmatch(WAKE_LOCK_SAID, page.inner_text("#awake")), 10, "the page to say about its "
                 f"wake lock (it says {page.inner_text('#awake')!r})")
        hide = """hidden => {
            const state = hidden ? 'hidden' : 'visible';
            Object.defineProperty(document, 'visibilityState', {value: state, configurable: true});
            document.dispatchEvent(new Event('visibilitychange'));
        }"""
        job = endless_gpu_job(client, "ipad")
        wait_for_gpu_work(page)
        page.evaluate(hide, True)
        with pytest.raises(RemoteMagicError, match="ipad.*went to the background"):
            job.result(timeout=30)
        wait_for(lambda: "ipad" not in tab_workers(client), 20, "the hidden tab to leave the fleet")
        page.evaluate(hide, False)
        wait_for(lambda: "ipad" in tab_workers(client), 30, "the tab to join again when shown")
        # The lock, let go while hidden, is asked for again once shown and joined
        wait_for(lambda: page.evaluate("wakeLocksAsked") == 2, 10, "the wake lock asked for again")
        wait_for(lambda: re.fullmatch(WAKE_LOCK_SAID, page.inner_text("#awake")), 10, "the page to say about its "
                 "wake lock again")
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        out = client.execute("y = x * 2", {"x": x}, worker="ipad", gpu=True).values["y"]
        np.testing.assert_array_equal(out, x * 2)
    finally:
        page.close()


def test_a_lost_device_fails_the_job_and_the_next_one_gets_a_new_device(
        hub: WorkerProcess, browser: Any, client: remote_magic.Client) -> None:
    page = join(browser, hub, client, "gpu-loser")
    try:
        job = endless_gpu_job(client, "gpu-loser")
        wait_for_gpu_work(page)
        page.evaluate("() => { for (const o of objects.values()) if (o instanceof GPUDevice) o.destroy(); }")
        with pytest.raises(RemoteMagicError, match="lost"):
            job.result(timeout=30)
        x = np.arange(6, dtype=np.float32)
        out = client.execute("y = x + 1", {"x": x}, worker="gpu-loser", gpu=True)
        np.testing.assert_array_equal(out.values["y"], x + 1)
    finally:
        page.close()


def test_a_wrong_secret_is_refused_and_the_page_says_so(hub: WorkerProcess, browser: Any,
                                                        client: remote_magic.Client) -> None:
    base, _ = link_parts(hub)
    page = open_tab(browser, f"{base}/?name=intruder#not-the-secret", joined=False)
    try:
        page.wait_for_function("document.body.className === 'failed'", timeout=30_000)
        assert "wrong secret" in page.inner_text("#state")
        assert "intruder" not in tab_workers(client)
    finally:
        page.close()


def test_a_browser_without_webgpu_says_the_tab_cant_be_a_gpu_worker_and_what_to_do(hub: WorkerProcess,
                                                                                    browser: Any) -> None:
    plain = browser.browser_type.launch(executable_path=chromium_path(), headless=True)  # no WebGPU flag
    try:
        page = open_tab(plain, link_of(hub), joined=False)
        page.wait_for_function("document.body.className === 'failed'", timeout=30_000)
        state, about = page.inner_text("#state"), page.inner_text("#about")
        assert state.startswith("This tab can't be a GPU worker: this browser has WebGPU but offers no WebGPU "
                                "adapter"), state
        assert "chrome://gpu" in about and "--enable-unsafe-webgpu" in about, about
        assert "this device's GPU" not in page.inner_text("body"), "the page says nothing runs on this device's GPU"
        page.close()
        # A browser without WebGPU at all (one whose navigator has no gpu)
        page = open_tab(plain, link_of(hub), joined=False, init_script="delete Navigator.prototype.gpu")
        page.wait_for_function("document.body.className === 'failed'", timeout=30_000)
        state, about = page.inner_text("#state"), page.inner_text("#about")
        assert state == "This tab can't be a GPU worker: this browser has no WebGPU.", state
        assert about.startswith("Open the link in a browser that has it: Chrome or Edge 113 and later"), about
    finally:
        plain.close()


def test_malformed_and_oversized_messages_are_refused_without_harm(hub: WorkerProcess, browser: Any,
                                                                  client: remote_magic.Client) -> None:
    import aiohttp

    base, secret = link_parts(hub)
    door, work = base.replace("http", "ws") + "/hello", base.replace("http", "ws") + "/ws"

    def refused(url: str, *messages: Any) -> tuple[int | None, str]:
        """How the worker closes a WebSocket to ``url`` that sends ``messages`` (run off this thread:
        Playwright's loop runs on it)."""
        result: tuple[int | None, str] = in_thread(lambda: asyncio.run(exchange(url, *messages)), "fuzz").result(60)
        return result

    async def exchange(url: str, *messages: Any) -> tuple[int | None, str]:
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(url, max_msg_size=0) as socket:
                if not await send_all(socket, messages):  # refused while still sending
                    return None, "dropped"
                reply = await socket.receive(timeout=20)
                while reply.type == aiohttp.WSMsgType.TEXT:  # the welcome of a tab that joined
                    reply = await socket.receive(timeout=20)
                assert reply.type == aiohttp.WSMsgType.CLOSE, reply
                return reply.data, str(reply.extra or "")

    def ticket() -> str:
        async def prove() -> str:
            async with aiohttp.ClientSession() as session:
                async with session.ws_connect(door) as socket:
                    await socket.send_str(json.dumps({"type": "hello", "secret": secret, "name": "fuzz",
                                                      "adapter": {}}))
                    answer = json.loads((await socket.receive(timeout=20)).data)
                    assert answer["type"] == "ticket", answer
                    return str(answer["ticket"])
        proven: str = in_thread(lambda: asyncio.run(prove()), "prove").result(60)
        return proven

    def status_without(url: str) -> int:
        async def opening() -> int:
            async with aiohttp.ClientSession() as session:
                try:
                    async with session.ws_connect(url):
                        return 101
                except aiohttp.WSServerHandshakeError as exc:
                    return exc.status
        status: int = in_thread(lambda: asyncio.run(opening()), "open").result(60)
        return status

    assert refused(door, "not json")[0] == 4400
    assert refused(door, json.dumps({"type": "hello", "secret": "nope"}))[0] == 4401
    assert refused(door, b"\x00\x01binary first")[0] == 4400
    code, _ = refused(door, "x" * (1 << 20))  # a stranger's hello is read up to 64 KiB, no further
    assert code in (1009, None), code
    assert status_without(work) == 403 and status_without(f"{work}?ticket=made-up") == 403
    used = ticket()
    code, _ = refused(f"{work}?ticket={used}", b"\xff\xff\xff\xff garbage answer")
    assert code == 4400
    assert status_without(f"{work}?ticket={used}") == 403  # a ticket opens one socket
    code, _ = refused(f"{work}?ticket={ticket()}", b"\x00" * (40 * 10**6))
    assert code in (1009, None), code  # message too big, said or the connection dropped while it was sent
    wait_for(lambda: re.search(r"browser tab 'fuzz[-\d]*' sent a message the worker refused", hub.log()), 10,
             "the refusal in the log")
    page = join(browser, hub, client, "after-fuzz")
    try:
        x = np.arange(5, dtype=np.float32)
        out = client.execute("y = x - 1", {"x": x}, worker="after-fuzz", gpu=True)
        np.testing.assert_array_equal(out.values["y"], x - 1)
    finally:
        page.close()


def test_the_page_over_https_with_the_users_certificate(tmp_path: Path, browser: Any) -> None:
    import trustme

    authority = trustme.CA()
    issued = authority.issue_cert("127.0.0.1")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    issued.cert_chain_pems[0].write_to_path(cert)
    issued.private_key_pem.write_to_path(key)
    hub = start_worker(tmp_path / "tls", "--listen", "127.0.0.1:0", "--gpu", "off", "--name", "machine",
                       "--browser", "127.0.0.1:0", "--browser-cert", str(cert), "--browser-key", str(key))
    try:
        base, secret = link_parts(hub)
        assert base.startswith("https://"), base
        # The test's own authority isn't in Chromium's store: this browser context trusts what it is shown.
        context = browser.new_context(ignore_https_errors=True)
        page = open_tab(context, f"{base}/?name=secure#{secret}")
        assert page.evaluate("window.isSecureContext && location.protocol") == "https:"
        with remote_magic.connect(hub.token, timeout=10) as client:
            wait_for(lambda: "secure" in tab_workers(client), 30, "the HTTPS tab in the fleet")
            x = np.arange(8, dtype=np.float32)
            np.testing.assert_array_equal(client.execute("y = x * x", {"x": x}, worker="secure", gpu=True)
                                          .values["y"], x * x)
        context.close()
    finally:
        hub.stop()


def test_a_certificate_without_its_key_is_refused_with_what_to_do(tmp_path: Path) -> None:
    result = subprocess.run(["remote-worker", "--listen", "127.0.0.1:0", "--browser", "127.0.0.1:0",
                             "--browser-cert", str(tmp_path / "cert.pem")], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60, env={**os.environ, "REMOTE_MAGIC_HOME": str(tmp_path / "home")})
    assert result.returncode == 2
    assert "--browser-cert and --browser-key go together" in result.stderr


def test_a_frozen_tab_fails_its_job_as_not_answering(hub: WorkerProcess, browser: Any,
                                                     client: remote_magic.Client) -> None:
    """A page whose script stops (paused in the debugger here; frozen by a browser, or a hung device): its
    WebSocket stays open, it just never answers."""
    page = join(browser, hub, client, "frozen")
    try:
        job = endless_gpu_job(client, "frozen")
        wait_for_gpu_work(page)
        frozen_at = time.monotonic()
        debugger = page.context.new_cdp_session(page)
        debugger.send("Debugger.enable")
        debugger.send("Debugger.pause")
        with pytest.raises(RemoteMagicError, match="'frozen' stopped answering"):
            job.result(timeout=30)
        assert time.monotonic() - frozen_at < 15
        wait_for(lambda: "frozen" not in tab_workers(client), 20, "the frozen tab to leave the fleet")
        debugger.send("Debugger.resume")
    finally:
        page.close()
