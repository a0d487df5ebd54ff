"""The built wheel ships the WGSL shaders: build it, install it in a fresh venv, run a kernel there."""

from __future__ import annotations

import io
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


def test_the_wheel_a_worker_serves_holds_what_pip_builds(wheel: Path) -> None:
    """remote-worker packs its own files into the notebook side's wheel (worker/own_wheel.py) instead of running
    a build backend: the same files with the same content as the wheel pip builds from this clone, and the same
    entry points; its metadata is the installed copy's (an editable install's dates from when it was installed,
    so only what a notebook's pip reads of it first is compared)."""
    from email.parser import HeaderParser

    from remote_magic.worker.own_wheel import build_own_wheel

    served = zipfile.ZipFile(io.BytesIO(build_own_wheel().data))
    with zipfile.ZipFile(wheel) as built:
        ours = {n for n in served.namelist() if ".dist-info/" not in n}
        theirs = {n for n in built.namelist() if ".dist-info/" not in n}
        assert ours == theirs, (sorted(ours - theirs), sorted(theirs - ours))
        assert [n for n in ours if served.read(n) != built.read(n)] == []
        metadata_of = [{n.split("/")[1]: archive.read(n) for n in archive.namelist() if ".dist-info/" in n}
                       for archive in (served, built)]
    assert metadata_of[0]["entry_points.txt"] == metadata_of[1]["entry_points.txt"]
    metadata = [HeaderParser().parsestr(texts["METADATA"].decode()) for texts in metadata_of]
    for field in ("Name", "Requires-Python"):
        assert metadata[0][field] == metadata[1][field], field
    assert metadata[0]["Version"].startswith(metadata[1]["Version"] + "+")  # and a label of the files' digest
    notebook_side = [sorted(r for r in m.get_all("Requires-Dist") or [] if "extra ==" not in r) for m in metadata]
    assert notebook_side[0] == notebook_side[1]
