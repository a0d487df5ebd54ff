"""The pip command that installs this copy of remote-magic with one of its extras.

remote-magic isn't on the package index yet, so ``pip install "remote-magic[worker]"`` would fail.
The command names where this copy was installed from, as pip recorded it (PEP 610's
``direct_url.json``): a clone (``pip install "/path/to/clone[worker]"``, with ``-e`` for an
editable one), a git URL, or a wheel; only a copy with no such record gets the index's name. A copy
installed from the wheel a worker serves (``%pip install`` of the line ``remote-worker`` prints) has a
URL that ends with that worker, so its command names the extra's own requirements instead.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import re
import urllib.parse
from typing import Any

SERVED_WHEEL_GENERATOR = "Generator: remote-magic (a worker's own wheel)"
"""The WHEEL file's line that marks the wheel ``remote-worker`` packs of itself (worker/own_wheel.py)."""


@functools.lru_cache(maxsize=None)
def install_command(extra: str) -> str:
    """``pip install ...`` that adds ``extra`` (worker, lan, dask) to this copy of remote-magic."""
    origin, distribution = _origin()
    if distribution is not None and SERVED_WHEEL_GENERATOR in (distribution.read_text("WHEEL") or ""):
        return "pip install " + " ".join(f'"{r}"' for r in _extra_requirements(distribution, extra))
    url = str(origin.get("url") or "")
    vcs, folder = origin.get("vcs_info"), origin.get("dir_info")
    if isinstance(vcs, dict) and url:
        return f'pip install "remote-magic[{extra}] @ {vcs.get("vcs", "git")}+{url}"'
    if url.startswith("file://") and isinstance(folder, dict):
        editable = "-e " if folder.get("editable") else ""
        return f'pip install {editable}"{urllib.parse.unquote(url[len("file://"):])}[{extra}]"'
    if url:
        return f'pip install "remote-magic[{extra}] @ {url}"'
    return f'pip install "remote-magic[{extra}]"'


def _origin() -> tuple[dict[str, Any], importlib.metadata.Distribution | None]:
    """pip's record of where the installed copy came from, and that copy's distribution."""
    # Every copy on the path: a build's remote_magic.egg-info in a clone's root (the working directory)
    # comes first there, and only the installed one has pip's record.
    for distribution in importlib.metadata.distributions(name="remote-magic"):
        try:
            origin = json.loads(distribution.read_text("direct_url.json") or "null")
        except ValueError:
            continue
        if isinstance(origin, dict):
            return origin, distribution
    return {}, None


def _extra_requirements(distribution: importlib.metadata.Distribution, extra: str) -> list[str]:
    """What ``extra`` adds, from the copy's metadata (``Requires-Dist: zeroconf>=0.100; extra == "lan"``)."""
    marker = re.compile(r"""\s*;\s*extra\s*==\s*["']""" + re.escape(extra) + r"""["']\s*$""")
    return [marker.sub("", r) for r in distribution.requires or [] if marker.search(r)]
