"""pandas objects in their portable form (used when the two sides' pandas differ) come back equal.

Across pandas releases this runs in tests/notebook/test_colab.py (pandas 2.2.3 in the notebook, the newest on
the worker); here the same pandas rebuilds what it encoded, so the result must be exactly equal.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from remote_magic.wire import serialization


def _round_trip(value: object) -> object:
    packed = serialization.pack({"v": value}, portable_pandas=True)
    assert b"pandas.core.frame" not in bytes(packed.frames[0])  # not pandas' own pickle
    return serialization.unpack(packed.header(), packed.frames)["v"]


FRAME = pd.DataFrame({
    "float": [1.5, np.nan, 3.0],
    "int": np.array([1, 2, 3], dtype=np.int32),
    "text": ["a", None, "c"],
    "category": pd.Categorical(["u", "v", "u"], ordered=True),
    "nullable": pd.array([1, None, 3], dtype="Int64"),
    "flag": pd.array([True, None, False], dtype="boolean"),
    "when": pd.date_range("2024-01-01", periods=3, tz="Europe/Paris"),
    "naive": pd.date_range("2024-01-01", periods=3),
}, index=pd.Index(["x", "y", "z"], name="key"))


def test_a_frame_of_every_common_dtype_comes_back_equal() -> None:
    pd.testing.assert_frame_equal(_round_trip(FRAME), FRAME)


def test_multi_indexes_series_and_attrs_come_back() -> None:
    frame = FRAME[["float", "int"]].copy()
    frame.columns = pd.MultiIndex.from_tuples([("a", 1), ("b", 2)], names=["outer", "inner"])
    frame.attrs["source"] = "sensor"
    back = _round_trip(frame)
    pd.testing.assert_frame_equal(back, frame)
    assert back.attrs == {"source": "sensor"}
    series = pd.Series([3, 1, 2], index=pd.RangeIndex(10, 13), name="s")
    pd.testing.assert_series_equal(_round_trip(series), series)
    pd.testing.assert_index_equal(_round_trip(FRAME.index), FRAME.index)


@pytest.mark.parametrize("value", [{"nested": [FRAME["float"], FRAME.index]}, (FRAME, FRAME)])
def test_pandas_objects_inside_containers_travel_portably_too(value: object) -> None:
    back = _round_trip(value)
    if isinstance(value, dict):
        pd.testing.assert_series_equal(back["nested"][0], FRAME["float"])
    else:
        pd.testing.assert_frame_equal(back[1], FRAME)
        assert back[0] is back[1]  # one object sent twice stays one object
