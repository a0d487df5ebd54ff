"""A pytest plugin (``-p on_worker_gpu``) for tinygrad's ``test_ops.py``: tinygrad's ``WEBGPU`` device, and its default
device, is the one an offloaded cell gets (``worker/gpu/tinygrad_device.py`` on the wgpu adapter remote-worker would
choose); and, unless ``REMOTE_MAGIC_TINYGRAD_ALL_OPS=1``, only the tests of :data:`DEFAULT_TESTS` run."""

from __future__ import annotations

import os
from typing import Any

from choose_tests import default_tests

from remote_magic.worker.gpu import tinygrad_hook
from remote_magic.worker.gpu.device import open_device

DEFAULT_TESTS = default_tests()
"""The tests the default suite runs (``default_tests.txt``, written by ``choose_tests.py``): between them they call
every operation test_ops.py calls, with each string or boolean argument value it passes, and every test under
0.05 s on lavapipe besides."""

_device = open_device()
tinygrad_hook.install(lambda: _device, default=True)


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    if os.environ.get("REMOTE_MAGIC_TINYGRAD_ALL_OPS") == "1":
        return
    left_out = [item for item in items if item.name not in DEFAULT_TESTS]
    items[:] = [item for item in items if item.name in DEFAULT_TESTS]
    config.hook.pytest_deselected(items=left_out)
