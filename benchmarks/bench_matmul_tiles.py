"""Matmul tilings by shape (issue 21): the tiling the worker picks, beside the one fixed tiling it had
before, a naive kernel and local numpy, in GFLOP/s.

    python benchmarks/bench_matmul_tiles.py                         # n = 64 ... 2048 and six other shapes
    python benchmarks/bench_matmul_tiles.py --sizes 64 256 --shapes 1x1024x1024 --no-write   # quick check

For each product (square n x n, and ``--shapes`` given as MxKxN) it measures, with the inputs already
on the device:

* **chosen**: ``worker/gpu/matmul.py`` as the worker runs it, the tiling picked by shape and adapter
  (named in the table), with vec4 loads where K and N are multiples of 4;
* **old 128×128**: the one tiling every product used before (16x16 invocations, 8x8 outputs each,
  element-wise loads), forced;
* **naive**: one invocation per element of C, no workgroup memory (the shipped ``naive`` entry point), forced;
* **subgroups** and **tiles**, only on a device with the "subgroups" feature: the ``subgroups8`` kernel
  (``shaders/matmul_subgroups.wgsl``, loads of A shared through the subgroup), forced, beside the tiling
  chosen as on a device without the feature (where **chosen** is the subgroup kernel, the one it replaced);
* **numpy**: ``A @ B`` on this machine's CPU.

Kernel times wait for the device (``ctx.wait()``) and are read from timestamp queries around the compute
pass when the adapter has them, else the wall time of the launch and the wait. Each figure is the median
of ``--repeat`` rounds after a warm-up (at least 3 rounds; no more once a shape passed ``--budget``
seconds), each round running every column once in a shuffled order, so a drift in a shared machine's speed
hits all alike.
Every result is checked against numpy in float64. Prints a markdown table and, unless ``--no-write``,
replaces its section of ``benchmarks/results.md``.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time
from typing import Any, Callable, Sequence

import numpy as np
from report import MIN_ROUNDS, RESULTS_PATH, gpu_lines, interleaved_medians, write_section

from remote_magic.worker.gpu import GpuRuntime
from remote_magic.worker.gpu.matmul import TILE_128, TILE_SUBGROUPS, choose_tiling, matmul, naive_tiling
from remote_magic.worker.gpu.runtime import DEFAULT_MATMUL_THREADS

log = logging.getLogger("bench_matmul_tiles")

SECTION = "## Matmul tilings by shape (issue 21)"
DEFAULT_SIZES = [64, 128, 256, 512, 1024, 2048]
DEFAULT_SHAPES = ["4096x64x4096", "32x1024x1024", "1x1024x1024", "128x3072x768", "128x768x768", "32x4096x32"]
"""Skinny products, and products with a long K whose C is too small to fill the device with tiles: split-K's (a
GPT-2 block's MLP down and attention projection on a GPU; the last on a software adapter without subgroups)."""
SUBGROUP_COLUMN = "subgroups"
"""The column measured only where the device has the "subgroups" feature."""


def parse_shape(text: str) -> tuple[int, int, int]:
    """``MxKxN`` as (m, k, n)."""
    try:
        m, k, n = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not MxKxN, e.g. 4096x64x4096") from None
    return m, k, n


