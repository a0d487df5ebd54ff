"""A jitted step's kernels replayed with what tinygrad worked out when it captured them (``TinyJit``'s graph).

Without a graph, tinygrad's JIT works out every kernel's buffers, launch sizes and program again at each call:
about 30 µs of Python a kernel on a 2-core VM, 1.4 ms of a GPT-2 block's 51-kernel step (whose warm step took
7.4 ms without it and 5.0 ms with it on an NVIDIA H200). This graph looks them up once, when the JIT first runs
the batch (and makes the bind group of each kernel that binds none of the step's inputs and variables), and a
replay only puts in the step's inputs and variables and records the dispatches, into the device's one compute
pass as before; on a GPU it submits them too (``WebGpuDevice.submits_each_batch``).
tinygrad batches a jitted step's kernels into graphs of this class because the ``WEBGPU`` device names it
(``tinygrad_device.py``), as its Metal and CUDA devices name theirs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from tinygrad.device import Buffer, Device
from tinygrad.engine.jit import GraphRunner
from tinygrad.uop.ops import UOp


@dataclass(frozen=True)
class BoundDispatch:
    """A dispatch made once for a replay to record as it is: a program's ``bound`` gives one per kernel it runs."""

    kernel: str
    pipeline: Any
    group: Any
    """Its bind group, made for this dispatch alone."""
    groups: tuple[int, ...]
    """Its workgroups along x, y and z."""
    tuned_matmul: bool = False
    """Whether it is a run of the tuned matmul (counted in the device's ``tuned_matmuls``)."""


@dataclass(frozen=True)
class _Dispatch:
    """One kernel of the batch: its program, the buffers it binds, and where the step's inputs go among them."""

    program: Any
    buffers: tuple[Any, ...]
    inputs: tuple[tuple[int, int], ...]
    """(the binding, the JIT input's slot) of each binding that takes one of the step's inputs."""
    info: Any
    """tinygrad's ``ProgramInfo``: its launch sizes and variables."""
    launch: tuple[tuple[int, ...], tuple[int, ...] | None, tuple[int | None, ...]] | None
    """Global size, local size and variable values, where they depend on no variable (else worked out each time)."""
    bound: tuple[BoundDispatch, ...] | None
    """What it records, made once where neither the step's inputs nor its variables change it (and its program
    can: ``bound``)."""


class WebGpuGraph(GraphRunner):
    """The kernels of one batch of a jitted step, each dispatch's program and buffers looked up once."""

    def __init__(self, linear: UOp, input_uops: tuple[UOp, ...] = ()) -> None:
        super().__init__(linear, input_uops)
        self.dev: Any = Device[self.device]
        self.dispatches: list[_Dispatch] = []
        for (_, ast, bufs, _), program, replace in zip(self.calls, self.runtimes, self.uop_replace):
            info = ast.arg
            positions = info.globals  # (the call's arguments a kernel binds, in binding order)
            inputs = tuple((binding, slot) for binding, position in enumerate(positions)
                           for replaced, slot in replace if replaced == position)
            launch = None if info.vars else (*info.launch_dims({}), info.vals({}))
            buffers = tuple(bufs[p]._buf for p in positions)
            bind = getattr(program, "bound", None)
            bound = bind(buffers, *launch) if bind is not None and launch is not None and not inputs else None
            self.dispatches.append(_Dispatch(program, buffers, inputs, info, launch, bound))
        self.tuned_matmuls = sum(b.tuned_matmul for d in self.dispatches for b in d.bound or ())
        """The tuned matmul's runs in a replay's dispatches made once (the others count their own)."""
        self.replay: list[tuple[BoundDispatch, ...] | _Dispatch] = []
        """What a replay records, in order: each stretch of dispatches made once (recorded together), or a
        dispatch recorded as tinygrad calls its program."""
        for dispatch in self.dispatches:
            if dispatch.bound is None:
                self.replay.append(dispatch)
            elif self.replay and isinstance(self.replay[-1], tuple):
                self.replay[-1] += dispatch.bound
            else:
                self.replay.append(dispatch.bound)

    def __call__(self, input_uops: tuple[UOp, ...], var_vals: dict[str, int], wait: bool = False) -> float | None:
        with self.dev.gpu.guard("replaying a jitted step's kernels"):
            self._record(input_uops, var_vals)
        if self.dev.submits_each_batch:
            self.dev.submit()
        if not wait:
            return None
        start = time.perf_counter()
        self.dev.synchronize()
        return time.perf_counter() - start

    def _record(self, input_uops: tuple[UOp, ...], var_vals: dict[str, int]) -> None:
        self.dev.tuned_matmuls += self.tuned_matmuls
        for dispatch in self.replay:
            if isinstance(dispatch, tuple):
                self.dev.dispatch_bound(dispatch)
                continue
            buffers = dispatch.buffers
            if dispatch.inputs:
                with_inputs = list(buffers)
                for binding, slot in dispatch.inputs:
                    buffer = input_uops[slot].buffer
                    assert isinstance(buffer, Buffer)  # (one device: tinygrad batches no multi-device kernel here)
                    with_inputs[binding] = buffer.ensure_allocated()._buf
                buffers = tuple(with_inputs)
            global_size, local_size, vals = dispatch.launch or (*dispatch.info.launch_dims(var_vals),
                                                                dispatch.info.vals(var_vals))
            dispatch.program(*buffers, global_size=global_size, local_size=local_size or (1, 1, 1), vals=vals)
