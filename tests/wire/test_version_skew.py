"""A value that can't load because a library differs between the sides names the library, both
versions and the fix.

The notebook side (this process) and a real worker import two real releases of one small library
(`skewlib` 1.0 here, 2.0 there, where a class was renamed), and a library only the worker has.

A worker without matplotlib (this environment less that package) says so at connect, a cell that imports it
says it is missing there and how to install it, and once it is installed the running worker has it and says so.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Iterator

import pytest
from IPython.core.interactiveshell import InteractiveShell

import remote_magic
from remote_magic import InputError, OutputError
from remote_magic.wire.versions import installed_version
from support import WorkerProcess, run, start_worker, wait_for

RELEASES = {
    "notebook": {"skewlib": '__version__ = "1.0"\n\nclass Thing:\n    def __init__(self):\n        self.v = 1\n'},
    "worker": {"skewlib": '__version__ = "2.0"\n\nclass RenamedThing:\n    def __init__(self):\n        self.v = 2\n',
               "workeronly": '__version__ = "3.1"\n\nclass Tool:\n    pass\n'},
}


def _install(root: Path, side: str) -> Path:
    folder = root / side
    folder.mkdir()
    for module, source in RELEASES[side].items():
        (folder / f"{module}.py").write_text(source)
    return folder


@pytest.fixture
def skewed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[remote_magic.Client]:
    """A client with skewlib 1.0 and a worker with skewlib 2.0 (and workeronly 3.1)."""
    monkeypatch.syspath_prepend(str(_install(tmp_path, "notebook")))
    for module in ("skewlib", "workeronly"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    worker: WorkerProcess = start_worker(tmp_path / "w", "--listen", "127.0.0.1:0", "--gpu", "off",
                                         env={"PYTHONPATH": str(_install(tmp_path, "worker"))})
    try:
        with remote_magic.connect(worker.token, timeout=10) as client:
            yield client
    finally:
        worker.stop()


def test_an_input_made_with_another_release_names_the_library_and_both_versions(
        skewed: remote_magic.Client) -> None:
    import skewlib

    with pytest.raises(InputError) as info:
        skewed.run("v = thing.v", {"thing": skewlib.Thing()})
    message = str(info.value)
    assert message.startswith("`thing` can't be loaded on the worker (AttributeError:")
    assert ("it was pickled in the notebook with skewlib 1.0, and on the worker skewlib is 2.0: install one "
            "version on both sides (`pip install skewlib==1.0` on the worker, or `pip install skewlib==2.0` "
            "in the notebook)") in message
    assert info.value.name == "thing"
    assert skewed.run("import skewlib\nv = skewlib.__version__")["v"] == "2.0"  # the worker is still usable


def test_a_result_made_with_another_release_names_the_library_and_both_versions(
        skewed: remote_magic.Client) -> None:
    with pytest.raises(OutputError) as info:
        skewed.run("import skewlib\nthing = skewlib.RenamedThing()\nfine = 1")
    assert ("it was pickled on the worker with skewlib 2.0, and in the notebook skewlib is 1.0: install one "
            "version on both sides (`pip install skewlib==2.0` in the notebook, or `pip install skewlib==1.0` "
            "on the worker)") in str(info.value)
    assert info.value.name == "thing"


def test_a_result_from_a_library_missing_here_says_what_to_install(skewed: remote_magic.Client) -> None:
    with pytest.raises(OutputError) as info:
        skewed.run("import workeronly\ntool = [workeronly.Tool()]", outputs=["tool"])
    assert ("it was pickled on the worker with workeronly 3.1, which isn't installed in the notebook: "
            "`pip install workeronly==3.1` in the notebook") in str(info.value)


MATPLOTLIB = ("matplotlib", "mpl_toolkits", "pylab.py")  # what installing matplotlib puts in site-packages


def _without_matplotlib(tmp: Path) -> tuple[Path, Path, list[Path]]:
    """A virtual environment that sees this one's packages less matplotlib's: its `remote-worker`, the folder
    its packages are in, and matplotlib's entries, which linked into that folder install it."""
    site = Path(sysconfig.get_paths()["purelib"])
    packages = tmp / "packages"
    packages.mkdir()
    held_back = []
    for entry in site.iterdir():
        if entry.name.startswith(MATPLOTLIB) and not entry.name.startswith("matplotlib_inline"):
            held_back.append(entry)
        else:
            (packages / entry.name).symlink_to(entry)
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    venv_site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    (Path(venv_site) / "packages.pth").write_text(f"import site; site.addsitedir({str(packages)!r})\n")
    script = venv / "bin" / "remote-worker"
    script.write_text(f"#!{python}\nfrom remote_magic.worker.cli import main\nraise SystemExit(main())\n")
    script.chmod(0o755)
    return script, packages, held_back


def test_a_package_missing_on_the_worker_is_named_with_how_to_install_it_and_once_installed_it_is_there(
        tmp_path: Path) -> None:
    script, packages, matplotlib = _without_matplotlib(tmp_path)
    worker = start_worker(tmp_path / "w", "--listen", "127.0.0.1:0", "--gpu", "off", "--name", "box",
                          executable=script)
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "remote_magic")
    try:
        _, out = run(shell, f"%offload_connect {worker.token}")
        ours = installed_version("matplotlib")
        assert (f"matplotlib is {ours} here and not installed on worker 'box': code that imports it fails there. "
                "Install it there: `pip install matplotlib`") in out.stderr
        assert "so plots work" not in out.stderr

        result, out = run(shell, "%%offload\nimport matplotlib\nversion = matplotlib.__version__")
        assert isinstance(result.error_in_exec, ModuleNotFoundError)
        assert ("`matplotlib` is not installed on worker 'box'. Install it there (`pip install matplotlib` in the "
                "Python environment remote-worker runs in") in out.stderr
        assert "subprocess.check_call([sys.executable, '-m', 'pip', 'install', 'matplotlib'])" in out.stderr

        for entry in matplotlib:  # installed while the worker runs
            (packages / entry.name).symlink_to(entry)
        result, out = run(shell, "%%offload\nimport matplotlib\nversion = matplotlib.__version__")
        assert result.success, out.stderr
        assert shell.user_ns["version"] == ours

        # The hub's listing says so within a refresh, and connecting again says nothing of matplotlib.
        with remote_magic.connect(worker.token, timeout=10) as client:
            wait_for(lambda: client.workers()[0]["versions"].get("matplotlib") == ours, 30,
                     "the worker's heartbeat to announce matplotlib")
        _, out = run(shell, f"%offload_connect {worker.token}")
        assert "matplotlib" not in out.stderr
    finally:
        shell.run_line_magic("unload_ext", "remote_magic")
        shell.reset(new_session=False)
        worker.stop()
