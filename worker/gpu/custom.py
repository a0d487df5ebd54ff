"""User kernels: WGSL registered by name and called as ``gpu.NAME(*inputs, ...)``.

Binding convention (all in ``@group(0)``, numbered from 0 without gaps):

* inputs first, one ``var<storage, read> NAME: array<f32>`` per positional argument;
* then outputs, one ``var<storage, read_write> NAME: array<f32>`` per entry of ``out_shape``
  (zero-filled before the kernel runs);
* then, only if the call passes ``params``, one ``var<uniform> NAME: STRUCT`` whose fields are
  4-byte scalars (``f32``, ``u32``, ``i32``) in the order of ``params``.

Each binding is exactly the array's size, so ``arrayLength(&x)`` is its element count. The
workgroup count defaults to one invocation per element of the first output: ``ceil(n /
workgroup size)`` workgroups, folded into y when past the per-dimension limit, so a 1-D kernel
indexes with ``gid.x + gid.y * num_workgroups.x * WORKGROUP_SIZE`` and returns when past the end.
``workgroups=(x, y, z)`` sets the count explicitly.
"""

from __future__ import annotations

import keyword
import logging
import math
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import wgpu

from remote_magic.errors import GpuError, GpuLimitError, ShaderError

from .context import DeviceContext
from .convert import is_lossy_float, to_float32
from .pipelines import compile_module, create_pipeline
from .uniforms import scalars

log = logging.getLogger(__name__)

_DECL = re.compile(
    r"(?:@group\(\s*(?P<g1>\d+)\s*\)\s*@binding\(\s*(?P<b1>\d+)\s*\)|@binding\(\s*(?P<b2>\d+)\s*\)\s*@group\(\s*(?P<g2>\d+)\s*\))"
    r"\s*var\s*<\s*(?P<space>storage|uniform)\s*(?:,\s*(?P<access>read_write|read)\s*)?>")
_ENTRY = re.compile(r"@compute\s*(?:@workgroup_size\((?P<size>[^)]*)\)\s*)?fn\s+(?P<name>\w+)"
                    r"|@workgroup_size\((?P<size2>[^)]*)\)\s*@compute\s*fn\s+(?P<name2>\w+)")
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)


@dataclass
class KernelSpec:
    """What the WGSL declares: inputs, outputs, whether it takes params, its entry point."""

    name: str
    source: str
    inputs: int
    outputs: int
    has_params: bool
    entry: str
    workgroup_size: tuple[int, int, int]
    compiled: dict[int, Any] = field(default_factory=dict)  # id(context) -> (context, pipeline)


def _position(source: str, offset: int) -> tuple[int, int]:
    line = source.count("\n", 0, offset) + 1
    return line, offset - (source.rfind("\n", 0, offset) + 1) + 1


def parse(name: str, source: str) -> KernelSpec:
    """Check ``source`` against the binding convention; :class:`ShaderError` points at a violation."""
    code = _COMMENT.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), source)  # keep offsets
    decls = []
    for match in _DECL.finditer(code):
        group = int(match.group("g1") or match.group("g2"))
        binding = int(match.group("b1") or match.group("b2"))
        kind = ("uniform" if match.group("space") == "uniform"
                else "output" if match.group("access") == "read_write" else "input")
        decls.append((binding, kind, group, match.start()))
    for binding, kind, group, at in decls:
        if group != 0:
            raise ShaderError(f"kernel {name}: every binding must be in @group(0)", *_position(source, at))
    decls.sort()
    for index, (binding, kind, _, at) in enumerate(decls):
        if binding != index:
            raise ShaderError(f"kernel {name}: bindings must be numbered 0, 1, 2, ... without gaps "
                              f"(found @binding({binding}) where {index} was expected)", *_position(source, at))
    order = [kind for _, kind, _, _ in decls]
    expected = sorted(order, key=["input", "output", "uniform"].index)
    if order != expected or order.count("uniform") > 1 or "output" not in order:
        at = decls[0][3] if decls else 0
        raise ShaderError(f"kernel {name}: declare inputs (var<storage, read>) first, then at least one output "
                          "(var<storage, read_write>), then at most one var<uniform> for params",
                          *_position(source, at))
    entries = [(m.group("name") or m.group("name2"), m.group("size") or m.group("size2"), m.start())
               for m in _ENTRY.finditer(code)]
    if len(entries) != 1:
        raise ShaderError(f"kernel {name}: the WGSL must have exactly one @compute entry point "
                          f"(found {len(entries)})",
                          *(_position(source, entries[1][2]) if len(entries) > 1 else (None, None)))
    entry, size_text, _ = entries[0]
    return KernelSpec(name, source, order.count("input"), order.count("output"), "uniform" in order, entry,
                      _workgroup_size(size_text))


