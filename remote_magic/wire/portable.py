"""pandas objects in a form any pandas release loads, for when the two sides' pandas differ.

A DataFrame pickled by pandas 3 doesn't load under pandas 2.2 (Colab's pin), and the reverse
is not promised either: pickles hold pandas' internals (blocks, dtype constructors). When the
versions differ, a DataFrame, Series or Index travels as numpy arrays and dtype names instead,
and is rebuilt by the receiver's own pandas, as that pandas would have built it from the same
data (a pandas 3 ``str`` column becomes pandas 2's ``object`` column of strings, and back).

What this form leaves out: a DatetimeIndex's ``freq``, and subclasses of these types (which
travel as pickles, as everything does when the versions match).
"""

from __future__ import annotations

import sys
from typing import Any

Encoded = tuple[Any, ...]


def reduce(obj: Any) -> tuple[Any, tuple[Encoded]] | None:
    """A pickle reduction of a pandas DataFrame, Series or Index, or None for anything else."""
    pd = sys.modules.get("pandas")
    if pd is None:
        return None
    kind = type(obj)
    if kind is pd.DataFrame:
        columns = [_encode_column(obj.iloc[:, i]) for i in range(obj.shape[1])]
        return rebuild, (("frame", columns, _encode_index(obj.columns), _encode_index(obj.index),
                          dict(obj.attrs)),)
    if kind is pd.Series:
        return rebuild, (("series", _encode_column(obj), _encode_index(obj.index), obj.name, dict(obj.attrs)),)
    if isinstance(obj, pd.Index) and kind.__module__.startswith("pandas."):
        return rebuild, (("index", _encode_index(obj)),)
    return None


def _encode_column(series: Any) -> Encoded:
    import numpy as np
    import pandas as pd

    dtype = series.dtype
    if isinstance(dtype, np.dtype):
        return ("numpy", series.to_numpy())
    if isinstance(dtype, pd.CategoricalDtype):
        return ("category", series.cat.codes.to_numpy(), _encode_index(dtype.categories), bool(dtype.ordered))
    if isinstance(dtype, pd.DatetimeTZDtype):
        utc = series.dt.tz_convert("UTC").dt.tz_localize(None)
        return ("datetime_tz", utc.to_numpy(), str(dtype.tz))
    values = series.to_numpy(dtype=object, na_value=None)
    if isinstance(dtype, pd.StringDtype) and dtype.na_value is not pd.NA:
        return ("inferred_strings", values)  # pandas 3's default `str`: what pandas infers for strings
    return ("extension", values, str(dtype))


def _encode_index(index: Any) -> Encoded:
    import pandas as pd

    if type(index) is pd.RangeIndex:
        return ("range", index.start, index.stop, index.step, index.name)
    if isinstance(index, pd.MultiIndex):
        return ("multi", [_encode_index(level) for level in index.levels],
                [codes.copy() for codes in index.codes], list(index.names))
    return ("values", _encode_column(pd.Series(index, copy=False)), index.name)


def rebuild(encoded: Encoded) -> Any:
    """The pandas object ``encoded`` stands for, built by this side's pandas."""
    import pandas as pd

    kind = encoded[0]
    if kind == "frame":
        _, columns, names, index, attrs = encoded
        frame = pd.DataFrame({i: _decode_column(column) for i, column in enumerate(columns)})
        frame.columns, frame.index = _decode_index(names), _decode_index(index)
        frame.attrs.update(attrs)
        return frame
    if kind == "series":
        _, column, index, name, attrs = encoded
        series = _decode_column(column)
        series.index, series.name = _decode_index(index), name
        series.attrs.update(attrs)
        return series
    return _decode_index(encoded[1])


def _decode_column(column: Encoded) -> Any:
    import numpy as np
    import pandas as pd

    kind = column[0]
    if kind == "numpy":
        return pd.Series(column[1], copy=False)
    if kind == "category":
        _, codes, categories, ordered = column
        return pd.Series(pd.Categorical.from_codes(codes, _decode_index(categories), ordered=ordered))
    if kind == "datetime_tz":
        _, values, tz = column
        return pd.Series(values).dt.tz_localize("UTC").dt.tz_convert(tz)
    if kind == "inferred_strings":
        return pd.Series([np.nan if v is None else v for v in column[1]])
    return pd.Series(column[1], dtype=object).astype(column[2])


def _decode_index(index: Encoded) -> Any:
    import pandas as pd

    kind = index[0]
    if kind == "range":
        _, start, stop, step, name = index
        return pd.RangeIndex(start, stop, step, name=name)
    if kind == "multi":
        _, levels, codes, names = index
        return pd.MultiIndex(levels=[_decode_index(level) for level in levels], codes=codes, names=names)
    _, column, name = index
    return pd.Index(_decode_column(column), name=name)
