"""examples/data_parallel.ipynb executed in a real Jupyter kernel (nbclient) against a hub with two joined workers."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

import nbformat
import pytest

from support import WorkerProcess, cell_text, join_worker, notebook_client, start_worker

NOTEBOOK = Path(__file__).parents[2] / "examples" / "data_parallel.ipynb"


@pytest.fixture
def two(tmp_path: Path) -> Iterator[WorkerProcess]:
    """A hub with worker 'home' and a worker 'joiner' that joined it; yields the hub."""
    hub = start_worker(tmp_path / "home", "--listen", "127.0.0.1:0", "--gpu", "off", "--name", "home",
                       "--heartbeat-interval", "0.2", "--outage-grace", "1")
    joiner = join_worker(hub, tmp_path / "joiner", "joiner")
    yield hub
    joiner.stop()
    hub.stop()


def test_data_parallel_notebook_trains_the_local_model_on_two_workers(
        two: WorkerProcess, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("REMOTE_MAGIC_TOKEN", two.token)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    notebook_client(nb, tmp_path).execute()
    connect, _, shard, train, local, split, check = [c for c in nb.cells if c.cell_type == "code"]
    assert "Connected to tcp://127.0.0.1" in cell_text(connect)
    shards = cell_text(shard)
    assert re.search(r"2 shards of \[2000, 2000\] rows on (home, joiner|joiner, home)", shards), shards
    losses = [float(x) for x in re.search(r"mean loss every 10 steps: \[([^\]]*)\]", cell_text(train))[1].split(",")]
    last = float(re.search(r"last: ([\d.]+)", cell_text(train))[1])
    assert losses[0] == pytest.approx(0.6931, abs=1e-4) and last < losses[-1] < losses[0] and last < 0.3
    assert "loss went down at every step: True" in cell_text(train)
    assert "same weights as training on this machine: True" in cell_text(local)
    assert not any(o["output_type"] == "error" for o in split.outputs)
    assert "gathered predictions equal the local ones: True" in cell_text(check)
    accuracy = re.search(r"accuracy ([\d.]+), counted on 2 workers", cell_text(check))
    assert accuracy and float(accuracy[1]) > 0.85, cell_text(check)
