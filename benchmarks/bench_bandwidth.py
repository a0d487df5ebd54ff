"""Elementwise and reduction kernels beside the adapter's copy bandwidth (issue 21), in GB/s.

    python benchmarks/bench_bandwidth.py                          # 1M, 16M and 64M float32 values
    python benchmarks/bench_bandwidth.py --sizes 1 --no-write     # quick check (sizes in Mi values)

For each size n it measures, with the inputs already on the device:

* **exp**: the unary kernel, ``exp(a)``;
* **add**: the binary kernel on two dense arrays, ``a + b``;
* **matrix + row**: the binary kernel broadcasting a row, ``(n/1024, 1024) + (1024,)``;
* **sum all**: the reduction of all n values (two passes, float-float sums);
* **sum last axis**: the reduction of each row of ``(n/1024, 1024)``;
* **copy**: ``copy_buffer_to_buffer`` of the same n values, the adapter's own bandwidth;
* **numpy add** and **numpy copyto**: ``np.add(a, b, out=c)`` and ``np.copyto(c, a)`` on this machine's CPU.

Effective GB/s counts the bytes each must read and write (an input read once, an output written once:
12n bytes for add, 8n for exp and copy, 4n for a sum) over the median time. Kernel times are the wall
time of the launch and a wait for the device (``ctx.wait()``), so a small array's figure includes the
launch's fixed cost. Each figure is the median of ``--repeat`` rounds after a warm-up (at least 3; no
more once a size passed ``--budget`` seconds), each round running every column once in a shuffled
order, so a drift in a shared machine's speed hits all alike. Every kernel's result is checked against
numpy once. A size whose buffers exceed the adapter's ``max_storage_buffer_binding_size`` has no kernel
figures (the kernels bind whole arrays). Prints a markdown table and, unless ``--no-write``, replaces
its section of ``benchmarks/results.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import platform
import sys
import time
from typing import Any, Callable, Sequence

import numpy as np
from report import MIN_ROUNDS, RESULTS_PATH, code_version, interleaved_medians, machine, write_section

from remote_magic.worker.gpu import GpuRuntime, launch
from remote_magic.worker.gpu.memory import Allocation

log = logging.getLogger("bench_bandwidth")

SECTION = "## Elementwise and reduction bandwidth (issue 21)"
MI = 1 << 20
DEFAULT_SIZES = [1, 16, 64]
"""Array lengths in Mi float32 values."""
COLS = 1024
"""Row length of the 2-D cases (broadcast row, sum over the last axis)."""
COLUMNS = ("exp", "add", "broadcast", "sum_all", "sum_rows", "copy", "np_add", "np_copyto")
LABELS = {
    "exp": "exp (unary)", "add": "add (binary, dense)", "broadcast": f"matrix + row (n/{COLS}×{COLS} + {COLS})",
    "sum_all": "sum of all", "sum_rows": f"sum over last axis (n/{COLS}×{COLS})",
    "copy": "adapter copy_buffer_to_buffer", "np_add": "numpy np.add (host)", "np_copyto": "numpy np.copyto (host)",
}
KERNELS = ("exp", "add", "broadcast", "sum_all", "sum_rows")


def moved_bytes(name: str, n: int) -> int:
    """Bytes column ``name`` must read and write for n values."""
    rows = n // COLS
    return {"exp": 8 * n, "add": 12 * n, "broadcast": 8 * n + 4 * COLS, "sum_all": 4 * n,
            "sum_rows": 4 * n + 4 * rows, "copy": 8 * n, "np_add": 12 * n, "np_copyto": 8 * n}[name]


class Bench:
    """The timed columns of one array size on one runtime; each call returns seconds."""

    def __init__(self, rt: GpuRuntime) -> None:
        self.rt = rt
        self.ctx = rt.dispatcher.ctx

    def _wall(self, work: Callable[[], Any]) -> float:
        start = time.perf_counter()
        work()
        self.ctx.wait()
        return time.perf_counter() - start

    def columns(self, n: int, rng: np.random.Generator) -> tuple[dict[str, Callable[[], float]], float]:
        """The timed callables for arrays of n values (kernels run once and checked), and the largest error."""
        ctx = self.ctx
        rows = n // COLS
        a = rng.uniform(-4.0, 4.0, n).astype(np.float32)
        b = rng.standard_normal(n, np.float32)
        row = rng.standard_normal(COLS, np.float32)
        x, y, r = ctx.upload(a), ctx.upload(b), ctx.upload(row)
        ctx.wait()
        matrix = a.reshape(rows, COLS)
        launches: dict[str, tuple[Callable[[], Allocation], np.ndarray]] = {
            "exp": (lambda: launch.elementwise(ctx, "exp", [(x, (n,))], (n,)), np.exp(a.astype(np.float64))),
            "add": (lambda: launch.elementwise(ctx, "add", [(x, (n,)), (y, (n,))], (n,)), a.astype(np.float64) + b),
            "broadcast": (lambda: launch.elementwise(ctx, "add", [(x, (rows, COLS)), (r, (COLS,))], (rows, COLS)),
                          (matrix.astype(np.float64) + row).ravel()),
            "sum_all": (lambda: launch.reduce(ctx, "sum", x, 1, n, 1), np.array([a.sum(dtype=np.float64)])),
            "sum_rows": (lambda: launch.reduce(ctx, "sum", x, rows, COLS, 1), matrix.sum(axis=1, dtype=np.float64)),
        }
        runs: dict[str, Callable[[], float]] = {}
        errors = []
        if 4 * n <= ctx.max_binding:
            for name, (run, reference) in launches.items():
                got = ctx.download(run(), reference.size).astype(np.float64)
                scale = np.abs(reference).max() if name != "sum_all" else np.abs(a).sum()
                errors.append(float(np.abs(got - reference).max() / scale))
                runs[name] = lambda run=run: self._wall(run)
        else:
            log.info("%d Mi values exceed the %d MiB binding limit: copy and numpy only", n // MI,
                     ctx.max_binding // MI)
        target = ctx.empty(4 * n)

        def copy() -> None:
            encoder = ctx.handle.create_command_encoder()
            encoder.copy_buffer_to_buffer(x.buffer, 0, target.buffer, 0, 4 * n)
            ctx.handle.queue.submit([encoder.finish()])

        copy()
        if not np.array_equal(ctx.download(target, n), a):
            raise RuntimeError("copy_buffer_to_buffer gave different values")
        out = np.empty_like(a)

        def host(work: Callable[[], Any]) -> float:
            start = time.perf_counter()
            work()
            return time.perf_counter() - start

        runs["copy"] = lambda: self._wall(copy)
        runs["np_add"] = lambda: host(lambda: np.add(a, b, out=out))
        runs["np_copyto"] = lambda: host(lambda: np.copyto(out, a))
        return runs, max(errors, default=0.0)


def medians(runs: dict[str, Callable[[], float]], repeat: int, budget_s: float) -> dict[str, float]:
    """Each run once to warm up, then :func:`report.interleaved_medians`."""
    for run in runs.values():
        run()
    return interleaved_medians(runs, repeat, budget_s)


def measure(bench: Bench, n: int, rng: np.random.Generator, repeat: int, budget_s: float) -> dict[str, Any]:
    """One size: GB/s of every column measured (absent: over the binding limit), and the largest error."""
    runs, err = bench.columns(n, rng)
    seconds = medians(runs, repeat, budget_s)
    rates = {name: moved_bytes(name, n) / seconds[name] / 1e9 for name in seconds}
    return {"n": n, "rates": rates, "err": err}


def table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The markdown table: one line per column, one column per size, kernels also as a share of copy."""
    head = " | ".join(f"{row['n'] // MI}M" for row in rows)
    lines = [f"| GB/s (share of adapter copy) | {head} |", "| --- |" + " ---: |" * len(rows)]
    for name in COLUMNS:
        cells = []
        for row in rows:
            rate = row["rates"].get(name)
            if rate is None:
                cells.append("over binding limit")
            elif name in KERNELS:
                cells.append(f"{rate:.2f} ({rate / row['rates']['copy']:.0%})")
            else:
                cells.append(f"{rate:.2f}")
        lines.append(f"| {LABELS[name]} | {' | '.join(cells)} |")
    return lines


