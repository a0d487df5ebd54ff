"""WGSL sources of remote-magic's built-in GPU kernels, shipped inside the wheel as package data.

Each kernel family is one ``.wgsl`` file beside this module; :func:`source` reads it through
``importlib.resources`` so it works from a source checkout, an installed wheel or a zip.
"""

from __future__ import annotations

from importlib import resources

KERNEL_FILES: tuple[str, ...] = ("matmul", "elementwise", "reduce", "softmax", "transpose")
"""The built-in shader files, without the ``.wgsl`` suffix."""


def source(name: str) -> str:
    """The WGSL text of the built-in shader file ``name`` (e.g. ``"matmul"``).

    Raises ``FileNotFoundError`` naming the available files when there is no such shader.
    """
    if name not in KERNEL_FILES:
        raise FileNotFoundError(f"no built-in shader {name!r}; available: {', '.join(KERNEL_FILES)}")
    return resources.files(__name__).joinpath(f"{name}.wgsl").read_text(encoding="utf-8")


def location(name: str) -> str:
    """Where the shader file ``name`` is read from, as a string (for diagnostics and tests)."""
    return str(resources.files(__name__).joinpath(f"{name}.wgsl"))
