"""The magics in a real IPython InteractiveShell against a real remote-worker."""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np
import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from remote_magic import JobTimeout, RemoteError
from remote_magic.wire.tokens import Token
from support import WorkerProcess, run


def test_cell_runs_remotely_and_its_assignments_come_back(ip: InteractiveShell) -> None:
    a = np.arange(6.0).reshape(2, 3)
    b = np.ones((3, 2))

    class Box:
        pass

    obj = Box()
    ip.user_ns.update(a=a, b=b, x=[1, 2, 3], obj=obj, n=10)
    result, out = run(ip, "%%offload\nimport numpy as np\nc = a @ b\nx[0] = 99\nobj.attr = 'set'\nn += 1\n"
                          "print(c.shape)\nc.sum()")
    assert result.success, result.error_in_exec
    np.testing.assert_allclose(ip.user_ns["c"], a @ b)
    assert ip.user_ns["x"] == [99, 2, 3]
    assert ip.user_ns["obj"].attr == "set"
    assert ip.user_ns["n"] == 11
    assert "(2, 2)" in out.stdout
    assert result.result == pytest.approx((a @ b).sum())  # the last expression is the cell's value


def test_only_names_the_cell_reads_are_sent(ip: InteractiveShell) -> None:
    import threading

    ip.user_ns.update(unused=threading.Lock(), a=np.ones(3))  # a lock can't be pickled: sending it would fail
    result, _ = run(ip, "%%offload\nfresh = a.sum()")
    assert result.success, result.error_in_exec
    assert ip.user_ns["fresh"] == 3.0


def test_an_exception_shows_the_remote_traceback_and_keeps_what_the_cell_did_before_it(ip: InteractiveShell) -> None:
    ip.user_ns.update(x=[1, 2, 3], n=5)
    result, out = run(ip, "%%offload\nx[0] = 'changed'\nn = 6\nfresh = 1\nraise ValueError('boom on the worker')\n"
                          "late = 2")
    assert isinstance(result.error_in_exec, ValueError)  # the worker's type: `except ValueError` catches it
    assert isinstance(result.error_in_exec, RemoteError) and type(result.error_in_exec).__name__ == "ValueError"
    assert "ValueError: boom on the worker" in out.stdout + out.stderr
    assert '<offload cell' in out.stdout + out.stderr
    # As in a local run: what ran before the exception stays done, what came after never ran.
    assert ip.user_ns["x"] == ["changed", 2, 3] and ip.user_ns["n"] == 6 and ip.user_ns["fresh"] == 1
    assert "late" not in ip.user_ns


def test_display_and_matplotlib_figures_appear_in_the_cell(ip: InteractiveShell) -> None:
    cell = ("%%offload\nfrom IPython.display import display, HTML\nimport matplotlib.pyplot as plt\n"
            "display(HTML('<b>from the worker</b>'))\nplt.plot([1, 2, 3])\nh = 1")
    result, out = run(ip, cell)
    assert result.success, result.error_in_exec
    html = [o.data for o in out.outputs if "text/html" in o.data]
    assert html and "<b>from the worker</b>" in html[0]["text/html"]
    pngs = [o.data["image/png"] for o in out.outputs if "image/png" in o.data]
    assert len(pngs) == 1
    import base64

    assert base64.b64decode(pngs[0]).startswith(b"\x89PNG")


