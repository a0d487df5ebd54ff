"""examples/quickstart.ipynb executed in a real Jupyter kernel (nbclient) against a real worker."""

from __future__ import annotations

import base64
from pathlib import Path

import nbformat
import pytest

from support import WorkerProcess, cell_text, notebook_client, saved_outputs

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
    assert [o["output_type"] for o in saved_outputs(offload)] == ["stream", "execute_result"]
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
    """A cell's outputs as saved, comparably: each one's type and its text (a figure: its mime types)."""
    return [(o["output_type"], o.get("text") or ",".join(sorted(o.get("data", {})))) for o in saved_outputs(cell)]


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


SETUP_FIGURES = "%matplotlib inline\nimport matplotlib.pyplot as plt\nplt.close('all')\nplt.ioff()"
FIGURES = (  # (source, kept local in the offloaded run)
    ("fig, ax = plt.subplots()\n_ = ax.plot([1, 2])\nprint(plt.isinteractive(), len(plt.get_fignums()))", False),
    ("plt.show()", False),
    ("fig2, ax2 = plt.subplots()\n_ = ax2.plot([2, 1])\nplt.show()\nprint(len(plt.get_fignums()))", False),
    ("fig3 = plt.figure()\n_ = fig3.add_subplot().plot([3, 4])\nplt.ion()\nprint(plt.isinteractive())", False),
    ("print(plt.isinteractive())", True),
    ("fig3", False),
    ("fig4 = plt.figure()\n_ = plt.plot([0, 1])", False),
    ("plt.ioff()\nprint(plt.isinteractive())", False),
    ("print(plt.isinteractive())", True),
)


def test_interactive_mode_is_the_notebooks_and_decides_the_figures_a_cell_shows(worker: WorkerProcess,
                                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                                 tmp_path: Path) -> None:
    """After ``plt.ioff()`` in the notebook, an offloaded cell reads ``plt.isinteractive()`` False and shows a
    figure it made only on ``plt.show()`` (or as its value), as the inline backend does locally; ``plt.ion()``
    and ``plt.ioff()`` in an offloaded cell come back (before: interactive mode was each side's own, and an
    offloaded cell showed every figure still open at its end)."""
    monkeypatch.setenv("REMOTE_MAGIC_TOKEN", worker.token)
    cells = ["%load_ext remote_magic\n%offload_connect", SETUP_FIGURES]
    cells += [source for source, _ in FIGURES] + [SETUP_FIGURES]
    cells += [source if local else "%%offload\n" + source for source, local in FIGURES]
    cells += ["%%offload\nprint(plt.get_backend())"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])
    notebook_client(nb, tmp_path).execute()
    connect, *ran, backend = nb.cells
    assert "Connected to tcp://127.0.0.1" in cell_text(connect)
    local, offloaded = ran[1:len(FIGURES) + 1], ran[len(FIGURES) + 2:]
    image = ("display_data", "image/png,text/plain")
    assert [_shown(cell) for cell in local] == [
        [("stream", "False 1\n")],  # made with interactive mode off: not shown, left open
        [image],  # ...until plt.show()
        [image, ("stream", "0\n")],
        [("stream", "True\n")],  # made while off, then plt.ion(): not shown
        [("stream", "True\n")],
        [("execute_result", "image/png,text/plain")],  # a figure as the value shows
        [image, image],  # a figure made with interactive mode on: every open figure shows
        [("stream", "False\n")],
        [("stream", "False\n")],
    ]
    # Offloaded, the notices saying what stayed on the worker (`fig`: a Figure) come in addition.
    assert [[(kind, text) for kind, text in _shown(cell) if not text.startswith("remote-magic: ")]
            for cell in offloaded] == [_shown(cell) for cell in local]
    assert cell_text(backend) == "module://remote_magic.worker.figures\n"  # still Agg there
