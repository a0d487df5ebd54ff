"""A name an offloaded cell bound by an import statement comes back as the notebook's own import.

A module may pick what a name is for the process it is imported in: ``tqdm.auto``'s ``tqdm`` is the
widget bar in a Jupyter kernel with ipywidgets, the text bar elsewhere. Sent as a value (a class
travels by reference to where it was defined), an offloaded cell's ``from tqdm.auto import tqdm`` would
bind the worker's pick in the notebook, and later local cells would use it. So the worker sends such a
name as where it was imported from (``notebook_imports``), and unpickling it in the notebook imports it
there, as the same statement in a local cell would (``imported_here``).

Only a module, class or function that is still the very object the statement bound: data (``from config
import settings``, a list the cell appended to) travels as a value, like any other. Where the notebook
can't import it (a module only the worker has), the name gets the value the worker sent with it, as if it
had been sent alone (a module: ``serialization.ModuleRef``, with its notice).
"""

from __future__ import annotations

import importlib
import inspect
import logging
import pickle
import sys
import types
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from .cellcode import Imported, names_imported

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NotebookImport:
    """A value the worker sends as "what ``imported`` binds in the notebook"; ``serialization`` pickles it as
    a call of ``imported_here``, with ``value`` pickled on its own to fall back on."""

    imported: Imported
    value: Any

    def reduction(self, fallback: bytes) -> tuple[Any, tuple[str, str | None, bool, bytes]]:
        """Its pickle reduction, ``fallback`` being ``value``'s own pickle."""
        return imported_here, (*self.imported, fallback)


def notebook_imports(values: Mapping[str, Any], code: str) -> dict[str, Any]:
    """``values`` (what a cell bound, by name) with each name that ``code``'s import statements bound to a
    module, class or function, and that is still bound to the very object they bound, as a NotebookImport."""
    imported = names_imported(code)
    starred = [star.module for star in imported.pop("*", [])]  # `from m import *` may have bound any of m's names
    return {name: _as_notebook_import(value, [*imported.get(name, ()), *(Imported(m, name) for m in starred)])
            for name, value in values.items()}


def _as_notebook_import(value: Any, imported: Iterable[Imported]) -> Any:
    if not (isinstance(value, (types.ModuleType, type)) or inspect.isroutine(value)):
        return value  # data: what the cell left in it comes back
    for origin in imported:
        if _bound_here(origin) is value:
            return NotebookImport(origin, value)
    return value


_MISSING = object()


def _bound_here(origin: Imported) -> Any:
    """What the import statement binds in this process now (``_MISSING``: nothing, its module isn't loaded)."""
    module = sys.modules.get(origin.module.partition(".")[0] if origin.top else origin.module)
    if module is None:
        return _MISSING
    return module if origin.attribute is None else getattr(module, origin.attribute, _MISSING)


def imported_here(module: str, attribute: str | None, top: bool, fallback: bytes) -> Any:
    """What ``from module import attribute`` (``attribute`` None: ``import module``; ``top``: without ``as``)
    binds in this process; where that import fails, the value the worker sent (``fallback``, its pickle)."""
    try:
        return _import(module, attribute, top)
    except Exception as exc:  # a module's code runs as it is imported: whatever fails, the worker's value stands
        log.debug("`import %s` fails here (%s: %s); the worker's value is used", module, type(exc).__name__, exc)
        return pickle.loads(fallback)


def _import(module: str, attribute: str | None, top: bool) -> Any:
    """As the import statement does it."""
    found = importlib.import_module(module)
    if attribute is None:
        return sys.modules[module.partition(".")[0]] if top else found
    try:
        return getattr(found, attribute)
    except AttributeError:  # `from package import submodule` imports the submodule
        return importlib.import_module(f"{module}.{attribute}")
