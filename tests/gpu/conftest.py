"""Fixtures for GPU tests: one real wgpu runtime (lavapipe on CPU-only machines), fresh random data.

Without an adapter the GPU tests skip, unless REMOTE_MAGIC_REQUIRE_GPU=1 (CI), where they fail.
"""

from __future__ import annotations

import secrets
from typing import Iterator

import numpy as np
import pytest
from gpu_checks import make_runtime

from remote_magic.worker.gpu import GpuNamespace, GpuRuntime


@pytest.fixture(scope="session")
def runtime() -> Iterator[GpuRuntime]:
    """The shared runtime (mode 'on'), as the executor would make it."""
    rt = make_runtime()
    yield rt
    rt.close()


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

