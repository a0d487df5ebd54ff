"""What a worker tells the hub about its machine."""

from __future__ import annotations

import os
import platform
import socket
from typing import Any

import psutil


def host_capabilities() -> dict[str, Any]:
    """Hostname, OS, Python, CPU count, memory and battery, as JSON-able values."""
    caps: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(terse=True),
        "system": platform.system(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count() or 1,
        "memory_bytes": psutil.virtual_memory().total,
    }
    try:
        battery = psutil.sensors_battery()
    except (AttributeError, NotImplementedError, OSError):  # not every OS reports one
        battery = None
    if battery is not None:
        caps["battery"] = {"percent": round(battery.percent), "plugged_in": bool(battery.power_plugged)}
    return caps
