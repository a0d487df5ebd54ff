"""The package's shape: no import circle, each process loading its own side, and modules that can run
as scripts.

Imports are read from the source, wherever they sit in a file (inside functions and under
``TYPE_CHECKING`` too): a circle that only type checking or a late import closes is still two
modules that each need the other.
"""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

REPO = Path(__file__).resolve().parents[2]
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


@functools.cache  # read once per process: every test below asks for it (none may change it)
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


NOTEBOOK_SIDE = sorted(module for module, path in MODULES.items()
                       if module.startswith("remote_magic.notebook") or (
                           path.parent == FOLDERS["remote_magic"] and path.name != "__init__.py"
                           and module not in ("remote_magic.errors", "remote_magic._version")))
"""The notebook's modules: the client API, its job tables, the Dask client, the magics. ``errors`` and
``_version`` are every side's."""
SERVER_SIDES = ("remote_magic.wire", "remote_magic.hub", "remote_magic.worker", "remote_magic.kernel_provider")
"""What runs in a worker, hub or executor process (and the kernel provisioner, in a Jupyter server)."""


def _on_a_server_side(module: str) -> bool:
    return any(module == package or module.startswith(package + ".") for package in SERVER_SIDES)


def _reachable(graph: dict[str, set[str]], module: str) -> set[str]:
    """Every module ``module`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        for target in graph[todo.pop()] - seen:
            seen.add(target)
            todo.append(target)
    return seen


def test_the_notebook_side_is_the_client_its_job_tables_and_the_magics() -> None:
    assert {"remote_magic.client", "remote_magic.client_jobs", "remote_magic.fleet_jobs", "remote_magic.dask_client",
            "remote_magic.dask_jobs", "remote_magic.notebook.magics"} <= set(NOTEBOOK_SIDE)
    assert not any(_on_a_server_side(module) for module in NOTEBOOK_SIDE)


def test_no_hub_worker_or_wire_module_imports_the_notebook_side() -> None:
    graph = _graph(packages_as_modules=False)
    reached = {module: sorted(_reachable(graph, module) & set(NOTEBOOK_SIDE))
               for module in MODULES if _on_a_server_side(module)}
    assert {module: targets for module, targets in reached.items() if targets} == {}


def test_the_gpu_layer_imports_nothing_of_the_tab_server() -> None:
    """An executor's GPU code reaches a tab through the tab protocol only: the page's server and the
    bridge (``worker/browser/``) run in remote-worker, not in the executor."""
    graph = _graph(packages_as_modules=False)
    reached = {module: sorted(target for target in _reachable(graph, module)
                              if target.startswith("remote_magic.worker.browser"))
               for module in MODULES if module.startswith("remote_magic.worker.gpu")}
    assert {module: targets for module, targets in reached.items() if targets} == {}
    # What docs/gpu.md says the layer imports from outside it, and what the tab's device imports at all.
    outside = {target for module, targets in _graph(packages_as_modules=True).items()
               if module.startswith("remote_magic.worker.gpu")
               for target in targets if not target.startswith(("remote_magic.worker.gpu", "remote_magic.wire."))}
    assert outside == {"remote_magic.errors", "remote_magic.shaders", "remote_magic.worker.tab_protocol"}
    assert _imports("remote_magic.worker.gpu.tab_device", MODULES["remote_magic.worker.gpu.tab_device"]) == {
        "remote_magic.errors", "remote_magic.worker.tab_protocol", "remote_magic.worker.gpu.device"}


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@dataclass(frozen=True)
class Boundary:
    """A side of the house (``side``: a package) that must not reach modules ``forbidden`` says, directly or
    through others."""

    name: str
    side: str
    forbidden: Callable[[str], bool]
    example: str  # one forbidden module, for the check that a planted import is caught

    def crossings(self, graph: dict[str, set[str]]) -> dict[str, list[str]]:
        """The side's modules that reach a forbidden one, each with what it reaches."""
        reached = {module: sorted(t for t in _reachable(graph, module) if self.forbidden(t))
                   for module in graph if _within(module, self.side)}
        return {module: targets for module, targets in reached.items() if targets}


WIRE_BELOW = ("remote_magic.wire", "remote_magic.errors", "remote_magic._version")

BOUNDARIES = [
    Boundary("the hub never imports the notebook side (the client, its job tables, the Dask client, the magics)",
             "remote_magic.hub", lambda m: m in NOTEBOOK_SIDE or _within(m, "remote_magic.notebook"),
             "remote_magic.client_jobs"),
    Boundary("the hub never imports a worker's code (remote-worker hosts the hub, not the other way round)",
             "remote_magic.hub", lambda m: _within(m, "remote_magic.worker"), "remote_magic.worker.supervisor"),
    Boundary("the GPU layer never imports the tab server (it reaches a tab through the tab protocol)",
             "remote_magic.worker.gpu", lambda m: _within(m, "remote_magic.worker.browser"),
             "remote_magic.worker.browser.server"),
    Boundary("the wire imports only the exception tree and the version", "remote_magic.wire",
             lambda m: not m.startswith(WIRE_BELOW), "remote_magic.hub.fleet"),
    Boundary("the kernel provisioner (in Jupyter's process) imports no hub, worker or notebook side",
             "remote_magic.kernel_provider", lambda m: not m.startswith((*WIRE_BELOW, "remote_magic.kernel_provider")),
             "remote_magic.client"),
]