def test_ctrl_c_stops_the_remote_job_and_the_next_cell_works(ip: InteractiveShell) -> None:
    """A real SIGINT arrives while the cell waits on the worker; the remote sleep(60) stops."""

    class InterruptOnText:
        def __init__(self) -> None:
            self.text = ""
            self.sent_at: float | None = None

        def write(self, text: str) -> int:
            self.text += text
            if "sleeping" in self.text and self.sent_at is None:
                self.sent_at = time.monotonic()
                os.kill(os.getpid(), signal.SIGINT)
            return len(text)

        def flush(self) -> None:
            pass

    trigger = InterruptOnText()
    saved = sys.stdout
    sys.stdout = trigger
    try:
        result = ip.run_cell("%%offload\nimport time\nprint('sleeping', flush=True)\ntime.sleep(60)\nx = 1")
    finally:
        sys.stdout = saved
    assert isinstance(result.error_in_exec, KeyboardInterrupt)
    assert trigger.sent_at is not None and time.monotonic() - trigger.sent_at < 2.0
    # Shown as a local Ctrl-C: which job stopped where, then KeyboardInterrupt; none of the client's internals.
    shown = trigger.text[trigger.text.index("sleeping") + len("sleeping\n"):].strip().splitlines()
    assert len(shown) == 2 and shown[1] == "KeyboardInterrupt", shown
    assert shown[0].startswith("remote-magic: stopped job ") and "on worker 'shared'" in shown[0]
    result, _ = run(ip, "%%offload\nfresh = 'next cell works'")
    assert result.success and ip.user_ns["fresh"] == "next cell works"


def test_offload_workers_shows_a_table(ip: InteractiveShell) -> None:
    table = ip.run_line_magic("offload_workers", "")
    assert "<table>" in table._repr_html_() and "<td>shared</td>" in table._repr_html_()
    assert "shared" in repr(table) and "jobs" in repr(table)


def test_mistakes_are_usage_errors_with_what_to_do(ip: InteractiveShell, monkeypatch) -> None:
    with pytest.raises(SyntaxError, match="invalid syntax") as syntax:  # as the same cell locally
        ip.run_cell_magic("offload", "", "x = 1\nx = = 2")
    assert syntax.value.lineno == 2
    for ipython_only in ("!ls", "len?"):
        with pytest.raises(SyntaxError, match="%%offload runs plain Python"):
            ip.run_cell_magic("offload", "", f"x = 1\n{ipython_only}")
    with pytest.raises(UsageError):
        ip.run_cell_magic("offload", "--no-such-flag", "x = 1")
    ip.run_line_magic("offload_disconnect", "")
    with pytest.raises(UsageError, match="not connected: run %offload_connect TOKEN"):
        ip.run_cell_magic("offload", "", "x = 1")
    monkeypatch.delenv("REMOTE_MAGIC_TOKEN")
    with pytest.raises(UsageError, match="needs the token"):
        ip.run_line_magic("offload_connect", "")
    with pytest.raises(UsageError, match="not a remote-magic token"):
        ip.run_line_magic("offload_connect", "garbage")


def test_every_magic_has_help(ip: InteractiveShell) -> None:
    magics = ip.magics_manager.magics
    for kind, name, words in [("line", "offload_connect", "TOKEN"), ("cell", "offload", "--worker"),
                              ("line", "offload_workers", "table"), ("line", "offload_disconnect", "Disconnect"),
                              ("cell", "offload_kernel", "WGSL"), ("line", "offload_serve", "--join"),
                              ("line", "offload_reset", "fresh interpreter"), ("line", "offload_get", "--force"),
                              ("line", "offload_put", "progress bar")]:
        assert words in (magics[kind][name].__doc__ or ""), name


def test_offload_serve_hosts_a_hub_that_workers_join(tmp_path, monkeypatch) -> None:
    from support import start_worker, wait_for

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "remote_magic")
    try:
        with capture_output() as out:
            shell.run_line_magic("offload_serve", "--listen 127.0.0.1:0 --advertise tcp://127.0.0.1:45999")
        command = next(line.strip() for line in out.stdout.splitlines() if "remote-worker --join" in line)
        token = command.split()[0].removeprefix("REMOTE_MAGIC_JOIN_TOKEN=")
        advertised = Token.decode(token)
        assert advertised.role.value == "worker" and advertised.address == "tcp://127.0.0.1:45999"
        served = shell.magics_manager.registry["ConnectionMagics"].connection.served
        real = advertised.with_address(f"tcp://127.0.0.1:{served.hub.port}").encode()  # no forwarder here
        joined = start_worker(tmp_path, "--join", "--gpu", "off", "--name", "dialed-in", token_file=False,
                              env={"REMOTE_MAGIC_JOIN_TOKEN": real})
        try:
            wait_for(lambda: "dialed-in" in repr(shell.run_line_magic("offload_workers", "")), 20, "the worker")
            shell.user_ns["a"] = np.arange(4.0)
            result, _ = run(shell, "%%offload --worker dialed-in\nc = a * 2")
            assert result.success, result.error_in_exec
            np.testing.assert_array_equal(shell.user_ns["c"], np.arange(4.0) * 2)
        finally:
            joined.stop()
        with pytest.raises(UsageError, match="is not an address like tcp://HOST:PORT"):
            shell.run_line_magic("offload_serve", "--advertise nowhere")
    finally:
        shell.run_line_magic("unload_ext", "remote_magic")
        for name in ("a", "c"):
            shell.user_ns.pop(name, None)


