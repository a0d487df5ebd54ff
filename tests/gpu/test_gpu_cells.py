"""GPU cells end to end: %%offload matmul, --stats, %%offload_kernel and the fleet table,
through a real remote-worker running WGSL on a real adapter (lavapipe without a GPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

import remote_magic
from remote_magic import GpuError, ShaderError
from support import WorkerProcess, connected_shell, require_a_gpu, start_worker

pytestmark = pytest.mark.gpu

GPU_MEMORY = "64MB"
"""The worker's budget for arrays kept on the GPU between cells (--gpu-memory)."""
SCALE_SHIFT = (Path(__file__).parents[2] / "examples" / "scale_shift.wgsl").read_text()  # the docs example


@pytest.fixture(scope="module")
def gpu_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    w = start_worker(tmp_path_factory.mktemp("gpu-worker"), "--listen", "127.0.0.1:0", "--gpu", "on",
                     "--name", "gpu", "--gpu-memory", GPU_MEMORY)
    require_a_gpu(w)
    yield w
    w.stop()


@pytest.fixture
def ip(gpu_worker: WorkerProcess) -> Iterator[InteractiveShell]:
    with connected_shell(gpu_worker.token) as (shell, _):
        yield shell


def _relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def _assert_within_ulps_of_terms(out: np.ndarray, ref: np.ndarray, terms: np.ndarray, ulps: float = 2) -> None:
    """Each value within ``ulps`` float32 ulps of its terms' magnitude: a GPU fuses ``a * x + b`` into one
    rounding where numpy rounds twice, which near a zero result is many of the result's own ulps."""
    bound = ulps * float(np.finfo(np.float32).eps) * np.asarray(terms, np.float64)
    bad = np.abs(np.asarray(out, np.float64) - ref) > bound
    assert not bad.any(), f"{int(bad.sum())} of {bad.size} values differ by more than {ulps} ulps of their terms"


def test_matmul_cell_runs_on_the_gpu_and_says_what_ran(ip: InteractiveShell) -> None:
    rng = np.random.default_rng()
    A, B = rng.standard_normal((70, 45)), rng.standard_normal((45, 33))  # not multiples of a tile
    ip.user_ns.update(A=A, B=B, np=np)  # the notebook imported numpy as np
    with capture_output() as out:
        result = ip.run_cell("%%offload matmul --stats\nC = A @ B\nH = np.maximum(C, 0).sum(axis=1)")
    assert result.success, result.error_in_exec
    C, H = ip.user_ns["C"], ip.user_ns["H"]
    assert type(C) is np.ndarray and C.dtype == np.float64  # numpy's dtype, computed in float32
    assert _relative_error(C, A @ B) < 1e-4
    assert type(H) is np.ndarray and H.dtype == np.float64
    assert _relative_error(H, np.maximum(A @ B, 0).sum(axis=1)) < 1e-4
    assert "remote-magic: A, B: the GPU computed float64 results from them in float32" in out.stderr
    assert "GPU kernels matmul×1; with numpy np.maximum×1, np.sum×1" in out.stderr  # --stats
    assert "already on the GPU 0 (not uploaded: 0 B)" in out.stderr  # fresh inputs: each was uploaded


def test_custom_kernel_compiles_runs_and_reports_errors_with_position(ip: InteractiveShell) -> None:
    with capture_output() as out:
        ip.run_cell_magic("offload_kernel", "scale_shift", SCALE_SHIFT)
    assert "kernel gpu.scale_shift compiled" in out.stdout
    X = np.linspace(-1, 1, 100_000, dtype=np.float32)
    ip.user_ns["X"] = X
    result = ip.run_cell("%%offload --gpu\nY = gpu.scale_shift(X, params=[2.5, -1.0])")
    assert result.success, result.error_in_exec
    _assert_within_ulps_of_terms(ip.user_ns["Y"], X.astype(np.float64) * 2.5 - 1.0, np.abs(X * 2.5) + 1.0)
    broken = SCALE_SHIFT.replace("x[i] * p.scale", "x[i] * p.scale * undefined_name")
    with pytest.raises(ShaderError) as info:
        ip.run_cell_magic("offload_kernel", "broken", broken)
    line = next(n for n, text in enumerate(broken.splitlines(), 1) if "undefined_name" in text)
    assert info.value.line == line and info.value.column is not None
    assert "undefined_name" in str(info.value)


def test_a_cell_the_gpu_fails_midway_keeps_what_it_did_before_as_a_local_cell_that_raised(
        ip: InteractiveShell) -> None:
    ip.user_ns.update(X=np.ones(1000, np.float32), kept=[0])
    with capture_output():
        ip.run_cell_magic("offload_kernel", "scale_shift", SCALE_SHIFT)
        result = ip.run_cell("%%offload --gpu\nkept[0] = 1\nfirst = X * 2\nY = gpu.scale_shift(X)\nafter = 3")
    assert isinstance(result.error_in_exec, GpuError), result.error_in_exec  # said as it is: `except GpuError`
    assert "pass params" in str(result.error_in_exec)  # (scale_shift's scale and shift)
    assert ip.user_ns["kept"] == [1] and "after" not in ip.user_ns and "Y" not in ip.user_ns
    np.testing.assert_array_equal(ip.user_ns["first"], np.full(1000, 2.0))


