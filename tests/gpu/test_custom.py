"""Custom WGSL kernels: the binding convention, params, several outputs, compile errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gpu_checks import ELEMENTWISE_TOL, assert_within_ulps_of_terms, rel_err

from remote_magic.errors import GpuError, ShaderError
from remote_magic.worker.gpu import DeviceArray, GpuRuntime

pytestmark = pytest.mark.gpu

SCALE_SHIFT = (Path(__file__).parents[2] / "examples" / "scale_shift.wgsl").read_text()  # the docs example

SUM_AND_DIFF = """\
@binding(0) @group(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> total: array<f32>;
@group(0) @binding(3) var<storage, read_write> diff: array<f32>;

@compute @workgroup_size(32, 1, 1)
fn pairwise(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i < arrayLength(&total)) {
        total[i] = a[i] + b[i];
        diff[i] = a[i] - b[i];
    }
}
"""

BROKEN = """\
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    y[gid.x] = x[gid.x] * undefined_name;
}
"""


def test_custom_kernel_with_params(runtime: GpuRuntime, gpu: Any, rng: np.random.Generator) -> None:
    runtime.register_kernel("scale_shift", SCALE_SHIFT)
    x = rng.standard_normal((37, 11)).astype(np.float32)
    out = gpu.scale_shift(x, params=[2.5, -1.0])
    assert isinstance(out, DeviceArray) and out.shape == x.shape
    assert rel_err(np.asarray(out), x.astype(np.float64) * 2.5 - 1.0) < ELEMENTWISE_TOL
    chained = gpu.scale_shift(out + 1, params=[1.0, 0.0], out_shape=(37 * 11,))  # results compose
    assert chained.shape == (407,)
    assert rel_err(np.asarray(chained), (x.astype(np.float64) * 2.5).ravel()) < ELEMENTWISE_TOL
    assert runtime.take_stats()["kernels"]["scale_shift"] == 2
    assert "scale_shift" in gpu.kernels and "scale_shift" in dir(gpu)


def test_two_inputs_two_outputs_and_explicit_workgroups(runtime: GpuRuntime, gpu: Any,
                                                        rng: np.random.Generator) -> None:
    runtime.register_kernel("sum_and_diff", SUM_AND_DIFF)
    a, b = rng.standard_normal(100).astype(np.float32), rng.standard_normal(100).astype(np.float32)
    total, diff = gpu.sum_and_diff(a, b, out_shape=[(100,), (100,)])
    assert_within_ulps_of_terms(np.asarray(total), a.astype(np.float64) + b, np.abs(a) + np.abs(b))
    assert_within_ulps_of_terms(np.asarray(diff), a.astype(np.float64) - b, np.abs(a) + np.abs(b))
    half, _ = gpu.sum_and_diff(a, b, out_shape=[(100,), (100,)], workgroups=(2,))  # 64 invocations
    assert_within_ulps_of_terms(np.asarray(half)[:64], (a.astype(np.float64) + b)[:64], (np.abs(a) + np.abs(b))[:64])
    np.testing.assert_array_equal(np.asarray(half)[64:], 0.0)  # outputs start zero-filled


def test_compile_error_points_at_line_and_column(runtime: GpuRuntime) -> None:
    with pytest.raises(ShaderError) as info:
        runtime.register_kernel("broken", BROKEN)
    assert (info.value.line, info.value.column) == (6, 27)
    assert "undefined_name" in str(info.value) and "line 6, column 27" in str(info.value)
    assert "broken" not in runtime.custom_kernels


def test_convention_violations_are_shader_errors(runtime: GpuRuntime) -> None:
    outputs_first = SUM_AND_DIFF.replace("var<storage, read> b", "var<storage, read_write> b").replace(
        "@binding(2) var<storage, read_write> total", "@binding(2) var<storage, read> total")
    with pytest.raises(ShaderError, match="inputs .* first") as info:
        runtime.register_kernel("misordered", outputs_first)
    assert info.value.line == 1
    gap = SCALE_SHIFT.replace("@binding(2)", "@binding(5)")
    with pytest.raises(ShaderError, match="without gaps") as info:
        runtime.register_kernel("gap", gap)
    assert info.value.line == 6


def test_calls_that_break_the_convention(runtime: GpuRuntime, gpu: Any) -> None:
    runtime.register_kernel("scale_shift", SCALE_SHIFT)
    x = np.ones(8, np.float32)
    with pytest.raises(GpuError, match="declares 1 input"):
        gpu.scale_shift(x, x, params=[1.0, 0.0])
    with pytest.raises(GpuError, match="pass params"):
        gpu.scale_shift(x)
    with pytest.raises(GpuError, match="built-in"):
        runtime.register_kernel("matmul", SCALE_SHIFT)
    with pytest.raises(GpuError, match="identifier"):
        runtime.register_kernel("not-a-name", SCALE_SHIFT)
    with pytest.raises(AttributeError, match="no kernel 'nope'"):
        gpu.nope(x)
