"""This project's tuned matmul (``shaders/matmul.wgsl``, tiled as ``matmul.py`` tiles it) run for tinygrad's float32
matrix products on its ``WEBGPU`` device, plain or with elementwise work fused around them, where it measures faster
than tinygrad's own kernel.

tinygrad 0.14 gives a device no hook that sees a kernel's AST: its renderer, compiler and program class get the
kernel only after tinygrad has optimized and lowered it, where a matmul is no longer recognizable. So
:func:`install` wraps ``tinygrad.codegen.do_to_program`` (in memory, tinygrad's files untouched), the function
that turns each kernel's AST into a program for a renderer: for a kernel of this device's renderer whose AST is a
plain or fused product (``tinygrad_fused.fused_product_of``), it runs tinygrad's own code generation as before,
then times tinygrad's kernel and the tuned one once on this adapter, and where the tuned one is faster returns
tinygrad's program with its source replaced by a description of the tuned launch (:data:`MARKER`), which
:class:`TunedMatmulProgram` runs with the same buffers. The choice is part of the program, so tinygrad's program
cache (and this worker's copy of it on disk, ``tinygrad_programs.py``, per adapter) and ``TinyJit`` keep it: each
product is timed once per adapter.

What counts as a product is ``tinygrad_fused.py``'s to find: plain ones (``x @ w``, ``x @ w.T``, ``g.T @ x``) and
the many a model's kernels fuse work into, after the product (a bias, an activation, a residual: an *epilogue*) or
before it, into an operand (an activation recomputed, a gradient's mask, a transposed view: a *prologue*). For a
fused one the tuned program runs each prologue into a buffer of its own, the product (into a buffer of its own when
there is an epilogue), then the epilogue: each a kernel tinygrad generates from the fused kernel's AST
(:class:`Stage`). It is measured against tinygrad's fused kernel as a plain product is. A kernel whose stages would
bind more than WebGPU's 8 buffers is left to tinygrad.
"""

from __future__ import annotations

import json
import logging
import math
import time
import weakref
from dataclasses import dataclass, replace
from typing import Any, Callable, ContextManager, Protocol

from tinygrad import codegen
from tinygrad.uop import Ops
from tinygrad.uop.ops import UOp

from remote_magic.errors import GpuError

from .context import DeviceContext
from .device import GpuDevice
from .matmul import SUM_SPLITS_INVOCATIONS, choose_tiling, sum_splits_params
from .memory import STORAGE_USAGE, round_up
from .stats import Stats
from .tinygrad_fused import Gemm, constant_size, fused_product_of
from .tinygrad_graph import BoundDispatch
from .tinygrad_programs import ProgramCache
from .uniforms import MATMUL


class ProgramBuffers(Protocol):
    """Where a program's own buffers come from: counted with tinygrad's (``tinygrad_device.WebGpuAllocator``)."""

    def program_buffer(self, size: int) -> Any: ...
    def free_program_buffer(self, buffer: Any) -> None: ...


class TinygradDevice(Protocol):
    """What this module uses of tinygrad's ``WEBGPU`` device (``tinygrad_device.py``, a layer above)."""

    gpu: GpuDevice
    adapter: str
    renderer_class: type
    tuned_matmul: str
    tuned_matmuls: int
    programs: ProgramCache

    @property
    def allocator(self) -> ProgramBuffers: ...
    def matmul_context(self) -> DeviceContext: ...
    def uniform_bytes(self, data: bytes) -> Any: ...
    def bind_group(self, layout: Any, resources: tuple[Any, ...], keep: bool = True,
                   bindings: tuple[int, ...] | None = None) -> Any: ...
    def dispatch(self, kernel: str, pipeline: Any, group: Any, groups: tuple[int, ...],
                 wait: bool = False) -> float | None: ...
    def copy_for_reading(self, buffer: Any) -> Any: ...
    def synchronize(self) -> None: ...
    def kernel_times(self) -> ContextManager[Any]: ...
    @property
    def timing_kernels(self) -> bool: ...
    def runtime(self, obj: Any) -> Any: ...


