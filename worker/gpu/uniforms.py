"""Uniform layouts: each built-in kernel's WGSL ``Params`` struct, declared once, in Python.

A :class:`UniformLayout` lists a struct's fields (name and WGSL type, in order), places them by
WGSL's alignment rules for the uniform address space, and packs values into the bytes a kernel
binds through one precomputed :class:`struct.Struct`. ``tests/gpu/test_uniforms.py`` parses the
``var<uniform>`` struct of every ``shaders/*.wgsl`` and checks it against :data:`LAYOUTS` field by
field, so the two cannot drift apart.

Types: the scalars ``u32``, ``i32``, ``f32``; ``vec2``/``vec3``/``vec4`` of them (``vec4<u32>`` or
``vec4u``); and ``array<T, N>`` of those, whose element stride WGSL requires to be a multiple of
16 bytes in a uniform (``array<vec4<u32>, 2>`` holds eight u32, ``array<u32, 8>`` is not allowed).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from functools import lru_cache
from operator import itemgetter
from typing import Any, Callable, Mapping, Sequence, Union

UNIFORM_UNIT = 16
"""Uniform buffers are bound in 16-byte units; packed bytes are padded to a multiple of this."""

SCALARS = {"u32": "I", "i32": "i", "f32": "f"}
"""WGSL scalar type -> :mod:`struct` code (little-endian, 4 bytes each)."""

_ALIASES = {f"vec{n}{suffix}": f"vec{n}<{scalar}>" for n in (2, 3, 4)
            for suffix, scalar in (("u", "u32"), ("i", "i32"), ("f", "f32"))}
_VECTOR = re.compile(r"vec([234])<(\w+)>")
_ARRAY = re.compile(r"array<(.+),(\d+)[ui]?>")

Value = Union[float, Sequence[float]]
"""A scalar field's number, or a vector or array field's numbers (fewer are padded with zeros)."""


@dataclass(frozen=True)
class Field:
    """One member of a uniform struct, placed."""

    name: str
    wgsl: str
    """Its WGSL type, written canonically (``array<vec4<u32>, 2>``)."""
    offset: int
    """Byte offset in the struct."""
    size: int
    """Bytes it spans (an array's padding between elements included)."""
    count: int
    """Numbers it holds: 1 for a scalar, 8 for ``array<vec4<u32>, 2>``."""


@dataclass(frozen=True)
class _Type:
    text: str  # canonical WGSL
    align: int
    size: int
    code: str  # struct format of the value, padding included
    count: int


def canonical(wgsl: str) -> str:
    """``wgsl`` type text written one way: no spaces but after commas, aliases and literal suffixes expanded."""
    return _parse(re.sub(r"\s+", "", wgsl)).text


def _parse(text: str) -> _Type:
    if text in SCALARS:
        return _Type(text, 4, 4, SCALARS[text], 1)
    text = _ALIASES.get(text, text)
    vector = _VECTOR.fullmatch(text)
    if vector and vector.group(2) in SCALARS:
        n = int(vector.group(1))
        return _Type(f"vec{n}<{vector.group(2)}>", 8 if n == 2 else 16, 4 * n, f"{n}{SCALARS[vector.group(2)]}", n)
    array = _ARRAY.fullmatch(text)
    if array:
        element, length = _parse(array.group(1)), int(array.group(2))
        stride = _round_up(element.size, element.align)
        if stride % UNIFORM_UNIT:
            raise ValueError(f"array<{element.text}, {length}> has a {stride}-byte stride, but a uniform's must be a "
                             f"multiple of {UNIFORM_UNIT}: use vec4 elements (array<vec4<u32>, 2> holds eight u32)")
        code = (element.code + _pad(stride - element.size)) * length
        return _Type(f"array<{element.text}, {length}>", max(element.align, UNIFORM_UNIT), stride * length, code,
                     element.count * length)
    raise ValueError(f"unsupported uniform field type {text!r}: use u32, i32, f32, their vectors, or arrays of them")


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def _pad(nbytes: int) -> str:
    return f"{nbytes}x" if nbytes else ""


class UniformLayout:
    """A WGSL uniform struct: its fields in order, their offsets, and a packer for its bytes."""

    def __init__(self, name: str, fields: Sequence[tuple[str, str]]) -> None:
        """``fields`` are (name, WGSL type) in declaration order; names starting with ``_`` are padding (0)."""
        self.name = name
        placed: list[Field] = []
        code, end, align = "<", 0, 4
        for field_name, wgsl in fields:
            kind = _parse(re.sub(r"\s+", "", wgsl))
            offset = _round_up(end, kind.align)
            code += _pad(offset - end) + kind.code
            placed.append(Field(field_name, kind.text, offset, kind.size, kind.count))
            end, align = offset + kind.size, max(align, kind.align)
        self.fields: tuple[Field, ...] = tuple(placed)
        self.size = _round_up(end, align)
        """The struct's size as WGSL computes it (``SizeOf``)."""
        self.nbytes = max(UNIFORM_UNIT, _round_up(self.size, UNIFORM_UNIT))
        """Bytes :meth:`pack` returns: the size rounded up to whole 16-byte units."""
        # Built once, as pack runs for every dispatch: the struct, a getter of the fields' values
        # in order, the padding fields' defaults, and where vectors and arrays sit.
        self._struct = struct.Struct(code + _pad(self.nbytes - end))
        self._names = frozenset(f.name for f in self.fields)
        self._get = _getter([f.name for f in self.fields])
        self._defaults = {f.name: 0 if f.count == 1 else () for f in self.fields if f.name.startswith("_")}
        self._arrays = tuple((index, f.count, f.name) for index, f in enumerate(self.fields) if f.count > 1)

    def field(self, name: str) -> Field:
        """The field called ``name``."""
        for field in self.fields:
            if field.name == name:
                return field
        raise KeyError(f"{self.name} has no field {name}")

    def pack(self, **values: Value) -> bytes:
        """The struct's bytes, one keyword per field; padding fields (``_name``) may be left out."""
        if not values.keys() <= self._names:
            raise TypeError(f"{self.name} has no field {', '.join(sorted(values.keys() - self._names))}")
        try:
            ordered = self._get({**self._defaults, **values} if self._defaults else values)
        except KeyError as exc:
            raise TypeError(f"{self.name} needs a value for {exc.args[0]}") from None
        return self._pack(ordered)

    def pack_ordered(self, values: Sequence[Any]) -> bytes:
        """The struct's bytes from one value per field (see :data:`Value`), in declaration order."""
        if len(values) != len(self.fields):
            raise TypeError(f"{self.name} has {len(self.fields)} fields, not {len(values)}")
        return self._pack(tuple(values))

    def _pack(self, ordered: tuple[Any, ...]) -> bytes:
        if not self._arrays:
            return self._struct.pack(*ordered)
        flat: list[Any] = []
        start = 0
        for index, count, name in self._arrays:  # scalars up to it as they are; it padded with zeros
            numbers = ordered[index]
            if len(numbers) > count:
                raise ValueError(f"{self.name}.{name} holds at most {count} values, not {len(numbers)}")
            flat += ordered[start:index]
            flat += numbers
            flat += [0] * (count - len(numbers))
            start = index + 1
        flat += ordered[start:]
        return self._struct.pack(*flat)

    def __repr__(self) -> str:
        fields = ", ".join(f"{f.name}: {f.wgsl}" for f in self.fields)
        return f"UniformLayout({self.name} {{ {fields} }}, {self.size} bytes)"


def _getter(names: list[str]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """A function giving the values of ``names`` in a mapping, as a tuple (a KeyError names a missing one)."""
    if len(names) >= 2:
        return itemgetter(*names)
    return lambda values: tuple(values[name] for name in names)  # itemgetter of one name gives no tuple


@lru_cache(maxsize=256)
def scalars(types: tuple[str, ...]) -> UniformLayout:
    """A struct of the given scalar types, fields ``p0``, ``p1``... (custom kernels' params)."""
    return UniformLayout("params", [(f"p{i}", wgsl) for i, wgsl in enumerate(types)])


DIMS = "array<vec4<u32>, 2>"
"""Up to eight extents or strides, one per dimension (unused ones 0)."""

ELEMENTWISE = UniformLayout("elementwise.wgsl Params", [
    ("n", "u32"), ("ndim", "u32"), ("flags", "u32"), ("scalar", "f32"),
    ("shape", DIMS), ("a_strides", DIMS), ("b_strides", DIMS), ("one", "f32"),
])
REDUCE = UniformLayout("reduce.wgsl Params", [
    ("outer", "u32"), ("len", "u32"), ("inner", "u32"), ("chunks", "u32"),
    ("chunk", "u32"), ("count", "u32"), ("scale", "f32"), ("lo_in", "u32"),
    ("lo_out", "u32"), ("one", "f32"), ("_pad1", "u32"), ("_pad2", "u32"),
])
SOFTMAX = UniformLayout("softmax.wgsl Params", [
    ("outer", "u32"), ("len", "u32"), ("inner", "u32"), ("rows", "u32"),
])
TRANSPOSE = UniformLayout("transpose.wgsl Params", [
    ("n", "u32"), ("ndim", "u32"), ("rows", "u32"), ("cols", "u32"),
    ("batch", "u32"), ("tiles_r", "u32"), ("tiles_c", "u32"), ("_pad", "u32"),
    ("shape", DIMS), ("strides", DIMS),
])
MATMUL = UniformLayout("matmul.wgsl Params", [
    ("M", "u32"), ("N", "u32"), ("K", "u32"), ("batch", "u32"),
    ("lda", "u32"), ("ldb", "u32"), ("ldc", "u32"), ("accumulate", "u32"),
    ("a_off", "u32"), ("b_off", "u32"), ("c_off", "u32"), ("batch_ndim", "u32"),
    ("tiles_n", "u32"), ("tiles_m", "u32"), ("c_bstride", "u32"), ("_pad", "u32"),
    ("batch_shape", DIMS), ("a_bstride", DIMS), ("b_bstride", DIMS),
])
SORT = UniformLayout("sort.wgsl Params", [
    ("rows", "u32"), ("len", "u32"), ("shift", "u32"), ("total", "u32"),
    ("k", "u32"), ("j", "u32"), ("steps", "u32"), ("flags", "u32"),
])
SELECT = UniformLayout("select.wgsl Params", [
    ("n", "u32"), ("ndim", "u32"), ("flags", "u32"), ("a_bits", "u32"),
    ("b_bits", "u32"), ("c_bits", "u32"), ("_pad1", "u32"), ("_pad2", "u32"),
    ("shape", DIMS), ("a_strides", DIMS), ("b_strides", DIMS), ("c_strides", DIMS),
])

ARG_REDUCE = UniformLayout("arg_reduce.wgsl Params", [
    ("outer", "u32"), ("len", "u32"), ("inner", "u32"), ("chunks", "u32"),
    ("chunk", "u32"), ("count", "u32"), ("idx_in", "u32"), ("idx_out", "u32"),
])
SCAN = UniformLayout("scan.wgsl Params", [
    ("outer", "u32"), ("len", "u32"), ("inner", "u32"), ("chunks", "u32"),
    ("chunk", "u32"), ("count", "u32"), ("lo_in", "u32"), ("lo_out", "u32"),
    ("carried", "u32"), ("carry_lo", "u32"), ("one", "f32"), ("quads", "u32"),
])
INTEGER = UniformLayout("integer.wgsl Params", [
    ("n", "u32"), ("ndim", "u32"), ("flags", "u32"), ("scalar", "u32"),
    ("shape", DIMS), ("a_strides", DIMS), ("b_strides", DIMS),
])

COUNTING = UniformLayout("counting.wgsl Params", [
    ("n", "u32"), ("m", "u32"), ("width", "u32"), ("rows", "u32"),
    ("scalar", "u32"), ("value", "u32"), ("_pad1", "u32"), ("_pad2", "u32"),
])
GATHER = UniformLayout("gather.wgsl Params", [
    ("n", "u32"), ("width", "u32"), ("_pad1", "u32"), ("_pad2", "u32"),
])

LAYOUTS: Mapping[str, UniformLayout] = {
    "elementwise": ELEMENTWISE, "reduce": REDUCE, "softmax": SOFTMAX, "transpose": TRANSPOSE, "matmul": MATMUL,
    "sort": SORT,
    "select": SELECT,
    "arg_reduce": ARG_REDUCE, "scan": SCAN,
    "integer": INTEGER,
    "counting": COUNTING,
    "gather": GATHER,
}
"""Built-in shader file (``shaders/NAME.wgsl``) -> the layout of its ``var<uniform>``."""
