"""What change tracking costs (issue 9, "Performance"): fingerprinting a 100 MB array that a cell
reads but doesn't change, against sending that array on loopback; and the empty cell's round trip.

    python benchmarks/bench_tracking.py               # 100 MB × 10, 1000 empty cells; about a minute
    python benchmarks/bench_tracking.py --size-mb 10 --iterations 200 --no-write   # quick check
    python benchmarks/bench_tracking.py --baseline /tmp/old/.venv/bin/python /tmp/old   # the empty cell
        # against another checkout (installed in that interpreter), alternating, in the same run

A cell that reads ``a`` and doesn't assign it is run twice over: with ``outputs`` left to the worker
(so it fingerprints every input before and after the cell, to find what changed in place), and with
``outputs=["n"]`` (nothing tracked). The difference is what tracking costs; the untracked call is
what sending the array costs (there, plus a few bytes back).
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np
from bench_roundtrip import Sample, bench_offload_cell, echo_peer, make_array, ms, remote_worker, time_calls
from report import write_section, zmq_peer_lines

from remote_magic.worker.tracking import fingerprint

log = logging.getLogger("bench_tracking")

SECTION_TITLE = "## Change tracking (issue 9)"
EMPTY_CELL_GOAL_S = 1e-3
TRACKING_GOAL = 0.10


def bench_reading_cell(token: str, array: np.ndarray, repeats: int) -> tuple[Sample, Sample]:
    """A cell that reads the array and changes nothing: tracked (outputs found by the worker), untracked."""
    import remote_magic

    with remote_magic.connect(token) as client:
        def cell(outputs: list[str] | None) -> None:
            values = client.run("n = a.shape[0]", {"a": array}, outputs)
            if values != {"n": array.shape[0]}:
                raise RuntimeError(f"wrong outputs: {sorted(values)}")

        tracked, untracked = Sample([], array.nbytes), Sample([], array.nbytes)
        for _ in range(repeats):  # alternating, so drift in the machine's speed hits both alike
            tracked.seconds += time_calls(lambda: cell(None), 0 if tracked.seconds else 1, 1)
            untracked.seconds += time_calls(lambda: cell(["n"]), 0 if untracked.seconds else 1, 1)
    return tracked, untracked


# Run by each interpreter, in its own checkout: the median empty cell, in seconds, on stdout.
_EMPTY_CELL_SCRIPT = """
import os, statistics, sys
sys.path.insert(0, os.path.join(sys.argv[1], "benchmarks"))
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
from bench_roundtrip import bench_offload_cell, remote_worker
with remote_worker() as token:
    offload, _ = bench_offload_cell(token, 30, int(sys.argv[2]))
print(statistics.median(offload.seconds))
"""


def bench_against(baseline: tuple[str, str], iterations: int, rounds: int = 3) -> tuple[list[float], list[float]]:
    """The empty cell's median in this checkout and in ``baseline`` (its Python, its checkout), each run in
    a fresh process with its own worker, alternating ``rounds`` times."""
    here = (sys.executable, str(Path(__file__).resolve().parent.parent))
    medians: dict[tuple[str, str], list[float]] = {here: [], baseline: []}
    for _ in range(rounds):
        for python, repo in (here, baseline):
            done = subprocess.run([python, "-c", _EMPTY_CELL_SCRIPT, repo, str(iterations)], capture_output=True,
                                  text=True, check=True, cwd=tempfile.gettempdir())  # not this checkout's package
            medians[(python, repo)].append(float(done.stdout.split()[-1]))
    return medians[here], medians[baseline]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=float, default=100.0, help="the array's size (default 100)")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls with the array (default 10)")
    parser.add_argument("--iterations", type=int, default=1000, help="timed empty cells (default 1000)")
    parser.add_argument("--no-write", action="store_true", help="print the table only; leave results.md alone")
    parser.add_argument("--baseline", nargs=2, metavar=("PYTHON", "CHECKOUT"),
                        help="also time the empty cell in another checkout, installed in PYTHON, alternating")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    load_before = os.getloadavg()
    array = make_array(args.size_mb)
    fingerprint_s = Sample(time_calls(lambda: fingerprint(array), 1, args.repeats))
    with remote_worker() as token:
        tracked, untracked = bench_reading_cell(token, array, args.repeats)
        empty_cell, local_cell = bench_offload_cell(token, 50, args.iterations)
    with echo_peer(curve=False) as sock:
        def tiny() -> None:
            sock.send(b"x")
            sock.recv()
        raw = Sample(time_calls(tiny, 50, args.iterations))
    cost = tracked.median - untracked.median
    share = cost / untracked.median
    size = f"{array.nbytes / 1e6:.0f} MB"
    rows = [
        ("| what | median | goal | met? |", "| --- | ---: | --- | --- |"),
        (f"| cell reading a {size} array, tracked (fingerprints before and after) | {ms(tracked.median)} | — | — |",
         f"| the same cell, untracked (`outputs=['n']`): sending the array | {ms(untracked.median)} | — | — |",
         f"| tracking's cost: the difference | {ms(cost)} ({share:.1%} of sending) | ≤ {TRACKING_GOAL:.0%} of sending "
         f"| {'yes' if share <= TRACKING_GOAL else 'no'} |",
         f"| one fingerprint of the array (xxh3-128 of its pickle, here) | {ms(fingerprint_s.median)} | — | — |",
         f"| empty `%%offload` cell (`run_cell`) | {ms(empty_cell.median)} | ≤ {ms(EMPTY_CELL_GOAL_S)} "
         f"| {'yes' if empty_cell.median <= EMPTY_CELL_GOAL_S else 'no'} |",
         f"| local empty `run_cell` (context) | {ms(local_cell.median)} | — | — |",
         f"| raw pyzmq DEALER/ROUTER, tiny message (context: this machine's speed in this run) "
         f"| {ms(raw.median)} | — | — |"),
    ]
    if args.baseline:
        ours, theirs = bench_against((args.baseline[0], args.baseline[1]), args.iterations // 2)
        commit = subprocess.run(["git", "-C", args.baseline[1], "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip() or args.baseline[1]
        rows.append((f"| empty cell, this checkout, in turn with the one below (medians of {len(ours)} runs) "
                     f"| {', '.join(ms(s) for s in ours)} | — | — |",
                     f"| empty cell, commit {commit} | {', '.join(ms(s) for s in theirs)} | — | — |"))
    table = "\n".join(line for group in rows for line in group)
    print(table)
    if not args.no_write:
        method = (f"A {size} float64 array, 1 warm-up then {args.repeats} timed calls of each kind, alternating, "
                  "medians; "
                  f"{args.iterations} empty cells after 50 warm-ups through a real IPython shell. Over TCP "
                  "loopback to a private `remote-worker --gpu off`, working in an empty folder (each cell looks "
                  "through its working directory once on its round trip, for the files it wrote: about 25 ms "
                  "more per cell with 5,000 files there, docs/semantics.md). Goals from issue 9, \"Performance\". "
                  "The raw pyzmq row says how fast this machine ran that day: set the empty cell beside it, and "
                  "beside the round-trip section's figures only as far as their raw pyzmq rows agree.")
        command = " ".join(["python benchmarks/bench_tracking.py", *(argv if argv is not None else sys.argv[1:])])
        write_section(SECTION_TITLE, "\n".join([f"Measured by `{command}`.", "", *zmq_peer_lines(
            load_before, f"numpy {np.__version__}"), "", table, "", method]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
