"""How the worker maps a buffer it reads back: every such buffer is a copy's destination, the copy submitted just
before."""

from __future__ import annotations

from typing import Any

READ_AFTER_COPY: Any = "READ_NOSYNC"
"""The map mode for reading a buffer that a copy submitted just before wrote: wgpu-py's own for that (its
``queue.read_buffer`` maps so). Plain ``READ`` first submits an empty command buffer, against wgpu-native's bug
with a buffer written through a mapping (gfx-rs/wgpu-native#305), which a copy's destination is not; that
submission cost each read of a tinygrad step's loss about 0.7 ms of the host on lavapipe."""
