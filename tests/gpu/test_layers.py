"""worker/gpu imports downward only: each module imports nothing from its own layer or above.

:data:`LAYERS` is the order, bottom first, written down once. Every import counts, wherever it
is written: at the top, inside a function, or under ``if TYPE_CHECKING:``. An upper module that a
lower one needs to call is reached through a Protocol in the lower module, or passed in.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "remote_magic.worker.gpu"
FOLDER = Path(__file__).resolve().parents[2] / "worker" / "gpu"

LAYERS: tuple[tuple[str, ...], ...] = (
    # wgpu-py's C types from cffi's declarations, before the device names any; the map mode of a read back
    ("wgpu_types", "mapping"),
    # the device and everything that needs no other module of the package
    ("convert", "device", "host_ops", "memory", "notices", "stats", "tinygrad_fused", "tinygrad_graph",
     "tinygrad_hook", "tinygrad_programs", "uniforms"),
    # compiling (errors of any device, a tab's too); buffers kept between cells by content digest; a tab's device
    ("pipelines", "resident", "tab_device"),
    ("context",),  # one device: pool, resident buffers, transfers, pipelines, timer, dispatch
    ("launch", "custom", "sort", "arg_reduce", "scan", "counting"),  # launching the built-in shaders and users' kernels
    ("matmul", "select", "integer", "unique", "gather"),  # kernels built on launch (unique: on sort and scan)
    ("tinygrad_matmul",),  # the tuned matmul in tinygrad's place; the device it runs on through a Protocol
    # tinygrad's WEBGPU device over wgpu-py (it copies arrays kept by resident, runs tinygrad_matmul's programs)
    ("tinygrad_device",),
    ("dispatch",),  # running kernels on host values; counting what ran with numpy
    ("numpy_kernels",),  # numpy operations as kernels, with numpy's answers
    ("numpy_counting", "numpy_indexing"),  # bincount, add.at, sort, quantiles, unique; x[rows]: numpy_kernels' rules
    ("numpy_api",),  # __array_ufunc__ / __array_function__: what goes to a kernel
    ("arrays",),  # DeviceArray
    ("namespace",),  # the cell's `gpu`; knows the runtime through a Protocol
    ("runtime",),  # GpuRuntime, what the executor holds
    ("__init__",),  # the public names
)
LAYER = {module: index for index, layer in enumerate(LAYERS) for module in layer}


def package_imports(source: str) -> set[str]:
    """Modules of the package that ``source`` (a module of it) imports, anywhere in the file.

    ``from . import x`` names module ``x``; any other import of the package itself is ``__init__``.
    """
    modules = {path.stem for path in FOLDER.glob("*.py")}
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = PACKAGE.rsplit(".", node.level - 1)[0] if node.level else ""  # `from ..x` is the parent's x
            target = ".".join(part for part in (base, node.module) if part)
            targets = [(target, [alias.name for alias in node.names])]
        else:
            continue
        for target, names in targets:
            if target == PACKAGE:
                found |= {name if name in modules else "__init__" for name in names} or {"__init__"}
            elif target.startswith(PACKAGE + "."):
                found.add(target[len(PACKAGE) + 1:].split(".")[0])
    return found


def test_every_module_has_a_layer() -> None:
    modules = sorted(path.stem for path in FOLDER.glob("*.py"))
    assert modules == sorted(LAYER), "add the new module to LAYERS (or remove the old one)"
    assert len(LAYER) == sum(len(layer) for layer in LAYERS), "a module is in two layers"


def test_every_module_imports_only_from_lower_layers() -> None:
    upward = []
    for path in sorted(FOLDER.glob("*.py")):
        module = path.stem
        for imported in sorted(package_imports(path.read_text(encoding="utf-8"))):
            if LAYER[imported] >= LAYER[module]:
                upward.append(f"{module} (layer {LAYER[module]}) imports {imported} (layer {LAYER[imported]})")
    assert upward == []


def test_imports_count_inside_functions_and_under_type_checking() -> None:
    source = """\
from typing import TYPE_CHECKING
import numpy as np
from remote_magic.errors import GpuError
from . import custom, DeviceArray
from .dispatch import Dispatcher
if TYPE_CHECKING:
    from .runtime import GpuRuntime

def later():
    from .numpy_api import array_ufunc
    import remote_magic.worker.gpu.launch
    from .. import executor
    from remote_magic.worker.gpu import GpuNamespace
"""
    assert package_imports(source) == {"custom", "__init__", "dispatch", "runtime", "numpy_api", "launch"}