class Bench:
    """The timed columns of one product on one runtime; each call returns seconds."""

    def __init__(self, rt: GpuRuntime) -> None:
        self.rt = rt
        self.ctx = rt.dispatcher.ctx
        self.timestamps = bool(self.ctx.timer.timestamps)

    def _kernel_seconds(self, launch: Callable[[], Any]) -> float:
        self.rt.take_stats()
        start = time.perf_counter()
        launch()
        self.ctx.wait()
        wall = time.perf_counter() - start
        gpu_time = float(self.rt.take_stats()["gpu_time_s"])
        return gpu_time if self.timestamps and gpu_time > 0 else wall

    def columns(self, a: np.ndarray, b: np.ndarray) -> tuple[dict[str, Callable[[], float]], float]:
        """The timed callables for ``a @ b`` (each run once, unchecked), and their largest relative error."""
        ctx = self.ctx
        m, n = a.shape[0], b.shape[1]
        x, y = ctx.upload(a), ctx.upload(b)
        launches: dict[str, Callable[[], Any]] = {
            "chosen": lambda: matmul(ctx, x, a.shape, y, b.shape, DEFAULT_MATMUL_THREADS),
            "old": lambda: matmul(ctx, x, a.shape, y, b.shape, tiling=TILE_128, vectorize=False),
            "naive": lambda: matmul(ctx, x, a.shape, y, b.shape, tiling=naive_tiling(m, n)),
        }
        if ctx.device.subgroups:
            tiles = choose_tiling(ctx, (m, n, a.shape[1]), 1, DEFAULT_MATMUL_THREADS, subgroups=False)
            launches[SUBGROUP_COLUMN] = lambda: matmul(ctx, x, a.shape, y, b.shape, tiling=TILE_SUBGROUPS)
            launches["tiles"] = lambda: matmul(ctx, x, a.shape, y, b.shape, tiling=tiles)
        reference = a.astype(np.float64) @ b
        errors = []
        for launch in launches.values():
            out, _ = launch()
            got = ctx.download(out, m * n).reshape(m, n)
            errors.append(float(np.linalg.norm(got - reference) / np.linalg.norm(reference)))

        def host() -> float:
            start = time.perf_counter()
            a @ b
            return time.perf_counter() - start

        runs: dict[str, Callable[[], float]] = {name: (lambda launch=launch: self._kernel_seconds(launch))
                                                for name, launch in launches.items()}
        runs["numpy"] = host
        return runs, max(errors)


def measure(bench: Bench, shape: tuple[int, int, int], rng: np.random.Generator, repeat: int,
            budget_s: float) -> dict[str, Any]:
    """One row: GFLOP/s of every column for an (m x k) @ (k x n) product, the tiling chosen, the error."""
    m, k, n = shape
    a = rng.standard_normal((m, k), np.float32)
    b = rng.standard_normal((k, n), np.float32)
    runs, err = bench.columns(a, b)
    seconds = interleaved_medians(runs, repeat, budget_s)
    tiling = choose_tiling(bench.ctx, (m, n, k), 1, DEFAULT_MATMUL_THREADS)
    vec4 = tiling.entry != "naive" and k % 4 == 0 and n % 4 == 0
    flops = 2 * m * n * k
    row: dict[str, Any] = {name: flops / seconds[name] / 1e9 for name in seconds}
    tiles = choose_tiling(bench.ctx, (m, n, k), 1, DEFAULT_MATMUL_THREADS, subgroups=False)
    row.update(shape=shape, tiling=f"{tiling.name}{', vec4' if vec4 else ''}", err=err,
               tiles_tiling=tiles.name if tiles != tiling else None)  # (named where the tiles column runs another)
    return row


