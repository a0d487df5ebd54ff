"""Per-cell overhead (issue 21, item 4): the empty job's round trip with the worker started in an empty
folder and in a folder of 100,000 files, beside raw pyzmq DEALER/ROUTER with CurveZMQ in the same run.

    python benchmarks/bench_cell_overhead.py                  # 1000 calls per folder; about a minute
    python benchmarks/bench_cell_overhead.py --iterations 200 --files 20000 --no-write   # quick check
    git archive HEAD | tar -x -C /tmp/before                  # an older checkout, not installed
    python benchmarks/bench_cell_overhead.py --baseline /tmp/before   # that code too, in the same run

A worker looks at its working directory for the files each cell writes (worker/workdir.py). The
folder of files is made in a temporary folder: ``--files`` files of 100 bytes, a thousand to a
subfolder. Each worker (one per folder, and per checkout with ``--baseline``) is started in its
folder, and answers ``Client.run("pass")`` ``--warmup`` times untimed (the first call is timed
alone: it starts the executor, and the folder's first look), then ``--iterations`` times timed, one
call to each folder's worker in turn.
``--baseline`` runs the same workers from another checkout's sources (put first on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from bench_roundtrip import (
    Row,
    Sample,
    echo_peer,
    latency_row,
    markdown_table,
    ms,
    remote_worker,
    time_calls,
)
from report import write_section, zmq_peer_lines

log = logging.getLogger("bench_cell_overhead")

SECTION_TITLE = "## Per-cell overhead and the worker's folder (issue 21)"
GOAL_RATIO = 1.3
"""The empty job in the folder of files, at most this many times its time in an empty folder."""
FILES_PER_FOLDER = 1000
PACKAGE_FOLDERS = ("worker", "shaders", "kernel_provider")  # installed inside remote_magic (pyproject.toml)


def make_files(root: Path, count: int) -> None:
    """``count`` files of 100 bytes under ``root``, FILES_PER_FOLDER to a subfolder."""
    payload = b"x" * 100
    for i in range(count):
        folder = root / f"d{i // FILES_PER_FOLDER:04}"
        if i % FILES_PER_FOLDER == 0:
            folder.mkdir()
        (folder / f"f{i:06}.dat").write_bytes(payload)


def importable(checkout: Path, into: Path) -> Path:
    """A folder that, first on PYTHONPATH, imports ``remote_magic`` from ``checkout`` as it installs
    (worker/, shaders/ and kernel_provider/ inside it), as scripts/check.sh lays it out for mypy."""
    package = into / "remote_magic"
    package.mkdir(parents=True)
    for entry in (checkout / "remote_magic").iterdir():
        (package / entry.name).symlink_to(entry)
    for folder in PACKAGE_FOLDERS:
        (package / folder).symlink_to(checkout / folder)
    return into


def worker_in(folder: Path, pythonpath: Path | None) -> "contextlib.AbstractContextManager[str]":
    """A ``remote-worker --gpu off`` on 127.0.0.1 started in ``folder`` (its keys elsewhere), running the
    code under ``pythonpath`` first when given (a baseline checkout); its token."""
    env = None if pythonpath is None else {
        "PYTHONPATH": os.pathsep.join([str(pythonpath), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return remote_worker(cwd=folder, env=env,
                         command=[sys.executable, "-c", "from remote_magic.worker.cli import main; main()"])


def bench_empty_job(folders: Sequence[Path], pythonpath: Path | None, warmup: int,
                    iterations: int) -> list[tuple[float, Sample]]:
    """For a worker started in each folder (all running at once): its first ``Client.run("pass")`` (seconds),
    and the timed ones after ``warmup`` more, one call on each worker in turn (so drift in the machine's
    speed hits all alike)."""
    import remote_magic

    with contextlib.ExitStack() as stack:
        clients = [stack.enter_context(remote_magic.connect(stack.enter_context(worker_in(folder, pythonpath))))
                   for folder in folders]
        firsts = [time_calls(lambda: client.run("pass"), 0, 1)[0] for client in clients]
        for client in clients:
            time_calls(lambda: client.run("pass"), warmup, 0)
        samples: list[list[float]] = [[] for _ in clients]
        for _ in range(iterations):
            for client, seconds in zip(clients, samples):
                seconds += time_calls(lambda: client.run("pass"), 0, 1)
        return [(first, Sample(seconds)) for first, seconds in zip(firsts, samples)]


def bench_raw_curve(warmup: int, iterations: int) -> Sample:
    with echo_peer(curve=True) as sock:
        def tiny() -> None:
            sock.send(b"x")
            sock.recv()
        return Sample(time_calls(tiny, warmup, iterations))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=100_000, help="files in the busy folder (default 100000)")
    parser.add_argument("--iterations", type=int, default=1000, help="timed calls per worker (default 1000)")
    parser.add_argument("--warmup", type=int, default=50, help="untimed calls before them (default 50)")
    parser.add_argument("--baseline", type=Path, metavar="CHECKOUT",
                        help="also time another checkout's worker (its sources, e.g. from git archive)")
    parser.add_argument("--no-write", action="store_true", help="print the table only; leave results.md alone")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="rm-bench-folders-") as scratch:
        empty, busy = Path(scratch) / "empty", Path(scratch) / "busy"
        empty.mkdir()
        busy.mkdir()
        started = time.perf_counter()
        make_files(busy, args.files)
        log.info("made %d files in %.1f s", args.files, time.perf_counter() - started)
        codes: list[tuple[str, Path | None]] = [("this checkout", None)]
        if args.baseline is not None:
            codes.append((f"baseline ({args.baseline})", importable(args.baseline.resolve(), Path(scratch) / "old")))
        rows: list[Row] = []
        ratios: list[str] = []
        for name, pythonpath in codes:
            [(first_empty, in_empty), (first_busy, in_busy)] = bench_empty_job(
                [empty, busy], pythonpath, args.warmup, args.iterations)
            ratio = in_busy.median / in_empty.median
            rows += [latency_row(f"{name}: `Client.run(\"pass\")`, worker in an empty folder", in_empty),
                     Row(f"{name}: the same, worker in a folder of {args.files:,} files", ms(in_busy.median),
                         f"p90 {ms(in_busy.p90)}", f"≤ {GOAL_RATIO:g}× the empty folder",
                         f"{'yes' if ratio <= GOAL_RATIO else 'no'} ({ratio:.2f}×)"),
                     Row(f"{name}: first call (starts the executor; the folder's first look), empty folder / "
                         f"{args.files:,} files", f"{ms(first_empty)} / {ms(first_busy)}", "—")]
            ratios.append(f"{name} {ratio:.2f}×")
            log.info("%s: %s empty, %s with files", name, ms(in_empty.median), ms(in_busy.median))
        raw = bench_raw_curve(args.warmup, args.iterations)
        rows.append(latency_row("raw pyzmq DEALER/ROUTER with CurveZMQ, tiny message (this machine's speed in "
                                "this run)", raw))
    table = markdown_table(rows)
    print(table)
    if not args.no_write:
        method = (f"Over TCP loopback to a private `remote-worker --gpu off` (no `--max-memory`), started in each "
                  f"folder, both running: {args.warmup} untimed calls, then {args.iterations} timed, one to each "
                  "worker in turn, median and p90. The folder of files: "
                  f"{args.files:,} files of 100 bytes, {FILES_PER_FOLDER:,} to a subfolder. The empty "
                  "job still carries the worker's look for the files the cell wrote: before issue 21 a scan of up "
                  "to 20,000 entries on each cell's round trip; since, on Linux, the inotify events queued by then, "
                  "read once after the cell (the folder is scanned once, when the first cell starts there). "
                  "Goal from issue 21: "
                  f"the folder of files within {GOAL_RATIO:g}× of the empty folder ({', '.join(ratios)}).")
        command = " ".join(["python benchmarks/bench_cell_overhead.py", *(argv if argv is not None else sys.argv[1:])])
        write_section(SECTION_TITLE, "\n".join([f"Measured by `{command}`.", "", *zmq_peer_lines(load_before),
                                                "", table, "", method]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