log = logging.getLogger(__name__)

MARKER = "// remote-magic tuned matmul "
"""How a program's source starts when it is the tuned matmul; the launch follows as JSON."""
TIMED_RUNS = 2
"""Runs of each kernel timed (after one untimed) when a product is first compiled; the faster run counts."""
MAX_BINDINGS = 8
"""Buffers one tinygrad kernel may bind on WebGPU (tinygrad's rule for its ``WEBGPU`` device): a prologue or epilogue
that would bind more (its own buffer besides the fused kernel's) leaves the product to tinygrad."""


@dataclass(frozen=True)
class Stage:
    """A kernel tinygrad generated for work fused around a product (``tinygrad_fused.Fused``), run before the tuned
    matmul (a prologue, computing an operand) or after it (an epilogue, computing what the kernel stores from the
    product)."""

    name: str
    """Its entry point (tinygrad's name for it)."""
    source: str
    """Its WGSL, as tinygrad rendered it."""
    buffers: tuple[int | None, ...]
    """For each of its bindings, the position of the buffer among the fused kernel's (None: the buffer of its own,
    the operand it computes or the product it reads)."""
    global_size: tuple[int, ...]
    local_size: tuple[int, ...]


@dataclass(frozen=True)
class Launch:
    """How :class:`TunedMatmulProgram` runs a product: its :class:`Gemm`; where C, A and B are among the buffers the
    program is called with (tinygrad passes them in its program's ``globals`` order; None: a buffer of the program's
    own, which a prologue computes or an epilogue reads); and the :class:`Stage` of each prologue and epilogue."""

    gemm: Gemm
    out: int | None
    a: int | None
    b: int | None
    prologue_a: Stage | None = None
    prologue_b: Stage | None = None
    epilogue: Stage | None = None

    def source(self) -> str:
        """The program's source: :data:`MARKER` and this launch."""
        return MARKER + json.dumps({**vars(self), "gemm": vars(self.gemm),
                                    **{name: None if stage is None else vars(stage) for name, stage in self.stages()}})

    def stages(self) -> tuple[tuple[str, Stage | None], ...]:
        """Each stage by its field's name, in the order they run (the product between the prologues and the
        epilogue)."""
        return ("prologue_a", self.prologue_a), ("prologue_b", self.prologue_b), ("epilogue", self.epilogue)

    @staticmethod
    def parse(lib: bytes) -> Launch | None:
        """The launch a program's binary describes, if it is a tuned matmul's."""
        if not lib.startswith(MARKER.encode()):
            return None
        fields = json.loads(lib[len(MARKER):].decode())

        def stage(name: str) -> Stage | None:
            saved = fields.get(name)
            return None if saved is None else Stage(saved["name"], saved["source"], tuple(saved["buffers"]),
                                                    tuple(saved["global_size"]), tuple(saved["local_size"]))

        return Launch(Gemm(**fields["gemm"]), fields["out"], fields["a"], fields["b"], stage("prologue_a"),
                      stage("prologue_b"), stage("epilogue"))


@dataclass(frozen=True)
class _SumSplits:
    """Split-K's second pass of one product: ``sum_splits`` adds the parts' partial products into C."""

    pipeline: Any
    layout: Any
    params: Any
    """Its uniform (``matmul.sum_splits_params``)."""
    groups: tuple[int, int, int]
    partials: Any
    """The buffer of the parts' partial products, one after another: the program's own."""


