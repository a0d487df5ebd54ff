"""Many tiny tasks over 3 worker processes (issue 13): remote-magic's ``Client.map`` beside ipyparallel and Dask.

Everything runs in one run on this machine, over 127.0.0.1 only, each peer alone with 3 worker processes:

- remote-magic: a hub (``remote-worker --name home``) and 2 workers that joined it, all ``--gpu off``;
  ``client.map(square, range(N))`` with its default chunks (about 4 per worker), with ``chunksize=1``
  (one job per task), and, for reference, N ``client.submit`` calls;
- ipyparallel: 3 engines, a load-balanced view's ``map_sync(square, range(N))`` (its default: one
  task per item) and the same with ``chunksize`` as remote-magic's default;
- Dask: a LocalCluster of 3 worker processes with 1 thread each, ``client.gather(client.map(square,
  range(N), pure=False))``; and, on the same cluster, remote-magic's API through its Dask engine,
  ``remote_magic.connect("dask://...").map(square, range(N))`` (default chunks, and ``chunksize=1``).

Each is timed from the call to the last result, every result checked, the best of ``--repeat`` runs
kept (after one warm-up call). Tasks/s = N / seconds. The table is printed and written into the
"## Many tiny tasks on 3 workers (issue 13)" section of ``benchmarks/results.md`` with the machine line.

Run it from the repository root (``pip install -e ".[bench]" "dask[distributed]"``)::

    python benchmarks/bench_fleet.py                    # 1000 tasks, best of 3
    python benchmarks/bench_fleet.py --tasks 200 --repeat 1 --no-write
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from bench_faults import remote_worker_executable, spawn_worker, start_hub, wait_until
from report import RESULTS_PATH, write_section, zmq_peer_lines

log = logging.getLogger("bench_fleet")

SECTION_TITLE = "## Many tiny tasks on 3 workers (issue 13)"
WORKERS = 3
START_TIMEOUT_S = 120.0
TOKEN_COMMAND_TIMEOUT_S = 30.0


def square(i: int) -> int:
    return i * i


@dataclass
class Row:
    peer: str
    call: str
    seconds: float
    tasks: int

    @property
    def rate(self) -> float:
        return self.tasks / self.seconds


def best(label: tuple[str, str], tasks: int, repeat: int, run: Callable[[], list[Any]]) -> Row:
    """Time ``run`` ``repeat`` times, checking its results each time; the fastest run."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        results = run()
        times.append(time.perf_counter() - started)
        if results != [square(i) for i in range(tasks)]:
            raise RuntimeError(f"{label[0]}: {label[1]} came back wrong")
    row = Row(*label, min(times), tasks)
    log.info("%s %s: %.0f tasks/s (runs: %s s)", *label, row.rate, ", ".join(f"{t:.3f}" for t in times))
    return row


def default_chunksize(tasks: int) -> int:
    return max(1, math.ceil(tasks / (4 * WORKERS)))  # remote-magic's default (fleet_jobs.CHUNKS_PER_WORKER)


def remote_magic_fleet(root: Path) -> Iterator[Any]:
    """A hub with worker 'home' and two joined workers; yields a connected client."""
    import remote_magic
    from remote_magic.wire.tokens import Token

    hub, token = start_hub(root / "hub", "--name", "home")
    joined = []
    try:
        worker_token = subprocess.run([remote_worker_executable(), "token", "--worker"], capture_output=True,
                                      text=True, env={**os.environ, "REMOTE_MAGIC_HOME": str(hub.home)},
                                      timeout=TOKEN_COMMAND_TIMEOUT_S, check=True).stdout.strip()
        worker_token = Token.decode(worker_token).with_address(Token.decode(token).address).encode()
        for n in range(1, WORKERS):
            joined.append(spawn_worker(root / f"w{n}", ["--join", "--gpu", "off", "--name", f"w{n}"],
                                       env={"REMOTE_MAGIC_JOIN_TOKEN": worker_token}))
        with remote_magic.connect(token) as client:
            wait_until(lambda: len(client.workers()) == WORKERS, START_TIMEOUT_S, "the workers did not join")
            yield client
    finally:
        for worker in [*joined, hub]:
            worker.stop()


def bench_remote_magic(tasks: int, repeat: int) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="rm-bench-fleet-") as root:
        for client in remote_magic_fleet(Path(root)):
            client.map(square, range(WORKERS * 4), chunksize=1)  # warm-up: every worker's session started
            return [
                best(("remote-magic", "client.map(square, items)"), tasks, repeat,
                     lambda: client.map(square, range(tasks))),
                best(("remote-magic", "client.map(square, items, chunksize=1)"), tasks, repeat,
                     lambda: client.map(square, range(tasks), chunksize=1)),
                best(("remote-magic", "[client.submit(square, i) ...] then .result()"), tasks, repeat,
                     lambda: [f.result() for f in [client.submit(square, i) for i in range(tasks)]]),
            ]
    raise RuntimeError("remote-magic: the fleet did not start")


