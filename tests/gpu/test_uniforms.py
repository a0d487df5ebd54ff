"""Each built-in kernel's uniform is declared once (worker/gpu/uniforms.py) and agrees with its WGSL.

The WGSL side is parsed here from ``shaders/*.wgsl``: every struct bound as ``var<uniform>``
must match its Python layout field by field (names, types, order, offsets, total size). Offsets
and sizes are recomputed here from WGSL's layout rules, independently of the packer.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from remote_magic import shaders
from remote_magic.worker.gpu import uniforms
from remote_magic.worker.gpu.custom import pack_params
from remote_magic.worker.gpu.uniforms import LAYOUTS, UniformLayout, canonical

SHADER_FILES = sorted(Path(shaders.__file__).parent.glob("*.wgsl"))
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_UNIFORM = re.compile(r"var\s*<\s*uniform\s*>\s*(\w+)\s*:\s*([\w<>, ]+?)\s*;")


def uniform_structs(source: str) -> dict[str, list[tuple[str, str]]]:
    """The struct type of each ``var<uniform>`` in WGSL ``source``: its members as (name, type), in order."""
    code = _COMMENT.sub("", source)
    structs = {}
    for variable, type_name in _UNIFORM.findall(code):
        body = re.search(rf"\bstruct\s+{type_name}\s*\{{(.*?)\}}", code, re.DOTALL)
        assert body is not None, f"var<uniform> {variable}: {type_name} is not a struct in this file"
        structs[type_name] = [_member(text) for text in _split_members(body.group(1))]
    return structs


def _split_members(body: str) -> list[str]:
    """``body`` split at the commas outside ``<...>``."""
    members, depth, current = [], 0, ""
    for char in body:
        depth += {"<": 1, ">": -1}.get(char, 0)
        if char == "," and depth == 0:
            members.append(current)
            current = ""
        else:
            current += char
    return [m.strip() for m in [*members, current] if m.strip()]


def _member(text: str) -> tuple[str, str]:
    assert "@" not in text, f"{text!r}: member attributes (@align, @size) are not supported by UniformLayout"
    name, _, wgsl = text.partition(":")
    return name.strip(), " ".join(wgsl.split())


def wgsl_offsets(members: list[tuple[str, str]]) -> tuple[list[int], int]:
    """Offsets of ``members`` and the struct's size by WGSL's rules, for scalars, vectors and arrays of them."""

    def align_size(wgsl: str) -> tuple[int, int]:
        wgsl = canonical(wgsl)
        if wgsl in ("u32", "i32", "f32"):
            return 4, 4
        vector = re.fullmatch(r"vec(\d)<\w+>", wgsl)
        if vector:
            n = int(vector.group(1))
            return (8 if n == 2 else 16), 4 * n
        array = re.fullmatch(r"array<(.+), (\d+)>", wgsl)
        assert array, f"no layout rule here for {wgsl}"
        align, size = align_size(array.group(1))
        stride = -(-size // align) * align
        assert stride % 16 == 0, f"{wgsl}: a uniform array's stride must be a multiple of 16"
        return max(align, 16), stride * int(array.group(2))

    offsets, end, struct_align = [], 0, 1
    for _, wgsl in members:
        align, size = align_size(wgsl)
        offsets.append(-(-end // align) * align)
        end, struct_align = offsets[-1] + size, max(struct_align, align)
    return offsets, -(-end // struct_align) * struct_align


def test_every_shader_uniform_has_a_layout() -> None:
    with_uniforms = {path.stem for path in SHADER_FILES if uniform_structs(path.read_text(encoding="utf-8"))}
    assert with_uniforms == set(LAYOUTS)
    assert set(LAYOUTS) <= set(shaders.KERNEL_FILES)


@pytest.mark.parametrize("shader", sorted(LAYOUTS))
def test_the_layout_matches_the_wgsl_struct(shader: str) -> None:
    [members] = uniform_structs(shaders.source(shader)).values()  # one var<uniform> per shader
    layout = LAYOUTS[shader]
    assert [(f.name, f.wgsl) for f in layout.fields] == [(name, canonical(wgsl)) for name, wgsl in members]
    offsets, size = wgsl_offsets(members)
    assert [f.offset for f in layout.fields] == offsets
    assert layout.size == size
    assert layout.nbytes == size  # all built-in uniforms are whole 16-byte units: nothing appended


@pytest.mark.parametrize("shader", sorted(LAYOUTS))
def test_pack_puts_each_value_at_its_fields_offset(shader: str) -> None:
    layout = LAYOUTS[shader]
    values: dict[str, object] = {}
    for number, field in enumerate(layout.fields, start=1):
        first = 100 * number
        values[field.name] = float(first) if field.wgsl == "f32" else (
            first if field.count == 1 else list(range(first, first + field.count - 1)))  # one left to pad
    data = layout.pack(**values)  # type: ignore[arg-type]
    assert len(data) == layout.nbytes
    for field in layout.fields:
        code = "f" if field.wgsl == "f32" else "I"
        read = struct.unpack_from(f"<{field.count}{code}", data, field.offset)
        expected = values[field.name]
        assert list(read) == (list(expected) + [0] if isinstance(expected, list) else [expected]), field.name


def test_pack_refuses_wrong_fields_and_fills_padding() -> None:
    layout = uniforms.SOFTMAX
    assert layout.pack(outer=1, len=2, inner=3, rows=4) == struct.pack("<4I", 1, 2, 3, 4)
    with pytest.raises(TypeError, match="needs a value for rows"):
        layout.pack(outer=1, len=2, inner=3)
    with pytest.raises(TypeError, match="no field cols"):
        layout.pack(outer=1, len=2, inner=3, rows=4, cols=5)
    transpose = uniforms.TRANSPOSE
    with pytest.raises(ValueError, match="at most 8 values"):
        transpose.pack(n=1, ndim=9, rows=0, cols=0, batch=0, tiles_r=0, tiles_c=0, shape=[1] * 9, strides=())
    data = transpose.pack(n=1, ndim=0, rows=2, cols=3, batch=4, tiles_r=5, tiles_c=6, shape=(), strides=())
    assert struct.unpack_from("<8I", data) == (1, 0, 2, 3, 4, 5, 6, 0)  # _pad is 0


def test_wgsl_alignment_rules() -> None:
    layout = UniformLayout("mixed", [("a", "u32"), ("b", "vec3f"), ("c", "f32"), ("d", "vec2<i32>"),
                                     ("e", "array<vec4u, 2>"), ("f", "i32")])
    assert [(f.name, f.wgsl, f.offset) for f in layout.fields] == [
        ("a", "u32", 0), ("b", "vec3<f32>", 16), ("c", "f32", 28), ("d", "vec2<i32>", 32),
        ("e", "array<vec4<u32>, 2>", 48), ("f", "i32", 80)]
    assert (layout.size, layout.nbytes) == (96, 96)
    data = layout.pack(a=1, b=(1.5, 2.5, 3.5), c=4.5, d=(-1, -2), e=range(8), f=-3)
    assert struct.unpack_from("<3f", data, 16) == (1.5, 2.5, 3.5)
    assert struct.unpack_from("<f2i", data, 28) == (4.5, -1, -2)
    assert struct.unpack_from("<8Ii", data, 48) == (*range(8), -3)
    assert UniformLayout("small", [("x", "f32")]).nbytes == 16  # bound in 16-byte units
    with pytest.raises(ValueError, match="multiple of 16"):
        UniformLayout("bad", [("dims", "array<u32, 8>")])  # WGSL rejects this stride in a uniform
    with pytest.raises(ValueError, match="unsupported"):
        UniformLayout("bad", [("m", "mat4x4<f32>")])


def test_custom_params_pack_as_their_types() -> None:
    data = pack_params([2.5, -1, 7, True])
    assert data == struct.pack("<fiII", 2.5, -1, 7, 1)
    assert pack_params([]) == bytes(16)
    assert struct.unpack("<f12x", pack_params([1e40])) == (float("inf"),)  # beyond float32: inf, as numpy
