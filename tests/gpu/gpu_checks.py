"""Helpers for GPU tests: making a runtime, relative error against a float64 reference, specials."""

from __future__ import annotations

import os

import numpy as np
import pytest

from remote_magic.errors import GpuError
from remote_magic.worker.gpu import GpuRuntime

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


def make_runtime(**options: object) -> GpuRuntime:
    """A runtime in mode 'on'; skips (or fails under REMOTE_MAGIC_REQUIRE_GPU=1) without an adapter."""
    try:
        return GpuRuntime.create(mode="on", **options)  # type: ignore[arg-type]
    except GpuError as exc:
        if os.environ.get("REMOTE_MAGIC_REQUIRE_GPU") == "1":
            pytest.fail(f"REMOTE_MAGIC_REQUIRE_GPU=1 but no GPU adapter: {exc}")
        pytest.skip(f"no GPU adapter: {exc}")
