"""A transfer budget (issue 11, item 6): `%offload_connect --max-transfer SIZE` bounds what a notebook sends
and receives over its connection (a tunnel's monthly cap). A cell that would send more than is left is
stopped before anything is sent; results that would pass it stay on the worker as handles, saying why;
`%offload_workers` and `--stats` show the bytes."""

from __future__ import annotations

import numpy as np
import pytest
from IPython.core.error import UsageError

import remote_magic
from remote_magic import OverBudget, RemoteValue
from support import WorkerProcess, connected_shell, run

MB = 10**6


def _sent_to_worker(client: remote_magic.Client) -> int:
    return int(next(w for w in client.workers() if w["name"] == "shared")["bytes_in"])


def test_a_budget_stops_what_would_pass_it_and_says_what_crossed(worker: WorkerProcess) -> None:
    with connected_shell(f"{worker.token} --max-transfer 3M") as (shell, printed), \
            remote_magic.connect(worker.token) as observer:
        assert "Connected to" in printed
        shell.user_ns["x"] = np.random.default_rng(0).random(500_000)  # 4 MB: more than the budget
        before = _sent_to_worker(observer)
        result, out = run(shell, "%%offload\ntotal = float(x.sum())")
        assert isinstance(result.error_in_exec, OverBudget) and "total" not in shell.user_ns
        assert "this job would send 4.0 MB, more than the 3.0 MB left" in str(result.error_in_exec)
        assert _sent_to_worker(observer) == before  # nothing went

        result, out = run(shell, "%%offload --stats\nimport numpy as np\nbig = np.ones(500_000)\nsmall = 7")
        assert result.success, out.stderr
        assert shell.user_ns["small"] == 7
        big = shell.user_ns["big"]
        assert isinstance(big, RemoteValue) and "over this notebook's transfer budget" in big.why
        assert "over the link: sent" in out.stderr

        table = repr(shell.run_line_magic("offload_workers", ""))
        client = shell.magics_manager.registry["ConnectionMagics"].connection.client
        sent, received = client.bytes_sent, client.bytes_received
        assert 0 < sent + received < 1 * MB
        assert "This notebook sent" in table and "left of its 3.0 MB budget" in table


def test_a_malformed_budget_is_refused_saying_what_a_size_looks_like(worker: WorkerProcess) -> None:
    with pytest.raises(UsageError, match="--max-transfer: 'lots' is not a size like 512MB, 2GB or 2GiB"):
        with connected_shell(f"{worker.token} --max-transfer lots"):
            pass
