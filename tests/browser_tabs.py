"""Helpers for tests with a real browser: Debian's Chromium driven by Playwright, its WebGPU on
SwiftShader (the CPU) where the machine has no GPU.

Without Chromium the browser tests skip, unless REMOTE_MAGIC_REQUIRE_GPU=1 (CI), where they fail:
the test command installs it (`scripts/test.sh`).
"""

from __future__ import annotations

import os
import shutil
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


def open_tab(browser: Any, link: str, *, joined: bool = True) -> Any:
    """A new page at ``link``; with ``joined``, once it says it joined the fleet."""
    page = browser.new_page()
    page.goto(link)
    if joined:
        page.wait_for_function("document.body.className === 'joined' || document.body.className === 'failed'",
                               timeout=JOIN_TIMEOUT_S * 1000)
        state = page.inner_text("#state")
        assert "Joined the fleet" in state, state
    return page
