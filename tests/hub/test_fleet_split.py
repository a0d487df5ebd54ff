"""Split and gather on a real fleet: a hub worker and two joined worker processes, the client API and
%%offload --split / --gather in a real IPython shell."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import test_fleet_run
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from test_fleet_run import NAMES

import remote_magic
from remote_magic import FleetError, GatherError, SplitError
from remote_magic.split_gather import piece_sizes
from support import run

# Its fleet (a hub worker and two joined ones) and the client and shell on it, started once for this module.
three, fleet_client, fleet_shell = test_fleet_run.three, test_fleet_run.fleet_client, test_fleet_run.fleet_shell

# Each piece says where it ran and what it got, so the test can check the rows each worker saw.
CELL = """
import os
where = os.environ['REMOTE_MAGIC_HOME']
Y = X * w + 1
M = [s.upper() for s in L]
first, rows = L[0], len(X)
"""


def test_split_of_an_array_and_a_list_gathers_what_a_local_run_gives(fleet_client: remote_magic.Client) -> None:
    X, L, w = np.arange(30.0).reshape(10, 3), [f"s{i}" for i in range(10)], np.array([1.0, 2.0, 3.0])
    result = fleet_client.split(CELL, {"X": X, "L": L, "w": w}, split=["X", "L"], gather=["Y", "M"])
    np.testing.assert_array_equal(result.gathered["Y"], X * w + 1)
    assert result.gathered["M"] == [s.upper() for s in L]
    # The pieces cover the rows once, in order, sized by the speeds the workers report.
    speeds = {w["name"]: w.get("speed") for w in fleet_client.workers()}
    assert list(result.results) == list(result.pieces) == NAMES
    assert [len(rows) for rows in result.pieces.values()] == piece_sizes(10, [speeds[n] for n in NAMES])
    assert [i for rows in result.pieces.values() for i in rows] == list(range(10))
    for name, rows in result.pieces.items():
        values = result.results[name].values
        assert f"/{name}/" in values["where"]
        assert (values["first"], values["rows"]) == (L[rows.start], len(rows))
        assert "Y" in values and "X" not in values  # the inputs were read, not changed: they don't come back


def test_split_of_a_dataframe_gathers_with_pd_concat(fleet_client: remote_magic.Client) -> None:
    frame = pd.DataFrame({"a": range(7), "b": np.linspace(0, 1, 7)}, index=[f"r{i}" for i in range(7)])
    code = "out = df.assign(c=df.a * df.b)\ntotal = out.c\n"
    result = fleet_client.split(code, {"df": frame}, split="df", gather="out,total", workers=["third", "home"])
    local = frame.assign(c=frame.a * frame.b)
    pd.testing.assert_frame_equal(result.gathered["out"], local)
    pd.testing.assert_series_equal(result.gathered["total"], local.c)
    assert list(result.pieces) == ["third", "home"]


def test_split_refuses_inputs_it_cannot_cut_before_anything_runs(fleet_client: remote_magic.Client) -> None:
    before = sum(w["jobs_done"] for w in fleet_client.workers())
    with pytest.raises(SplitError, match=r"differ in length along axis 0 \(`X` has 3, `y` has 2\)"):
        fleet_client.split("z = 1", {"X": [1, 2, 3], "y": [1, 2]}, split=["X", "y"])
    with pytest.raises(SplitError, match=r"`d` is a dict, which can't be split"):
        fleet_client.split("z = 1", {"d": {"a": 1}}, split=["d"])
    with pytest.raises(remote_magic.NoSuchWorker, match="no worker named 'nobody'"):
        fleet_client.split("z = 1", {"X": [1, 2]}, split=["X"], workers=["home", "nobody"])
    assert sum(w["jobs_done"] for w in fleet_client.workers()) == before


def test_an_input_shorter_than_the_workers_runs_on_fewer(fleet_client: remote_magic.Client) -> None:
    result = fleet_client.split("y = [v * 2 for v in X]", {"X": [5, 6]}, split="X", gather="y")
    assert result.gathered["y"] == [10, 12] and len(result.pieces) == 2
    assert "`X` has 2 items, fewer than the 3 workers: the cell runs on 2" in result.notes[0]


def test_a_value_that_cannot_be_concatenated_is_a_gather_error_with_every_result(
        fleet_client: remote_magic.Client) -> None:
    with pytest.raises(GatherError, match=r"`s` can't be concatenated: the pieces gave int.*leave `s` out") as caught:
        fleet_client.split("s = sum(X)", {"X": list(range(9))}, split="X", gather="s")
    assert sum(r.values["s"] for r in caught.value.results.values()) == sum(range(9))
    with pytest.raises(GatherError, match=r"`t` was not assigned by the cell on 'joiner' \(rows \d+-\d+\)"):
        fleet_client.split("import os\nif '/joiner/' not in os.environ['REMOTE_MAGIC_HOME']: t = X",
                           {"X": list(range(9))}, split="X", gather="t")


JOINER_FAILS = ("import os\nzero = '/joiner/' in os.environ['REMOTE_MAGIC_HOME']\n"
                "y = [1 / (0 if zero else v) for v in X]")
"""A cell whose piece fails on the worker 'joiner' only (the pieces' sizes depend on measured speeds)."""


def test_one_piece_failing_is_a_fleet_error_and_nothing_is_gathered(fleet_client: remote_magic.Client) -> None:
    with pytest.raises(FleetError, match=r"failed on 1 of 3 workers: 'joiner': ZeroDivisionError.*Nothing was "
                                         r"gathered \(y\)") as caught:
        fleet_client.split(JOINER_FAILS, {"X": [1, 2, 3, 4, 5, 6]}, split="X", gather="y", workers=NAMES)
    assert sorted(caught.value.results) == ["home", "third"]


def test_offload_split_binds_gathered_names_and_others_per_worker(fleet_shell: InteractiveShell) -> None:
    ns = fleet_shell.user_ns
    ns.update(X=np.arange(24.0).reshape(12, 2), L=[f"s{i}" for i in range(12)], w=np.array([2.0, 3.0]))
    result, out = run(fleet_shell, "%%offload --split X,L --gather Y,M\n" + CELL + "rows\n")
    assert result.success, result.error_in_exec
    np.testing.assert_array_equal(ns["Y"], ns["X"] * ns["w"] + 1)
    assert ns["M"] == [s.upper() for s in ns["L"]]
    assert sorted(ns["rows"]) == sorted(NAMES) and sum(ns["rows"].values()) == 12
    assert result.result == ns["rows"]
    assert isinstance(ns["X"], np.ndarray) and ns["X"].shape == (12, 2)  # the notebook's input stays whole
    result, _ = run(fleet_shell, "%%offload --split X --workers joiner,third --gather Z\nZ = X.sum(axis=1)")
    assert result.success and ns["Z"].tolist() == ns["X"].sum(axis=1).tolist()


@pytest.mark.parametrize("line, cell, why", [
    ("--gather y", "y = X", "--gather concatenates the pieces of a --split"),
    ("--split X --worker home", "y = X", "--split runs the cell on several workers, --worker on one"),
    ("--split X --retries 1", "y = X", "--retries, --require and --prefer don't apply"),
    ("--split Q", "y = X", "`Q` is not defined in the notebook"),
    ("--split X", "y = 1", "the cell doesn't read `X`"),
    ("--split X,short", "y = X, short", "differ in length along axis 0 (`X` has 12, `short` has 2)"),
    ("--split n", "y = n", "`n` is a int, which can't be split"),
    ("--split X --workers home,nobody", "y = X", "no worker named 'nobody'"),
])
def test_offload_split_mistakes_are_usage_errors(fleet_shell: InteractiveShell, line: str, cell: str,
                                                 why: str) -> None:
    fleet_shell.user_ns.update(X=list(range(12)), short=[1, 2], n=3)
    result, _ = run(fleet_shell, f"%%offload {line}\n{cell}")
    assert isinstance(result.error_in_exec, UsageError), result.error_in_exec
    assert why in str(result.error_in_exec) and "y" not in fleet_shell.user_ns


def test_offload_split_failure_gathers_nothing_and_keeps_the_others(fleet_shell: InteractiveShell) -> None:
    ns = fleet_shell.user_ns
    ns.update(X=[1, 2, 3, 4, 5, 6], y="before")
    result, _ = run(fleet_shell, "%%offload --split X --gather y\nn = len(X)\n" + JOINER_FAILS)
    assert isinstance(result.error_in_exec, FleetError) and "Nothing was gathered (y)" in str(result.error_in_exec)
    assert ns["y"] == "before"  # not gathered, not replaced by a partial {worker: value}
    assert sorted(ns["n"]) == NAMES and sum(ns["n"].values()) == 6  # what the pieces did stays done, as with --all
    result, out = run(fleet_shell, "%%offload --split X --gather s\ns = sum(X)")
    assert isinstance(result.error_in_exec, GatherError)
    assert sum(ns["s"].values()) == 21 and "nothing was gathered" in out.stderr
