"""Split and gather without a fleet: piece sizes by speed, what can be cut and joined, and the plan's errors."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, strategies as st

from remote_magic import GatherError, SplitError
from remote_magic.split_gather import concatenate, cut, length, piece_sizes, plan


def test_pieces_are_in_proportion_to_speed() -> None:
    assert piece_sizes(100, [10.0, 30.0]) == [25, 75]
    assert piece_sizes(90, [1.0, 2.0, 3.0]) == [15, 30, 45]
    assert piece_sizes(10, [2.0, 1.0, 1.0]) == [5, 3, 2]  # 5, 2.5, 2.5: the remainder to the earlier one


def test_pieces_are_equal_when_a_speed_is_missing() -> None:
    assert piece_sizes(10, [None, 40.0, 20.0]) == [4, 3, 3]
    assert piece_sizes(9, [0.0, 1.0, 1.0]) == [3, 3, 3]
    assert piece_sizes(0, [1.0, 2.0]) == [0, 0]


def test_a_slow_worker_still_gets_one_item() -> None:
    assert piece_sizes(3, [1000.0, 1.0, 1.0]) == [1, 1, 1]
    assert piece_sizes(10, [1000.0, 1.0]) == [9, 1]


@given(st.integers(0, 500), st.lists(st.one_of(st.none(), st.floats(0.1, 1000)), min_size=1, max_size=8))
def test_pieces_cover_every_item_once(total: int, speeds: list[float | None]) -> None:
    sizes = piece_sizes(total, speeds)
    assert sum(sizes) == total and len(sizes) == len(speeds) and min(sizes) >= 0
    if total >= len(speeds):
        assert min(sizes) >= 1


def test_what_can_be_cut_along_axis_0() -> None:
    frame = pd.DataFrame({"a": range(5)}, index=list("vwxyz"))
    assert [length(n, v) for n, v in (("a", np.zeros((5, 2))), ("l", [1, 2]), ("t", (1,)), ("f", frame),
                                      ("s", frame["a"]))] == [5, 2, 1, 5, 5]
    assert cut(np.arange(10).reshape(5, 2), range(1, 3)).tolist() == [[2, 3], [4, 5]]
    assert list(cut(frame, range(3, 5)).index) == ["y", "z"]  # by position, keeping the index
    with pytest.raises(SplitError, match=r"`d` is a dict, which can't be split: --split cuts numpy arrays"):
        length("d", {"a": 1})
    with pytest.raises(SplitError, match="0-d array"):
        length("z", np.array(1.0))


def test_what_can_be_joined_along_axis_0() -> None:
    assert concatenate("y", [np.arange(2), np.arange(3)]).tolist() == [0, 1, 0, 1, 2]
    assert concatenate("y", [[1], [2, 3]]) == [1, 2, 3] and concatenate("y", [(1,), (2,)]) == (1, 2)
    frame = pd.DataFrame({"a": range(4)})
    pd.testing.assert_frame_equal(concatenate("f", [frame.iloc[:1], frame.iloc[1:]]), frame)
    with pytest.raises(GatherError, match=r"`y` can't be concatenated: the pieces gave float, list.*leave `y` out"):
        concatenate("y", [[1.0], 2.0])
    with pytest.raises(GatherError, match=r"`y`'s pieces can't be concatenated along axis 0 .*\(2, 2\), \(2, 3\)"):
        concatenate("y", [np.zeros((2, 2)), np.zeros((2, 3))])


WORKERS = [{"name": "a", "speed": 10.0}, {"name": "b", "speed": 30.0}, {"name": "c", "speed": 20.0}]


def test_a_plan_gives_each_worker_its_rows_in_order() -> None:
    chosen = plan({"X": np.arange(12), "L": list(range(12)), "w": 2}, ["X", "L"], WORKERS)
    assert chosen.pieces == {"a": range(0, 2), "b": range(2, 8), "c": range(8, 12)} and chosen.notes == []
    assert chosen.inputs_for["b"]["X"].tolist() == list(range(2, 8)) and chosen.inputs_for["c"]["L"] == [8, 9, 10, 11]
    assert all("w" not in inputs for inputs in chosen.inputs_for.values())


def test_an_input_shorter_than_the_workers_runs_on_the_fastest_few() -> None:
    chosen = plan({"X": [1, 2]}, ["X"], WORKERS)
    assert chosen.pieces == {"b": range(0, 1), "c": range(1, 2)}
    assert chosen.notes == ["`X` has 2 items, fewer than the 3 workers: the cell runs on 2 ('b', 'c'); 'a' gets "
                            "no piece"]
    assert plan({"X": []}, ["X"], WORKERS).pieces == {"b": range(0, 0)}


def test_a_plan_refuses_what_it_cannot_split() -> None:
    with pytest.raises(SplitError, match=r"differ in length along axis 0 \(`X` has 3, `y` has 2\)"):
        plan({"X": [1, 2, 3], "y": [1, 2]}, ["X", "y"], WORKERS)
    with pytest.raises(SplitError, match=r"`Q` is not among the inputs \(X\)"):
        plan({"X": [1]}, ["Q"], WORKERS)
    with pytest.raises(SplitError, match="`n` is a int"):
        plan({"n": 3}, ["n"], WORKERS)
