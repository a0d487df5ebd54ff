"""What an offloaded cell takes from the notebook: the values it reads, the worker holding those that stayed
on one, and how this notebook shows figures and text (for the worker to render the cell's output alike).
"""

from __future__ import annotations

import re
import sys
import types
from typing import Any

from IPython.core.error import UsageError

from ..wire.cellcode import identifiers, names_read, runtime_lookups
from ..wire.displays import TEXT_FORMAT
from ..wire.handles import RemoteValue
from ..wire.sizes import human_size
from .notices import notice

_HISTORY = re.compile(r"_{1,3}|_i{1,3}|_i?\d+")
"""IPython's output and input history (``_``, ``__``, ``_5``, ``_i``): hidden names a cell may read."""


def values_read(cell: str, shell: Any) -> dict[str, Any]:
    """The notebook's values the cell reads (not IPython's own hidden names, but its history).

    A cell that isn't Python raises SyntaxError as the same cell run locally would, saying when it is
    IPython syntax (another magic, a !command, ? help) that %%offload can't run.
    """
    try:
        reads = names_read(cell)
    except SyntaxError as exc:
        line = (exc.text or "").strip()
        if line.startswith(("%", "!", "?")) or line.endswith("?"):
            exc.msg += ": %%offload runs plain Python (no other magics, !commands or ? help)"
        raise
    namespace, hidden = shell.user_ns, shell.user_ns_hidden
    strings, opaque = runtime_lookups(cell)
    for name in strings:  # eval(expr), df.query(cond): the names in the string are read too
        if isinstance(namespace.get(name), str):
            reads |= identifiers(namespace[name])
    read = {name: namespace[name] for name in reads if name in namespace and (
            _HISTORY.fullmatch(name) or not (name in hidden and hidden[name] is namespace[name]))}
    if "Out" in reads and isinstance(namespace.get("Out"), dict):  # IPython's output history, as `_5` reads it
        read["Out"] = {number: value for number, value in namespace["Out"].items() if _pickles(value)}
    if "In" in reads and isinstance(namespace.get("In"), list):
        read["In"] = list(namespace["In"])
    if opaque is not None:
        read.update(_every_variable(opaque, read, namespace, hidden))
    return read


def _pickles(value: Any) -> bool:
    import cloudpickle

    try:
        cloudpickle.dumps(value, protocol=5)
    except Exception:  # pickling runs the value's own code: what fails stays here
        return False
    return True


RUNTIME_LOOKUP_BYTES = 64 * 2**20
"""How much of the notebook's other variables goes with a cell that looks names up at run time (``eval`` of
a string it builds, ``globals()``): those past it stay here, and the notice names them."""

_TRAVEL_SAFELY = {"builtins", "__main__", "numpy", "pandas", "matplotlib", *sys.stdlib_module_names}
"""Where a value's type (or a module) comes from for it to go with such a cell unasked: what every worker
can load (remote-magic's [worker] extra brings numpy, pandas and matplotlib)."""


def _every_variable(call: str, read: dict[str, Any], namespace: dict[str, Any],
                    hidden: dict[str, Any]) -> dict[str, Any]:
    """The notebook's other variables, for a cell whose ``call`` looks names up at run time: those that pickle,
    from modules every worker has, up to RUNTIME_LOOKUP_BYTES; a notice says so, naming what stayed."""
    import cloudpickle

    sent: dict[str, Any] = {}
    left: list[str] = []
    size = 0
    for name, value in namespace.items():
        if name in read or name.startswith("_") or (name in hidden and hidden[name] is value):
            continue
        module = value.__name__ if isinstance(value, types.ModuleType) else type(value).__module__
        if isinstance(value, RemoteValue) or str(module).split(".")[0] not in _TRAVEL_SAFELY:
            left.append(f"`{name}`")
            continue
        hint = getattr(value, "nbytes", None)  # an array's or a Series' size, known without pickling it
        if (hint if isinstance(hint, int) else sys.getsizeof(value)) > RUNTIME_LOOKUP_BYTES - size:
            left.append(f"`{name}`")
            continue
        try:
            weight = 0 if isinstance(value, types.ModuleType) else len(cloudpickle.dumps(value, protocol=5))
        except Exception:  # pickling runs the value's own code: what fails here stays here
            left.append(f"`{name}`")
            continue
        if size + weight > RUNTIME_LOOKUP_BYTES:
            left.append(f"`{name}`")
            continue
        size += weight
        sent[name] = value
    stayed = f"; {', '.join(left)} stayed here (a handle, too large, or of a package the worker may lack)" if (
        left) else ""
    notice(f"`{call}` looks names up as the cell runs, so the notebook's other variables went with it "
           f"({len(sent)} of them, {human_size(size)}){stayed}")
    return sent


def worker_holding(inputs: dict[str, Any], asked: str | None) -> str | None:
    """The worker a cell must run on: the one holding the values it reads by handle, or the one asked for."""
    holders = {value.worker: name for name, value in inputs.items() if isinstance(value, RemoteValue)}
    if len(holders) > 1 or (holders and asked is not None and asked not in holders):
        where = ", ".join(f"`{name}` on {worker!r}" for worker, name in holders.items())
        raise UsageError(f"this cell reads values that live on workers ({where}), so it can run only there"
                         + (f", not on {asked!r}" if asked else "") + ": make them again where it runs")
    return asked if asked is not None else next(iter(holders), None)


def figure_formats(shell: Any) -> list[str]:
    """The formats this notebook shows figures in (``%config InlineBackend.figure_formats``, or the older
    ``figure_format``)."""
    inline = sys.modules.get("matplotlib_inline.backend_inline")
    if inline is not None and inline.InlineBackend.initialized():
        return sorted(inline.InlineBackend.instance().figure_formats)
    configured = shell.config.get("InlineBackend", {})
    formats = configured.get("figure_formats") or (
        [configured["figure_format"]] if "figure_format" in configured else [])
    return sorted(formats) or ["png"]


def text_format(shell: Any) -> dict[str, Any]:
    """How this notebook shows values as text, for the worker to show the cell's value alike."""
    plain = shell.display_formatter.formatters["text/plain"]
    return {name: getattr(plain, name) for name in TEXT_FORMAT}


def listed(names: str | None) -> list[str] | None:
    """``a, b`` as typed after an option (``--keep a,b``, ``matmul,softmax``): the names."""
    return [name.strip() for name in names.split(",") if name.strip()] if names else None


def unquoted(values: list[str] | None) -> list[str] | None:
    """``--require "memory>=16GB"`` as typed: IPython's magic parser keeps the quotes."""
    return None if values is None else [v[1:-1] if len(v) > 1 and v[0] == v[-1] and v[0] in "'\"" else v
                                        for v in values]
