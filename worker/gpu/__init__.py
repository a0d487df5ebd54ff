"""GPU compute for offloaded cells: WGSL kernels through wgpu, and GPU-resident arrays.

The executor makes one :class:`GpuRuntime` when it starts; cells see its :attr:`GpuRuntime.gpu`
object as ``gpu`` and, in GPU cells, their numpy inputs as :class:`DeviceArray`. See
``docs/gpu.md`` for what runs on the GPU, the modes, and the custom-kernel convention.
"""

from .arrays import DeviceArray
from .host_ops import KERNEL_NAMES
from .namespace import GpuNamespace
from .runtime import GpuRuntime

__all__ = ["DeviceArray", "GpuNamespace", "GpuRuntime", "KERNEL_NAMES"]
