"""Libraries that look at where they run, at import, see a Jupyter kernel, as in the notebook.

pandas picks its display defaults when it is imported: in a Jupyter kernel ``display.max_columns``
is 20 and a wide frame wraps its columns, while in a terminal it is 0 and columns are cut to the
terminal's width (``pandas.io.formats.console.is_terminal``, which asks ``get_ipython()`` whether
there is a kernel). The executor has no IPython shell, so without this a wide DataFrame printed by
an offloaded cell would read differently from the same cell run in the notebook.
"""

from __future__ import annotations

import builtins
import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any, Sequence

KERNEL_AWARE = frozenset({"pandas"})
"""Top-level modules that decide their defaults by asking ``get_ipython()`` when imported."""


class _KernelShell:
    """What ``get_ipython()`` answers while a kernel-aware library is imported: a shell with a kernel."""

    kernel = None


def _get_ipython() -> _KernelShell:
    return _KernelShell()


class _KernelLoader(importlib.abc.Loader):
    """Runs the real loader with ``get_ipython`` defined, and only for as long as the import runs."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        defined = hasattr(builtins, "get_ipython")
        if not defined:
            builtins.get_ipython = _get_ipython  # type: ignore[attr-defined]
        try:
            self._loader.exec_module(module)
        finally:
            if not defined:
                del builtins.get_ipython  # type: ignore[attr-defined]
            # From now on the module is as any other: its loader is the real one (importlib.resources asks it).
            module.__loader__ = self._loader
            if module.__spec__ is not None:
                module.__spec__.loader = self._loader


class _KernelAwareFinder(importlib.abc.MetaPathFinder):
    """Finds kernel-aware libraries as the other finders do, and wraps their loader."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in KERNEL_AWARE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec: Any = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _KernelLoader(spec.loader)
                return spec  # type: ignore[no-any-return]
        return None


def install() -> None:
    """From now on, kernel-aware libraries this process imports take a Jupyter kernel's defaults."""
    if not any(isinstance(finder, _KernelAwareFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _KernelAwareFinder())
