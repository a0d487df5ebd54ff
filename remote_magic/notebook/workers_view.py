"""What ``%offload_workers`` shows: per worker, its name, state, what it runs now, its GPU in short and its
transfers, in a notebook's width (at most ``WIDTH`` characters of text; a narrow HTML table).

In a Jupyter kernel the view refreshes in place (``LiveDisplay``: a display redrawn by its id, asking the
hub every ``REFRESH_S`` while something runs and every ``IDLE_REFRESH_S`` while nothing does) while the
notebook stays connected, until a newer view replaces it; elsewhere it shows once.
Every column is in ``%offload_workers --all`` (``tables.py``).
"""

from __future__ import annotations

import html
import logging
import textwrap
import threading
import uuid
from typing import Any, Callable, Sequence

from .. import progress
from ..engine import LinkTraffic
from ..errors import RemoteMagicError
from ..wire.sizes import human_size
from .tables import NO_WORKERS, notes

log = logging.getLogger(__name__)

WIDTH = 100
"""The most characters a line of the text view takes: a notebook cell's width."""

REFRESH_S = 1.0
"""How often a live view asks the hub for the fleet again while a worker is busy or a message crosses."""

IDLE_REFRESH_S = 2.0
"""How often it asks while every worker is idle: each answer crosses the link (a tunnel's budget too)."""

ASK_TIMEOUT_S = 5.0
"""How long a live view waits for the hub's answer before it stops refreshing."""

COLUMNS = ("worker", "state", "running now", "GPU", "data in / out")
WIDEST = (16, 5, 24, 28, 17)
"""The most characters each column takes; longer cells are cut with an ellipsis."""

FOOTNOTE = ("running now: for how long, and the job's first line. GPU: its adapter, discrete or integrated "
            "(a real GPU) or software (the CPU), tab: in a browser tab; none or numpy: cells compute with numpy. "
            "data in / out: bytes of jobs sent to it / sent back (up or down N%: this notebook's message "
            "crossing now). Every column: %offload_workers --all.")

Bundle = dict[str, str]
Crossing = Sequence[tuple[str, str, int, int]]
"""This notebook's large messages crossing now: worker, direction, bytes across, bytes in all
(``progress.crossing``)."""


def _cut(text: str, most: int) -> str:
    return text if len(text) <= most else text[:most - 1] + "…"


def _state(worker: dict[str, Any]) -> str:
    """idle, busy, held (its battery keeps it from jobs) or away (silent past the liveness bound)."""
    if worker.get("reachable") is False:
        return "away"
    if worker.get("held"):
        return "held"
    return str(worker.get("state", "?"))


def _seconds(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.0f} h"


def _running(worker: dict[str, Any]) -> str:
    """'12 s: model.fit(X, y)': for how long its job has run, and the job's first line; '' when idle."""
    if not worker.get("job"):
        return ""
    summary = worker.get("job_summary") or f"job {worker['job']}"
    running = worker.get("running_s")
    return f"{_seconds(running)}: {summary}" if isinstance(running, (int, float)) else str(summary)


def _gpu(worker: dict[str, Any]) -> str:
    """'llvmpipe (software)', 'NVIDIA GeFo… (discrete)', 'SwiftShader… (tab, software)', 'llvmpipe (software,
    numpy)' (cells compute with numpy there: --gpu auto found only a software adapter), 'none', 'off'."""
    gpu = worker.get("gpu") or {}
    if not gpu.get("adapter"):
        return "off" if gpu.get("mode") == "off" else "none"
    name = str(gpu["adapter"]).split(" (")[0]
    where = "tab, " if gpu.get("browser_tab") else ""
    numpy = "" if gpu.get("active") else ", numpy"
    return f"{_cut(name, 12)} ({where}{gpu.get('adapter_type', '?')}{numpy})"


def _data(worker: dict[str, Any], crossing: Crossing) -> str:
    """'1.2 MB / 3.4 kB', or 'up 45% of 26.0 MB' while this notebook's message to or from it crosses."""
    for name, way, done, total in crossing:
        if name and name == worker.get("name"):
            return f"{way} {100 * done // max(total, 1)}% of {human_size(total)}"
    sent, back = worker.get("bytes_in"), worker.get("bytes_out")
    return f"{human_size(sent)} / {human_size(back)}" if isinstance(sent, int) and isinstance(back, int) else "?"


def rows(workers: Sequence[dict[str, Any]], crossing: Crossing = ()) -> list[tuple[str, ...]]:
    """The view's cells, each cut to its column's ``WIDEST``."""
    found = [(str(w.get("name", "?")), _state(w), _running(w), _gpu(w), _data(w, crossing)) for w in workers]
    return [tuple(_cut(cell, most) for cell, most in zip(row, WIDEST)) for row in found]


