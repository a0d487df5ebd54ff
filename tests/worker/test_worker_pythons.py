"""A worker on another Python than the notebook runs the notebook's cells.

The worker runs from a fresh venv (the wheel with its [worker] extra and the newest releases)
on Python 3.13 by default; with REMOTE_MAGIC_MATRIX=1, on every supported Python this machine
has (3.10 to 3.13). The notebook is a real IPython shell in this process.
"""

from __future__ import annotations

import base64
import os
import platform
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


@pytest.fixture(params=PYTHONS)
def other_python_worker(request: pytest.FixtureRequest, wheel: Path, tmp_path: Path) -> Iterator[WorkerProcess]:
    interpreter, version = find_python(request.param)
    if not version.startswith(f"{request.param}."):
        pytest.skip(f"no Python {request.param} on this machine")
    python = make_venv(interpreter, tmp_path / "venv")
    run_command(python, "-m", "pip", "install", f"{wheel}[worker]", "matplotlib", "pandas", cwd=tmp_path)
    worker = start_worker(tmp_path / "w", "--listen", "127.0.0.1:0", "--gpu", "off", "--name", f"py{version}",
                          executable=python.parent / "remote-worker")
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