class TunedMatmulProgram:
    """A tinygrad program that runs this project's tuned matmul for its :class:`Launch`, recorded into the device's
    compute pass as tinygrad's kernels are; with the launch's prologues before it and its epilogue after, each run by
    the program ``compile_stage`` makes for it, and a buffer of the program's own (held while it is, and counted as
    tinygrad's are) for each operand a prologue computes and for the product an epilogue reads."""

    def __init__(self, dev: TinygradDevice, launch: Launch, name: str,
                 compile_stage: Callable[[Stage], Any] | None = None) -> None:
        self.dev = dev
        self.launch = launch
        self.name = name
        gemm = launch.gemm
        ctx = dev.matmul_context()
        # the subgroup kernel reads its operands row-major only
        tiling = choose_tiling(ctx, (gemm.m, gemm.n, gemm.k), 1, subgroups=not (gemm.trans_a or gemm.trans_b))
        lda = gemm.m if gemm.trans_a else gemm.k
        ldb = gemm.k if gemm.trans_b else gemm.n
        vec4 = (tiling.entry != "naive" and not gemm.trans_a and not gemm.trans_b
                and all(v % 4 == 0 for v in (gemm.k, gemm.n)))
        constants = {**tiling.constants(vec4), **({"TRANS_A": 1} if gemm.trans_a else {}),
                     **({"TRANS_B": 1} if gemm.trans_b else {})}
        elements = {"prologue_a": gemm.m * gemm.k, "prologue_b": gemm.k * gemm.n, "epilogue": gemm.m * gemm.n}
        with dev.gpu.guard(f"compiling the tuned matmul for tinygrad's {name}"):
            self.pipeline = ctx.pipelines.get(tiling.shader, tiling.entry, constants)
            self.layout = self.pipeline.get_bind_group_layout(0)
            self.stages: dict[str, tuple[Stage, Any, Any]] = {}
            """Each stage of the launch by name: it, its program, and its buffer of its own."""
            for stage_name, stage in launch.stages():
                if stage is not None:
                    assert compile_stage is not None, "a launch with stages needs compile_stage"
                    self.stages[stage_name] = (stage, compile_stage(stage), self._own_buffer(4 * elements[stage_name]))
        tiles_n, tiles_m = math.ceil(gemm.n / tiling.tile_n), math.ceil(gemm.m / tiling.tile_m)
        parts, depth = tiling.split, gemm.k // tiling.split
        self.groups = ctx.fold(tiles_n * tiles_m * parts)
        params = MATMUL.pack(M=gemm.m, N=gemm.n, K=depth, batch=parts, lda=lda, ldb=ldb, ldc=gemm.n, accumulate=0,
                             a_off=0, b_off=0, c_off=0, batch_ndim=1, tiles_n=tiles_n, tiles_m=tiles_m,
                             c_bstride=gemm.m * gemm.n, batch_shape=(parts,),  # (K's parts as a batch: split-K)
                             a_bstride=(depth * (lda if gemm.trans_a else 1),),
                             b_bstride=(depth * (1 if gemm.trans_b else ldb),))
        self.params = dev.uniform_bytes(params)
        self.sum_splits: _SumSplits | None = None
        """Split-K's second pass (``matmul.py``), where K is split."""
        if parts > 1:
            with dev.gpu.guard(f"compiling the tuned matmul for tinygrad's {name}"):
                pipeline = ctx.pipelines.get("matmul", "sum_splits")
            self.sum_splits = _SumSplits(pipeline, pipeline.get_bind_group_layout(0),
                                         dev.uniform_bytes(sum_splits_params(parts, gemm.m * gemm.n)),
                                         ctx.fold(math.ceil(gemm.m * gemm.n / SUM_SPLITS_INVOCATIONS)),
                                         self._own_buffer(round_up(4 * parts * gemm.m * gemm.n, 16)))
        self.tiling = tiling.name

    def _own_buffer(self, size: int) -> Any:
        """A buffer of the program's own, held while it is and counted as tinygrad's are."""
        own = self.dev.allocator.program_buffer(size)
        # (not at exit: the device may be gone by then, and the process's end frees it)
        weakref.finalize(self, self.dev.allocator.free_program_buffer, own).atexit = False
        return own

    def _operands(self, bufs: tuple[Any, ...]) -> tuple[Any, Any, Any]:
        """C, A and B of a run over ``bufs``: each the buffer tinygrad passed, or the program's own where a stage
        computes it (an operand) or reads it (the product)."""
        launch = self.launch
        return (self._buffer(launch.out, "epilogue", bufs), self._buffer(launch.a, "prologue_a", bufs),
                self._buffer(launch.b, "prologue_b", bufs))

    def _buffer(self, position: int | None, stage_name: str, bufs: tuple[Any, ...]) -> Any:
        return self.stages[stage_name][2] if position is None else bufs[position]

    def _run_stage(self, stage_name: str, bufs: tuple[Any, ...], wait: bool = False) -> float | None:
        stage, program, own = self.stages[stage_name]
        result: float | None = program(*(own if n is None else bufs[n] for n in stage.buffers),
                                       global_size=stage.global_size, local_size=stage.local_size, wait=wait)
        return result

    def bound(self, bufs: tuple[Any, ...], *_: Any) -> tuple[BoundDispatch, ...] | None:
        """A run over ``bufs``, its stages' dispatches and its own made once, for a dispatch a jitted step replays
        as it is (``tinygrad_graph.py``); None where C is an operand too, or a stage binds a buffer twice (each run
        reads a fresh copy)."""
        split = self.sum_splits
        out, a, b = self._operands(bufs)
        if out is a or out is b:
            return None
        stages = {name: program.bound(tuple(own if n is None else bufs[n] for n in stage.buffers),
                                      stage.global_size, stage.local_size, ())
                  for name, (stage, program, own) in self.stages.items()}
        if None in stages.values():
            return None
        dispatches: list[BoundDispatch] = []
        for name in ("prologue_a", "prologue_b"):
            dispatches += stages.get(name) or ()
        product = out if split is None else split.partials
        group = self.dev.bind_group(self.layout, (a, b, product, self.params), keep=False)
        dispatches.append(BoundDispatch(self.name, self.pipeline, group, self.groups, tuned_matmul=True))
        if split is not None:
            group = self.dev.bind_group(split.layout, (split.partials, out, split.params), keep=False,
                                        bindings=(0, 2, 3))
            dispatches.append(BoundDispatch(f"{self.name}_sum_splits", split.pipeline, group, split.groups))
        dispatches += stages.get("epilogue") or ()
        return tuple(dispatches)

    def __call__(self, *bufs: Any, global_size: tuple[int, int, int] = (1, 1, 1),
                 local_size: tuple[int, int, int] = (1, 1, 1), vals: tuple[int, ...] = (),
                 wait: bool = False, **_: Any) -> float | None:
        dev = self.dev
        for stage_name in ("prologue_a", "prologue_b"):
            if stage_name in self.stages:
                self._run_stage(stage_name, bufs)
        with dev.gpu.guard(f"running the tuned matmul for tinygrad's {self.name}"):
            out, a, b = self._operands(bufs)
            # (WebGPU forbids binding C, written, as an operand too: an operand C is read from a copy, made for
            # this dispatch alone)
            operands = tuple(dev.copy_for_reading(x) if x is out else x for x in (a, b))
            split = self.sum_splits
            product = out if split is None else split.partials
            group = dev.bind_group(self.layout, (*operands, product, self.params), keep=out is not a and out is not b)
            dev.tuned_matmuls += 1
            last = "epilogue" not in self.stages
            waited = dev.dispatch(self.name, self.pipeline, group, self.groups, wait and last and split is None)
            if split is not None:
                group = dev.bind_group(split.layout, (split.partials, out, split.params), bindings=(0, 2, 3))
                waited = dev.dispatch(f"{self.name}_sum_splits", split.pipeline, group, split.groups, wait and last)
        return waited if last else self._run_stage("epilogue", bufs, wait)


