# mypy: allow-untyped-calls
# (IPython's argument parser carries no type hints.)
"""Options several magics take, declared once: ``--worker``, a copy's ``--force``, and ``%%offload``'s
option groups (where the cell runs, on several workers at once), which its help shows under their headings.

Each is a decorator list to put among a magic's ``@argument`` lines, as if written there.
"""

from __future__ import annotations

from typing import Callable, TypeVar

from IPython.core.magic_arguments import argument, argument_group

Magic = TypeVar("Magic", bound=Callable[..., object])
Declaration = argument | argument_group


def arguments(*declared: Declaration) -> Callable[[Magic], Magic]:
    """Declare these options on a magic, in this order (one decorator for a list of ``@argument`` lines).

    A group (`argument_group`) takes the options after it, here and below its line: put groups last.
    """
    def declare(magic: Magic) -> Magic:
        for declaration in reversed(declared):  # decorators apply bottom-up
            magic = declaration(magic)
        return magic
    return declare


def worker_option(action: str) -> argument:
    """``--worker NAME``: the worker a magic acts on, ``action`` saying how ("copy from")."""
    return argument("--worker", default=None, metavar="NAME", help=f"{action} the worker with this name")


def copy_options(action: str) -> Callable[[Magic], Magic]:
    """%offload_get's and %offload_put's options: the worker to copy from or to, and ``--force``."""
    return arguments(
        worker_option(action),
        argument("--force", action="store_true", help="replace what is already at the destination"),
    )


placement_options = arguments(
    argument_group("where the cell runs"),
    worker_option("run on"),
    argument("--require", action="append", default=None, metavar="REQUIREMENT",
             help="run on a worker that has this: gpu, memory>=16GB, cpus>=8, a --label (repeatable: all must hold)"),
    argument("--prefer", default=None, choices=["fastest"], help="fastest: the fastest idle worker that matches"),
    argument("--retries", type=int, default=0, metavar="N",
             help="run the cell again on another worker, up to N times, when its worker is lost"),
)
"""``%%offload``'s options that pick the one worker a cell runs on."""

several_options = arguments(
    argument_group("on several workers at once"),
    argument("--all", action="store_true", help="run on every worker at once; names come back as {worker: value}"),
    argument("--workers", default=None, metavar="A,B", help="run on these workers at once, e.g. box,laptop (as --all)"),
    argument("--split", default=None, metavar="X[,Y]",
             help="cut these inputs along axis 0, one piece per worker (sized by speed), and run the cell on each"),
    argument("--gather", default=None, metavar="NAME[,NAME]",
             help="with --split: concatenate these names' pieces in order (other names come back as {worker: value})"),
)
"""``%%offload``'s options that run a cell on several workers at once."""
