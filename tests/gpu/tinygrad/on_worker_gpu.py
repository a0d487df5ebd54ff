"""A pytest plugin (``-p on_worker_gpu``) for tinygrad's ``test_ops.py``: tinygrad's ``WEBGPU`` device, and its default
device, is the one an offloaded cell gets (``worker/gpu/tinygrad_device.py`` on the wgpu adapter remote-worker would
choose); and, unless ``REMOTE_MAGIC_TINYGRAD_ALL_OPS=1``, the slowest variants are left out (:data:`LEFT_OUT`)."""

from __future__ import annotations

import os
from typing import Any

from remote_magic.worker.gpu import tinygrad_hook
from remote_magic.worker.gpu.device import open_device

LEFT_OUT = frozenset({
    "test_asymmetric_padding_conv2d", "test_avg_pool2d", "test_avg_pool2d_asymmetric_padding",
    "test_avg_pool2d_ceil_mode", "test_avg_pool2d_ceil_mode_include_pad_output_size_reduce_by_one",
    "test_avg_pool2d_ceil_mode_padding_not_counted", "test_avg_pool2d_padding",
    "test_avg_pool2d_padding_not_counted", "test_bias_conv_transpose2d", "test_biased_conv2d",
    "test_binary_crossentropy_reductions", "test_broadcast_partial", "test_conv2d", "test_conv2d_bs_1_cin_1",
    "test_cross_entropy_class_probabilities", "test_cross_entropy_smoothing", "test_cummax", "test_cummin",
    "test_cumprod", "test_cumsum", "test_dilated_conv2d", "test_dilated_conv_transpose2d", "test_div_rounding_mode",
    "test_einsum", "test_einsum_ellipsis", "test_fancy_conv2d", "test_flip", "test_global_avg_pool2d",
    "test_grouped_conv2d", "test_grouped_conv_transpose2d", "test_interpolate_bilinear",
    "test_interpolate_bilinear_corners_aligned", "test_interpolate_linear", "test_interpolate_trilinear",
    "test_interpolate_trilinear_corners_aligned", "test_isclose", "test_isclose_edge_cases",
    "test_large_input_conv2d", "test_log_softmax_other_axis", "test_logcumsumexp", "test_max", "test_max_pool2d",
    "test_max_pool2d_asymmetric_padding", "test_max_pool2d_bigger_stride", "test_max_pool2d_bigger_stride_dilation",
    "test_max_pool2d_ceil_mode", "test_max_pool2d_ceil_mode_output_size_reduce_by_one", "test_max_pool2d_dilation",
    "test_max_pool2d_padding", "test_max_pool2d_return_indices", "test_max_pool2d_simple",
    "test_max_pool2d_smaller_stride", "test_max_pool2d_unit_stride", "test_max_unpool2d", "test_nested_conv2d",
    "test_nll_loss_3d_weight", "test_nll_loss_weight", "test_nonzero", "test_output_padded_conv_transpose2d",
    "test_pad", "test_pad_circular_mode", "test_pad_reflect_mode", "test_pad_replicate_mode", "test_pad_slice",
    "test_padded_conv2d_1x1", "test_padded_conv2d_bs1", "test_padded_conv2d_p21", "test_padded_conv2d_p22",
    "test_padded_conv_transpose2d", "test_pow", "test_pow_const", "test_repeat",
    "test_scaled_dot_product_attention", "test_scaled_dot_product_attention_gqa",
    "test_scaled_dot_product_attention_mismatch_ls", "test_scatter", "test_scatter_reduce", "test_simple_conv2d",
    "test_simple_conv2d_1x1_m4", "test_simple_conv2d_batched", "test_simple_conv2d_bias", "test_simple_conv2d_m4",
    "test_simple_conv2d_nhwc", "test_simple_conv_transpose3d", "test_simple_cummax", "test_simple_cummin",
    "test_simple_cumprod", "test_simple_cumsum", "test_simple_padding_conv1d", "test_slice_ellipsis",
    "test_slice_fancy_indexing_dim_collapse_int", "test_slice_fancy_indexing_dim_inject_and_collapse",
    "test_slice_fancy_indexing_dim_inject_none", "test_slice_fancy_indexing_list_indices",
    "test_slice_fancy_indexing_list_with_tensors", "test_slice_fancy_indexing_no_dim_collapse",
    "test_slice_fancy_indexing_tuple_indices", "test_slice_fancy_indexing_with_tensors", "test_slice_stride_gt_one",
    "test_small_cummax", "test_small_cummin", "test_small_gemm_padded", "test_softmax_other_axis", "test_sort",
    "test_sparse_categorical_crossentropy", "test_sparse_categorical_crossentropy_ignore_index",
    "test_sparse_categorical_crossentropy_label_smoothing", "test_std", "test_std_axis", "test_std_mean",
    "test_std_one_in_axis", "test_strided_conv2d", "test_strided_conv2d_simple", "test_strided_conv_transpose2d",
    "test_var", "test_var_axis"
})
"""The tests of test_ops.py the default suite leaves out: those that took 0.5 s or more on lavapipe (2 cores), except
the cheapest one that computes of each tinygrad operation's tests, so every operation tested stays tested (306 of
422 run, in about 100 s; all of them take about 7 minutes)."""

_device = open_device()
tinygrad_hook.install(lambda: _device, default=True)


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    if os.environ.get("REMOTE_MAGIC_TINYGRAD_ALL_OPS") == "1":
        return
    left_out = [item for item in items if item.name in LEFT_OUT]
    items[:] = [item for item in items if item.name not in LEFT_OUT]
    config.hook.pytest_deselected(items=left_out)