_device: TinygradDevice | None = None
"""The opened ``WEBGPU`` device whose renderer's programs this replaces (the newest: a lost one is replaced)."""
_faster: dict[tuple[str, str], bool] = {}
"""Whether the tuned matmul measured faster, by adapter and launch (:meth:`Launch.source`)."""


def install(device: TinygradDevice) -> None:
    """Make tinygrad's programs for ``device``'s renderer run the tuned matmul where it measures faster (see the
    module docstring). Once per process; a later device (after a lost one) takes the earlier one's place."""
    global _device
    _device = device
    original = getattr(codegen, "do_to_program", None)
    if original is None:  # (another tinygrad release: its own kernels run everything)
        log.warning("tinygrad %s has no tinygrad.codegen.do_to_program: the tuned matmul is not used", codegen)
        return
    if not getattr(original, "remote_magic_tuned", False):
        wrapped = _wrapping(original)
        setattr(wrapped, "remote_magic_tuned", True)
        codegen.do_to_program = wrapped


def _wrapping(original: Callable[[UOp, Any], UOp]) -> Callable[[UOp, Any], UOp]:
    def do_to_program(ast: UOp, renderer: Any) -> UOp:
        program = original(ast, renderer)
        device = _device
        if device is None or renderer.__class__ is not device.renderer_class or device.gpu.lost:
            return program
        if device.tuned_matmul not in ("measure", "always", "never"):
            raise GpuError(f"Device['WEBGPU'].tuned_matmul is {device.tuned_matmul!r}: make it 'measure' (the "
                           "faster kernel on this adapter), 'always' (the tuned matmul) or 'never' (tinygrad's)")
        if device.tuned_matmul == "never":
            return program
        try:
            launch = _found(ast, program, lambda stage_ast: original(stage_ast, renderer))
            return program if launch is None else _tuned(device, ast, program, launch)
        except Exception:  # (the tuned kernel is only ever a faster way: tinygrad's own still computes it)
            if device.gpu.lost:
                raise
            log.warning("the tuned matmul failed for tinygrad's %s; tinygrad's kernel runs it", program.arg.name,
                        exc_info=True)
            return program
    return do_to_program


