"""The speed-up of a 3-way ``--split`` over one worker, on a CPU-bound numpy computation (issue 13).

One run on this machine, over 127.0.0.1 only: a hub (``remote-worker --name home``) and 2 workers that
joined it, all ``--gpu off``, every worker with OMP/OpenBLAS/MKL limited to 1 thread, so one worker uses
one core. The computation: each row of ``x`` (ROWS × 64) through a 64-wide tanh layer ``LAYERS`` times
(``y = tanh(y @ W)``): small matrix products, CPU-bound, little data moved.

- one worker: ``client.execute(CELL, {"x": x, "W": W}, worker="home")``;
- 3 workers: ``client.split(CELL, {"x": x, "W": W}, split="x", gather="y")``, pieces sized by speed.

Each is timed from the call to the result, the result checked against the one-worker run, the best of
``--repeat`` runs kept (after one warm-up each). Speed-up = one worker's seconds / the split's. The table
is printed and written into the "## Split speed-up on 3 workers (issue 13)" section of
``benchmarks/results.md``, with the machine's core count and load: the goal (≥ 2.5× with 3 workers)
needs at least 3 free cores.

Run it from the repository root (``pip install -e ".[bench]"``)::

    python benchmarks/bench_split.py                  # best of 3
    python benchmarks/bench_split.py --rows 3000 --repeat 1 --no-write
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
from bench_fleet import remote_magic_fleet
from report import RESULTS_PATH, write_section, zmq_peer_lines

log = logging.getLogger("bench_split")

SECTION_TITLE = "## Split speed-up on 3 workers (issue 13)"
WIDTH = 64
LAYERS = 100
ONE_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
"""Set for the workers (they inherit this process's environment): one worker, one core."""

CELL = f"""
y = x
for _ in range({LAYERS}):
    y = np.tanh(y @ W)
"""


def timed(label: str, repeat: int, run: Callable[[], Any]) -> tuple[list[float], Any]:
    """``repeat`` runs of ``run`` (after a warm-up): each one's seconds, and the last result."""
    run()
    times, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - started)
    log.info("%s: best %.3f s (runs: %s s)", label, min(times), ", ".join(f"{t:.3f}" for t in times))
    return times, result


def bench(rows: int, repeat: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, WIDTH))
    W = rng.normal(size=(WIDTH, WIDTH)) / np.sqrt(WIDTH)
    inputs = {"x": x, "W": W, "np": np}
    with tempfile.TemporaryDirectory(prefix="rm-bench-split-") as root:
        for client in remote_magic_fleet(Path(root)):
            one_s, one = timed("one worker", repeat,
                               lambda: client.execute(CELL, inputs, ["y"], worker="home").values["y"])
            split_s, split = timed("3-way split", repeat,
                                   lambda: client.split(CELL, inputs, ["y"], split="x", gather="y"))
            if not np.allclose(split.gathered["y"], one, rtol=1e-10, atol=1e-12):
                raise RuntimeError("the split's result differs from the one-worker run")
            speeds = {str(w["name"]): w.get("speed") for w in client.workers()}
            return {"one": one_s, "split": split_s, "pieces": {w: len(r) for w, r in split.pieces.items()},
                    "speeds": speeds}
    raise RuntimeError("the fleet did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=12000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.environ.update(ONE_THREAD)
    load = os.getloadavg()
    found = bench(args.rows, args.repeat)
    one_s, split_s = min(found["one"]), min(found["split"])
    speedup = one_s / split_s
    runs = {key: ", ".join(f"{t:.2f}" for t in found[key]) for key in ("one", "split")}
    cores = os.cpu_count() or 1
    pieces = ", ".join(f"{w} {n} rows (speed {found['speeds'].get(w)})" for w, n in found["pieces"].items())
    body = "\n".join([
        *zmq_peer_lines(load, f"numpy {np.__version__}"),
        f"- {args.rows} rows × {WIDTH} through a {WIDTH}-wide tanh layer {LAYERS} times (`y = np.tanh(y @ W)`), "
        "each worker limited to 1 BLAS/OpenMP thread; a hub and 2 joined workers, `--gpu off`; best of "
        f"{args.repeat} runs after a warm-up, the split's result checked against the one-worker run.",
        f"- Pieces (by measured speed): {pieces}.",
        "",
        "| run | call | best seconds | every run (s) | speed-up (best) |",
        "| --- | --- | ---: | --- | ---: |",
        f"| one worker | `client.execute(cell, inputs, worker=\"home\")` | {one_s:.3f} | {runs['one']} | 1.00× |",
        f"| 3 workers | `client.split(cell, inputs, split=\"x\", gather=\"y\")` | {split_s:.3f} | {runs['split']} | "
        f"{speedup:.2f}× |",
        "",
        f"This machine has {cores} core{'s' if cores != 1 else ''}"
        + (f", fewer than the 3 workers: they share {cores}, so the speed-up is bounded by {cores}× less what "
           "sending the pieces and the other processes on the machine take, and the goal (≥ 2.5× on 3 workers) "
           "can't be measured here; it needs 3 or more free cores." if cores < 3 else
           "; the goal is ≥ 2.5× on 3 workers."),
    ])
    print(body)
    if not args.no_write:
        write_section(SECTION_TITLE, body, RESULTS_PATH)
        print(f"\nwritten to {RESULTS_PATH}")


if __name__ == "__main__":
    main()
