"""Everything installs under the one import name `remote_magic`: a user's own `worker.py` and
`shaders/` beside their notebook (first on sys.path) shadow nothing.

A real remote-worker started in such a folder runs a GPU cell; a notebook-side process there
imports the package, not the user's files.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import remote_magic
from support import require_a_gpu, start_worker

TRAP = "raise RuntimeError('the user\\'s own {} was imported instead of remote-magic\\'s')\n"


@pytest.fixture
def users_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "notebooks"
    (folder / "shaders").mkdir(parents=True)
    (folder / "worker.py").write_text(TRAP.format("worker.py"))
    (folder / "shaders" / "__init__.py").write_text(TRAP.format("shaders/"))
    (folder / "kernel_provider.py").write_text(TRAP.format("kernel_provider.py"))
    return folder


@pytest.mark.gpu
def test_a_worker_started_beside_a_users_worker_py_runs_a_gpu_cell(users_folder: Path, tmp_path: Path) -> None:
    worker = start_worker(tmp_path / "w", "--listen", "127.0.0.1:0", "--gpu", "on", cwd=users_folder)
    try:
        require_a_gpu(worker)
        with remote_magic.connect(worker.token, timeout=10) as client:
            a, b = np.ones((4, 3), np.float32), np.full((3, 2), 2.0, np.float32)
            result = client.execute("c = a @ b", {"a": a, "b": b}, gpu=["matmul"])
    finally:
        worker.stop()
    np.testing.assert_allclose(result.values["c"], a @ b)
    assert result.stats["kernels"] == {"matmul": 1}
    assert "was imported instead" not in worker.log()


def test_the_notebook_side_imports_beside_a_users_worker_py(users_folder: Path) -> None:
    probe = subprocess.run(
        [sys.executable, "-c", "import remote_magic.worker.gpu, remote_magic.shaders, remote_magic.kernel_provider, "
         "remote_magic.notebook.magics; print(remote_magic.shaders.location('matmul'))"],
        cwd=users_folder, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(users_folder)})
    assert probe.returncode == 0, probe.stderr
    assert "was imported instead" not in probe.stderr
    assert not probe.stdout.strip().startswith(str(users_folder))


def test_the_notebook_side_loads_nothing_of_the_worker_side() -> None:
    """%load_ext, connect and %offload_serve's modules import no worker code and no worker-only library
    (xxhash is the notebook side's too now: digests of large values)."""
    probe = subprocess.run(
        [sys.executable, "-c", "import sys, remote_magic, remote_magic.notebook.magics, remote_magic.hub.served; "
         "print(sorted(m for m in sys.modules if m.split('.')[0] in ('wgpu', 'psutil', 'ngrok', 'zeroconf') "
         "or m.startswith('remote_magic.worker')))"],
        capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "[]"
