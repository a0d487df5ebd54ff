"""Results that stay where they are when asked (issue 11, item 4): `%%offload --keep NAME` leaves values on
the worker as handles that show type and size, later offloaded cells use them in place without sending
them again, and `%offload_pull NAME` brings one back."""

from __future__ import annotations

import numpy as np
import pytest
from IPython.core.interactiveshell import InteractiveShell

import remote_magic
from remote_magic import OutputError, RemoteValue
from support import WorkerProcess, run


def _bytes_sent_to(client: remote_magic.Client, worker: str) -> int:
    return int(next(w for w in client.workers() if w["name"] == worker)["bytes_in"])


def test_kept_values_stay_on_the_worker_are_used_in_place_and_come_back_when_pulled(
        ip: InteractiveShell, worker: WorkerProcess) -> None:
    result, out = run(ip, "%%offload --keep big,table\nimport numpy as np\nbig = np.arange(1_000_000.0)\n"
                          "table = {'a': big}\nhead = big[:3].copy()")
    assert result.success, out.stderr
    big = ip.user_ns["big"]
    assert isinstance(big, RemoteValue) and isinstance(ip.user_ns["table"], RemoteValue)
    assert big.summary == "float64 (1000000,), 8.0 MB" and ip.user_ns["table"].summary == "1 items"
    assert repr(big) == ("<ndarray float64 (1000000,), 8.0 MB on worker 'shared', not here: kept there, as asked "
                         "(--keep). Offloaded cells use `big` in place; %offload_pull big brings it here>")
    assert "`big` (ndarray float64 (1000000,), 8.0 MB: kept there, as asked (--keep))" in out.stderr
    np.testing.assert_array_equal(ip.user_ns["head"], [0.0, 1.0, 2.0])  # what wasn't named came back

    with remote_magic.connect(worker.token) as observer:
        before = _bytes_sent_to(observer, "shared")
        result, out = run(ip, "%%offload\ntotal = float(big.sum())\ntable['b'] = 1")
        sent = _bytes_sent_to(observer, "shared") - before
    assert result.success, out.stderr
    assert ip.user_ns["total"] == float(np.arange(1_000_000.0).sum())
    assert sent < 64 << 10, sent  # the handle crossed, not its 8 MB

    result, out = run(ip, "%offload_pull big table")
    assert result.success, out.stderr
    np.testing.assert_array_equal(ip.user_ns["big"], np.arange(1_000_000.0))
    assert set(ip.user_ns["table"]) == {"a", "b"}  # as the later cell left it there
    assert "Pulled `big` (float64 (1000000,), 8.0 MB) from worker 'shared'" in out.stdout


def test_pull_and_keep_refuse_what_they_cant_do_saying_why(ip: InteractiveShell) -> None:
    ip.user_ns["here"] = 1
    for line, said in [("%offload_pull nothing", "`nothing` isn't defined"),
                       ("%offload_pull here", "`here` is a int here already")]:
        result, out = run(ip, line)
        assert not result.success and said in str(result.error_in_exec) + out.stderr
    result, out = run(ip, "%%offload --all --keep x\nx = 1")
    assert not result.success and "--keep leaves values on the one worker" in str(result.error_in_exec)
    assert "x" not in ip.user_ns


def test_the_client_api_keeps_and_pulls(worker: WorkerProcess) -> None:
    with remote_magic.connect(worker.token) as client:
        result = client.execute("import threading\nlock = threading.Lock()\nmodel = [1, 2, 3]", keep=["model"])
        model, lock = result.kept_on_worker["model"], result.kept_on_worker["lock"]
        assert "kept there, as asked" in model.why and "can't be pickled" in lock.why
        assert client.pull(model) == [1, 2, 3]
        with pytest.raises(OutputError, match="lock"):
            client.pull(lock)