def bench_ipyparallel(tasks: int, repeat: int) -> list[Row]:
    import ipyparallel

    cluster = ipyparallel.Cluster(n=WORKERS, log_level=logging.WARNING)
    rc = cluster.start_and_connect_sync()
    try:
        rc.wait_for_engines(WORKERS, timeout=START_TIMEOUT_S)
        view = rc.load_balanced_view()
        view.map_sync(square, range(WORKERS * 4))  # warm-up
        chunk = default_chunksize(tasks)
        return [
            best(("ipyparallel", "load_balanced_view().map_sync(square, items)"), tasks, repeat,
                 lambda: list(view.map_sync(square, range(tasks)))),
            best(("ipyparallel", f"... map_sync with chunksize={chunk}"), tasks, repeat,
                 lambda: list(view.map(square, range(tasks), chunksize=chunk, block=True))),
        ]
    finally:
        rc.close()
        cluster.stop_cluster_sync()


def bench_dask(tasks: int, repeat: int) -> list[Row]:
    from dask.distributed import Client, LocalCluster

    for name in ("distributed", "tornado", "bokeh"):
        logging.getLogger(name).setLevel(logging.ERROR)
    with LocalCluster(n_workers=WORKERS, threads_per_worker=1, processes=True,  # type: ignore[no-untyped-call]
                      dashboard_address=None, silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client:  # type: ignore[no-untyped-call]
        client.wait_for_workers(WORKERS)
        client.gather(client.map(square, range(WORKERS * 4), pure=False))  # warm-up
        rows = [best(("Dask", "client.gather(client.map(square, items, pure=False))"), tasks, repeat,
                     lambda: client.gather(client.map(square, range(tasks), pure=False)))]
        return rows + bench_dask_engine(cluster.scheduler_address, tasks, repeat)


def bench_dask_engine(scheduler: str, tasks: int, repeat: int) -> list[Row]:
    """remote-magic's API on the same Dask cluster: ``connect("dask://...").map``, each chunk a Dask task."""
    import remote_magic

    with remote_magic.connect("dask://" + scheduler.split("://", 1)[1]) as client:
        client.map(square, range(WORKERS * 4), chunksize=1)  # warm-up: every Dask worker's runner made
        return [best(("remote-magic on Dask", 'connect("dask://...").map(square, items)'), tasks, repeat,
                     lambda: client.map(square, range(tasks))),
                best(("remote-magic on Dask", 'connect("dask://...").map(square, items, chunksize=1)'), tasks,
                     repeat, lambda: client.map(square, range(tasks), chunksize=1))]


def table(rows: list[Row], missing: list[str]) -> str:
    ipp = next((r.rate for r in rows if r.peer == "ipyparallel"), None)
    lines = ["| peer | call | seconds | tasks/s | vs ipyparallel's map |", "| --- | --- | ---: | ---: | ---: |"]
    for r in rows:
        ratio = f"{r.rate / ipp:.2f}×" if ipp else "—"
        lines.append(f"| {r.peer} | `{r.call}` | {r.seconds:.3f} | {r.rate:,.0f} | {ratio} |")
    lines += [f"| {name} | not installed | — | — | — |" for name in missing]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-ipyparallel", action="store_true")
    parser.add_argument("--no-dask", action="store_true")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    load = os.getloadavg()
    rows = bench_remote_magic(args.tasks, args.repeat)
    missing = []
    for name, skip, run, module in (("ipyparallel", args.no_ipyparallel, bench_ipyparallel, "ipyparallel"),
                                    ("Dask", args.no_dask, bench_dask, "distributed")):
        if skip:
            continue
        try:
            __import__(module)
        except ImportError:
            missing.append(name)
            continue
        rows += run(args.tasks, args.repeat)
    body = "\n".join([
        *zmq_peer_lines(load),
        f"- {args.tasks} calls of `square(i)` (`i * i`), 3 worker processes per peer, 1 thread each; best of "
        f"{args.repeat} runs after a warm-up, every result checked. remote-magic: a hub and 2 joined workers, "
        "`--gpu off`; ipyparallel: 3 engines; Dask: LocalCluster(n_workers=3, threads_per_worker=1), also "
        "serving remote-magic on Dask (`remote_magic.connect(\"dask://...\")`: each chunk one Dask task, all "
        "submitted in one graph, run through the executor's job machinery on the Dask worker: inputs and "
        "result packed as for a remote-worker, output captured and streamed as Dask events).",
        "",
        table(rows, missing),
        "",
        "remote-magic on Dask pays Dask's scheduling for each task and, on top of it, the job machinery a cell "
        "gets (packing, output capture, the result read as a remote-worker's): with `chunksize=1` once per item, "
        "with its default chunks once per chunk (12 here).",
    ])
    print(body)
    if not args.no_write:
        write_section(SECTION_TITLE, body, RESULTS_PATH)
        print(f"\nwritten to {RESULTS_PATH}")


if __name__ == "__main__":
    main()
