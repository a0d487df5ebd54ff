"""The notebook side as Colab runs it: Colab's pinned packages, its Python, a real kernel.

A venv is built from Colab's published runtime (``tests/data/colab-pip-freeze.txt`` as pip
constraints), with Python 3.13 when this machine has it. The project's wheel must install there
without changing one pinned version, and ``examples/colab_quickstart.ipynb`` then runs in a real
kernel of that venv (nbclient) against a real worker from the test environment: the newest
releases, and another Python minor version. A second venv holds the oldest versions the notebook
side declares (Python 3.10 when at hand) and runs offloaded cells in a real IPython shell.
"""

from __future__ import annotations

import base64
import json
import platform
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any, Iterator

import nbformat
import pytest
from conformance import compare, run_notebook

from support import (
    REPO,
    WorkerProcess,
    find_python,
    make_venv,
    notebook_client,
    run_command,
    saved_outputs,
    start_worker,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

# Colab's published runtime (googlecolab/backend-info, 2026-08-19): the workspace's shared copy when
# there is one beside the repository, else the copy kept with the tests.
COLAB_FREEZE = next(p for p in (REPO.parent / "shared" / "colab" / "pip-freeze.txt",
                                REPO / "tests" / "data" / "colab-pip-freeze.txt") if p.exists())
NOTEBOOK = REPO / "examples" / "colab_quickstart.ipynb"
# What Colab's kernel holds of what the notebook side touches, installed at Colab's pins first. (Not Colab's notebook
# server, which the kernel never imports: with its 50 dependencies it doubled the venv's install.)
COLAB_KERNEL_PACKAGES = ("pip", "ipython", "ipykernel", "jupyter_client", "traitlets", "pyzmq", "tornado", "numpy",
                         "cloudpickle", "matplotlib", "pandas", "tqdm")
# The oldest versions pyproject.toml declares for the notebook side.
OLDEST = ("ipython==7.34.0", "ipykernel==6.17.0", "jupyter_client==7.4.0", "traitlets==5.7.0", "pyzmq==25.0.0",
          "numpy==1.24.0", "cloudpickle==2.1.0", "tqdm==4.60.0")


def _constraints(path: Path) -> dict[str, str]:
    """Colab's `name==version` lines, written as a constraints file; {normalised name: version}."""
    pins = {}
    for line in COLAB_FREEZE.read_text().splitlines():
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", line.strip())
        if match:
            pins[_normalise(match[1])] = match[2]
    path.write_text("".join(f"{name}=={version}\n" for name, version in pins.items()))
    return pins


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _freeze(python: Path) -> dict[str, str]:
    listed = json.loads(run_command(python, "-m", "pip", "list", "--format", "json", cwd=python.parent).stdout)
    return {_normalise(p["name"]): p["version"] for p in listed}


def _say(text: str, *, always: bool = False) -> None:
    """Test output a reader of the CI log needs (which Pythons ran): with -s, and ``always`` in the
    warnings summary of every run too."""
    print(f"[colab test] {text}", file=sys.stderr)
    if always:
        warnings.warn(f"[colab test] {text}", stacklevel=2)


@pytest.fixture(scope="module")
def colab_python(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Iterator[tuple[Path, str]]:
    """A venv as Colab's runtime is, with the notebook side installed under its pins."""
    tmp = tmp_path_factory.mktemp("colab")
    interpreter, version = find_python("3.13", "3.12", "3.11", "3.10")
    if not version.startswith("3.13"):
        _say(f"no Python 3.13 on this machine: the Colab venv uses Python {version} instead", always=True)
    python = make_venv(interpreter, tmp / "venv")
    pins = _constraints(tmp / "colab-constraints.txt")
    _say(f"Colab's pins from {COLAB_FREEZE}")
    # --no-compile: Python compiles what it imports when it does (half an install's time is compiling it all)
    pip = (python, "-m", "pip", "install", "--no-compile", "-c", tmp / "colab-constraints.txt")
    run_command(*pip, *COLAB_KERNEL_PACKAGES, cwd=tmp)
    before = _freeze(python)
    run_command(*pip, wheel, cwd=tmp)
    after = _freeze(python)
    changed = {n: (v, after.get(n)) for n, v in before.items() if after.get(n) != v}
    assert not changed, f"installing remote-magic changed Colab's packages: {changed}"
    off_pin = {n: (v, pins[n]) for n, v in after.items() if n in pins and v != pins[n]}
    assert not off_pin, f"packages off Colab's pins (installed, pinned): {off_pin}"
    run_command(python, "-m", "pip", "check", cwd=tmp)
    lacking = sorted(set(after) - set(before) - set(pins) - {"remote-magic"})  # Colab has the others, at their pins
    assert not lacking, f"the notebook side brought packages Colab lacks: {lacking}"
    _say(f"Colab venv: Python {version}, IPython {after['ipython']}, ipykernel {after['ipykernel']}, "
         f"jupyter_client {after['jupyter-client']}; the worker: Python {platform.python_version()}")
    yield python, version


@pytest.fixture(scope="module")
def newest_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    """A worker in the test environment: the newest releases, GPU off."""
    worker = start_worker(tmp_path_factory.mktemp("newest-worker"), "--listen", "127.0.0.1:0", "--gpu", "off",
                          "--name", "home-box")
    yield worker
    worker.stop()


def _kernelspec(python: Path, root: Path) -> str:
    spec = root / "kernels" / "colab"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Colab's runtime", "language": "python"}))
    return "colab"


def _text(cell: Any) -> str:
    parts = []
    for output in cell.get("outputs", []):
        parts.append(output.get("text", ""))
        for mime in ("text/plain", "text/markdown", "text/html"):
            parts.append(output.get("data", {}).get(mime, ""))
        parts.extend(output.get("traceback", []))
    return "".join(parts)


def test_the_colab_quickstart_runs_on_colabs_runtime_against_a_newer_worker(
        colab_python: tuple[Path, str], newest_worker: WorkerProcess, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    python, notebook_python = colab_python
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("REMOTE_MAGIC_TOKEN", newest_worker.token)
    kernel = _kernelspec(python, tmp_path / "jupyter")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # Beyond the quickstart: what can't cross Python versions says so, by name.
    nb.cells.insert(-1, nbformat.v4.new_code_cell(
        "from dataclasses import dataclass\n\n@dataclass\nclass Settings:\n    scale: float = 2.0\n"
        "    name: str = 'x'"))
    nb.cells.insert(-1, nbformat.v4.new_code_cell(
        "%%offload\nsettings = Settings(scale=3.0)\nprint('scaled', settings.scale * 2)"))
    nb.cells.insert(-1, nbformat.v4.new_code_cell("print(type(settings) is Settings, settings)"))
    nb.cells.insert(-1, nbformat.v4.new_code_cell(
        "def make_scaler(k):\n    def scale(x):\n        return x * k\n    return scale\n\ntriple = make_scaler(3)"))
    nb.cells.insert(-1, nbformat.v4.new_code_cell("%%offload\ntripled = triple(2)",
                                                  metadata={"tags": ["raises-exception"]}))
    notebook_client(nb, tmp_path, kernel, 180).execute()

    code = [c for c in nb.cells if c.cell_type == "code"]
    (connect, definitions, offload, check, rich, to_worker, dtypes, failing, untouched, workers,
     _, dataclass_offload, dataclass_check, _, closure, _) = code
    worker_python = platform.python_version()
    assert "Connected to tcp://127.0.0.1" in _text(connect) and "home-box" in _text(connect)
    if notebook_python.rsplit(".", 1)[0] != worker_python.rsplit(".", 1)[0]:
        assert f"Python is {notebook_python} here and {worker_python} on worker 'home-box'" in _text(connect)
    assert not definitions.outputs
    assert f"computed on the worker, Python {worker_python}" in _text(offload)
    assert [o["output_type"] for o in saved_outputs(offload)] == ["stream", "execute_result"]
    assert "back in the notebook: RunningMean True True" in _text(check)

    assert "**largest z:**" in _text(rich)
    assert "`fig` (Figure: it holds a matplotlib Figure" in _text(rich) and "stayed on worker 'home-box'" in _text(rich)
    png = [o["data"]["image/png"] for o in rich.outputs if "image/png" in o.get("data", {})]
    assert len(png) == 1 and base64.b64decode(png[0]).startswith(b"\x89PNG")
    # As locally: the value, then the figures still open when the cell ended
    assert [o["output_type"] for o in rich.outputs][-2:] == ["execute_result", "display_data"]
    assert "<table" in rich.outputs[-2]["data"]["text/html"]

    assert "DataFrame (10, 3)" in _text(to_worker)
    assert "{'x': 'float64', 'z': 'float64', 'z2': 'float64'}" in _text(dtypes)  # built by the notebook's pandas

    assert "ValueError: something went wrong on the worker" in _text(failing)
    assert failing.outputs[-1]["output_type"] == "error"
    assert "kept, as after a local run: [0, 1, 2]" in _text(untouched)
    assert "<td>home-box</td>" in _text(workers)

    assert "scaled 6.0" in _text(dataclass_offload)  # a dataclass of fields: its line is known on 3.13
    assert "True Settings(scale=3.0, name='x')" in _text(dataclass_check)
    if notebook_python.rsplit(".", 1)[0] != worker_python.rsplit(".", 1)[0]:
        assert closure.outputs[-1]["output_type"] == "error"
        message = _text(closure)
        assert "`triple` can't be loaded on the worker" in message
        assert "make_scaler.<locals>.scale" in message
        assert f"Python {notebook_python} bytecode, which Python {worker_python} on the worker can't load" in message
    else:
        _say("the notebook and the worker run one Python minor version: bytecode crosses")
        assert closure.outputs == [] or closure.outputs[-1]["output_type"] != "error"


OLDEST_SHELL = textwrap.dedent("""
    import json, sys
    import IPython
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    ip = InteractiveShell.instance()
    report = {"python": sys.version.split()[0], "ipython": IPython.__version__}
    with capture_output() as out:
        ip.run_line_magic("load_ext", "remote_magic")
        ip.run_line_magic("offload_connect", sys.argv[1])
        ip.run_cell("class Acc:\\n    def __init__(self):\\n        self.n = 0\\n    def add(self, k):\\n"
                    "        self.n += k\\n        return self\\nbump = lambda a: a.add(2)\\n")
        result = ip.run_cell("%%offload\\nimport numpy as np\\nacc = bump(Acc())\\ntotal = int(np.arange(4).sum())\\n"
                             "print('on the worker', acc.n)\\ntotal * 10")
    report.update(success=result.success, value=result.result, total=ip.user_ns.get("total"),
                  same_class=type(ip.user_ns.get("acc")) is ip.user_ns["Acc"], stdout=out.stdout,
                  stderr=out.stderr)
    print(json.dumps(report))
""")


# Run by Colab's Python: a whole kernel on the worker through the provisioner, with Colab's jupyter_client.
_REMOTE_KERNEL_SCRIPT = textwrap.dedent("""
    import queue
    import time
    import jupyter_client
    from jupyter_client import KernelManager

    km = KernelManager(kernel_name="remote-magic")
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    def show(msg):
        if msg["msg_type"] == "stream":
            print(msg["content"]["text"], end="")
    kc.execute_interactive("import os; print('parent', os.getppid())", timeout=60, output_hook=show)
    # Pressed once the loop runs: ipykernel drops a request (no reply ever) whose handler an interrupt cuts
    # short before the cell's code starts, which its execute_input doesn't rule out on a loaded machine.
    msg_id = kc.execute("print('looping', flush=True)\\nwhile True: pass")
    while not (lambda m: m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "stream")(
            kc.get_iopub_msg(timeout=60)):
        pass
    # Pressed again, as a user would, were a press lost; the time is from the press that stopped it.
    reply, presses, deadline = None, 0, time.monotonic() + 60
    while reply is None and time.monotonic() < deadline:
        pressed, presses = time.monotonic(), presses + 1
        km.interrupt_kernel()
        try:
            reply = kc.get_shell_msg(timeout=5)
        except queue.Empty:
            pass
    print("interrupted", reply["content"].get("ename"), "in", round(time.monotonic() - pressed, 3), "s",
          "after", presses, "presses")
    km.restart_kernel()
    kc.wait_for_ready(timeout=60)
    kc.execute_interactive("print('after restart', os.getppid() if 'os' in dir() else 'fresh')", timeout=60,
                           output_hook=show)
    kc.stop_channels()
    km.shutdown_kernel()
    print("alive", km.is_alive(), "jupyter_client", jupyter_client.__version__)
""")


@pytest.mark.parametrize("name", ["second_pass", "mixed_module_state"])
def test_conformance_notebooks_offloaded_from_colabs_python_end_as_they_do_there(
        colab_python: tuple[Path, str], newest_worker: WorkerProcess, tmp_path: Path, name: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The conformance notebooks run on the default interpreter elsewhere; Colab's Python (3.13) inlines
    comprehensions (PEP 709), among other differences the notebook side must not show."""
    python, _ = colab_python
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    kernel = _kernelspec(python, tmp_path / "jupyter")
    notebook = Path(__file__).parents[1] / "conformance" / f"{name}.ipynb"
    offloaded = run_notebook(notebook, tmp_path / "offloaded", token=newest_worker.token, kernel_name=kernel)
    local = run_notebook(notebook, tmp_path / "local", kernel_name=kernel)
    differences = compare(local, offloaded)
    assert not differences, f"{notebook.name} differs when offloaded from Colab's Python:\n" + "\n".join(differences)


def test_a_kernel_on_the_worker_through_colabs_jupyter_client(
        colab_python: tuple[Path, str], newest_worker: WorkerProcess, tmp_path: Path) -> None:
    python, _ = colab_python
    env = {"JUPYTER_DATA_DIR": str(tmp_path / "jupyter"), "JUPYTER_PATH": str(tmp_path / "jupyter"),
           "REMOTE_MAGIC_TOKEN": newest_worker.token}
    run_command(python.parent / "remote-worker", "kernelspec", "install", cwd=tmp_path, env=env)
    out = run_command(python, "-c", _REMOTE_KERNEL_SCRIPT, cwd=tmp_path, env=env).stdout
    pins = _constraints(tmp_path / "pins.txt")
    assert f"parent {newest_worker.process.pid}\n" in out  # the kernel is the worker's child
    interrupted = re.search(r"interrupted KeyboardInterrupt in ([\d.]+) s", out)
    assert interrupted is not None and float(interrupted[1]) < 2.0, out
    assert "after restart fresh" in out
    assert f"alive False jupyter_client {pins['jupyter-client']}" in out


def test_the_oldest_supported_notebook_side_offloads_cells(
        wheel: Path, newest_worker: WorkerProcess, tmp_path: Path) -> None:
    interpreter, version = find_python("3.10", "3.11")
    if not version.startswith(("3.10.", "3.11.")):  # numpy 1.24 has wheels up to Python 3.11
        pytest.skip(f"the oldest declared versions need Python 3.10 or 3.11; this machine has {version}")
    if not version.startswith("3.10."):
        _say(f"no Python 3.10 on this machine: the oldest-versions venv uses Python {version}", always=True)
    python = make_venv(interpreter, tmp_path / "venv")
    run_command(python, "-m", "pip", "install", "--no-compile", *OLDEST, wheel, cwd=tmp_path)
    installed = _freeze(python)
    assert [f"{n}=={installed[_normalise(n)]}" for n in (p.split("==")[0] for p in OLDEST)] == list(OLDEST)
    report = json.loads(run_command(python, "-c", OLDEST_SHELL, newest_worker.token, cwd=tmp_path,
                                    env={"PYTHONPATH": ""}).stdout.strip().splitlines()[-1])
    _say(f"oldest notebook side: Python {report['python']}, IPython {report['ipython']}; "
         f"the worker: Python {platform.python_version()}")
    # The notebook side alone can't run a worker, and says what to install.
    alone = subprocess.run([python.parent / "remote-worker", "--listen", "127.0.0.1:0"], capture_output=True,
                           text=True, timeout=60)
    assert alone.returncode == 2
    assert re.search(r"lacks (psutil, )?(xxhash, )?wgpu, which a worker needs", alone.stderr), alone.stderr
    # A command that works: the package isn't on the index, so it names the wheel this copy came from.
    assert f'pip install "remote-magic[worker] @ {wheel.resolve().as_uri()}"' in alone.stderr, alone.stderr
    assert report["ipython"] == "7.34.0"
    assert report["success"], report["stderr"] + report["stdout"]
    assert (report["value"], report["total"], report["same_class"]) == (60, 6, True)
    assert "on the worker 2" in report["stdout"]


DASK_SHELL = textwrap.dedent("""
    import json, sys
    from distributed import LocalCluster
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    if __name__ == "__main__":
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                          dashboard_address=None) as cluster:
            ip = InteractiveShell.instance()
            ip.user_ns["L"] = [3, 1, 2]
            with capture_output() as out:
                ip.run_line_magic("load_ext", "remote_magic")
                ip.run_line_magic("offload_connect", "dask://" + cluster.scheduler_address.split("://")[1])
                result = ip.run_cell("%%offload\\nL.sort()\\nprint('sorted on dask')\\nlen(L)")
                ip.run_line_magic("offload_disconnect", "")
            print(json.dumps({"success": result.success, "value": result.result, "L": ip.user_ns["L"],
                              "stdout": out.stdout, "stderr": out.stderr}))
""")


def test_the_dask_extra_keeps_colabs_dask_and_runs_a_cell_on_a_dask_cluster(
        colab_python: tuple[Path, str], wheel: Path, tmp_path: Path) -> None:
    python, _ = colab_python
    pins = _constraints(tmp_path / "colab-constraints.txt")
    before = _freeze(python)
    run_command(python, "-m", "pip", "install", "--no-compile", "-c", tmp_path / "colab-constraints.txt",
                f"{wheel}[dask]", cwd=tmp_path)
    after = _freeze(python)
    changed = {n: (v, after.get(n)) for n, v in before.items() if after.get(n) != v}
    assert not changed, f"installing remote-magic[dask] changed Colab's packages: {changed}"
    assert after["dask"] == pins["dask"] and after["distributed"] == pins["dask"]  # distributed matches Colab's dask
    run_command(python, "-m", "pip", "check", cwd=tmp_path)
    report = json.loads(run_command(python, "-c", DASK_SHELL, cwd=tmp_path, env={"PYTHONPATH": ""},
                                    timeout=300).stdout.strip().splitlines()[-1])
    assert report["success"], report["stderr"] + report["stdout"]
    assert (report["value"], report["L"]) == (3, [1, 2, 3])
    assert "Connected to dask://127.0.0.1:" in report["stdout"] and "sorted on dask" in report["stdout"]