def test_the_fleet_table_shows_the_adapter_and_gpu_counters(ip: InteractiveShell) -> None:
    ip.user_ns.update(A=np.ones((16, 16), np.float32), B=np.ones((16, 16), np.float32))
    assert ip.run_cell("%%offload matmul\nC = A @ B").success
    table = ip.run_line_magic("offload_workers", "--all")
    [worker] = table.workers
    assert worker["gpu"]["active"] and worker["gpu"]["adapter"]
    assert worker["gpu"]["adapter"] in repr(table)
    assert worker["gpu"]["adapter_type"] in repr(table)


def test_client_api_takes_the_gpu_choice(gpu_worker: WorkerProcess) -> None:
    x = np.random.default_rng().standard_normal((8, 40)).astype(np.float32)
    with remote_magic.connect(gpu_worker.token) as client:
        result = client.execute("s = np.exp(x).sum(axis=1)\nimport numpy as np", {"x": x, "np": np}, ["s"],
                                gpu=True)
    np.testing.assert_allclose(result.values["s"], np.exp(x).sum(axis=1), rtol=1e-5)
    assert result.stats["kernels"].get("exp") == 1



def test_a_repeated_gpu_cell_finds_its_unchanged_inputs_on_the_gpu(gpu_worker: WorkerProcess) -> None:
    rng = np.random.default_rng()
    A = rng.standard_normal((128, 96)).astype(np.float32)
    B = rng.standard_normal((96, 64)).astype(np.float32)
    code = "C = A @ B"
    with remote_magic.connect(gpu_worker.token) as client:
        [info] = client.workers()
        assert info["gpu"]["gpu_memory"] == 64_000_000, "--gpu-memory reaches the executor"
        assert "arrays kept on it between cells, per notebook: 64.0 MB (--gpu-memory)" in gpu_worker.log()
        first = client.execute(code, {"A": A, "B": B}, ["C"], gpu=True)
        second = client.execute(code, {"A": A, "B": B}, ["C"], gpu=True)
        following = client.execute("s = float(C.sum())", {"C": second.values["C"]}, ["s"], gpu=True)
    assert first.stats["bytes_uploaded"] == A.nbytes + B.nbytes and first.stats["uploads"] == 2
    assert second.stats["bytes_uploaded"] == 0 and second.stats["uploads"] == 0, second.stats
    assert second.stats["resident_hits"] == 2 and second.stats["bytes_resident"] == A.nbytes + B.nbytes
    assert second.stats["readbacks"] == 1, "the result still comes back to the notebook"
    np.testing.assert_array_equal(second.values["C"], first.values["C"])
    assert following.stats["bytes_uploaded"] == 0 and following.stats["resident_hits"] == 1, \
        "the result read back stays on the GPU for the next cell that sends it"
    assert following.values["s"] == pytest.approx(float(first.values["C"].astype(np.float64).sum()), rel=1e-4, abs=1e-2)


def test_counting_and_order_kernels_in_a_cell(ip: InteractiveShell) -> None:
    """np.bincount, np.add.at (in place, on an array the cell made), np.median and np.unique in a --gpu cell:
    numpy's answers in the notebook, each run by its kernel."""
    rng = np.random.default_rng()
    labels = rng.integers(0, 10, 20_000)
    scores = rng.standard_normal(20_000).astype(np.float32)
    ip.user_ns.update(labels=labels, scores=scores, np=np)
    code = ("counts = np.bincount(labels)\ntotals = np.zeros(10, np.float32)\nnp.add.at(totals, labels, 1.0)\n"
            "middle = np.median(scores)\nkinds, seen = np.unique(labels, return_counts=True)")
    with capture_output() as out:
        result = ip.run_cell("%%offload --gpu --stats\n" + code)
    assert result.success, result.error_in_exec
    expected = np.bincount(labels)
    np.testing.assert_array_equal(ip.user_ns["counts"], expected)
    np.testing.assert_array_equal(ip.user_ns["totals"], expected.astype(np.float32))  # whole numbers: exact
    assert ip.user_ns["middle"] == np.median(scores) and type(ip.user_ns["middle"]) is np.float32
    np.testing.assert_array_equal(ip.user_ns["kinds"], np.arange(10))
    np.testing.assert_array_equal(ip.user_ns["seen"], expected)
    for kernel in ("bincount×1", "add_at×2", "median×", "unique×"):
        assert kernel in out.stderr, out.stderr  # --stats