def test_timeouts_on_the_magics_line(ip: InteractiveShell, worker: WorkerProcess) -> None:
    result, out = run(ip, f"%offload_connect {worker.token} --timeout 5")
    assert result.success and "Connected to" in out.stdout
    result, out = run(ip, "%%offload --timeout 1\nimport time\ntime.sleep(60)\nslept = True")
    assert isinstance(result.error_in_exec, JobTimeout) and "1 s timeout" in str(result.error_in_exec)
    assert "slept" not in ip.user_ns


def test_the_settings_are_one_configurable_every_magic_reads(ip: InteractiveShell) -> None:
    """``%config OffloadMagics`` lists and sets them, as for any IPython configurable."""
    run(ip, "%config OffloadMagics.default_timeout = 1")
    try:
        assert ip.run_line_magic("config", "OffloadMagics.default_timeout") == 1
        result, out = run(ip, "%config OffloadMagics")
        assert "default_timeout" in out.stdout and "connect_timeout" in out.stdout
        result, _ = run(ip, "%%offload\nimport time\ntime.sleep(60)\nslept = True")
        assert isinstance(result.error_in_exec, JobTimeout) and "1 s timeout" in str(result.error_in_exec)
        assert "slept" not in ip.user_ns
    finally:  # the shell is the process's one: the setting would reach every later test's extension
        run(ip, "%config OffloadMagics.default_timeout = None")
    assert ip.run_line_magic("config", "OffloadMagics.default_timeout") is None


def test_ipython_help_finds_every_magic_with_one_percent_or_two_and_names_no_repository_path(
        ip: InteractiveShell) -> None:
    magics = ip.magics_manager.magics
    asked = [f"%{name}?" for name in magics["line"] if name.startswith("offload")]
    asked += [f"%%{name}?" for name in magics["cell"] if name.startswith("offload")]
    assert {"%offload?", "%%offload?", "%offload_kernel?", "%%offload_kernel?", "%offload_connect?"} <= set(asked)
    for question in asked:
        result, out = run(ip, question)
        assert result.success and "not found" not in out.stdout, (question, out.stdout)
        assert "Docstring:" in out.stdout and "docs/" not in out.stdout, (question, out.stdout)
    # %offload on a line (one %) says where it goes, rather than running nothing.
    with pytest.raises(UsageError, match="put %%offload \\(two %\\) on the cell's first line"):
        ip.run_line_magic("offload", "--gpu")


def test_unloading_the_extension_removes_every_magic_it_added() -> None:
    from remote_magic.notebook.magics import MAGICS_CLASSES

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "remote_magic")
    ours = {kind: {name for magics in MAGICS_CLASSES for name in magics.magics[kind]} for kind in ("line", "cell")}
    assert len(ours["line"]) + len(ours["cell"]) == 14  # %offload and %offload_kernel are both, for `%offload?`
    assert "offload_pull" in ours["line"] and ours["line"] <= set(shell.magics_manager.magics["line"])
    shell.run_line_magic("unload_ext", "remote_magic")
    assert not any(ours[kind] & set(shell.magics_manager.magics[kind]) for kind in ours)
    assert not any(type(c).__name__ == "OffloadMagics" for c in shell.configurables)
