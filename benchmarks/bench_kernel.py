"""A whole kernel on a worker (issue 12): start time, an ``execute_request`` round trip for ``pass``, and
interrupt latency, through the remote-magic provisioner and for a local ipykernel, in the same run.

    python benchmarks/bench_kernel.py                       # 5 starts, 300 round trips, 10 interrupts
    python benchmarks/bench_kernel.py --starts 2 --iterations 50 --interrupts 3 --no-write   # quick check

Both kernels are started by a real ``jupyter_client.KernelManager``: the local one from the ``python3``
kernelspec of this environment, the remote one from a kernelspec ``remote-worker kernelspec install``
writes into a temporary Jupyter data folder, against a private ``remote-worker --listen 127.0.0.1:0``.

- start: ``start_kernel()`` until ``wait_for_ready()`` returns (a kernel_info round trip answered);
- round trip: ``execute_interactive("pass")``, from the execute_request to its execute_reply and the
  kernel's idle status on iopub (what a front end waits for);
- interrupt: a ``while True: pass`` cell is running (its execute_input seen on iopub), then from
  ``interrupt_kernel()`` (SIGINT, the kernelspecs' interrupt mode) to its execute_reply with
  KeyboardInterrupt.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
import time
from queue import Empty
from typing import Any, Sequence

import jupyter_client
from bench_roundtrip import Sample, ms, remote_worker, time_calls
from jupyter_client import BlockingKernelClient, KernelManager
from report import write_section, zmq_peer_lines

log = logging.getLogger("bench_kernel")

SECTION_TITLE = "## A whole kernel on a worker (issue 12)"
REMOTE_KERNEL = "remote-magic-bench"
TIMEOUT_S = 60


def start(name: str) -> tuple[KernelManager, BlockingKernelClient, float]:
    began = time.perf_counter()
    km = KernelManager(kernel_name=name)
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=TIMEOUT_S)
    return km, kc, time.perf_counter() - began


def stop(km: KernelManager, kc: BlockingKernelClient) -> None:
    kc.stop_channels()
    km.shutdown_kernel()


def round_trip(kc: BlockingKernelClient) -> None:
    reply = kc.execute_interactive("pass", timeout=TIMEOUT_S, output_hook=lambda msg: None)
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"pass failed: {reply['content']}")


def interrupt_once(km: KernelManager, kc: BlockingKernelClient) -> float:
    msg_id = kc.execute("while True: pass")
    deadline = time.monotonic() + TIMEOUT_S
    while True:  # the loop runs once its execute_input is out
        if time.monotonic() > deadline:
            raise RuntimeError("the busy loop never started")
        try:
            msg = kc.get_iopub_msg(timeout=1)
        except Empty:
            continue
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "execute_input":
            break
    time.sleep(0.2)  # let the loop run: interrupting a cell that hasn't begun is a different case
    pressed = time.perf_counter()
    km.interrupt_kernel()
    reply = kc.get_shell_msg(timeout=TIMEOUT_S)
    took = time.perf_counter() - pressed
    if reply["parent_header"].get("msg_id") != msg_id or reply["content"].get("ename") != "KeyboardInterrupt":
        raise RuntimeError(f"unexpected reply to the interrupted cell: {reply['content']}")
    while True:  # drain its iopub messages (error, idle) before the next
        try:
            kc.get_iopub_msg(timeout=0.2)
        except Empty:
            break
    return took


def measure(name: str, starts: int, iterations: int, interrupts: int) -> dict[str, Sample]:
    start_s = []
    for _ in range(starts):
        km, kc, took = start(name)
        start_s.append(took)
        stop(km, kc)
    km, kc, _ = start(name)
    try:
        rtt = Sample(time_calls(lambda: round_trip(kc), 20, iterations))
        stops = Sample([interrupt_once(km, kc) for _ in range(interrupts)])
    finally:
        stop(km, kc)
    return {"start": Sample(start_s), "rtt": rtt, "interrupt": stops}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=5, help="timed kernel starts each (default 5)")
    parser.add_argument("--iterations", type=int, default=300, help="timed round trips each (default 300)")
    parser.add_argument("--interrupts", type=int, default=10, help="timed interrupts each (default 10)")
    parser.add_argument("--no-write", action="store_true", help="print the table only; leave results.md alone")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    load_before = os.getloadavg()
    local = measure("python3", args.starts, args.iterations, args.interrupts)
    with remote_worker() as token, tempfile.TemporaryDirectory(prefix="rm-bench-jupyter-") as data:
        os.environ.update(JUPYTER_DATA_DIR=data, JUPYTER_PATH=data, REMOTE_MAGIC_TOKEN=token)
        subprocess.run(["remote-worker", "kernelspec", "install", "--name", REMOTE_KERNEL], check=True,
                       capture_output=True)
        remote = measure(REMOTE_KERNEL, args.starts, args.iterations, args.interrupts)

    def row(what: str, key: str) -> str:
        ours, theirs = remote[key], local[key]
        return (f"| {what} | {ms(ours.median)} (p90 {ms(ours.p90)}) | {ms(theirs.median)} (p90 {ms(theirs.p90)}) "
                f"| {ours.median / theirs.median:.1f}× |")

    table = "\n".join([
        "| what | through the provisioner (worker on this machine) | local ipykernel | ratio |",
        "| --- | ---: | ---: | ---: |",
        row(f"kernel start, `start_kernel()` to `wait_for_ready()` ({args.starts} starts)", "start"),
        row(f"`execute_request` round trip for `pass`, reply and idle ({args.iterations} calls)", "rtt"),
        row(f"interrupt of `while True: pass` to its KeyboardInterrupt reply ({args.interrupts} times)", "interrupt"),
    ])
    print(table)
    if not args.no_write:
        method = ("Both kernels are started by `jupyter_client.KernelManager` in this process: the local one from "
                  "the environment's `python3` kernelspec, the remote one from a kernelspec `remote-worker kernelspec "
                  "install` wrote, against a private `remote-worker --listen 127.0.0.1:0` (hub and worker in one "
                  "process) on the same machine, so the remote figures are the relay's and the hub's cost without a "
                  "network: over a real link add its round-trip time per message (a start takes several). "
                  "Round trips: 20 warm-ups, then `execute_interactive(\"pass\")` until its reply and the idle "
                  "status. Interrupts: SIGINT (the kernelspecs' `interrupt_mode`), 0.2 s into the loop.")
        command = " ".join(["python benchmarks/bench_kernel.py", *(argv if argv is not None else sys.argv[1:])])
        write_section(SECTION_TITLE, "\n".join([f"Measured by `{command}`.", "", *zmq_peer_lines(
            load_before, f"jupyter_client {jupyter_client.__version__}", f"ipykernel {_ipykernel_version()}"),
            "", table, "", method]))
    return 0


def _ipykernel_version() -> Any:
    import ipykernel

    return ipykernel.__version__


if __name__ == "__main__":
    sys.exit(main())
