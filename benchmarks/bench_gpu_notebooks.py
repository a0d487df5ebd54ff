"""Public numpy notebooks under ``%%offload --gpu`` (issue 30): how many cells reach a GPU kernel, and how many
end differently from the same notebook run locally.

    python benchmarks/bench_gpu_notebooks.py
    python benchmarks/bench_gpu_notebooks.py --notebooks numpy100 --no-write

For each notebook of ``tests/conformance/`` named (by default the public numpy ones: numpy-100, the handbook's
numpy chapters, a numpy tutorial and a simulation), a fresh ``remote-worker --gpu on`` (lavapipe without a GPU)
and three runs in real Jupyter kernels (nbclient): locally; with every cell under ``%%offload --gpu``, compared
with the local run as ``tests/end_to_end/test_conformance_gpu.py`` compares them (outputs per cell, then the
final namespace; floats within float32 precision only after a cell said it computed float64 data in float32);
and under ``%%offload --gpu --stats``, whose per-cell line says which GPU kernels ran and what numpy computed.

Prints a markdown table and, unless ``--no-write``, replaces its section of ``benchmarks/results.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

from conformance import compare, run_notebook  # noqa: E402
from report import code_version, machine, write_section  # noqa: E402

from support import require_a_gpu, start_worker  # noqa: E402

SECTION = "## Public numpy notebooks under %%offload --gpu (issue 30)"
NOTEBOOKS = ("numpy100", "pdsh_numpy", "numpy_basics_tutorial", "numpy_simulation")
STATS = re.compile(r"ran on [^:]+: GPU kernels (.*?); with numpy (.*?); GPU time")


def adapter_of(gpu: dict[str, Any]) -> str:
    """The adapter a worker's GPU description (``require_a_gpu``'s) names; lavapipe said to be no GPU."""
    software = " — lavapipe, Mesa's software Vulkan, not a GPU" if gpu.get("adapter_type") == "software" else ""
    return f"{gpu.get('adapter')} ({gpu.get('adapter_type')}, {gpu.get('backend')}){software}"


def measure(name: str, workdir: Path) -> tuple[int, int, int, int, list[str], str]:
    """(offloaded cells, cells that ran a GPU kernel, cells that computed something with numpy, the number of
    differences from the local run, those differences in words, the worker's adapter) for one notebook."""
    notebook = REPO / "tests" / "conformance" / f"{name}.ipynb"
    (workdir / "cwd").mkdir(parents=True)
    worker = start_worker(workdir / "worker", "--listen", "127.0.0.1:0", "--gpu", "on", cwd=workdir / "cwd")
    try:
        adapter = adapter_of(require_a_gpu(worker))
        compared = run_notebook(notebook, workdir / "gpu", token=worker.token, gpu=True)
        counted = run_notebook(notebook, workdir / "stats", token=worker.token, magic="%%offload --gpu --stats")
    finally:
        worker.stop()
    differences = compare(run_notebook(notebook, workdir / "local"), compared)
    offloaded = [cell for cell in counted.cells if cell.offloaded]
    per_cell = [STATS.findall(cell.stderr) for cell in offloaded]
    assert any(per_cell), f"{name}: no --stats line was found in any cell's output"
    on_gpu = sum(1 for found in per_cell if any(kernels != "none" for kernels, _ in found))
    with_numpy = sum(1 for found in per_cell if any(numpy != "none" for _, numpy in found))
    return len(offloaded), on_gpu, with_numpy, len(differences), differences, adapter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--notebooks", nargs="*", default=list(NOTEBOOKS), help="conformance notebooks by name")
    parser.add_argument("--no-write", action="store_true", help="print only; leave results.md as it is")
    args = parser.parse_args()
    os.environ["PYTHONHASHSEED"] = "0"  # both runs and the worker order sets of strings alike
    load = os.getloadavg()[0]
    rows, totals, adapter = [], [0, 0, 0, 0], ""
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.notebooks:
            cells, on_gpu, with_numpy, differing, differences, adapter = measure(name, Path(tmp) / name)
            for difference in differences:
                print(difference, file=sys.stderr)
            rows.append(f"| {name} | {cells} | {on_gpu} | {with_numpy} | {differing} |")
            totals = [a + b for a, b in zip(totals, (cells, on_gpu, with_numpy, differing))]
    rows.append(f"| **all** | {totals[0]} | {totals[1]} | {totals[2]} | {totals[3]} |")
    body = "\n".join([
        f"- Date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- Machine: {machine()}; {code_version()}; load average (1 min) before / after: {load:.2f} / "
        f"{os.getloadavg()[0]:.2f}",
        f"- `python benchmarks/bench_gpu_notebooks.py`: a worker with `--gpu on` on {adapter}; every code cell "
        "under `%%offload --gpu`",
        "",
        "| notebook | offloaded cells | cells that ran a GPU kernel | cells that computed something with numpy | "
        "differences from the local run |",
        "| --- | ---: | ---: | ---: | ---: |",
        *rows,
        "",
        "A difference is a cell whose outputs, or a name of the final namespace, differ from the local run's (the "
        "conformance test's rule); the issue's starting point, on the same kind of run: 26 cells of 264 ran a GPU "
        "kernel and 95 differed, 68 of them silently.",
    ])
    print(body)
    if not args.no_write:
        write_section(SECTION, body)


if __name__ == "__main__":
    main()
