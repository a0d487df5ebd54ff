"""GPU cells end to end (issue 21): the same cell as local numpy, as a first and a repeated GPU cell
on a real worker, and as PyTorch on the worker's machine.

    python benchmarks/bench_gpu_cells.py                          # matmul n=256, 512, 1024; a 16 MB chain
    python benchmarks/bench_gpu_cells.py --sizes 256 --chain-mb 4 --repeat 3 --no-write   # quick check

It starts a private ``remote-worker --listen 127.0.0.1:0 --gpu on`` (keys in a temporary
``REMOTE_MAGIC_HOME``) and runs each cell with ``Client.execute(..., gpu=True)``, what
``%%offload --gpu`` runs:

* ``C = A @ B`` for n x n float32 matrices, and an elementwise chain
  ``Y = np.exp(-X * X) * 2.0 + X`` (after ``import numpy as np``) on a float32 array of ``--chain-mb`` MB;
* **first run**: inputs the worker has never seen (new random values each time), so they cross the
  wire and are uploaded to the GPU;
* **repeat run**: the same inputs again, unchanged: the hub has them (sent as digests) and the
  executor finds their buffers still on the GPU (``--gpu-memory``), so nothing is uploaded;
* the repeat run's counters: uploads, resident hits, readbacks (each cell's result comes back);
* **PyTorch** on this machine (the worker's: it runs here), host -> GPU -> host, when torch has CUDA or
  MPS; otherwise the row says why not.

Times are the median of ``--repeat`` runs after one warm-up; first, repeat and local runs take
turns. Prints a markdown table and, unless ``--no-write``, replaces the "GPU cells" section of
``benchmarks/results.md``. The adapter is in the section: on a machine without a GPU it is lavapipe
(Mesa's software Vulkan), slower than numpy.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
from bench_roundtrip import remote_worker
from report import write_section, zmq_peer_lines

from remote_magic.wire.sizes import human_size

log = logging.getLogger("bench_gpu_cells")

SECTION_TITLE = "## GPU cells: first and repeated runs (issue 21)"
CHAIN_CODE = "import numpy as np\nY = np.exp(-X * X) * 2.0 + X"
MATMUL_CODE = "C = A @ B"
SOFTWARE_NOTE = (" On lavapipe the GPU's memory is this machine's RAM and an upload is a memory copy, so what a "
                 "repeat run saves is small beside kernels that run on the CPU, and this shared machine's noise is of "
                 "the same size; on a GPU a hit saves a PCIe transfer.")


@dataclass
class Cell:
    """One benchmarked cell: its code, what it returns, and how to make fresh inputs."""

    label: str
    code: str
    output: str
    make_inputs: Callable[[np.random.Generator], dict[str, np.ndarray]]
    local: Callable[[dict[str, np.ndarray]], Any]


def matmul_cell(n: int) -> Cell:
    def make(rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {"A": rng.standard_normal((n, n), np.float32), "B": rng.standard_normal((n, n), np.float32)}
    return Cell(f"matmul n={n}", MATMUL_CODE, "C", make, lambda v: v["A"] @ v["B"])


def chain_cell(size_mb: float) -> Cell:
    count = int(size_mb * 1e6) // 4

    def make(rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {"X": rng.standard_normal(count, np.float32)}
    return Cell(f"elementwise chain, {human_size(4 * count)}", CHAIN_CODE, "Y", make,
                lambda v: np.exp(-v["X"] * v["X"]) * 2.0 + v["X"])


@dataclass
class Row:
    """One cell's figures, in seconds, and the repeat run's counters."""

    cell: Cell
    local: float
    first: float
    repeat: float
    first_stats: dict[str, Any]
    repeat_stats: dict[str, Any]
    torch: float | str


def _seconds(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _median_time(call: Callable[[], Any], repeat: int) -> float:
    call()  # warm-up
    return statistics.median(_seconds(call) for _ in range(repeat))


def _interleaved_medians(calls: dict[str, Callable[[], Any]], repeat: int) -> dict[str, float]:
    """The median seconds of each call, run in turns, so a drift in a shared machine's speed hits all alike."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeat):
        for name, call in calls.items():
            times[name].append(_seconds(call))
    return {name: statistics.median(values) for name, values in times.items()}