def table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The markdown table of ``rows``, with the subgroups columns where they were measured."""
    subgroups = all(SUBGROUP_COLUMN in row for row in rows)
    extra = " tiles | subgroups | subgroups ÷ tiles |" if subgroups else ""
    rule = "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: | ---: | ---: |" if subgroups else "")
    lines = ["| M×K @ K×N | chosen tiling | chosen | old 128×128 | naive | numpy | chosen ÷ old | chosen ÷ naive |"
             + extra, rule]
    for row in rows:
        m, k, n = row["shape"]
        line = (f"| {m}×{k} @ {k}×{n} | {row['tiling']} | {row['chosen']:.2f} | {row['old']:.2f} | "
                f"{row['naive']:.2f} | {row['numpy']:.1f} | {row['chosen'] / row['old']:.2f}× | "
                f"{row['chosen'] / row['naive']:.1f}× |")
        if subgroups:
            line += (f" {row['tiles']:.2f} | {row[SUBGROUP_COLUMN]:.2f} | "
                     f"{row[SUBGROUP_COLUMN] / row['tiles']:.2f}× |")
        lines.append(line)
    return lines


def render(rows: Sequence[dict[str, Any]], caps: dict[str, Any], timestamps: bool, args: argparse.Namespace,
           load: tuple[float, float]) -> str:
    """The results section's body: machine, table, how it was measured."""
    method = ("timestamp queries around the compute pass" if timestamps
              else "wall time of the launch and a wait for the device (no timestamp queries on this adapter)")
    slower = [r for r in rows if r["chosen"] < r["naive"]]
    return "\n".join([
        *gpu_lines("bench_matmul_tiles.py", caps, load),
        "",
        "GFLOP/s (2·M·N·K flops per product, float32, inputs already on the device; higher is better):",
        "",
        *table(rows),
        "",
        "Chosen slower than naive: " + (", ".join("×".join(map(str, r["shape"])) for r in slower) if slower
                                        else "at no shape measured") + ".",
        "",
        f"Kernel columns: {method}, after a wait for the device. Each figure is the median of up to "
        f"{args.repeat} rounds after a warm-up (at least {MIN_ROUNDS}; fewer than {args.repeat} once a shape "
        f"passed {args.budget:g} s), every column once per round in a shuffled order. Every result checked "
        f"against numpy in float64: largest relative error {max(r['err'] for r in rows):.1e}. "
        "Old 128×128: the single tiling before issue 21, forced. Naive: one invocation per element of C (the "
        "shipped `naive` entry point, forced). The rule that picks a tiling is in `worker/gpu/matmul.py`; on a "
        "software adapter it aims at 2 workgroups per CPU, on a GPU at 256." + subgroup_note(rows),
    ])


def subgroup_note(rows: Sequence[dict[str, Any]]) -> str:
    """What the subgroups column is, and at which shapes it beat the chosen tiling (empty without the column)."""
    if not all(SUBGROUP_COLUMN in r for r in rows):
        return ""
    faster = [r for r in rows if r[SUBGROUP_COLUMN] > r["tiles"]]
    named = [f"{'×'.join(map(str, r['shape']))}: {r['tiles_tiling']}" for r in rows if r["tiles_tiling"]]
    return (" Subgroups: the `subgroups8` kernel (`shaders/matmul_subgroups.wgsl`, A's loads shared through the "
            "subgroup, no workgroup memory), forced; tiles: the tiling chosen as on a device without the feature, "
            "forced (vec4 loads where K and N are multiples of 4)"
            + (f", where the chosen column ran another: {'; '.join(named)}" if named else "")
            + ". Subgroups faster than tiles at "
            + (", ".join("×".join(map(str, r["shape"])) for r in faster) if faster else "no shape measured")
            + ". `choose_tiling` takes it on a software adapter for a C of at most 512×512 elements, where it "
            "measured faster (the chosen column then runs it too); never on a GPU, where it is unmeasured.")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=DEFAULT_SIZES,
                        help="square sides (default 64 to 2048)")
    parser.add_argument("--shapes", type=parse_shape, nargs="*", default=[parse_shape(s) for s in DEFAULT_SHAPES],
                        help="more products as MxKxN (default: " + " ".join(DEFAULT_SHAPES) + ")")
    parser.add_argument("--repeat", type=int, default=7, help="timed rounds per product (default 7; the median counts)")
    parser.add_argument("--budget", type=float, default=20.0,
                        help="no more rounds for a product after this many seconds (default 20)")
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
    for shape in [(n, n, n) for n in args.sizes] + list(args.shapes):
        log.info("measuring %s", "x".join(map(str, shape)))
        rows.append(measure(bench, shape, rng, args.repeat, args.budget))
    load_after = os.getloadavg()[0]
    timestamps = bench.timestamps
    rt.close()
    body = render(rows, caps, timestamps, args, (load_before, load_after))
    print(body)
    if not args.no_write:
        write_section(SECTION, body)
    return 0 if all(math.isfinite(r["err"]) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
