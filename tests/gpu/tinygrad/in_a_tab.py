"""A pytest plugin (``-p in_a_tab``) for tinygrad's ``test_ops.py``: tinygrad's ``WEBGPU`` device, and its default
device, is a headless Chromium tab's WebGPU behind a tab bridge, as a browser-tab worker's executor has it
(``worker/gpu/tinygrad_device.py`` over ``TabDevice``); only the tests of :data:`IN_A_TAB` run."""

from __future__ import annotations

import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[2]))  # tests/, for browser_tabs

from browser_tabs import tab_bridge  # noqa: E402

from remote_magic.worker.gpu import tinygrad_hook  # noqa: E402
from remote_magic.worker.gpu.tab_device import open_tab_device  # noqa: E402

IN_A_TAB = frozenset({
    "test_arange", "test_eye", "test_add", "test_sub", "test_mul", "test_div", "test_exp", "test_log", "test_sqrt",
    "test_sin", "test_relu", "test_sigmoid", "test_gelu", "test_tanh", "test_where", "test_cmp_lt", "test_maximum",
    "test_xor", "test_lshift", "test_mod", "test_sum", "test_mean", "test_argmax", "test_softmax",
    "test_matmul_simple", "test_small_gemm", "test_gemm_fp16", "test_transpose", "test_pad_reshape",
    "test_slice_in_bounds_multidim", "test_cat", "test_gather", "test_argsort", "test_simple_grouped_conv2d",
    "test_max_pool2d_padding_int", "test_cross_entropy_class_indices", "test_nll_loss", "test_cast", "test_bitcast",
    "test_one_hot", "test_masked_fill", "test_small_cumsum",
})
"""The tests run in a tab (42 of 427, in about 30 s on 2 cores): one or two of each kind of operation (creation,
elementwise float and integer, comparison, reduction, matmul and float16, movement, indexing, sort, convolution,
pooling, losses, casts and bitcasts, scan), each cheap, as a tab runs each new kernel through two round trips to the
page; attention and the larger convolutions, several seconds each there, are left to the worker's run."""

_tab = ExitStack()
_device = open_tab_device(_tab.enter_context(tab_bridge()))
tinygrad_hook.install(lambda: _device, default=True)


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    left_out = [item for item in items if item.name not in IN_A_TAB]
    items[:] = [item for item in items if item.name in IN_A_TAB]
    config.hook.pytest_deselected(items=left_out)


def pytest_unconfigure(config: Any) -> None:
    _tab.close()
