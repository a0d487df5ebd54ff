"""A chain of 10 elementwise and reduction operations on a 64 MB array (issue 30), against its kernels' own time.

    python benchmarks/bench_gpu_chain.py                      # 64 MB (16 Mi float32 values)
    python benchmarks/bench_gpu_chain.py --mib 4 --no-write   # quick check

The chain, as a GPU cell's code would write it, on ``x`` of shape (n/1024, 1024), float32::

    y = x * 0.5; y = y + 1.0; y = np.abs(y); y = np.sqrt(y); y = y - 0.25
    y = np.maximum(y, 0.0); y = np.tanh(y); y = y * y; rows = y.sum(axis=1); top = y.max()

Columns, each the median of ``--repeat`` interleaved rounds after a warm-up:

* **GPU cell**: the chain on a DeviceArray, as a ``%%offload --gpu`` cell runs it: each operation a
  kernel whose result is read back (a DeviceArray's values are always on the host) and kept on the
  device by digest, so the next operation finds it there. ``x`` is on the device already (the warm-up
  put it there, as an earlier cell would have): this is the resident path, not a fresh upload.
* **kernels, one submission**: the same ten kernels launched on device buffers, recorded and submitted
  together, one wait at the end: the kernels' own time.
* **kernels, one submission each**: the same, each kernel submitted on its own (the launch pattern
  before recording), one wait at the end.
* **numpy**: the chain on the host, for context.

Every result is checked against numpy. Prints a markdown table and, unless ``--no-write``, replaces its
section of ``benchmarks/results.md``.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any, Callable

import numpy as np
from report import MIN_ROUNDS, gpu_lines, interleaved_medians, write_section

from remote_magic.worker.gpu import GpuRuntime, launch
from remote_magic.worker.gpu.context import DeviceContext
from remote_magic.worker.gpu.memory import Allocation

SECTION = "## A chain of 10 operations in a GPU cell (issue 30)"
MI = 1 << 20
COLS = 1024


def chain(x: Any) -> tuple[Any, Any]:
    """The ten operations, on numpy arrays or DeviceArrays alike."""
    y = x * 0.5
    y = y + 1.0
    y = np.abs(y)
    y = np.sqrt(y)
    y = y - 0.25
    y = np.maximum(y, 0.0)
    y = np.tanh(y)
    y = y * y
    return y.sum(axis=1), y.max()


def kernels(ctx: DeviceContext, x: Allocation, shape: tuple[int, int], submit_each: bool) -> list[Allocation]:
    """The chain's ten kernels on device buffers; returns the two results' buffers (not waited for)."""
    rows, cols = shape
    n = rows * cols
    steps: list[tuple[str, float | None]] = [("multiply", 0.5), ("add", 1.0), ("abs", None), ("sqrt", None),
                                             ("subtract", 0.25), ("maximum", 0.0), ("tanh", None), ("square", None)]
    y = x
    for name, scalar in steps:
        if name == "square":
            y = launch.elementwise(ctx, "multiply", [(y, (n,)), (y, (n,))], (n,))
        elif scalar is None:
            y = launch.elementwise(ctx, name, [(y, (n,))], (n,))
        else:
            y = launch.elementwise(ctx, name, [(y, (n,)), scalar], (n,))
        if submit_each:
            ctx.submit()
    row_sums = launch.reduce(ctx, "sum", y, rows, cols, 1)
    if submit_each:
        ctx.submit()
    top = launch.reduce(ctx, "max", y, 1, n, 1)
    ctx.submit()
    return [row_sums, top]


def columns(rt: GpuRuntime, mib: int, rng: np.random.Generator) -> tuple[dict[str, Callable[[], float]], float]:
    """The timed callables, each checked once against numpy; and the largest relative error."""
    ctx = rt.dispatcher.ctx
    n = mib * MI // 4
    shape = (n // COLS, COLS)
    a = rng.uniform(-4.0, 4.0, shape).astype(np.float32)
    x = rt.to_device({"x": a})["x"]
    expected_rows, expected_top = chain(a.astype(np.float64))
    buffer = ctx.upload(a)

    def error(rows: Any, top: Any) -> float:
        return max(float(np.abs(np.asarray(rows, np.float64) - expected_rows).max() / np.abs(expected_rows).max()),
                   abs(float(top) - float(expected_top)) / abs(float(expected_top)))

    def timed(work: Callable[[], Any]) -> float:
        start = time.perf_counter()
        work()
        ctx.wait()
        return time.perf_counter() - start

    rows, top = chain(x)
    errors = [error(rows, top)]
    row_buffer, top_buffer = kernels(ctx, buffer, shape, submit_each=False)
    errors.append(error(ctx.download(row_buffer, shape[0]), ctx.download(top_buffer, 1)[0]))
    runs: dict[str, Callable[[], float]] = {
        "cell": lambda: timed(lambda: chain(x)),
        "one_submission": lambda: timed(lambda: kernels(ctx, buffer, shape, submit_each=False)),
        "submit_each": lambda: timed(lambda: kernels(ctx, buffer, shape, submit_each=True)),
        "numpy": lambda: timed(lambda: chain(a)),
    }
    for run in runs.values():  # warm-up: pipelines compiled, x and the results kept on the device
        run()
    return runs, max(errors)


LABELS = {"cell": "GPU cell (DeviceArrays; each result read back, x resident)",
          "one_submission": "kernels alone, one submission", "submit_each": "kernels alone, one submission each",
          "numpy": "numpy on the host"}


def render(seconds: dict[str, float], mib: int, caps: dict[str, Any], err: float, stats: dict[str, Any],
           args: argparse.Namespace, load: tuple[float, float]) -> str:
    kernel_time = seconds["one_submission"]
    lines = [f"| {mib} MB float32, 10 operations | ms | × kernels alone |", "| --- | ---: | ---: |"]
    lines += [f"| {LABELS[name]} | {seconds[name] * 1e3:.1f} | {seconds[name] / kernel_time:.2f} |" for name in LABELS]
    return "\n".join([
        *gpu_lines("bench_gpu_chain.py", caps, load),
        "",
        *lines,
        "",
        f"One GPU cell chain's counters: {stats['readbacks']} readbacks ({stats['bytes_downloaded'] / MI:.0f} MiB), "
        f"{stats['uploads']} uploads ({stats['bytes_uploaded'] / MI:.0f} MiB), {stats['resident_hits']} operands found "
        "on the device by digest.",
        "",
        f"Median of up to {args.repeat} rounds after a warm-up (at least {MIN_ROUNDS}), every column once per round in "
        f"a shuffled order. Every result checked against numpy in float64: largest relative error {err:.1e}. The "
        "GPU cell's extra time over the kernels is its readbacks and the digests that find each result on the "
        "device again: a DeviceArray is an ndarray, so its values are on the host whenever code can read them.",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=64, help="array size in MiB (default 64)")
    parser.add_argument("--repeat", type=int, default=15, help="rounds at most (default 15)")
    parser.add_argument("--budget", type=float, default=60.0, help="seconds after which no new round starts")
    parser.add_argument("--no-write", action="store_true", help="print only; leave results.md as it is")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with GpuRuntime.create(mode="on") as rt:
        runs, err = columns(rt, args.mib, np.random.default_rng(0))
        seconds = interleaved_medians(runs, args.repeat, args.budget)
        rt.take_stats()
        runs["cell"]()
        stats = rt.take_stats()
        body = render(seconds, args.mib, rt.capabilities(), err, stats, args, (load_before, os.getloadavg()[0]))
    print(body)
    if not args.no_write:
        write_section(SECTION, body)


if __name__ == "__main__":
    main()
