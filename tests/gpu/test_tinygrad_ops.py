"""tinygrad's own ``test_ops.py`` (``tests/gpu/tinygrad/``, unchanged) on the worker's GPU device, PyTorch on the CPU as
its reference: every op tinygrad has, forward and backward, through ``worker/gpu/tinygrad_device.py`` on the real
adapter (lavapipe without a GPU). In a process of its own, whose tinygrad device is the one an offloaded cell gets
(``tests/gpu/tinygrad/on_worker_gpu.py``). The default suite runs the tests of ``tests/gpu/tinygrad/default_tests.txt``
(``choose_tests.py`` says how they are chosen: every operation, with each string or boolean argument it is given);
``REMOTE_MAGIC_TINYGRAD_ALL_OPS=1`` runs them all (about 4 minutes on 2 cores)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from browser_tabs import chromium_path

TINYGRAD_TESTS = Path(__file__).parent / "tinygrad"
sys.path.insert(0, str(TINYGRAD_TESTS))
from choose_tests import default_tests, ops_command, ops_environment  # noqa: E402

pytestmark = pytest.mark.gpu
TIMEOUT_S = 1800
"""A bound on one run of test_ops.py, not a wait: about 2.5 minutes on 2 idle cores, over 14.5 with both busy on a
slow 2-core VM (where 900 s failed the test)."""
SKIPPED_ON_WEBGPU = 13
"""Tests tinygrad itself skips on its WEBGPU device (of all of them)."""


@pytest.mark.timeout(TIMEOUT_S)
def test_tinygrad_test_ops_pass_on_the_workers_gpu_device() -> None:
    try:
        from remote_magic.worker.gpu.device import open_device

        open_device().close()
    except Exception as exc:  # no adapter: skipped here, a failure in CI
        if os.environ.get("REMOTE_MAGIC_REQUIRE_GPU") == "1":
            pytest.fail(f"no wgpu adapter: {exc}")
        pytest.skip(f"no wgpu adapter: {exc}")
    passed = _test_ops("on_worker_gpu")
    assert passed >= len(default_tests()) - SKIPPED_ON_WEBGPU


@pytest.mark.timeout(TIMEOUT_S)
def test_a_subset_of_tinygrad_test_ops_pass_in_a_browser_tab() -> None:
    chromium_path()
    passed = _test_ops("in_a_tab")
    assert passed >= 40  # (of 42 selected)


def _test_ops(plugin: str) -> int:
    """Runs test_ops.py with ``plugin`` choosing the device and the tests; how many passed (all must)."""
    run = subprocess.run([*ops_command(plugin), "--timeout", "300"], cwd=TINYGRAD_TESTS, env=ops_environment(),
                         capture_output=True, text=True, timeout=TIMEOUT_S - 30)
    tail = (run.stdout + run.stderr)[-6000:]
    assert run.returncode == 0, tail
    passed = re.search(r"(\d+) passed", run.stdout)
    assert passed, tail
    return int(passed.group(1))
