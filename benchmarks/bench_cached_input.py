"""What a cached input costs (issue 21, "No needless copies"): a cell that reads a 64 MB array the hub
holds already (it crosses the link as its digest), beside one local copy of that array and its local sum.

    python benchmarks/bench_cached_input.py                        # 64 MB, 30 cells of each kind
    python benchmarks/bench_cached_input.py --size-mb 16 --repeats 10 --no-write   # quick check
    python benchmarks/bench_cached_input.py --save /tmp/before.json --no-write     # on the code before a change
    python benchmarks/bench_cached_input.py --before /tmp/before.json              # after it: both in the table

The cell is ``s = float(A.sum())``, with ``A`` sent again each time: after the first call the hub holds
its frame, so only its digest travels, and the executor holds it mapped from the cell before
(worker/held_frames.py), so it isn't handed over again: the cost left is the notebook's digest of it,
unpickling it, the sum, the check that the cell didn't write its pages, and the result back. It runs
twice over: as a notebook cell runs it (the worker finds the outputs, fingerprinting ``A`` before and
after the cell to see whether it changed in place) and with ``outputs=["s"]`` (nothing tracked). The
goal: at most 2 local copies of the array.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
from bench_roundtrip import Sample, make_array, ms, remote_worker, time_calls
from report import code_version, write_section, zmq_peer_lines

log = logging.getLogger("bench_cached_input")

SECTION_TITLE = "## A cached input (issue 21)"
GOAL_COPIES = 2.0
CELL = "s = float(A.sum())"


def bench_cached_cell(token: str, array: np.ndarray, repeats: int) -> tuple[Sample, Sample]:
    """The cell with the array cached at the hub: tracked (outputs found by the worker), and untracked."""
    import remote_magic

    expected = float(array.sum())
    with remote_magic.connect(token) as client:
        def cell(outputs: list[str] | None) -> None:
            values = client.run(CELL, {"A": array}, outputs)
            if values != {"s": expected}:  # bit for bit the notebook's sum
                raise RuntimeError(f"wrong result: {values!r}, not {expected!r}")

        tracked, untracked = Sample([], array.nbytes), Sample([], array.nbytes)
        for _ in range(repeats):  # alternating, so drift in the machine's speed hits both alike
            tracked.seconds += time_calls(lambda: cell(None), 0 if tracked.seconds else 2, 1)
            untracked.seconds += time_calls(lambda: cell(["s"]), 0 if untracked.seconds else 2, 1)
    return tracked, untracked


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=float, default=64.0, help="the array's size (default 64)")
    parser.add_argument("--repeats", type=int, default=30, help="timed cells of each kind (default 30)")
    parser.add_argument("--no-write", action="store_true", help="print the table only; leave results.md alone")
    parser.add_argument("--save", type=Path, help="also write the medians to this JSON file")
    parser.add_argument("--before", type=Path, help="medians --save wrote on other code: shown beside these")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    load_before = os.getloadavg()
    array = make_array(args.size_mb)
    local_copy = Sample(time_calls(array.copy, 3, args.repeats * 2))
    local_sum = Sample(time_calls(lambda: float(array.sum()), 3, args.repeats * 2))
    with remote_worker() as token:
        tracked, untracked = bench_cached_cell(token, array, args.repeats)
    medians = {"tracked": tracked.median, "untracked": untracked.median, "copy": local_copy.median,
               "sum": local_sum.median, "code": code_version()}
    if args.save:
        args.save.write_text(json.dumps(medians))
    before = json.loads(args.before.read_text()) if args.before else None
    size = f"{array.nbytes / 1e6:.0f} MB"

    def copies(seconds: float, copy: float) -> str:
        return f"{seconds / copy:.1f}"

    def row(what: str, key: str, goal: bool) -> str:
        now = f"{ms(medians[key])} ({copies(medians[key], local_copy.median)} copies)" if goal else ms(medians[key])
        cells = [what]
        if before is not None:
            cells.append(f"{ms(before[key])} ({copies(before[key], before['copy'])} copies)" if goal
                         else ms(before[key]))
        cells.append(now)
        met = "yes" if medians[key] <= GOAL_COPIES * local_copy.median else "no"
        cells += [f"≤ {GOAL_COPIES:g} local copies", met] if goal else ["—", "—"]
        return "| " + " | ".join(cells) + " |"

    head = ["what (median)", *(["before"] if before is not None else []), "now", "goal", "met?"]
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 3) + " --- | --- |",
             row(f"`{CELL}` with a cached {size} `A`, as a notebook cell (tracked)", "tracked", True),
             row("the same, `outputs=['s']` (untracked)", "untracked", True),
             row(f"local `A.copy()` of the {size} array (the unit)", "copy", False),
             row("local `float(A.sum())`", "sum", False)]
    table = "\n".join(lines)
    print(table)
    if not args.no_write:
        method = (f"A {size} float64 array; {args.repeats} timed cells of each kind after 2 warm-ups (the first "
                  "sends the array; after it the hub holds it and only its digest travels), alternating, medians; "
                  f"the local copy and sum {args.repeats * 2} times each in the same run, beside them. Over TCP "
                  "loopback to a private `remote-worker --gpu off` in an empty folder. \"Copies\": the cell's "
                  "median over the local copy's median (of the same run). What a cached input still costs "
                  "(docs/protocol.md, \"Copies\"): the notebook digests the array to name it (a read of it); "
                  "the cell's sum, over the pages the executor kept mapped from the cell before (no copy, no "
                  "page faults); a read of those pages' entries in /proc/self/pagemap after the cell, to see "
                  "that it wrote none (a tracked cell also reads them before and after it, in place of hashing "
                  "`A` to find whether it changed in place); and the round trip."
                  + (f" Before: {before['code']}, measured on the same machine just before the change."
                     if before is not None else ""))
        command = " ".join(["python benchmarks/bench_cached_input.py", *(argv if argv is not None else sys.argv[1:])])
        write_section(SECTION_TITLE, "\n".join([f"Measured by `{command}`.", "", *zmq_peer_lines(
            load_before, f"numpy {np.__version__}"), "", table, "", method]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
