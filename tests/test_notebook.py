"""examples/quickstart.ipynb executed in a real Jupyter kernel (nbclient) against a real worker."""

from __future__ import annotations

import base64
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from support import WorkerProcess

NOTEBOOK = Path(__file__).parent.parent / "examples" / "quickstart.ipynb"


def _text(cell) -> str:
    parts = []
    for output in cell.get("outputs", []):
        parts.append(output.get("text", ""))
        parts.append(output.get("data", {}).get("text/plain", ""))
        parts.append(output.get("data", {}).get("text/markdown", ""))
        parts.extend(output.get("traceback", []))
    return "".join(parts)


def test_quickstart_notebook_runs_against_a_worker(worker: WorkerProcess, monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    monkeypatch.setenv("REMOTE_MAGIC_TOKEN", worker.token)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, kernel_name="python3", timeout=120,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    cells = [c for c in nb.cells if c.cell_type == "code"]
    connect, _, offload, check, figure, failing, untouched, workers, _ = cells
    assert "Connected to tcp://127.0.0.1" in _text(connect)
    assert "computed on the worker: (256, 64)" in _text(offload)
    assert [o["output_type"] for o in offload.outputs] == ["stream", "execute_result"]
    assert "c is back in the notebook: (256, 64) True" in _text(check)
    assert "**mean of c:**" in _text(figure)
    png = [o["data"]["image/png"] for o in figure.outputs if "image/png" in o.get("data", {})]
    assert len(png) == 1 and base64.b64decode(png[0]).startswith(b"\x89PNG")
    assert "RuntimeError: something went wrong on the worker" in _text(failing)
    assert failing.outputs[-1]["output_type"] == "error"
    assert "kept, as after a local run: [0, 1, 2]" in _text(untouched)
    html = [o["data"]["text/html"] for o in workers.outputs if "text/html" in o.get("data", {})]
    assert html and "<td>shared</td>" in html[0]
