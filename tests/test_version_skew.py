"""A value that can't load because a library differs between the sides names the library, both
versions and the fix.

The notebook side (this process) and a real worker import two real releases of one small library
(`skewlib` 1.0 here, 2.0 there, where a class was renamed), and a library only the worker has.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

import remote_magic
from remote_magic import InputError, OutputError
from support import WorkerProcess, start_worker

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
