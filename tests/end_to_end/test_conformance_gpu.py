"""The conformance test under %%offload --gpu (issue 30): the public numpy and pandas notebooks, and the
ones about identity and changes in place, run with every cell under %%offload --gpu against a worker
computing on its GPU (lavapipe without one) and locally: the same, except that after a cell says it
computed float64 data in float32, floats may differ within float32 precision (tests/conformance.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
from conformance import notebook_worker, notebooks, offloaded_differences

from support import WorkerProcess

pytestmark = pytest.mark.gpu

NOTEBOOKS = [p for p in notebooks(Path(__file__).parents[1] / "conformance") if p.stem in {
    "numpy100", "numpy_basics_tutorial", "numpy_simulation", "pdsh_numpy", "pdsh_pandas", "workflow_ml",
    "aliases_and_views", "identity_inside_values", "fitted_object"}]


@pytest.fixture(scope="module")
def notebooks_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    with notebook_worker(tmp_path_factory.mktemp("worker"), gpu=True) as worker:
        yield worker


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_a_notebook_on_the_gpu_ends_as_the_plain_one_but_for_floats_it_says_are_float32(
        notebook: Path, notebooks_worker: WorkerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    differences = offloaded_differences(notebook, tmp_path, notebooks_worker, gpu=True)
    assert not differences, f"{notebook.name} differs on the GPU:\n" + "\n".join(differences)
