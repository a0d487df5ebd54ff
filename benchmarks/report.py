"""What every benchmark writes beside its table: the machine, the code measured, and its section
of results.md (replaced in place; other benchmarks' sections stay as they are)."""

from __future__ import annotations

import datetime as dt
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
RESULTS_PATH = REPO / "benchmarks" / "results.md"
RESULTS_TITLE = "# Benchmark results"
MIN_ROUNDS = 3
"""Rounds :func:`interleaved_medians` always runs, whatever its time budget."""


def cpu_model() -> str:
    """The CPU's model name, from /proc/cpuinfo or the platform module."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> str:
    """One line: CPU model, cores, OS."""
    return f"{cpu_model()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def code_version() -> str:
    """The commit measured, and whether the working tree had changes on top of it."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "commit unknown"
    return f"commit {commit}{' with uncommitted changes' if dirty else ''}"


def zmq_peer_lines(load_before: tuple[float, float, float], *versions: str) -> list[str]:
    """The lines under a section's title for a benchmark of remote-magic beside pyzmq, ipyparallel and
    Dask: date, machine, Python and those libraries' versions (with ``versions``), commit, load."""
    import zmq

    import remote_magic

    found = [f"remote-magic {remote_magic.__version__}", f"pyzmq {zmq.__version__}", f"libzmq {zmq.zmq_version()}",
             *versions]
    for module, shown in (("ipyparallel", "ipyparallel"), ("distributed", "dask")):
        try:
            found.append(f"{shown} {__import__(module).__version__}")
        except ImportError:
            pass
    load_after = os.getloadavg()
    return [
        f"- Date: {dt.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}",
        f"- Machine: {machine()}",
        f"- Python {platform.python_version()}; {', '.join(found)}; {code_version()}",
        f"- Load average (1 min) before / after the run: {load_before[0]:.2f} / {load_after[0]:.2f}",
    ]


def gpu_lines(script: str, caps: dict[str, Any], load: tuple[float, float]) -> list[str]:
    """The lines a GPU benchmark's section starts with: how it was run (``script``'s command line), date,
    machine, adapter (``GpuRuntime.capabilities()``; lavapipe said to be no GPU), versions, commit, and the
    1-minute load average before and after the run (``load``)."""
    import numpy as np
    import wgpu

    software = " — lavapipe, Mesa's software Vulkan on the CPU, not a GPU" if caps.get("adapter_type") == "software" \
        else ""
    return [
        f"Measured by `python benchmarks/{script}{' ' + ' '.join(sys.argv[1:]) if sys.argv[1:] else ''}`.",
        "",
        f"- Date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- Machine: {machine()}",
        f"- Adapter: {caps.get('adapter')} ({caps.get('adapter_type')}, {caps.get('backend')}){software}",
        f"- Python {platform.python_version()}; numpy {np.__version__}, wgpu {wgpu.__version__}; {code_version()}",
        f"- Load average (1 min) before / after the run: {load[0]:.2f} / {load[1]:.2f}",
    ]


def write_section(title: str, body: str, path: Path = RESULTS_PATH) -> None:
    """Replace (or append) the section headed ``title`` in results.md, atomically."""
    text = path.read_text() if path.exists() else f"{RESULTS_TITLE}\n"
    lines = text.splitlines()
    section = [title, "", *body.strip("\n").splitlines(), ""]
    try:
        start = lines.index(title)
    except ValueError:
        while lines and not lines[-1].strip():
            lines.pop()
        lines += ["", *section]
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        lines[start:end] = section
    while lines and not lines[-1].strip():
        lines.pop()
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)


def interleaved_medians(runs: dict[str, Callable[[], float]], repeat: int, budget_s: float) -> dict[str, float]:
    """Median seconds of each run over up to ``repeat`` rounds (at least :data:`MIN_ROUNDS`; no more once
    ``budget_s`` has passed), every run once a round in a new order, so a drift in a shared machine's speed
    hits all alike. Each run returns the seconds it measured."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    order = list(runs)
    shuffle = random.Random(0).shuffle
    started = time.perf_counter()
    for round_ in range(repeat):
        shuffle(order)
        for name in order:
            times[name].append(runs[name]())
        if round_ + 1 >= MIN_ROUNDS and time.perf_counter() - started > budget_s:
            break
    return {name: statistics.median(values) for name, values in times.items()}
