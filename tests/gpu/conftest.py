"""Fixtures for GPU tests: fresh random data, and the runtime on each backend, so every test that takes
``runtime`` or ``gpu`` runs twice: on wgpu-py's adapter (lavapipe on CPU-only machines), and on the
WebGPU of a real browser tab (headless Chromium; SwiftShader without a GPU) through the tab bridge.

Without an adapter (or Chromium) those tests skip, unless REMOTE_MAGIC_REQUIRE_GPU=1 (CI), where they fail.
"""

from __future__ import annotations

import secrets
from typing import Iterator

import numpy as np
import pytest
from gpu_checks import make_runtime

from remote_magic.worker.gpu import GpuNamespace, GpuRuntime


@pytest.fixture(scope="session")
def wgpu_runtime() -> Iterator[GpuRuntime]:
    """The shared wgpu runtime (mode 'on'), as the executor would make it."""
    rt = make_runtime()
    yield rt
    rt.close()


@pytest.fixture(scope="session")
def tab_runtime() -> Iterator[GpuRuntime]:
    """A runtime whose device is a browser tab's WebGPU, as a tab worker's executor makes it."""
    from browser_tabs import tab_on_its_own_thread

    from remote_magic.worker.browser.server import TabServer

    bridges = []
    server = TabServer("127.0.0.1", 0, lambda bridge: bridges.append(bridge), lambda bridge, _: None)
    server.start()
    try:
        with tab_on_its_own_thread(server.link):
            rt = GpuRuntime.create(tab=bridges[0].endpoint)
            yield rt
            rt.close()
    finally:
        server.close()


@pytest.fixture(scope="session", params=["wgpu", "tab"])
def runtime(request: pytest.FixtureRequest) -> GpuRuntime:
    """The runtime of each backend in turn: wgpu-py on this machine, and a browser tab."""
    rt: GpuRuntime = request.getfixturevalue(f"{request.param}_runtime")
    return rt


@pytest.fixture
def gpu(runtime: GpuRuntime) -> GpuNamespace:
    """The ``gpu`` object cells see; stats are reset so each test counts its own work."""
    runtime.take_stats()
    return runtime.gpu


@pytest.fixture
def rng() -> np.random.Generator:
    """Fresh random inputs each run; the seed is printed so a failure can be replayed."""
    seed = secrets.randbits(32)
    print(f"random seed: {seed}")
    return np.random.default_rng(seed)

