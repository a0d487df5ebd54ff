"""A pytest plugin (``-p on_worker_gpu``): tinygrad's ``WEBGPU`` device, and its default device, is the one an
offloaded cell gets: ``worker/gpu/tinygrad_device.py`` on the wgpu adapter remote-worker would choose."""

from remote_magic.worker.gpu import tinygrad_hook
from remote_magic.worker.gpu.device import open_device

_device = open_device()
tinygrad_hook.install(lambda: _device, default=True)
