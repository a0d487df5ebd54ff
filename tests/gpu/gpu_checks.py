"""Comparisons for GPU tests: relative error against a float64 reference, special values."""

from __future__ import annotations

import numpy as np

ELEMENTWISE_TOL = 1e-5
"""‖out − ref‖/‖ref‖ allowed for elementwise kernels, reductions, softmax and transpose."""
MATMUL_TOL = 1e-4
"""‖out − ref‖/‖ref‖ allowed for matmul."""


def rel_err(out: object, ref: object) -> float:
    """‖out − ref‖ / ‖ref‖ in float64 (0 when both are empty or zero)."""
    out64 = np.asarray(out, dtype=np.float64)
    ref64 = np.asarray(ref, dtype=np.float64)
    assert out64.shape == ref64.shape, f"shape {out64.shape} != {ref64.shape}"
    denom = np.linalg.norm(ref64)
    num = np.linalg.norm(out64 - ref64)
    return float(num / denom) if denom else float(num)


def same_specials(out: object, ref: object) -> None:
    """NaN where the reference has NaN, equal infinities where it has infinities."""
    out_a, ref_a = np.asarray(out), np.asarray(ref)
    np.testing.assert_array_equal(np.isnan(out_a), np.isnan(ref_a))
    inf = np.isinf(ref_a)
    np.testing.assert_array_equal(out_a[inf], ref_a[inf])
