"""The built wheel ships the WGSL shaders: build it, install it in a fresh venv, run a kernel there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "remote_magic", "worker", "kernel_provider", "shaders")
BUILD_TIMEOUT_S = 300

CHECK = textwrap.dedent("""
    import json, sys
    import numpy as np
    import shaders
    from remote_magic.errors import GpuError
    from worker.gpu import GpuRuntime

    report = {"shader": shaders.location("matmul"), "worker": __import__("worker").__file__}
    try:
        rt = GpuRuntime.create(mode="on")
    except GpuError as exc:
        report["no_adapter"] = str(exc)
    else:
        a = np.arange(12, dtype=np.float32).reshape(3, 4)
        b = np.arange(8, dtype=np.float32).reshape(4, 2)
        report["matmul"] = rt.gpu.matmul(a, b).numpy().tolist()
        report["expected"] = (a @ b).tolist()
        rt.close()
    print(json.dumps(report))
""")


def run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True,
                            timeout=BUILD_TIMEOUT_S, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert result.returncode == 0, f"{args} failed:\n{result.stdout}\n{result.stderr}"
    return result


def test_wheel_installs_and_runs_a_kernel_from_its_own_shaders(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a clean copy: building in place would leave build/ in the repo
    source.mkdir()
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(path, source / name)
    dist = tmp_path / "dist"
    # An isolated build, as a user's `pip install` does: it gets the setuptools pyproject.toml asks for.
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", dist, source, cwd=tmp_path)
    (wheel,) = dist.glob("remote_magic-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = {n for n in archive.namelist() if n.startswith("shaders/")}
    assert {"shaders/__init__.py", "shaders/matmul.wgsl", "shaders/elementwise.wgsl", "shaders/reduce.wgsl",
            "shaders/softmax.wgsl", "shaders/transpose.wgsl"} <= shipped

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--system-site-packages", venv, cwd=tmp_path)
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    run(python, "-m", "pip", "install", "--no-deps", "--no-index", wheel, cwd=tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    report = json.loads(run(python, "-c", CHECK, cwd=outside).stdout.strip().splitlines()[-1])

    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                    cwd=outside).stdout.strip())
    assert Path(report["shader"]).is_relative_to(site), f"{report['shader']} is not inside {site}"
    assert Path(report["worker"]).is_relative_to(site)
    if "no_adapter" in report:
        if os.environ.get("REMOTE_MAGIC_REQUIRE_GPU") == "1":
            pytest.fail(f"REMOTE_MAGIC_REQUIRE_GPU=1 but no GPU adapter: {report['no_adapter']}")
        pytest.skip(f"no GPU adapter: {report['no_adapter']}")
    assert report["matmul"] == report["expected"]