def _found(ast: UOp, program: UOp, compile_stage: Callable[[UOp], UOp]) -> Launch | None:
    """How the tuned matmul runs the product of tinygrad's ``program`` (for ``ast``), the kernels for the work fused
    around it compiled by tinygrad with ``compile_stage``; None if it has no product it can run, or has variables."""
    info = program.arg
    fused = None if info.vars else fused_product_of(ast)
    if fused is None:
        return None
    gemm = fused.gemm
    if fused.plain and sorted(info.globals) != sorted({gemm.out, gemm.a, gemm.b}):
        return None
    stages = {}
    for stage_name, stage_ast, own in (("prologue_a", fused.a, gemm.a), ("prologue_b", fused.b, gemm.b),
                                       ("epilogue", fused.epilogue, fused.product)):
        if stage_ast is None:
            continue
        stage_program = compile_stage(stage_ast)
        compiled = stage_program.arg
        if compiled.vars or len(compiled.globals) > MAX_BINDINGS or own not in compiled.globals:
            return None
        global_size, local_size = compiled.launch_dims({})
        buffers = tuple(None if slot == own else info.globals.index(slot) for slot in compiled.globals)
        stages[stage_name] = Stage(compiled.function_name, stage_program.src[3].arg.decode(), buffers,
                                   tuple(global_size), tuple(local_size or (1, 1, 1)))

    def position(slot: int, stage_ast: UOp | None) -> int | None:  # (None: a buffer of the program's own)
        return None if stage_ast is not None else info.globals.index(slot)

    return Launch(gemm, position(gemm.out, fused.epilogue), position(gemm.a, fused.a), position(gemm.b, fused.b),
                  **stages)


