"""Helpers for tests with a real browser: Debian's Chromium driven by Playwright, its WebGPU on
SwiftShader (the CPU) where the machine has no GPU.

Without Chromium the browser tests skip, unless REMOTE_MAGIC_REQUIRE_GPU=1 (CI), where they fail:
the test command installs it (`scripts/test.sh`).
"""

from __future__ import annotations

import os
import shutil
import threading
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, Iterator

import pytest

CHROMIUM_FLAGS = ["--enable-unsafe-webgpu"]
"""Chromium on Linux offers WebGPU only with this flag; with it, headless Chromium's adapter is SwiftShader."""
JOIN_TIMEOUT_S = 60.0


def chromium_path() -> str:
    """Debian's Chromium (or $REMOTE_MAGIC_CHROMIUM); skips, or fails in CI, when there is none."""
    path = os.environ.get("REMOTE_MAGIC_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        message = "no Chromium: `apt-get install chromium` (scripts/test.sh does)"
        if os.environ.get("REMOTE_MAGIC_REQUIRE_GPU") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium with WebGPU on, closed after."""
    from playwright.sync_api import sync_playwright

    path = chromium_path()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=path, args=CHROMIUM_FLAGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def open_tab(browser: Any, link: str, *, joined: bool = True, init_script: str | None = None) -> Any:
    """A new page at ``link``; with ``joined``, once it says it joined the fleet. ``init_script`` runs in the
    page before its own scripts."""
    page = browser.new_page()
    if init_script:
        page.add_init_script(init_script)
    page.goto(link)
    if joined:
        page.wait_for_function("document.body.className === 'joined' || document.body.className === 'failed'",
                               timeout=JOIN_TIMEOUT_S * 1000)
        state = page.inner_text("#state")
        assert "Joined the fleet" in state, state
    return page


async def send_all(socket: Any, messages: Any) -> bool:
    """Send ``messages`` (``str`` as text, ``bytes`` as binary) on an aiohttp WebSocket; False when the server
    dropped the connection while they were sent (it refused one)."""
    try:
        for message in messages:
            if isinstance(message, bytes):
                await socket.send_bytes(message)
            else:
                await socket.send_str(message)
    except ConnectionError:
        return False
    return True


@contextmanager
def tab_on_its_own_thread(link: str) -> Iterator[None]:
    """A tab that opened ``link`` and joined, in a Chromium driven from a thread of its own, until the block
    ends. Playwright's sync API runs an event loop on the thread that uses it, which would leave later tests'
    ``asyncio.run`` on the main thread refused; this keeps it off the main thread."""
    chromium_path()  # skip or fail here, on the test's thread
    joined: Future[None] = Future()
    done = threading.Event()

    def run() -> None:
        try:
            with chromium() as browser:
                page = open_tab(browser, link)
                joined.set_result(None)
                done.wait()
                page.close()
        except BaseException as exc:
            if not joined.done():
                joined.set_exception(exc)
            raise

    thread = threading.Thread(target=run, name="chromium", daemon=True)
    thread.start()
    joined.result(timeout=JOIN_TIMEOUT_S + 30)
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=30)


@contextmanager
def tab_bridge() -> Iterator[str]:
    """A tab server on 127.0.0.1 and a headless Chromium tab joined to it, as a tab worker has them: yields the
    endpoint of the tab's bridge, where an executor's device (``GpuRuntime.create(tab=...)``) connects."""
    from remote_magic.worker.browser.server import TabServer

    bridges: list[Any] = []
    server = TabServer("127.0.0.1", 0, bridges.append, lambda *_: None)
    server.start()
    try:
        with chromium() as browser:
            page = open_tab(browser, server.link)
            try:
                yield bridges[0].endpoint
            finally:
                page.close()
    finally:
        server.close()


def batches_run(page: Any) -> int:
    """How many batches of GPU work the tab has run (its page's count)."""
    count: int = page.evaluate("batches")
    return count


def doing(page: Any) -> str:
    """What the page says the tab is doing."""
    text: str = page.inner_text("#doing")
    return text


RECORD_DOING = """() => {
    window.saidDoing = [];
    const line = document.getElementById('doing');
    new MutationObserver(() => window.saidDoing.push(line.textContent)).observe(line, {childList: true,
                                                                                 characterData: true, subtree: true});
}"""
"""Keeps each thing the page says it is doing in ``saidDoing``, for a test to read after the fact."""
