"""Which numpy operations a GPU cell runs as GPU kernels, on arrays of at least 1 MB (issue 30's list).

    python benchmarks/bench_gpu_coverage.py                 # 4 MB arrays (1 Mi values)
    python benchmarks/bench_gpu_coverage.py --mib 1 --no-write

Each operation runs once on DeviceArrays, as a ``%%offload --gpu`` cell's code would (inputs through
``GpuRuntime.to_device``, as the executor passes them), and once on the plain arrays with numpy. A row
says which GPU kernels ran, what numpy computed instead, and whether the result is numpy's: the same
dtype and shape, integers and booleans equal, floats within float32 rounding (relative 1e-5 of the
result's largest magnitude). Times are the median of ``--repeat`` rounds of each, after a warm-up,
on the same arrays (so inputs are resident on the device: this is the repeated-cell path).

Prints a markdown table and, unless ``--no-write``, replaces its section of ``benchmarks/results.md``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any, Callable

import numpy as np
from report import gpu_lines, write_section

from remote_magic.worker.gpu import GpuRuntime

SECTION = "## Which operations a GPU cell runs as kernels (issue 30)"
MI = 1 << 20

Operation = Callable[[dict[str, Any]], Any]


def operations() -> dict[str, Operation]:
    """Issue 30's list, by the name its row shows; each takes the cell's arrays by name."""
    def assign(a: dict[str, Any]) -> Any:
        y = a["f"].copy()
        y[a["idx"]] = 0.5
        y[10:1000] = a["f"][:990]
        return y

    def add_at(a: dict[str, Any]) -> Any:
        out = np.zeros(1024, np.float32)
        np.add.at(out, a["small"], a["f"])
        return out

    return {
        "slice, step": lambda a: a["m"][::2, 1::3] * 1.0,
        "integer-array index": lambda a: a["f"][a["idx"]],
        "boolean mask": lambda a: a["f"][a["f"] > 0],
        "np.newaxis broadcast": lambda a: a["v"][:, np.newaxis] * a["v"][np.newaxis, :256],
        "item and slice assignment": assign,
        "int32 // and %": lambda a: (a["i"] // 7, a["i"] % 7),
        "int32 & | ^ << >>": lambda a: (a["i"] & 0xFF, a["i"] | 3, a["i"] ^ 5, a["i"] << 2, a["i"] >> 3),
        "bincount": lambda a: np.bincount(a["small"]),
        "sort": lambda a: np.sort(a["f"]),
        "argsort": lambda a: np.argsort(a["f"], kind="stable"),
        "partition (kth value)": lambda a: np.partition(a["f"], 1000)[1000],
        "argpartition (kth value)": lambda a: a["f"][np.argpartition(a["f"], 1000)[1000]],
        "concatenate / stack / split": lambda a: (np.concatenate([a["f"], a["f"]]), np.stack([a["f"], a["f"]]),
                                                  np.split(a["f"], 4)[1]),
        "diag / diagonal": lambda a: (np.diag(a["sq"]), a["sq"].diagonal(1)),
        "np.add.at": add_at,
        "unique": lambda a: np.unique(a["small"]),
        "einsum ij,jk->ik": lambda a: np.einsum("ij,jk->ik", a["sq"], a["sq"]),
        "sin cos tan": lambda a: (np.sin(a["f"]), np.cos(a["f"]), np.tan(a["f"])),
        "exp log sqrt": lambda a: (np.exp(a["f"]), np.log(np.abs(a["f"]) + 1), np.sqrt(np.abs(a["f"]))),
        "tile / repeat": lambda a: (np.tile(a["v"], 3), np.repeat(a["v"], 2)),
        "floor ceil round clip": lambda a: (np.floor(a["f"]), np.ceil(a["f"]), np.round(a["f"], 2),
                                            np.clip(a["f"], -1, 1)),
        "where": lambda a: np.where(a["f"] > 0, a["f"], 0.0),
        "argmax / argmin": lambda a: (a["f"].argmax(), a["f"].argmin()),
        "any / all": lambda a: ((a["f"] > 3).any(), (a["f"] > -10).all()),
        "cumsum / cumprod": lambda a: (np.cumsum(a["f"]), np.cumprod(a["f"][:64] * 0.01 + 1)),
        "std / var": lambda a: (a["f"].std(), a["f"].var(axis=0)),
        "median / percentile": lambda a: (np.median(a["f"]), np.percentile(a["f"], [5, 95])),
        "matmul": lambda a: a["sq"] @ a["sq"],
        "sum / mean (axis)": lambda a: (a["m"].sum(axis=1), a["m"].mean(axis=0)),
    }


def inputs(mib: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The cell's arrays: float32 and int32 vectors of ``mib`` MiB, a matrix of the same size, a square one."""
    n = mib * MI // 4
    side = int(np.sqrt(n)) // 4 * 4
    return {
        "f": rng.standard_normal(n).astype(np.float32),
        "i": rng.integers(-1 << 20, 1 << 20, n).astype(np.int32),
        "small": rng.integers(0, 1024, n).astype(np.int64),
        "idx": rng.integers(0, n, n // 4),
        "m": rng.standard_normal((n // 1024, 1024)).astype(np.float32),
        "v": rng.standard_normal(n // 256).astype(np.float32),
        "sq": rng.standard_normal((side // 2, side // 2)).astype(np.float32),
    }


def same(got: Any, want: Any) -> bool:
    """numpy's result: dtype and shape, exact integers and booleans, floats within float32 rounding."""
    if isinstance(want, (tuple, list)):
        return isinstance(got, type(want)) and len(got) == len(want) and all(map(same, got, want))
    got_a, want_a = np.asarray(got), np.asarray(want)
    if got_a.dtype != want_a.dtype or got_a.shape != want_a.shape:
        return False
    if want_a.dtype.kind in "biu":
        return bool(np.array_equal(got_a, want_a))
    scale = float(np.max(np.abs(want_a))) if want_a.size else 0.0
    return bool(np.allclose(got_a, want_a, rtol=1e-5, atol=1e-5 * scale, equal_nan=True))


def median_time(run: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(rt: GpuRuntime, mib: int, repeat: int) -> list[tuple[str, str, str, bool, float, float]]:
    """One row per operation: name, kernels that ran, what numpy computed, same as numpy, GPU s, numpy s."""
    host = inputs(mib, np.random.default_rng(0))
    rows = []
    for name, op in operations().items():
        cell = rt.to_device(dict(host))
        want = op(host)
        rt.take_stats()
        got = op(cell)
        stats = rt.take_stats()
        ok = same(got, want)
        kernels = ", ".join(f"{k} ×{n}" for k, n in sorted(stats["kernels"].items())) or "none"
        numpy_ops = ", ".join(sorted(stats["numpy"])) or "nothing"
        gpu_s = median_time(lambda: op(cell), repeat)
        numpy_s = median_time(lambda: op(host), repeat)
        rt.end_cell(cell)
        rows.append((name, kernels, numpy_ops, ok, gpu_s, numpy_s))
    return rows


def render(rows: list[tuple[str, str, str, bool, float, float]], mib: int, caps: dict[str, Any],
           load: tuple[float, float], repeat: int) -> str:
    lines = [f"| operation ({mib} MiB arrays) | GPU kernels that ran (dispatches) | computed with numpy | numpy's "
             "answer | GPU cell ms | numpy ms |", "| --- | --- | --- | --- | ---: | ---: |"]
    lines += [f"| {name} | {kernels} | {numpy_ops} | {'yes' if ok else '**no**'} | {gpu * 1e3:.1f} | "
              f"{local * 1e3:.1f} |" for name, kernels, numpy_ops, ok, gpu, local in rows]
    on_gpu = sum(1 for row in rows if row[1] != "none")
    return "\n".join([
        *gpu_lines("bench_gpu_coverage.py", caps, load),
        "",
        *lines,
        "",
        f"{on_gpu} of {len(rows)} operations ran at least one GPU kernel; {sum(r[3] for r in rows)} of {len(rows)} "
        "gave numpy's answer (dtype, shape, exact integers and booleans, floats within float32 rounding). "
        f"Times: median of {repeat} runs of each after the checked one, inputs already on the device.",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=4, help="array size in MiB (default 4)")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs of each (default 5)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave results.md as it is")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with GpuRuntime.create(mode="on") as rt:
        rows = measure(rt, args.mib, args.repeat)
        body = render(rows, args.mib, rt.capabilities(), (load_before, os.getloadavg()[0]), args.repeat)
    print(body)
    if not args.no_write:
        write_section(SECTION, body)


if __name__ == "__main__":
    main()
