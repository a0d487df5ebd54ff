"""What a worker tells the hub about its machine, or, for a browser tab's worker, about where it runs.

A tab's worker runs its cells' Python in executors on this host, and their GPU work in the tab. The
host's CPUs, memory, speed and battery are the machine's own worker's to claim, and the tab's (a
phone's, a laptop's) are not measured here: a tab's worker reports none of them, so placement and
``%offload_workers`` take them as unknown, and describes its GPU by what the tab's adapter says.
"""

from __future__ import annotations

import logging
import os
import platform
import socket
import time
from typing import Any

import psutil

log = logging.getLogger(__name__)

BATTERY_ENV = "REMOTE_MAGIC_BATTERY"
"""A testing hook: ``percent,plugged`` (``42,false``) stands in for the battery psutil reads, when set."""

SPEED_ROUNDS = 3
SPEED_LOOP = 200_000
"""The speed benchmark: the best of SPEED_ROUNDS runs of a pure-Python loop of SPEED_LOOP steps (~20 ms)."""


def where_python_runs() -> dict[str, Any]:
    """This host's name, OS and Python: all that a browser tab's worker says of its machine (its cells'
    Python runs here; the tab's CPUs, memory, speed and battery are unknown)."""
    return {"hostname": socket.gethostname(), "platform": platform.platform(terse=True), "system": platform.system(),
            "machine": platform.machine(), "python": platform.python_version()}


def host_capabilities() -> dict[str, Any]:
    """Hostname, OS, Python, CPU count, memory, measured speed and battery, as JSON-able values."""
    caps: dict[str, Any] = {**where_python_runs(), "cpu_count": os.cpu_count() or 1,
                            "memory_bytes": psutil.virtual_memory().total, "speed": cpu_speed()}
    state = battery_state()
    if state is not None:
        caps["battery"] = state
    return caps


def battery_state() -> dict[str, Any] | None:
    """{percent, plugged_in} now, or None on a machine without a battery (or whose OS reports none).

    ``$REMOTE_MAGIC_BATTERY`` (``percent,plugged``) overrides the sensor: tests use it, and so may a
    machine whose sensor is wrong.
    """
    override = os.environ.get(BATTERY_ENV)
    if override:
        percent, _, plugged = override.partition(",")
        try:
            return {"percent": round(float(percent)), "plugged_in": plugged.strip().lower() in ("true", "1", "yes")}
        except ValueError:
            log.warning("ignoring $%s=%r: it should be PERCENT,PLUGGED like 42,false", BATTERY_ENV, override)
    try:
        battery = psutil.sensors_battery()
    except (AttributeError, NotImplementedError, OSError):  # not every OS reports one
        return None
    if battery is None:
        return None
    return {"percent": round(battery.percent), "plugged_in": bool(battery.power_plugged)}


def cpu_speed() -> float:
    """Millions of simple Python steps a second on one core: what ``--prefer fastest`` compares
    (after GPU presence). Rough, and measured while other work may run, but the same yardstick
    on every worker."""
    best = float("inf")
    for _ in range(SPEED_ROUNDS):
        started = time.perf_counter()
        total = 0
        for i in range(SPEED_LOOP):
            total += i * i % 7
        best = min(best, time.perf_counter() - started)
    return round(SPEED_LOOP / max(best, 1e-9) / 1e6, 1)
