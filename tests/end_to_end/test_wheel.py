"""The built wheel ships the WGSL shaders: build it, install it in a fresh venv, run a kernel there."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from support import make_venv, run_command

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CHECK = textwrap.dedent("""
    import json, sys
    import numpy as np
    from remote_magic import shaders
    from remote_magic.errors import GpuError
    from remote_magic.worker.gpu import GpuRuntime

    import remote_magic.worker

    report = {"shader": shaders.location("matmul"), "worker": remote_magic.worker.__file__}
    try:
        rt = GpuRuntime.create(mode="on")
    except GpuError as exc:
        report["no_adapter"] = str(exc)
    else:
        a = np.arange(12, dtype=np.float32).reshape(3, 4)
        b = np.arange(8, dtype=np.float32).reshape(4, 2)
        report["matmul"] = np.asarray(rt.gpu.matmul(a, b)).tolist()
        report["expected"] = (a @ b).tolist()
        rt.close()
    print(json.dumps(report))
""")


def test_building_the_wheel_prints_no_setuptools_warning(wheel: Path) -> None:
    log = (wheel.parents[1] / "build.log").read_text()
    assert "Building wheel for remote-magic" in log  # the backend's own output is there to check
    assert "BuildBackendWarning" not in log and "SetuptoolsDeprecationWarning" not in log, log
    assert "absent from the `packages` configuration" not in log, log
    with zipfile.ZipFile(wheel) as archive:
        page = {n for n in archive.namelist() if n.startswith("remote_magic/worker/browser/page/")}
    assert page == {"remote_magic/worker/browser/page/index.html", "remote_magic/worker/browser/page/tab.js"}


def test_wheel_installs_and_runs_a_kernel_from_its_own_shaders(tmp_path: Path, wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    shipped = {n.removeprefix("remote_magic/shaders/") for n in names if n.startswith("remote_magic/shaders/")}
    assert {"__init__.py", "matmul.wgsl", "elementwise.wgsl", "reduce.wgsl", "softmax.wgsl",
            "transpose.wgsl"} <= shipped
    # One import name: nothing outside remote_magic/ (and the distribution's own metadata).
    assert {n.split("/")[0] for n in names} == {"remote_magic", wheel.name.split("-py3")[0] + ".dist-info"}

    # A clean venv (nothing from the base interpreter): the worker side's dependencies come from the
    # index, as on a user's machine.
    python = make_venv(sys.executable, tmp_path / "venv")
    run_command(python, "-m", "pip", "install", f"{wheel}[worker]", cwd=tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    report = json.loads(run_command(python, "-c", CHECK, cwd=outside).stdout.strip().splitlines()[-1])

    site = Path(run_command(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                            cwd=outside).stdout.strip())
    assert Path(report["shader"]).is_relative_to(site), f"{report['shader']} is not inside {site}"
    assert Path(report["worker"]).is_relative_to(site)
    if "no_adapter" in report:
        if os.environ.get("REMOTE_MAGIC_REQUIRE_GPU") == "1":
            pytest.fail(f"REMOTE_MAGIC_REQUIRE_GPU=1 but no GPU adapter: {report['no_adapter']}")
        pytest.skip(f"no GPU adapter: {report['no_adapter']}")
    assert report["matmul"] == report["expected"]
