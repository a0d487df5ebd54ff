"""wgpu-py's C types looked up from cffi's declarations (``worker/gpu/wgpu_types.py``) are the types cffi's own C
parser makes of the same names: for declared structs, enums, handles and basic types, alone, as pointers and arrays."""

from __future__ import annotations

import random

import pytest

from remote_magic.worker.gpu import wgpu_types

pytestmark = pytest.mark.gpu


def test_a_type_looked_up_is_the_one_cffis_parser_makes() -> None:
    from wgpu.backends.wgpu_native import ffi

    wgpu_types.install(ffi)
    parser = ffi._parser
    looked_up = parser.parse_type
    assert looked_up.from_declarations
    names = sorted(key[len("typedef "):] for key in parser._declarations if key.startswith("typedef "))
    sample = random.Random(0).sample(names, 8) + ["WGPULimits", "WGPUAdapter", "WGPUFeatureName", "char", "uint32_t"]
    for name in sample:
        for cdecl in (name, f"{name} *", f"{name}[]", f"{name}[3]", f" {name}  * "):
            parsed = type(parser).parse_type(parser, cdecl)  # (cffi's own parser, unchanged on its class)
            assert looked_up(cdecl) == parsed, cdecl
            with ffi._lock:  # (cffi's C type object for each: one and the same)
                assert ffi._get_cached_btype(looked_up(cdecl)) is ffi._get_cached_btype(parsed), cdecl
    for other in ("const WGPULimits *", "WGPUAdapter **", "void(WGPUDevice const *, void *)"):  # cffi parses these
        assert looked_up(other) == type(parser).parse_type(parser, other), other
    buffer = ffi.new("WGPULimits *")
    buffer.maxBindGroups = 4
    assert buffer.maxBindGroups == 4 and ffi.sizeof("WGPULimits") == ffi.sizeof(buffer[0])
