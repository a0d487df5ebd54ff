"""The wheel pip builds: no setuptools warnings, the browser page and the shaders inside, nothing outside
remote_magic/; and the wheel a worker serves holds the same (tests/worker/test_worker_pythons.py installs the
built one in a fresh venv and runs a kernel from its shaders)."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]



def test_building_the_wheel_prints_no_setuptools_warning(wheel: Path) -> None:
    log = (wheel.parents[1] / "build.log").read_text()
    assert "Building wheel for remote-magic" in log  # the backend's own output is there to check
    assert "BuildBackendWarning" not in log and "SetuptoolsDeprecationWarning" not in log, log
    assert "absent from the `packages` configuration" not in log, log
    with zipfile.ZipFile(wheel) as archive:
        page = {n for n in archive.namelist() if n.startswith("remote_magic/worker/browser/page/")}
    assert page == {"remote_magic/worker/browser/page/index.html", "remote_magic/worker/browser/page/tab.js"}


def test_the_wheel_ships_the_shaders_and_nothing_outside_its_package(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    shipped = {n.removeprefix("remote_magic/shaders/") for n in names if n.startswith("remote_magic/shaders/")}
    assert {"__init__.py", "matmul.wgsl", "elementwise.wgsl", "reduce.wgsl", "softmax.wgsl",
            "transpose.wgsl"} <= shipped
    # One import name: nothing outside remote_magic/ (and the distribution's own metadata).
    assert {n.split("/")[0] for n in names} == {"remote_magic", wheel.name.split("-py3")[0] + ".dist-info"}


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
