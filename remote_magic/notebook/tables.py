"""The fleet as a table with every column (``%offload_workers --all``): plain text in a terminal, HTML in a
notebook. The compact, live view ``%offload_workers`` shows is ``workers_view.py``."""

from __future__ import annotations

import html
from typing import Any, Sequence

from ..engine import LinkTraffic
from ..wire.sizes import human_size


def _size(n: Any) -> str:
    return human_size(n) if isinstance(n, (int, float)) else "?"


def _gpu(worker: dict[str, Any]) -> str:
    gpu = worker.get("gpu") or {}
    if not gpu.get("adapter"):
        return "none" if gpu.get("mode") != "off" else "off"
    kind = gpu.get("adapter_type", "?")
    state = "" if gpu.get("active") else ", numpy (auto)"
    backend = f"{gpu.get('backend', '?')}{' in a browser tab' if gpu.get('browser_tab') else ''}"
    return f"{gpu['adapter']} ({backend}, {kind}{state})"


def _gpu_counters(worker: dict[str, Any]) -> str:
    stats = (worker.get("stats") or {}).get("gpu") or {}
    if not stats.get("kernels"):
        return ""
    dispatches = sum(stats["kernels"].values())
    return f"{dispatches} dispatches, {stats.get('gpu_time_s', 0.0) * 1e3:.1f} ms"


def _sessions(worker: dict[str, Any]) -> str:
    """'3 (1.2 GB; yours 410.0 MB)': the notebooks' interpreters a worker keeps, and this one's."""
    count = worker.get("sessions")
    if not isinstance(count, int):
        return "?"
    if not count:
        return "0"
    yours = worker.get("session_memory_bytes")
    mine = f"; yours {_size(yours)}" if isinstance(yours, int) else ""
    return f"{count} ({_size(worker.get('sessions_memory_bytes'))}{mine})"


def _tab(worker: dict[str, Any]) -> bool:
    """A browser tab's worker: its CPUs, memory, speed and power are unknown (worker/capabilities.py)."""
    return bool((worker.get("gpu") or {}).get("browser_tab"))


def _cpus(worker: dict[str, Any]) -> str:
    """'8 (speed 41)': CPU count and the measured single-core speed that --prefer fastest compares."""
    speed = worker.get("speed")
    cpus = worker.get("cpu_count", "unknown" if _tab(worker) else "?")
    return f"{cpus}" + (f" (speed {speed:g})" if isinstance(speed, (int, float)) else "")


def _memory(worker: dict[str, Any]) -> str:
    memory = worker.get("memory_bytes")
    return "unknown" if memory is None and _tab(worker) else _size(memory or None)


def _power(worker: dict[str, Any]) -> str:
    """'mains', 'plugged in, 87%', 'battery 42%, last resort', 'battery 15%: no jobs (under 20%)'; 'unknown'
    for a browser tab."""
    battery = worker.get("battery")
    if not isinstance(battery, dict):
        return "unknown" if _tab(worker) else "mains"
    percent = battery.get("percent", "?")
    if battery.get("plugged_in"):
        return f"plugged in, {percent}%"
    if worker.get("held"):
        policy = worker.get("on_battery")
        return f"battery {percent}%: no jobs ({'--on-battery never' if policy == 'never' else 'under --min-battery'})"
    return f"battery {percent}%" + (", last resort" if worker.get("on_battery", "last") == "last" else "")


def _work(worker: dict[str, Any]) -> str:
    """'3 (busy 12.5 s, GPU 0.4 s)': jobs run, and the seconds the hub counted them busy and on the GPU."""
    busy, gpu = worker.get("busy_s"), worker.get("gpu_s")
    if not isinstance(busy, (int, float)):
        return str(worker.get("jobs_done", 0))
    on_gpu = f", GPU {gpu:.1f} s" if isinstance(gpu, (int, float)) and gpu else ""
    return f"{worker.get('jobs_done', 0)} (busy {busy:.1f} s{on_gpu})"


def _data(worker: dict[str, Any]) -> str:
    """'1.0 MB / 2.0 kB': bytes of jobs sent to the worker, and of what it sent back."""
    sent, back = worker.get("bytes_in"), worker.get("bytes_out")
    return f"{human_size(sent)} / {human_size(back)}" if isinstance(sent, int) and isinstance(back, int) else "?"


def _labels(worker: dict[str, Any]) -> str:
    labels = worker.get("labels")
    return ", ".join(f"{k}={v}" for k, v in labels.items()) if isinstance(labels, dict) else ""


COLUMNS = ("name", "host", "platform", "python", "CPUs", "memory", "GPU", "power", "state", "jobs", "data in / out",
           "sessions", "GPU work", "labels")


def rows(workers: Sequence[dict[str, Any]]) -> list[tuple[str, ...]]:
    return [(
        str(w.get("name", "?")), str(w.get("hostname", "?")), str(w.get("platform", "?")),
        str(w.get("python", "?")), _cpus(w), _memory(w), _gpu(w), _power(w),
        str(w.get("state", "?")), _work(w), _data(w), _sessions(w), _gpu_counters(w), _labels(w),
    ) for w in workers]


def notes(hub_cache: dict[str, int], traffic: LinkTraffic | None) -> list[str]:
    """Below a fleet's table: this notebook's bytes over its connection, and what the hub keeps of its values."""
    found = []
    if traffic is not None:
        sent, received, budget = traffic
        left = f", {human_size(max(0, budget - sent - received))} left of its {human_size(budget)} budget" \
            if budget is not None else ""
        found.append(f"This notebook sent {human_size(sent)} and received {human_size(received)}{left}.")
    if hub_cache.get("max_bytes"):
        kept, most = human_size(hub_cache.get("bytes", 0)), human_size(hub_cache["max_bytes"])
        found.append(f"The hub keeps {kept} of this notebook's large values (at most {most}): sent again, they "
                     "cross as their digest.")
    return found


NO_WORKERS = ("no workers connected: start `remote-worker` on a machine (or `remote-worker --join`, with "
              "the worker token in $REMOTE_MAGIC_JOIN_TOKEN)")


class WorkersTable:
    """What ``%offload_workers --all`` shows: every column; ``.workers`` holds the raw dicts."""

    def __init__(self, workers: Sequence[dict[str, Any]], hub_cache: dict[str, int] | None = None,
                 traffic: LinkTraffic | None = None) -> None:
        self.workers = list(workers)
        self.hub_cache = hub_cache or {}
        self.traffic = traffic  # this notebook's bytes over its engine's link, and its budget (None: no link)

    def _notes(self) -> list[str]:
        return notes(self.hub_cache, self.traffic)

    def __repr__(self) -> str:
        if not self.workers:
            return NO_WORKERS
        table = [COLUMNS, *rows(self.workers)]
        widths = [max(len(r[i]) for r in table) for i in range(len(COLUMNS))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in table]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join([*lines, *self._notes()])

    def _repr_html_(self) -> str:
        if not self.workers:
            return f"<p>{html.escape(repr(self))}</p>"
        head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows(self.workers))
        notes = "".join(f"<p>{html.escape(note)}</p>" for note in self._notes())
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{notes}"
