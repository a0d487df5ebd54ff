"""The conformance test of issue 9: each notebook in tests/conformance/ (and any named by
REMOTE_MAGIC_CONFORMANCE_NOTEBOOKS) runs plain and offloaded in real Jupyter kernels, against a real
remote-worker; every cell must show the same and the namespaces must end the same.

The public numpy, pandas and matplotlib notebooks also run under %%offload --gpu against a worker with
--gpu on: the same, except that after a cell says it computed float64 data in float32, floats may differ
within float32 precision."""

from __future__ import annotations

from pathlib import Path

import pytest
from conformance import compare, notebooks, run_notebook

from support import require_a_gpu, start_worker

NOTEBOOKS = notebooks(Path(__file__).parent / "conformance")
GPU_NOTEBOOKS = [p for p in NOTEBOOKS if p.stem in {
    "numpy100", "numpy_basics_tutorial", "numpy_simulation", "pdsh_numpy", "pdsh_pandas", "pyda_pandas",
    "pdsh_matplotlib", "workflow_ml", "aliases_and_views", "identity_inside_values", "fitted_object"}]
"""The public numpy, pandas and matplotlib notebooks, and the ones about identity and changes in place."""


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_an_offloaded_notebook_ends_as_the_plain_one(notebook: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _check(notebook, tmp_path, monkeypatch, gpu=False)


@pytest.mark.gpu
@pytest.mark.parametrize("notebook", GPU_NOTEBOOKS, ids=[p.stem for p in GPU_NOTEBOOKS])
def test_a_notebook_on_the_gpu_ends_as_the_plain_one_but_for_floats_it_says_are_float32(
        notebook: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _check(notebook, tmp_path, monkeypatch, gpu=True)


def _check(notebook: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpu: bool) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "0")  # both runs, and the worker, order sets of strings alike
    worker = start_worker(tmp_path / "worker", "--listen", "127.0.0.1:0", "--gpu", "on" if gpu else "off",
                          cwd=_folder(tmp_path / "worker-cwd"))
    try:
        if gpu:
            require_a_gpu(worker)
        offloaded = run_notebook(notebook, tmp_path / "offloaded", token=worker.token, gpu=gpu)
    finally:
        worker.stop()
    local = run_notebook(notebook, tmp_path / "local")
    differences = compare(local, offloaded)
    where = "on the GPU" if gpu else "when offloaded"
    assert not differences, f"{notebook.name} differs {where}:\n" + "\n".join(differences)


def _folder(path: Path) -> Path:
    path.mkdir(parents=True)
    return path
