# mypy: allow-untyped-decorators, allow-untyped-calls
# (IPython's magic decorators and argument parser carry no type hints.)
"""Running cells on workers: %%offload, %%offload_kernel, %offload_jobs, %offload_attach."""

from __future__ import annotations

from argparse import Namespace
from typing import Any

from IPython.core import magic as ipython_magic
from IPython.core.error import UsageError
from IPython.core.magic import line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from ..engine import Engine
from ..errors import EngineError, InputError, NoSuchJob, RemoteError, RemoteMagicError, RequirementError
from ..results import JobResult
from ..wire.sizes import human_size
from . import cell_context, on_several
from .apply_result import apply_result
from .arguments import placement_options, several_options
from .cell_display import CellDisplay
from .connection import MagicsGroup, NotebookConnection
from .notices import (
    describe_files,
    describe_jobs,
    describe_stats,
    notice,
    say_if_a_local_file,
    say_if_a_local_module,
    say_if_not_installed_on_the_worker,
)
from .shared_state import SharedState

# IPython 8.13 lets `%%offload` end with `;` to hide the cell's value; 7.34 (Colab's) has no such decorator.
_output_can_be_silenced = getattr(ipython_magic, "output_can_be_silenced", lambda function: function)


@magics_class
class CellMagics(MagicsGroup):
    """Run cells on a remote-magic worker, and collect the jobs that outlived their notebook."""

    def __init__(self, shell: Any, connection: NotebookConnection, **kwargs: Any) -> None:
        super().__init__(shell, connection, **kwargs)
        self.gpu_kernels: dict[str, str] = {}  # %%offload_kernel NAME: its WGSL, sent with each cell
        self.cell_display = CellDisplay(shell)
        self.shared_state = SharedState(shell)

    def close(self) -> None:
        self.cell_display.close()
        self.shared_state.close()

    @magic_arguments()
    @argument("gpu_kernels", nargs="?", default=None, metavar="KERNEL[,KERNEL]",
              help="run numpy work on the worker's GPU with these kernels, e.g. matmul or matmul,softmax")
    @argument("--gpu", action="store_true", help="run numpy work on the worker's GPU with every kernel")
    @argument("--timeout", type=float, default=None, help="stop the job after this many seconds")
    @argument("--keep", default=None, metavar="NAME[,NAME]",
              help="leave these values on the worker: the notebook gets handles (%%offload_pull NAME brings one here)")
    @argument("--stats", action="store_true", help="show what ran on the GPU, for how long, and bytes moved")
    @placement_options
    @several_options
    @_output_can_be_silenced
    @line_cell_magic  # a line magic too only so that `%offload?` finds this help, as `%%offload?` does
    def offload(self, line: str, cell: str | None = None) -> Any:
        """Run this cell on a worker; the names it assigns come back into the notebook.

        Only the variables the cell reads are sent. Output streams while it runs, display()
        and matplotlib figures appear here, and the last expression is shown as the cell's
        value. An exception shows the worker's traceback; what the cell did before it stays done, as locally.

        --all (or --workers A,B) runs the cell on each of those workers at once: output comes under
        labels such as [stdout:A], each name it assigns comes back as {worker: value}, and so does its
        value. One worker failing stops none of the others; the error says which failed and why.
        --split X[,Y] cuts those inputs along axis 0 (arrays, lists, tuples, DataFrames, Series) into one
        contiguous piece per worker (every worker, or --workers A,B), sized by each one's measured speed, and
        runs the cell on each piece at once; the other inputs go whole. --gather NAME concatenates NAME's
        pieces in order; other names come back as {worker: value}, as with --all.
        --retries N runs the cell again elsewhere when its worker is lost (it may have run partly there).
        --keep NAME[,NAME] leaves those values on the worker (large results over a slow link): the
        notebook gets a handle showing type and size, later offloaded cells use the value in place, and
        %offload_pull NAME brings it here.

        Usage: %%offload [matmul[,softmax...]] [--gpu] [--worker NAME | --all | --workers A,B] [--retries N]
        [--timeout S] [--stats] [--keep NAME[,NAME]]
                         [--require REQUIREMENT ...] [--prefer fastest]
                         [--split X[,Y] [--gather NAME[,NAME]]]
        """
        cell = _cell_below("offload", cell)
        args = parse_argstring(self.offload, line)
        placed = bool(args.require or args.prefer)
        several = on_several.chosen_workers(args.all, args.workers, args.worker, args.retries, placed=placed,
                                            split=args.split is not None)
        client = self.connection.connected()
        inputs = cell_context.values_read(cell, self.shell)
        split = on_several.chosen_split(args.split, args.gather, inputs, self.namespace, args.worker, args.retries,
                                        placed)
        options: dict[str, Any] = dict(
            timeout=args.timeout or self.connection.settings.default_timeout,
            gpu=True if args.gpu else cell_context.listed(args.gpu_kernels),
            gpu_kernels=self.gpu_kernels or None, figure_formats=cell_context.figure_formats(self.shell),
            text_format=cell_context.text_format(self.shell), on_module_error=_module_not_here)
        if several is None:
            return self._offload_on_one(client, cell, inputs, args, options)
        if args.keep:
            raise UsageError("--keep leaves values on the one worker a cell runs on: drop --all, --workers "
                             "or --split, or keep them with a cell on one worker")
        results = on_several.run_on_several(client, cell, inputs, several, split, self.namespace,
                                            self.cell_display.show, **options)
        if args.stats:
            for name, each in results.items():
                notice(describe_stats(name, each.stats))
        return {name: each.value for name, each in results.items() if each.has_value} or None

    def _offload_on_one(self, client: Engine, cell: str, inputs: dict[str, Any], args: Namespace,
                        options: dict[str, Any]) -> Any:
        """%%offload on one worker: what the cell did lands here, also when it raised, as locally."""
        worker = cell_context.worker_holding(inputs, args.worker)
        before = client.traffic()
        try:
            result = client.execute(
                cell, inputs, worker=worker, **options, on_display=self.cell_display.show,
                on_files=lambda files: notice(describe_files(files)), retries=args.retries, on_retry=notice,
                require=cell_context.unquoted(args.require), prefer=args.prefer, keep=cell_context.listed(args.keep),
                # Random seeds, print and display options, rcParams: one process's locally; the cell takes ours.
                module_state=self.shared_state.for_cell())
        except (RequirementError, EngineError) as exc:
            raise UsageError(str(exc)) from None
        except RemoteError as error:
            if error.partial is not None:  # as locally: what the cell did before it raised stays done
                self._apply(error.partial, inputs)
            if not say_if_a_local_module(str(error)):
                say_if_not_installed_on_the_worker(error.remote_type, error.remote_message,
                                                   error.partial.worker if error.partial is not None else worker)
            say_if_a_local_file(error.remote_type, error.remote_message)
            if error.remote_type == "SystemExit":  # as locally: IPython says so, without a traceback
                raise SystemExit(_exit_code(error.remote_message)) from None
            raise
        except RemoteMagicError as error:
            if isinstance(error, InputError):
                say_if_a_local_module(str(error))
            # one raised midway (by the GPU, or by the cell's own use of remote-magic) carries what the cell did by
            # then: that stays done, as locally
            if error.partial is not None:
                self._apply(error.partial, inputs)
            raise
        self._apply(result, inputs)
        if args.stats:
            after = client.traffic()
            crossed = "" if before is None or after is None else (
                f"; over the link: sent {human_size(after.sent - before.sent)}, "
                f"received {human_size(after.received - before.received)}")
            notice(describe_stats(result.worker, result.stats) + crossed)
        return self._shown(result)

    @magic_arguments()
    @argument("name", help="the name the kernel is called by: gpu.NAME(...)")
    @line_cell_magic  # a line magic too only so that `%offload_kernel?` finds this help
    def offload_kernel(self, line: str, cell: str | None = None) -> None:
        """Define a custom WGSL compute kernel, callable as gpu.NAME(...) in offloaded cells.

        The worker compiles it now; a compile error shows its line and column. The cell is the kernel's
        WGSL: one @compute entry point, every binding in @group(0) numbered without gaps: first one
        `var<storage, read> x: array<f32>` per input (gpu.NAME's positional arguments, in order), then one
        `var<storage, read_write> y: array<f32>` per output (out_shape= gives their shapes; default: the
        first input's), then, only if the call passes params=[...], one `var<uniform>` struct of 4-byte
        scalars in that order (float: f32, int: u32). By default one invocation runs per element of the
        first output. Usage: %%offload_kernel NAME, then the WGSL below it.
        """
        cell = _cell_below("offload_kernel", cell)
        args = parse_argstring(self.offload_kernel, line)
        if not args.name.isidentifier():
            raise UsageError(f"{args.name!r} is not a valid Python name for gpu.{args.name}")
        try:
            self.connection.connected().execute("pass", gpu=True, gpu_kernels={**self.gpu_kernels, args.name: cell})
        except EngineError as exc:
            raise UsageError(str(exc)) from None
        self.gpu_kernels[args.name] = cell
        print(f"kernel gpu.{args.name} compiled")

    @line_magic
    def offload_jobs(self, line: str) -> None:
        """List the jobs that outlived the notebook that submitted them (a runtime that restarted, a link down
        past the heartbeat bound) and wait to be collected with %offload_attach JOB: any submitted with this
        notebook's token, running or ended."""
        try:
            waiting = self.connection.connected().jobs()
        except EngineError as exc:
            raise UsageError(str(exc)) from None
        print(describe_jobs(waiting))

    @magic_arguments()
    @argument("job", help="the job's id, as %%offload_jobs lists it")
    @line_magic
    def offload_attach(self, line: str) -> Any:
        """Collect a job that outlived the notebook that submitted it: its output is shown again, in order
        (and what it still prints, if it runs on), and what it changed lands in this namespace, as if this
        notebook had run the cell. Usage: %offload_attach JOB
        """
        args = parse_argstring(self.offload_attach, line)
        try:
            result = self.connection.connected().attach(args.job, on_display=self.cell_display.show)
        except (NoSuchJob, EngineError) as exc:
            raise UsageError(str(exc)) from None
        except RemoteMagicError as error:
            if error.partial is not None:
                apply_result(error.partial, self.namespace, {})
            raise
        apply_result(result, self.namespace, {})
        return self._shown(result)

    def _apply(self, result: JobResult, inputs: dict[str, Any]) -> None:
        """What an offloaded cell changed, here: the module state it shares with the notebook, and its names."""
        self.shared_state.take(result.module_state)
        apply_result(result, self.namespace, inputs)

    def _shown(self, result: JobResult) -> Any:
        """The cell's value, to show as the worker rendered it (None: the cell has none)."""
        if not result.has_value:
            return None
        self.cell_display.show_value_as(result.value, result.value_display)
        return result.value


def _cell_below(magic: str, cell: str | None) -> str:
    """The cell a cell magic runs; used as a line magic, a UsageError that says where it goes."""
    if cell is None:
        raise UsageError(f"%%{magic} runs the cell below it: put %%{magic} (two %) on the cell's first line, "
                         f"and the code under it")
    return cell


def _module_not_here(name: str, ref: Any, exc: Exception) -> None:
    notice(f"`{name}` stays on the worker: module {ref.name!r} can't be imported here ({exc}); offloaded cells "
           "that read it have it")


def _exit_code(message: str) -> int | str | None:
    """``sys.exit(code)``'s code, from the message it came with."""
    if not message:
        return None
    try:
        return int(message)
    except ValueError:
        return message