def _tuned(device: TinygradDevice, ast: UOp, program: UOp, launch: Launch) -> UOp:
    """``program`` (tinygrad's for ``ast``), or the tuned matmul's (its ``launch``) in its place where it measures
    faster (or where a cell forces either: not saved for a later executor then, which measures)."""
    chosen = _choose(device, ast, program, launch)
    if device.tuned_matmul != "measure":
        device.programs.keep_unsaved(chosen)
    return chosen


def _choose(device: TinygradDevice, ast: UOp, program: UOp, launch: Launch) -> UOp:
    gemm = launch.gemm
    name = (f"matmul_tuned_{gemm.m}_{gemm.n}_{gemm.k}{'_ta' if gemm.trans_a else ''}{'_tb' if gemm.trans_b else ''}"
            f"{'' if all(stage is None for _, stage in launch.stages()) else '_fused'}")
    source = launch.source()
    tuned = program.replace(arg=replace(program.arg, name=name),
                            src=(*program.src[:2], UOp(Ops.SOURCE, arg=source), UOp(Ops.BINARY, arg=source.encode())))
    key = (device.adapter, source)
    if device.tuned_matmul == "measure" and key not in _faster:
        _faster[key] = _measure_faster(device, ast, program, tuned)
    if device.tuned_matmul == "measure" and not _faster[key]:
        return program
    return tuned


def _measure_faster(device: TinygradDevice, ast: UOp, program: UOp, tuned: UOp) -> bool:
    """True if the ``tuned`` program ran faster than tinygrad's ``program`` (for ``ast``) on ``device`` (the faster
    of :data:`TIMED_RUNS` runs each, on scratch buffers of the kernel's sizes). A run's time is its kernels' GPU time
    where the GPU has timestamp queries: on a GPU a kernel may take microseconds, and a run waited for takes a
    submission's round trip too (every product measured so on an NVIDIA H200 took 0.6-1.1 ms), which would decide by
    noise. Else (a browser tab, or a cell timing its own kernels already) the wall time of the run waited for."""
    theirs, ours = device.runtime(program.to_elf()), device.runtime(tuned.to_elf())
    sizes = {u.arg.slot: (constant_size(u) or 1) * max(4, u.arg.dtype.itemsize)
             for u in ast.toposort() if u.op is Ops.PARAM}
    handle = device.gpu.handle
    scratch = [handle.create_buffer(size=round_up(sizes.get(slot, 4), 16), usage=STORAGE_USAGE)
               for slot in program.arg.globals]
    global_size, local_size = program.arg.launch_dims({})

    def seconds(run: Callable[[], Any]) -> float:
        if device.gpu.timestamps and not device.timing_kernels:
            with device.kernel_times() as times:
                run()
            return float(times.total_s)
        device.synchronize()
        start = time.perf_counter()
        run()
        device.synchronize()
        return time.perf_counter() - start

    counted = device.tuned_matmuls
    try:
        def tinygrads() -> Any:
            return theirs(*scratch, global_size=global_size, local_size=local_size)

        def tuned_one() -> Any:
            return ours(*scratch)

        seconds(tinygrads), seconds(tuned_one)
        best_theirs = best_ours = math.inf
        for _ in range(TIMED_RUNS):
            best_theirs = min(best_theirs, seconds(tinygrads))
            best_ours = min(best_ours, seconds(tuned_one))
    finally:
        device.tuned_matmuls = counted  # (what the measure ran is not the cells')
        for buffer in scratch:
            buffer.destroy()
    log.info("tinygrad's %s: its kernel %.2f ms, the tuned matmul (%s) %.2f ms on %s", program.arg.name,
             best_theirs * 1e3, ours.tiling, best_ours * 1e3, device.adapter)
    return best_ours < best_theirs


def tuned_context(device: Any) -> DeviceContext:
    """A :class:`DeviceContext` on ``device`` for the tuned matmul's tiling and pipelines (no buffers of its)."""
    return DeviceContext(device, Stats())

