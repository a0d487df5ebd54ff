"""Counting and order kernels in a GPU cell (issue 30): bincount, np.add.at, partition, median, percentile
and unique on DeviceArrays, beside numpy on the same host.

    python benchmarks/bench_counting.py                      # 4 MiB of float32 values (1 Mi), int64 labels
    python benchmarks/bench_counting.py --mib 1 --no-write   # quick check

Each row is one numpy call as a ``%%offload --gpu`` cell's code writes it, on 1-D arrays of ``n`` values:
``x`` float32 (standard normal), ``labels`` int64 in [0, 1000), ``w`` float32 weights. Columns, each the
median of ``--repeat`` interleaved rounds after a warm-up:

* **GPU cell**: the call on DeviceArrays (its inputs on the device already, found by digest, as an
  earlier operation or cell would have left them), its result read back, as a cell gets it;
* **numpy**: the same call on the plain arrays.

Every GPU cell result is checked against numpy once. Prints a markdown table and, unless ``--no-write``,
replaces its section of ``benchmarks/results.md``.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any, Callable

import numpy as np
from report import MIN_ROUNDS, gpu_lines, interleaved_medians, write_section

from remote_magic.worker.gpu import GpuRuntime

SECTION = "## Counting and order kernels in a GPU cell (issue 30)"
MI = 1 << 20
BINS = 1000

CALLS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "np.bincount(labels)": lambda v: np.bincount(v["labels"]),
    "np.bincount(labels, weights=w)": lambda v: np.bincount(v["labels"], weights=v["w"]),
    "np.add.at(totals, labels, w)": lambda v: np.add.at(v["totals"], v["labels"], v["w"]),
    "np.partition(x, n // 2)": lambda v: np.partition(v["x"], v["x"].size // 2),
    "np.median(x)": lambda v: np.median(v["x"]),
    "np.percentile(x, [5, 50, 95])": lambda v: np.percentile(v["x"], [5, 50, 95]),
    "np.unique(labels, return_counts=True)": lambda v: np.unique(v["labels"], return_counts=True),
    "np.unique(x)": lambda v: np.unique(v["x"]),
}
"""The timed calls, by how a cell writes them."""


def same(got: Any, want: Any, name: str) -> None:
    """``got`` is numpy's ``want`` (floats of weighted sums within float32 rounding; a partition at n // 2)."""
    if isinstance(want, tuple):
        for g, w in zip(got, want):
            same(g, w, name)
        return
    got, want = np.asarray(got), np.asarray(want)
    if name.startswith("np.partition"):
        half = want.size // 2
        assert got[half] == want[half] and (got[:half] <= got[half]).all() and (got[half:] >= got[half]).all()
    elif "weights" in name:
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    else:
        np.testing.assert_array_equal(got, want)


def columns(rt: GpuRuntime, n: int, rng: np.random.Generator) -> dict[str, Callable[[], float]]:
    """The timed callables (two a call: GPU cell and numpy), each GPU result checked once against numpy."""
    host = {"x": rng.standard_normal(n).astype(np.float32), "labels": rng.integers(0, BINS, n),
            "w": rng.standard_normal(n).astype(np.float32), "totals": np.zeros(BINS, np.float32)}
    device = rt.to_device({name: value.copy() for name, value in host.items()})
    ctx = rt.dispatcher.ctx

    def timed(call: Callable[[dict[str, Any]], Any], values: dict[str, Any]) -> Callable[[], float]:
        def run() -> float:
            start = time.perf_counter()
            call(values)
            ctx.wait()
            return time.perf_counter() - start
        return run

    runs: dict[str, Callable[[], float]] = {}
    for name, call in CALLS.items():
        if name.startswith("np.add.at"):
            call(device), call(host)
            np.testing.assert_allclose(np.asarray(device["totals"]), host["totals"], rtol=1e-4, atol=1e-3)
        else:
            same(call(device), call(host), name)
        runs[f"gpu {name}"] = timed(call, device)
        runs[f"numpy {name}"] = timed(call, host)
    for run in runs.values():  # warm-up: pipelines compiled, inputs kept on the device
        run()
    return runs


def render(seconds: dict[str, float], n: int, caps: dict[str, Any], args: argparse.Namespace,
           load: tuple[float, float]) -> str:
    lines = [f"| {n:,} values ({n * 4 / MI:.0f} MiB float32, {n * 8 / MI:.0f} MiB int64 labels) | GPU cell ms | "
             "numpy ms | GPU / numpy |", "| --- | ---: | ---: | ---: |"]
    for name in CALLS:
        gpu, host = seconds[f"gpu {name}"], seconds[f"numpy {name}"]
        lines.append(f"| `{name}` | {gpu * 1e3:.1f} | {host * 1e3:.1f} | {gpu / host:.1f} |")
    return "\n".join([
        *gpu_lines("bench_counting.py", caps, load),
        "",
        *lines,
        "",
        f"Median of up to {args.repeat} rounds after a warm-up (at least {MIN_ROUNDS}), every column once per round in "
        "a shuffled order; inputs already on the device (found by digest), results read back. labels int64 in "
        f"[0, {BINS}), x and w float32 standard normal; every GPU result checked against numpy once.",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=4, help="float32 array size in MiB (default 4: 1 Mi values)")
    parser.add_argument("--repeat", type=int, default=7, help="rounds at most (default 7)")
    parser.add_argument("--budget", type=float, default=60.0, help="seconds after which no new round starts")
    parser.add_argument("--no-write", action="store_true", help="print only; leave results.md as it is")
    args = parser.parse_args()
    n = args.mib * MI // 4
    load_before = os.getloadavg()[0]
    with GpuRuntime.create(mode="on") as rt:
        runs = columns(rt, n, np.random.default_rng(0))
        seconds = interleaved_medians(runs, args.repeat, args.budget)
        body = render(seconds, n, rt.capabilities(), args, (load_before, os.getloadavg()[0]))
    print(body)
    if not args.no_write:
        write_section(SECTION, body)


if __name__ == "__main__":
    main()
