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
DOUBLING_WGSL = """
    @group(0) @binding(0) var<storage, read> x: array<f32>;
    @group(0) @binding(1) var<storage, read_write> y: array<f32>;
    @compute @workgroup_size(64)
    fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
        if (gid.x < arrayLength(&y)) { y[gid.x] = 2.0 * x[gid.x]; }
    }"""
"""A custom kernel, ``y = 2 * x``, for tests of what happens around a kernel rather than in it."""
FLOAT32_EPS = float(np.finfo(np.float32).eps)
"""One float32 ulp at 1.0 (2**-23)."""


def assert_within_ulps_of_terms(out: object, ref: object, terms: object, ulps: float = 2) -> None:
    """Each value of ``out`` within ``ulps`` float32 ulps of the magnitude of the terms that made it.

    A GPU may fuse ``a * x + b`` into one rounding where numpy rounds twice, or add in another
    order: the two differ by an ulp of the terms (``|a * x| + |b|``), which near a zero result is
    many of the result's own ulps. A wrong result is off by far more.
    """
    out64, ref64 = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    bound = ulps * FLOAT32_EPS * np.asarray(terms, np.float64)
    bad = np.abs(out64 - ref64) > bound
    assert not bad.any(), (f"{int(bad.sum())} of {bad.size} values differ by more than {ulps} ulps of their terms; "
                           f"first at {np.argwhere(bad)[0].tolist()}: {out64[bad][0]!r} != {ref64[bad][0]!r}")


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