class WorkersView:
    """The compact fleet ``%offload_workers`` shows (``.workers`` holds the raw dicts, as the hub lists them);
    in a Jupyter kernel it refreshes itself in place through ``refresh``, which gives the fleet now (None
    once the notebook disconnected)."""

    def __init__(self, workers: Sequence[dict[str, Any]], hub_cache: dict[str, int] | None = None,
                 traffic: LinkTraffic | None = None, crossing: Crossing = (),
                 refresh: "Callable[[], WorkersView | None] | None" = None) -> None:
        self.workers = list(workers)
        self.hub_cache = hub_cache or {}
        self.traffic = traffic  # this notebook's bytes over its engine's link, and its budget (None: no link)
        self.crossing = list(crossing)  # this notebook's large messages crossing now (progress.crossing)
        self.refresh = refresh

    def _notes(self) -> list[str]:
        to_hub = [f"This notebook is sending {human_size(done)} of {human_size(total)} to the hub."
                  for name, way, done, total in self.crossing if not name]
        kept = self.hub_cache if self.hub_cache.get("bytes") else {}  # nothing kept: nothing to say
        return [*to_hub, *notes(kept, self.traffic)]

    def what_changes(self) -> tuple[Any, ...]:
        """What a live view is redrawn for: the rows and what crosses, not this notebook's byte counts
        alone (asking the hub for the fleet adds to them)."""
        return tuple(rows(self.workers, self.crossing)), tuple(self.crossing), tuple(sorted(self.hub_cache.items()))

    def busy(self) -> bool:
        """Is a worker running a job, or a message of this notebook crossing?"""
        return bool(self.crossing) or any(w.get("job") for w in self.workers)

    def __repr__(self) -> str:
        if not self.workers:
            return "\n".join(textwrap.wrap(NO_WORKERS, WIDTH))
        table = [COLUMNS, *rows(self.workers, self.crossing)]
        widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS))]
        lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in table]
        lines.insert(1, "  ".join("-" * width for width in widths))
        below = [FOOTNOTE, *self._notes()]
        return "\n".join([*lines, *(line for note in below for line in textwrap.wrap(note, WIDTH))])

    def _repr_html_(self) -> str:
        if not self.workers:
            return f"<p>{html.escape(NO_WORKERS)}</p>"
        head = "".join(f"<th>{html.escape(column)}</th>" for column in COLUMNS)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
                       for row in rows(self.workers, self.crossing))
        below = "".join(f"<p><small>{html.escape(note)}</small></p>" for note in [FOOTNOTE, *self._notes()])
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{below}"

    def bundle(self) -> Bundle:
        """The view as a display's mime bundle."""
        return {"text/plain": repr(self), "text/html": self._repr_html_()}

    def _ipython_display_(self) -> None:
        from IPython.display import publish_display_data

        if self.refresh is None or not progress.in_a_kernel():
            publish_display_data(self.bundle())  # type: ignore[no-untyped-call]
            return
        LiveDisplay(self, self.refresh).start()


Publish = Callable[..., None]
"""``IPython.display.publish_display_data``'s signature: a bundle, and ``transient`` and ``update``."""

_newest: "LiveDisplay | None" = None  # the view the notebook showed last: the only one that refreshes
_newest_lock = threading.Lock()


def _publish(bundle: Bundle, **options: Any) -> None:
    from IPython.display import publish_display_data

    publish_display_data(bundle, **options)  # type: ignore[no-untyped-call]


class LiveDisplay:
    """A ``WorkersView`` shown with a display id and redrawn by a daemon thread, asking ``refresh`` for the fleet
    every ``every`` seconds while something runs (``idle_every`` while nothing does), while ``refresh`` gives
    a view (None: the notebook disconnected) and no newer ``LiveDisplay`` started."""

    def __init__(self, view: WorkersView, refresh: Callable[[], WorkersView | None], publish: Publish = _publish,
                 every: float = REFRESH_S, idle_every: float = IDLE_REFRESH_S) -> None:
        self.display_id = f"remote-magic-workers-{uuid.uuid4().hex}"
        self._view, self._refresh, self._publish = view, refresh, publish
        self._every, self._idle_every = every, idle_every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="remote-magic workers view", daemon=True)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        """Show the view, and keep it current; a view shown earlier stops refreshing."""
        global _newest
        with _newest_lock:
            _newest = self
        self._publish(self._view.bundle(), transient={"display_id": self.display_id})
        self._thread.start()

    def stop(self) -> None:
        """Stop refreshing; the view stays as it last read."""
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        view = self._view
        while not self._stop.wait(self._every if view.busy() else self._idle_every):
            if _newest is not self:
                return
            try:
                latest = self._refresh()
            except RemoteMagicError as exc:  # the hub went away, or didn't answer in time
                log.debug("The workers view stops refreshing: %s", exc)
                return
            except Exception as exc:  # a bug: said in one line (a thread's traceback would land in any cell)
                log.warning("The workers view stopped refreshing: %s: %s", type(exc).__name__, exc)
                return
            if latest is None:
                return
            if latest.what_changes() != view.what_changes():
                self._publish(latest.bundle(), transient={"display_id": self.display_id}, update=True)
            view = latest
