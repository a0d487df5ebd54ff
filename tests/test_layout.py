"""The package's shape: no import circle, and modules that can run as scripts.

Imports are read from the source, wherever they sit in a file (inside functions and under
``TYPE_CHECKING`` too): a circle that only type checking or a late import closes is still two
modules that each need the other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FOLDERS = {"remote_magic": REPO / "remote_magic", "remote_magic.worker": REPO / "worker",
           "remote_magic.kernel_provider": REPO / "kernel_provider", "remote_magic.shaders": REPO / "shaders"}
"""Where each package's source lies in the repository (setuptools installs them under one name)."""


def _modules() -> dict[str, Path]:
    found = {}
    for package, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            if package == "remote_magic" and path.relative_to(folder).parts[0] in ("worker", "kernel_provider",
                                                                                  "shaders"):
                continue
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _imports(module: str, path: Path) -> set[str]:
    """The package's modules that ``module`` imports, anywhere in its source."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""  # `from ..x` is the parent's x
            target = ".".join(part for part in (base, node.module) if part)
            targets = [f"{target}.{alias.name}" if f"{target}.{alias.name}" in MODULES else target
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:  # `import a.b.c` of a function or class: its module
                target = target.rpartition(".")[0]
            if target and target != module:
                found.add(target)
    return found


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of two or more modules (Tarjan's algorithm), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups)


def _graph(packages_as_modules: bool) -> dict[str, set[str]]:
    graph = {module: _imports(module, path) for module, path in MODULES.items()}
    if not packages_as_modules:  # `from remote_magic.wire import x` runs wire/__init__, which is no design edge
        packages = {module for module, path in MODULES.items() if path.name == "__init__.py"}
        graph = {module: targets - packages for module, targets in graph.items()}
    return graph


def test_the_import_graph_is_read_from_the_source() -> None:
    graph = _graph(packages_as_modules=True)
    assert "remote_magic.worker.supervisor" in graph and "remote_magic.wire.link" in graph
    assert "remote_magic.wire.chunks" in graph["remote_magic.wire.link"]
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_imports_a_module_that_imports_it_back() -> None:
    assert _circles(_graph(packages_as_modules=False)) == []


def test_the_wire_protocol_imports_nothing_above_it() -> None:
    below = ("remote_magic.wire", "remote_magic.errors", "remote_magic._version")
    upward = {module: sorted(target for target in targets if not target.startswith(below))
              for module, targets in _graph(packages_as_modules=False).items() if module.startswith(below[0])}
    assert {module: targets for module, targets in upward.items() if targets} == {}


@pytest.mark.parametrize("module", sorted(m for m, p in MODULES.items() if "__main__" in p.read_text(encoding="utf-8")))
def test_a_module_that_runs_as_a_script_defines_everything_before_it_runs(module: str) -> None:
    """``python -m MODULE`` runs the ``if __name__ == "__main__"`` block where it stands: a function
    defined below it doesn't exist yet."""
    body = ast.parse(MODULES[module].read_text(encoding="utf-8")).body
    mains = [i for i, node in enumerate(body) if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)]
    assert mains in ([], [len(body) - 1]), f"{module}: the __main__ block is not the module's last statement"