def bench_cell(client: Any, cell: Cell, rng: np.random.Generator, repeat: int) -> Row:
    """Local numpy, the first GPU run (fresh inputs each time), the repeat run and PyTorch, for ``cell``."""
    inputs = cell.make_inputs(rng)
    expected = cell.local(inputs)
    stats: dict[str, dict[str, Any]] = {}

    def offload(values: dict[str, np.ndarray], kind: str) -> None:
        result = client.execute(cell.code, values, [cell.output], gpu=True)
        stats[kind] = result.stats
        if values is inputs:
            got = np.asarray(result.values[cell.output], np.float64)
            err = float(np.linalg.norm(got - expected) / np.linalg.norm(expected))
            if err > 1e-4:
                raise RuntimeError(f"{cell.label}: relative error {err:.2e} against numpy")

    fresh = [cell.make_inputs(rng) for _ in range(repeat)]  # made before timing: not part of it
    offload(inputs, "first")  # warm-up (pipelines compiled), and the values the repeat runs send, seen once
    cell.local(inputs)
    medians = _interleaved_medians({"first": lambda: offload(fresh.pop(), "first"),
                                    "repeat": lambda: offload(inputs, "repeat"),
                                    "local": lambda: cell.local(inputs)}, repeat)
    return Row(cell, medians["local"], medians["first"], medians["repeat"], stats["first"], stats["repeat"],
               torch_time(cell, inputs, repeat))


def torch_time(cell: Cell, inputs: dict[str, np.ndarray], repeat: int) -> float | str:
    """Seconds of the cell in PyTorch, host -> GPU -> host (CUDA, else MPS), or why there is no figure."""
    try:
        import torch  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return "not installed"
    if torch.cuda.is_available():
        device = "cuda"
        sync: Callable[[], None] = torch.cuda.synchronize
    elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        device = "mps"
        sync = torch.mps.synchronize
    else:
        return "no CUDA or MPS"
    torch.backends.cuda.matmul.allow_tf32 = False

    def run() -> None:
        values = {k: torch.from_numpy(v).to(device) for k, v in inputs.items()}
        if cell.code == MATMUL_CODE:
            out = values["A"] @ values["B"]
        else:
            x = values["X"]
            out = torch.exp(-x * x) * 2.0 + x
        np.asarray(out.cpu())
        sync()
    return _median_time(run, repeat)


def _ms(seconds: float | str) -> str:
    return f"{seconds * 1e3:,.1f} ms" if isinstance(seconds, float) else seconds


def _counters(stats: dict[str, Any]) -> str:
    return (f"{stats.get('uploads', 0)} ({human_size(stats.get('bytes_uploaded', 0))}) / "
            f"{stats.get('resident_hits', 0)} ({human_size(stats.get('bytes_resident', 0))}) / "
            f"{stats.get('readbacks', 0)}")


def table(rows: Sequence[Row]) -> str:
    """The markdown table of ``rows``."""
    lines = ["| cell | local numpy | `--gpu` first run | `--gpu` repeat run | repeat ÷ first | first run: uploads / "
             "hits / readbacks | repeat run: uploads / hits / readbacks | PyTorch, host→GPU→host |",
             "| --- | ---: | ---: | ---: | ---: | --- | --- | ---: |"]
    for row in rows:
        lines.append(f"| {row.cell.label} | {_ms(row.local)} | {_ms(row.first)} | {_ms(row.repeat)} | "
                     f"{row.repeat / row.first:.2f} | {_counters(row.first_stats)} | {_counters(row.repeat_stats)} | "
                     f"{_ms(row.torch)} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024], help="matmul sides")
    parser.add_argument("--chain-mb", type=float, default=16.0, help="the elementwise chain's array, MB (default 16)")
    parser.add_argument("--repeat", type=int, default=7, help="timed runs of each (default 7; the median counts)")
    parser.add_argument("--no-write", action="store_true", help="print the table only; leave results.md alone")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(name)s: %(message)s")
    import remote_magic

    load_before = os.getloadavg()
    rng = np.random.default_rng(0)
    cells = [matmul_cell(n) for n in args.sizes] + [chain_cell(args.chain_mb)]
    rows = []
    with remote_worker("on") as token, remote_magic.connect(token) as client:
        [worker] = client.workers()
        gpu = worker["gpu"]
        for cell in cells:
            log.info("measuring %s", cell.label)
            rows.append(bench_cell(client, cell, rng, args.repeat))
    adapter = f"{gpu.get('adapter')} ({gpu.get('adapter_type')}, {gpu.get('backend')})"
    software = (" — lavapipe, Mesa's software Vulkan on the CPU, not a GPU" if gpu.get("adapter_type") == "software"
                else "")
    body = "\n".join([
        *zmq_peer_lines(load_before),
        f"- Adapter: {adapter}{software}; resident budget (`--gpu-memory`, default) "
        f"{human_size(gpu.get('gpu_memory', 0))}",
        "- `python benchmarks/bench_gpu_cells.py` (median of "
        f"{args.repeat} runs each; client and worker on this machine over loopback)",
        "",
        table(rows),
        "",
        "First run: inputs the worker hasn't seen. Repeat run: the same inputs, unchanged, so the hub has them "
        "and their buffers are still on the GPU; each run's result comes back to the notebook. Counters: "
        "uploads (bytes) / resident hits (bytes not uploaded) / readbacks."
        + (SOFTWARE_NOTE if gpu.get("adapter_type") == "software" else ""),
    ])
    print(body)
    if not args.no_write:
        write_section(SECTION_TITLE, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