def render(rows: Sequence[dict[str, Any]], caps: dict[str, Any], max_binding: int, args: argparse.Namespace,
           load: tuple[float, float]) -> str:
    """The results section's body: machine, table, how it was measured."""
    import wgpu

    software = (" — lavapipe, Mesa's software Vulkan on the CPU, not a GPU" if caps.get("adapter_type") == "software"
                else "")
    return "\n".join([
        f"Measured by `python benchmarks/bench_bandwidth.py{' ' + ' '.join(sys.argv[1:]) if sys.argv[1:] else ''}`.",
        "",
        f"- Date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- Machine: {machine()}",
        f"- Adapter: {caps.get('adapter')} ({caps.get('adapter_type')}, {caps.get('backend')}){software}; "
        f"binding limit {max_binding // MI} MiB",
        f"- Python {platform.python_version()}; numpy {np.__version__}, wgpu {wgpu.__version__}; {code_version()}",
        f"- Load average (1 min) before / after the run: {load[0]:.2f} / {load[1]:.2f}",
        "",
        "Effective GB/s (bytes read + written over the median time; float32, inputs already on the device; "
        "higher is better):",
        "",
        *table(rows),
        "",
        f"Kernels and copy: wall time of the launch and a wait for the device. Each figure is the median of up "
        f"to {args.repeat} rounds after a warm-up (at least {MIN_ROUNDS}), every column once per round in a "
        f"shuffled order. Every kernel result checked against numpy in float64: largest relative error "
        f"{max(r['err'] for r in rows):.1e}. Over binding limit: an operand larger than one binding may hold, "
        "which the kernels refuse (`GpuLimitError`); numpy computes those arrays.",
    ])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=DEFAULT_SIZES,
                        help="array lengths in Mi float32 values (default 1 16 64)")
    parser.add_argument("--repeat", type=int, default=9, help="timed rounds per size (default 9; the median counts)")
    parser.add_argument("--budget", type=float, default=20.0,
                        help="no more rounds for a size after this many seconds (default 20)")
    parser.add_argument("--adapter", help="GPU adapter name substring")
    parser.add_argument("--backend", choices=["vulkan", "metal", "d3d12"])
    parser.add_argument("--no-write", action="store_true", help=f"do not update {RESULTS_PATH.name}")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(name)s: %(message)s")

    rt = GpuRuntime.create(mode="on", adapter=args.adapter, backend=args.backend)
    caps = rt.capabilities()
    bench = Bench(rt)
    rng = np.random.default_rng(0)
    load_before = os.getloadavg()[0]
    rows = []
    for size in args.sizes:
        log.info("measuring %d Mi values", size)
        rows.append(measure(bench, size * MI, rng, args.repeat, args.budget))
    load_after = os.getloadavg()[0]
    max_binding = bench.ctx.max_binding
    rt.close()
    body = render(rows, caps, max_binding, args, (load_before, load_after))
    print(body)
    if not args.no_write:
        write_section(SECTION, body)
    return 0 if all(r["err"] < 1e-4 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
