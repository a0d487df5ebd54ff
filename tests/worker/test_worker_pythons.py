"""The built wheel installed in a fresh venv: a kernel from its own shaders, and a worker on another Python
than the notebook that runs the notebook's cells.

The venv (the wheel with its [worker] extra and the newest releases, nothing from the base interpreter)
is on Python 3.13 by default; with REMOTE_MAGIC_MATRIX=1, on every supported Python this machine has
(3.10 to 3.13). The notebook is a real IPython shell in this process.
"""

from __future__ import annotations

import base64
import json
import os
import platform
import textwrap
from pathlib import Path
from typing import Iterator

import pytest
from IPython.core.interactiveshell import InteractiveShell

from support import (
    WorkerProcess,
    find_python,
    make_venv,
    run,
    run_command,
    start_worker,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PYTHONS = ["3.10", "3.12", "3.13"] if os.environ.get("REMOTE_MAGIC_MATRIX") == "1" else ["3.13"]

DEFINITIONS = """\
import numpy as np
import pandas as pd

class Stats:
    def __init__(self, values):
        self.mean = float(np.mean(values))

def describe(frame):
    return Stats(frame['v']), len(frame)

def make_scaler(k):
    def scale(x):
        return x * k
    return scale

double = make_scaler(2)
frame = pd.DataFrame({'v': [1.0, 2.0, 6.0], 'label': ['a', 'b', 'c']})
"""


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


@pytest.fixture(scope="module", params=PYTHONS)
def installed(request: pytest.FixtureRequest, wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv on that Python with the wheel and its [worker] extra from the index, as on a user's
    machine; its python."""
    interpreter, version = find_python(request.param)
    if not version.startswith(f"{request.param}."):
        pytest.skip(f"no Python {request.param} on this machine")
    folder = tmp_path_factory.mktemp(f"py{version}")
    python = make_venv(interpreter, folder / "venv")
    # --no-compile: Python compiles what it imports when it does (half the install's time is compiling it all)
    run_command(python, "-m", "pip", "install", "--no-compile", f"{wheel}[worker]", cwd=folder)
    return python


def test_the_installed_wheel_runs_a_kernel_from_its_own_shaders(installed: Path, tmp_path: Path) -> None:
    report = json.loads(run_command(installed, "-c", CHECK, cwd=tmp_path).stdout.strip().splitlines()[-1])
    site = Path(run_command(installed, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                            cwd=tmp_path).stdout.strip())
    assert Path(report["shader"]).is_relative_to(site), f"{report['shader']} is not inside {site}"
    assert Path(report["worker"]).is_relative_to(site)
    if "no_adapter" in report:
        if os.environ.get("REMOTE_MAGIC_REQUIRE_GPU") == "1":
            pytest.fail(f"REMOTE_MAGIC_REQUIRE_GPU=1 but no GPU adapter: {report['no_adapter']}")
        pytest.skip(f"no GPU adapter: {report['no_adapter']}")
    assert report["matmul"] == report["expected"]


@pytest.fixture
def other_python_worker(installed: Path, tmp_path: Path) -> Iterator[WorkerProcess]:
    version = run_command(installed, "-c", "import platform; print(platform.python_version())",
                          cwd=tmp_path).stdout.strip()
    worker = start_worker(tmp_path / "w", "--listen", "127.0.0.1:0", "--gpu", "off", "--name", f"py{version}",
                          executable=installed.parent / "remote-worker")
    worker.python = version  # type: ignore[attr-defined]
    yield worker
    worker.stop()


def test_a_worker_on_another_python_runs_the_notebooks_cells(
        ip: InteractiveShell, other_python_worker: WorkerProcess) -> None:
    worker_python, notebook_python = other_python_worker.python, platform.python_version()  # type: ignore[attr-defined]
    result, out = run(ip, f"%offload_connect {other_python_worker.token}")
    assert result.success, result.error_in_exec
    if worker_python.rsplit(".", 1)[0] != notebook_python.rsplit(".", 1)[0]:
        assert f"Python is {notebook_python} here and {worker_python} on worker" in out.stderr
    run(ip, DEFINITIONS)
    result, out = run(ip, "%%offload\nimport platform, matplotlib.pyplot as plt\nstats, rows = describe(frame)\n"
                          "frame['twice'] = frame['v'] * 2\nplt.plot(frame['v'])\nplatform.python_version()")
    assert result.success, result.error_in_exec
    assert result.result == worker_python
    assert type(ip.user_ns["stats"]) is ip.user_ns["Stats"] and ip.user_ns["stats"].mean == 3.0
    assert ip.user_ns["frame"]["twice"].tolist() == [2.0, 4.0, 12.0]
    assert ip.user_ns["frame"]["label"].tolist() == ["a", "b", "c"]
    images = [o.data["image/png"] for o in out.outputs if "image/png" in o.data]
    assert len(images) == 1 and base64.b64decode(images[0]).startswith(b"\x89PNG")

    result, out = run(ip, "%%offload\ndoubled = double(4)")
    if worker_python.rsplit(".", 1)[0] == notebook_python.rsplit(".", 1)[0]:
        assert result.success and ip.user_ns["doubled"] == 8
    else:
        assert not result.success and "doubled" not in ip.user_ns
        assert "`double` can't be loaded on the worker: it holds `make_scaler.<locals>.scale`" in out.stdout
        assert f"Python {notebook_python} bytecode, which Python {worker_python} on the worker can't load" \
            in out.stdout
    result, _ = run(ip, "%%offload\nafter = 1 + 1")  # the worker is still usable
    assert result.success and ip.user_ns["after"] == 2