@pytest.mark.parametrize("boundary", BOUNDARIES, ids=lambda b: b.side + "-" + b.example.rsplit(".", 1)[1])
def test_no_side_reaches_across_its_boundary(boundary: Boundary) -> None:
    assert boundary.crossings(_graph(packages_as_modules=False)) == {}, boundary.name


@pytest.mark.parametrize("boundary", BOUNDARIES, ids=lambda b: b.side + "-" + b.example.rsplit(".", 1)[1])
def test_an_import_planted_across_a_boundary_is_caught_also_through_another_module(boundary: Boundary) -> None:
    """The check above fails when the boundary breaks: a direct import, and one through a module of another side."""
    graph = _graph(packages_as_modules=False)
    inside = sorted(module for module in graph if _within(module, boundary.side))[-1]
    assert boundary.example in graph and boundary.forbidden(boundary.example)
    direct = {**graph, inside: graph[inside] | {boundary.example}}
    assert boundary.example in boundary.crossings(direct)[inside]
    allowed = "remote_magic.errors"  # every side may import it; planted, it reaches the forbidden module
    through = {**graph, inside: graph[inside] | {allowed}, allowed: graph[allowed] | {boundary.example}}
    assert boundary.example in boundary.crossings(through)[inside]


def test_imports_are_read_inside_functions_and_under_type_checking(tmp_path: Path) -> None:
    """A late import or one only the type checker sees is an edge too (what the module docstring says)."""
    source = tmp_path / "planted.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..client import Client\n"
                      "def late():\n    from .. import client_jobs\n    import remote_magic.dask_client\n")
    assert _imports("remote_magic.hub.planted", source) == {"remote_magic.client", "remote_magic.client_jobs",
                                                            "remote_magic.dask_client"}


SEAM_USERS = ("remote_magic.hub.scheduler", "remote_magic.hub.delivery", "remote_magic.hub.jupyter_kernels")
"""The hub's modules that act on messages and send only through ``PeerSender`` (remote_magic/hub/sender.py)."""


@pytest.mark.parametrize("module", SEAM_USERS)
def test_the_hubs_handlers_send_only_through_the_peer_sender(module: str) -> None:
    """No peer's link, outbox or socket, and no import of the links: what sender.py says of them."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    reached = sorted({node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                      and node.attr in ("link", "outbox", "socket", "_socket")})
    assert reached == []
    assert not _imports(module, MODULES[module]) & {"remote_magic.wire.link", "remote_magic.wire.chunks",
                                                   "remote_magic.hub.broker"}


def _fresh(code: str) -> str:
    """What a fresh interpreter prints running ``code``."""
    probe = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr
    return probe.stdout


def _loaded_by(*modules: str) -> list[str]:
    """The package's modules a fresh interpreter holds after importing ``modules``."""
    code = f"import json, sys\nimport {', '.join(modules)}\n"
    loaded: list[str] = json.loads(_fresh(code + "print(json.dumps(sorted(m for m in sys.modules "
                                                 "if m.startswith('remote_magic'))))"))
    return loaded


def test_a_worker_hub_or_executor_process_loads_nothing_of_the_notebook_side() -> None:
    loaded = _loaded_by("remote_magic.worker.job_runner", "remote_magic.hub.broker", "remote_magic.worker.executor",
                        "remote_magic.worker.cli")
    assert "remote_magic.hub.broker" in loaded and "remote_magic.worker.executor" in loaded
    assert [module for module in loaded if module in NOTEBOOK_SIDE or module.startswith("remote_magic.notebook")] == []


def test_importing_the_package_loads_only_its_errors_until_a_name_is_used() -> None:
    assert _loaded_by("remote_magic") == ["remote_magic", "remote_magic._version", "remote_magic.errors"]
    used = _fresh("import sys, remote_magic\nremote_magic.connect\nprint('remote_magic.engines' in sys.modules, "
                  "remote_magic.Client.__module__, 'Client' in dir(remote_magic))")
    assert used.split() == ["True", "remote_magic.client", "True"]


@pytest.mark.parametrize("module", sorted(m for m, p in MODULES.items() if "__main__" in p.read_text(encoding="utf-8")))
def test_a_module_that_runs_as_a_script_defines_everything_before_it_runs(module: str) -> None:
    """``python -m MODULE`` runs the ``if __name__ == "__main__"`` block where it stands: a function
    defined below it doesn't exist yet."""
    body = ast.parse(MODULES[module].read_text(encoding="utf-8")).body
    mains = [i for i, node in enumerate(body) if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)]
    assert mains in ([], [len(body) - 1]), f"{module}: the __main__ block is not the module's last statement"
