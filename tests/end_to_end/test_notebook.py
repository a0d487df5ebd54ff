"""examples/quickstart.ipynb executed in a real Jupyter kernel (nbclient) against a real worker."""

from __future__ import annotations

import base64
from pathlib import Path

import nbformat
import pytest

from support import WorkerProcess, cell_text, notebook_client

NOTEBOOK = Path(__file__).parents[2] / "examples" / "quickstart.ipynb"




def test_quickstart_notebook_runs_against_a_worker(worker: WorkerProcess, monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    monkeypatch.setenv("REMOTE_MAGIC_TOKEN", worker.token)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    notebook_client(nb, tmp_path).execute()
    cells = [c for c in nb.cells if c.cell_type == "code"]
    connect, _, offload, check, figure, failing, untouched, workers, _ = cells
    assert "Connected to tcp://127.0.0.1" in cell_text(connect)
    assert "computed on the worker: (256, 64)" in cell_text(offload)
    assert [o["output_type"] for o in offload.outputs] == ["stream", "execute_result"]
    assert "c is back in the notebook: (256, 64) True" in cell_text(check)
    assert "**mean of c:**" in cell_text(figure)
    png = [o["data"]["image/png"] for o in figure.outputs if "image/png" in o.get("data", {})]
    assert len(png) == 1 and base64.b64decode(png[0]).startswith(b"\x89PNG")
    assert "RuntimeError: something went wrong on the worker" in cell_text(failing)
    assert failing.outputs[-1]["output_type"] == "error"
    assert "kept, as after a local run: [0, 1, 2]" in cell_text(untouched)
    html = [o["data"]["text/html"] for o in workers.outputs if "text/html" in o.get("data", {})]
    assert html and "<td>shared</td>" in html[0]


REDRAWS = ("""from IPython.display import clear_output
import matplotlib.pyplot as plt
for i in range(3):
    clear_output(wait=True)
    print(f"frame {i}")
    plt.plot([0, i])
    plt.show()
""", """from IPython.display import clear_output, display
for i in range(3):
    clear_output()
    print(f"step {i}")
display("shown")
clear_output(wait=True)
""")


def _shown(cell) -> list[tuple[str, str]]:
    """A cell's outputs, comparably: each one's type and its text (a figure: its mime types)."""
    return [(o["output_type"], o.get("text") or ",".join(sorted(o.get("data", {})))) for o in cell.outputs]


def test_clear_output_in_an_offloaded_cell_clears_the_cell_as_locally(worker: WorkerProcess,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    """A redraw loop (``clear_output(wait=True)``, then a line and a figure) leaves only its last frame,
    offloaded as locally (before: every frame piled up offloaded)."""
    monkeypatch.setenv("REMOTE_MAGIC_TOKEN", worker.token)
    cells = [nbformat.v4.new_code_cell("%load_ext remote_magic\n%offload_connect")]
    for redraw in REDRAWS:
        cells += [nbformat.v4.new_code_cell(redraw), nbformat.v4.new_code_cell("%%offload\n" + redraw)]
    nb = nbformat.v4.new_notebook(cells=cells)
    notebook_client(nb, tmp_path).execute()
    connect, frames_local, frames_offloaded, steps_local, steps_offloaded = nb.cells
    assert "Connected to tcp://127.0.0.1" in cell_text(connect)
    assert _shown(frames_local) == [("stream", "frame 2\n"), ("display_data", "image/png,text/plain")]
    assert _shown(frames_offloaded) == _shown(frames_local)
    # clear_output() clears at once; with wait=True and nothing after it, what was shown stays.
    assert _shown(steps_local) == [("stream", "step 2\n"), ("display_data", "text/plain")]
    assert _shown(steps_offloaded) == _shown(steps_local)