def _workgroup_size(text: str | None) -> tuple[int, int, int]:
    parts = [p.strip() for p in (text or "1").split(",") if p.strip()]
    try:
        sizes = [int(p.rstrip("ui")) for p in parts]
    except ValueError:  # an override or const name: the caller must pass workgroups=
        return (0, 0, 0)
    return tuple(sizes + [1] * (3 - len(sizes)))  # type: ignore[return-value]


def check_name(name: str, taken: Sequence[str]) -> None:
    """A kernel name must be a Python identifier that no built-in ``gpu`` attribute uses."""
    if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
        raise GpuError(f"kernel name {name!r} must be a Python identifier (it is called as gpu.{name}(...))")
    if name in taken:
        raise GpuError(f"gpu.{name} is a built-in; give the kernel another name")


def compile_spec(ctx: DeviceContext, spec: KernelSpec) -> Any:
    """The pipeline of ``spec`` on ``ctx`` (compiled once per device), with an explicit layout."""
    cached = spec.compiled.get(id(ctx))
    if cached is not None and cached[0] is ctx:
        return cached[1]
    device = ctx.handle
    with ctx.device.guard(f"compiling kernel {spec.name}"):
        module = compile_module(device, spec.source, f"kernel {spec.name}")
        entries = []
        for index in range(spec.inputs + spec.outputs + int(spec.has_params)):
            if index < spec.inputs:
                kind = {"type": wgpu.BufferBindingType.read_only_storage}
            elif index < spec.inputs + spec.outputs:
                kind = {"type": wgpu.BufferBindingType.storage}
            else:
                kind = {"type": wgpu.BufferBindingType.uniform}
            entries.append({"binding": index, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": kind})
        group_layout = device.create_bind_group_layout(entries=entries)
        layout = device.create_pipeline_layout(bind_group_layouts=[group_layout])
        pipeline = create_pipeline(device, module, spec.entry, f"kernel {spec.name}", layout=layout)
    spec.compiled = {id(ctx): (ctx, pipeline)}
    return pipeline


def pack_params(params: Sequence[Any]) -> bytes:
    """``params`` as a uniform: floats as f32, non-negative ints as u32, negative ints as i32."""
    types: list[str] = []
    values: list[Any] = []
    for value in params:
        if isinstance(value, (bool, np.bool_)):
            types.append("u32")
            values.append(int(value))
        elif isinstance(value, (np.floating, float)):
            types.append("f32")
            with np.errstate(over="ignore"):  # beyond float32's range is ±inf, as numpy casts it
                values.append(np.float32(value))
        elif isinstance(value, np.signedinteger) or (isinstance(value, int) and value < 0):
            types.append("i32")
            values.append(int(value))
        elif isinstance(value, (int, np.unsignedinteger)):
            types.append("u32")
            values.append(int(value))
        else:
            raise TypeError(f"params must be numbers (float -> f32, int -> u32/i32), not {type(value).__name__}")
    return scalars(tuple(types)).pack_ordered(values)


def workgroups_for(ctx: DeviceContext, spec: KernelSpec, count: int,
                   workgroups: Sequence[int] | None) -> int | tuple[int, int, int]:
    """The dispatch size: explicit ``workgroups``, or one invocation per output element."""
    if workgroups is not None:
        counts = [int(w) for w in workgroups] + [1] * (3 - len(workgroups))
        if len(counts) != 3 or any(c < 0 for c in counts):
            raise GpuError(f"workgroups must be up to three non-negative counts, not {workgroups!r}")
        if max(counts) > ctx.max_groups:
            raise GpuLimitError(f"workgroups={tuple(counts)} exceeds this GPU's {ctx.max_groups:,} per dimension "
                                "(max_compute_workgroups_per_dimension)")
        return (counts[0], counts[1], counts[2])
    per_group = math.prod(spec.workgroup_size)
    if per_group == 0:
        raise GpuError(f"kernel {spec.name}: its @workgroup_size is not a literal, so pass workgroups=(x, y, z)")
    return math.ceil(count / per_group)


def _shapes(out_shape: Any, inputs: Sequence[Any]) -> list[tuple[int, ...]]:
    if out_shape is None:
        if not inputs:
            raise GpuError("a kernel without inputs needs out_shape=")
        return [tuple(inputs[0].shape)]
    if isinstance(out_shape, (int, np.integer)):
        return [(int(out_shape),)]
    if all(isinstance(s, (int, np.integer)) for s in out_shape):
        return [tuple(int(s) for s in out_shape)]
    return [tuple(int(s) for s in ((shape,) if isinstance(shape, (int, np.integer)) else shape))
            for shape in out_shape]


def run(dispatcher: Any, spec: KernelSpec, args: Sequence[Any], out_shape: Any = None,
        params: Sequence[Any] | None = None, workgroups: Sequence[int] | None = None) -> Any:
    """Call kernel ``spec``: inputs ``args``, outputs of ``out_shape``; one float32 device array or a tuple."""
    if len(args) != spec.inputs:
        raise GpuError(f"kernel {spec.name} declares {spec.inputs} input(s) but was called with {len(args)}")
    if spec.has_params != (params is not None):
        raise GpuError(f"kernel {spec.name} " + ("declares a var<uniform>, so pass params=[...]" if spec.has_params
                                                 else "declares no var<uniform>, so it takes no params"))
    inputs = [to_float32(np.asarray(a).view(np.ndarray), f"input {i} of gpu.{spec.name}") for i, a in enumerate(args)]
    lossy = [a for a in args if isinstance(a, np.ndarray) and is_lossy_float(a.dtype)]
    if lossy:
        dispatcher.note_lossy(lossy)
    shapes = _shapes(out_shape, inputs)
    if len(shapes) != spec.outputs:
        raise GpuError(f"kernel {spec.name} declares {spec.outputs} output(s) but out_shape gives {len(shapes)}")
    if any(a.size == 0 for a in inputs):
        raise GpuError(f"gpu.{spec.name} got an empty input; arrayLength() cannot describe it, so skip the call")
    sizes = [math.prod(s) for s in shapes]
    ctx = dispatcher.ctx
    pipeline = compile_spec(ctx, spec)
    bindings: dict[int, Any] = {}
    for i, array in enumerate(inputs):
        ctx.check_binding(f"input {i} of gpu.{spec.name}", array.nbytes)
        bindings[i] = ctx.upload(np.ascontiguousarray(array))
    outputs = []
    for j, size in enumerate(sizes):
        ctx.check_binding(f"output {j} of gpu.{spec.name}", 4 * size)
        outputs.append(ctx.zeros(4 * size))
        bindings[spec.inputs + j] = outputs[-1]
    if all(sizes):
        groups = workgroups_for(ctx, spec, sizes[0], workgroups)
        ctx.dispatch(spec.name, pipeline, bindings, pack_params(params) if params is not None else None,
                     spec.inputs + spec.outputs, groups)
    elif any(sizes):
        raise GpuError(f"gpu.{spec.name}: an output of size zero cannot be bound next to non-empty ones")
    results = [dispatcher.wrap(ctx.download(alloc, size).reshape(shape) if size else np.zeros(shape, np.float32))
               for alloc, shape, size in zip(outputs, shapes, sizes)]
    return results[0] if len(results) == 1 else tuple(results)
