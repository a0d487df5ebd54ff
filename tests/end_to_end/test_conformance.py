"""The conformance test of issue 9: each notebook in tests/conformance/ (and any named by
REMOTE_MAGIC_CONFORMANCE_NOTEBOOKS) runs plain and offloaded in real Jupyter kernels, against a real
remote-worker; every cell must show the same and the namespaces must end the same. (Under %%offload
--gpu: test_conformance_gpu.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
from conformance import notebook_worker, notebooks, offloaded_differences

from support import WorkerProcess

NOTEBOOKS = notebooks(Path(__file__).parents[1] / "conformance")


@pytest.fixture(scope="module")
def notebooks_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    with notebook_worker(tmp_path_factory.mktemp("worker")) as worker:
        yield worker


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_an_offloaded_notebook_ends_as_the_plain_one(notebook: Path, notebooks_worker: WorkerProcess, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "0")  # both runs, and the worker, order sets of strings alike
    differences = offloaded_differences(notebook, tmp_path, notebooks_worker)
    assert not differences, f"{notebook.name} differs when offloaded:\n" + "\n".join(differences)
