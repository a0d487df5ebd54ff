"""%offload_workers (issue 32, item 8): a compact view that fits a notebook's width, per worker what it runs
now, its GPU in short and its transfers, refreshed in place while the notebook stays connected; the full
table under --all."""

from __future__ import annotations

import copy
from typing import Any

import remote_magic
from remote_magic.notebook.tables import WorkersTable
from remote_magic.notebook.workers_view import WIDTH, LiveDisplay, WorkersView
from support import WorkerProcess, connected_shell, in_thread, run, wait_for

MARKED_JOB = "marked = True\nimport time\ntime.sleep(1.5)\ndone = True"


def _view(client: Any) -> WorkersView:
    return WorkersView(client.workers(), client.hub_cache, client.traffic())


def test_the_compact_view_fits_a_notebook_with_long_names_a_tab_and_a_busy_worker(worker: WorkerProcess) -> None:
    with remote_magic.connect(worker.token) as client:
        [shared] = client.workers()
    tab, busy = copy.deepcopy(shared), copy.deepcopy(shared)
    tab.update(name="a-phone-in-the-kitchen-with-a-very-long-name", state="idle",
               gpu={"adapter": "SwiftShader Device (Subzero) (0x0000C0DE)", "adapter_type": "software",
                    "backend": "WebGPU", "browser_tab": True, "active": True})
    busy.update(name="workstation-under-the-desk-of-the-lab", state="busy", job="j-1", running_s=754.2,
                job_summary="model.fit(X_train, y_train, epochs=200, batch_size=64, validation_split=0.1)",
                bytes_in=12_345_678_901, bytes_out=987_654_321,
                gpu={"adapter": "NVIDIA GeForce RTX 4090", "adapter_type": "discrete", "backend": "Vulkan",
                     "active": True})
    view = WorkersView([shared, tab, busy], traffic=(2_000_000, 3_000_000, 10**9),
                       crossing=[("workstation-under-the-desk-of-the-lab", "up", 13_000_000, 26_000_000)])
    text = repr(view)
    assert max(len(line) for line in text.splitlines()) <= WIDTH, text
    header, _, *rows = text.splitlines()[:5]
    assert header.split() == ["worker", "state", "running", "now", "GPU", "data", "in", "/", "out"]
    assert rows[0].startswith("shared") and " idle " in rows[0] and " none " in rows[0]  # --gpu off: numpy
    assert "a-phone-in-the-…" in rows[1] and "SwiftShader… (tab, software)" in rows[1]
    assert "13 min: model.fit(" in rows[2] and "NVIDIA GeFo… (discrete)" in rows[2]
    assert "up 50% of 26.0 MB" in rows[2]  # this notebook's message to it, crossing now
    words = " ".join(text.split())  # the notes below the rows, unwrapped
    assert "data in / out: bytes of jobs sent to it / sent back" in words  # the footnote says what each number is
    assert "This notebook sent 2.0 MB and received 3.0 MB" in words
    assert "<td>a-phone-in-the-…</td>" in view._repr_html_()


def test_the_live_view_shows_a_running_job_then_idle_and_stops_when_replaced(worker: WorkerProcess) -> None:
    shown: list[str] = []

    def publish(bundle: dict[str, str], **options: Any) -> None:  # the display seam: what the cell would show
        shown.append(bundle["text/plain"])

    with remote_magic.connect(worker.token) as client:
        live = LiveDisplay(_view(client), lambda: _view(client), publish, every=0.1, idle_every=0.1)
        live.start()
        try:
            job = in_thread(lambda: client.run(MARKED_JOB), "the marked job")
            wait_for(lambda: "busy" in shown[-1] and ": marked = True" in shown[-1], 30,
                     "the view to show the job running")
            assert job.result(60)["done"] is True
            wait_for(lambda: " idle" in shown[-1] and "marked" not in shown[-1], 30, "the view to show idle")
            newer = LiveDisplay(_view(client), lambda: None, publish, every=0.1, idle_every=0.1)
            newer.start()
            wait_for(lambda: not live.running, 10, "the older view to stop refreshing")
            wait_for(lambda: not newer.running, 10, "the newer view to stop once its notebook disconnected")
        finally:
            live.stop()


def test_offload_workers_shows_the_compact_view_and_every_column_under_all(worker: WorkerProcess) -> None:
    with connected_shell(worker.token) as (shell, _):
        result, _ = run(shell, "%offload_workers")
        view = result.result
        assert isinstance(view, WorkersView) and [w["name"] for w in view.workers] == ["shared"]
        assert max(len(line) for line in repr(view).splitlines()) <= WIDTH
        table = shell.run_line_magic("offload_workers", "--all")
        assert isinstance(table, WorkersTable) and "platform" in repr(table) and "sessions" in repr(table)
