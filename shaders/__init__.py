"""WGSL sources of remote-magic's built-in GPU kernels, shipped inside the wheel as package data.

Each kernel family is one ``.wgsl`` file beside this module; :func:`source` reads it through
``importlib.resources`` so it works from a source checkout, an installed wheel or a zip. A file named
in :data:`EXTENDS` adds entry points to another and is compiled with it, as one module.
"""

from __future__ import annotations

from importlib import resources

KERNEL_FILES: tuple[str, ...] = ("matmul", "matmul_subgroups", "elementwise", "reduce", "softmax", "transpose",
                                  "sort", "select",
                                  "arg_reduce", "scan",
                                  "integer", "counting", "unique", "gather")
"""The built-in shader files, without the ``.wgsl`` suffix."""
EXTENDS: dict[str, str] = {"matmul_subgroups": "matmul", "unique": "sort"}
"""Files that use another's declarations: the source is the file, then the one it extends (WGSL's
module-scope declarations may come in any order, and this way the extension's lines keep their numbers)."""


def source(name: str) -> str:
    """The WGSL text of the built-in shader file ``name`` (e.g. ``"matmul"``), with the file it extends.

    Raises ``FileNotFoundError`` naming the available files when there is no such shader.
    """
    if name not in KERNEL_FILES:
        raise FileNotFoundError(f"no built-in shader {name!r}; available: {', '.join(KERNEL_FILES)}")
    text = resources.files(__name__).joinpath(f"{name}.wgsl").read_text(encoding="utf-8")
    return text + "\n" + source(EXTENDS[name]) if name in EXTENDS else text


def location(name: str) -> str:
    """Where the shader file ``name`` is read from, as a string (for diagnostics and tests)."""
    return str(resources.files(__name__).joinpath(f"{name}.wgsl"))
