"""The fleet as a table: plain text in a terminal, HTML in a notebook."""

from __future__ import annotations

import html
from typing import Any, Sequence


def _gib(n: Any) -> str:
    return f"{n / 2**30:.1f} GiB" if isinstance(n, (int, float)) and n else "?"


def _gpu(worker: dict[str, Any]) -> str:
    gpu = worker.get("gpu") or {}
    if not gpu.get("adapter"):
        return "none" if gpu.get("mode") != "off" else "off"
    kind = gpu.get("adapter_type", "?")
    state = "" if gpu.get("active") else ", numpy (auto)"
    return f"{gpu['adapter']} ({gpu.get('backend', '?')}, {kind}{state})"


def _gpu_counters(worker: dict[str, Any]) -> str:
    stats = (worker.get("stats") or {}).get("gpu") or {}
    if not stats.get("kernels"):
        return ""
    dispatches = sum(stats["kernels"].values())
    return f"{dispatches} dispatches, {stats.get('gpu_time_s', 0.0) * 1e3:.1f} ms"


def _sessions(worker: dict[str, Any]) -> str:
    """'3 (1.2 GiB; yours 410 MiB)': the notebooks' interpreters a worker keeps, and this one's."""
    count = worker.get("sessions")
    if not isinstance(count, int):
        return "?"
    if not count:
        return "0"
    yours = worker.get("session_memory_bytes")
    mine = f"; yours {_size(yours)}" if isinstance(yours, int) else ""
    return f"{count} ({_size(worker.get('sessions_memory_bytes'))}{mine})"


def _size(n: Any) -> str:
    if not isinstance(n, int):
        return "?"
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


COLUMNS = ("name", "host", "platform", "python", "CPUs", "memory", "GPU", "state", "jobs", "sessions", "GPU work")


def rows(workers: Sequence[dict[str, Any]]) -> list[tuple[str, ...]]:
    return [(
        str(w.get("name", "?")), str(w.get("hostname", "?")), str(w.get("platform", "?")),
        str(w.get("python", "?")), str(w.get("cpu_count", "?")), _gib(w.get("memory_bytes")), _gpu(w),
        str(w.get("state", "?")), str(w.get("jobs_done", 0)), _sessions(w), _gpu_counters(w),
    ) for w in workers]


class WorkersTable:
    """What ``%offload_workers`` shows; ``.workers`` holds the raw dicts."""

    def __init__(self, workers: Sequence[dict[str, Any]]) -> None:
        self.workers = list(workers)

    def __repr__(self) -> str:
        if not self.workers:
            return ("no workers connected: start `remote-worker` on a machine (or `remote-worker --join`, with "
                    "the worker token in $REMOTE_MAGIC_JOIN_TOKEN)")
        table = [COLUMNS, *rows(self.workers)]
        widths = [max(len(r[i]) for r in table) for i in range(len(COLUMNS))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in table]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        if not self.workers:
            return f"<p>{html.escape(repr(self))}</p>"
        head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows(self.workers))
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
