"""wgpu-py's C types looked up from what cffi already parsed, instead of parsing C again for each one.

wgpu-py drives wgpu-native through cffi's ABI mode. The first time a process names a C type
(``ffi.new("WGPULimits *")``), cffi parses that string with pycparser, and every such parse first declares each of
webgpu.h's type names: about 15 ms a type on a 2-core VM, 0.3 s of each executor's start before it has a device,
and again for each new type its first GPU cells name. The forms wgpu-py names almost every time, a declared or
basic type alone, a pointer to it or an array of it, are built here from the declarations cffi keeps since
wgpu-py's ``cdef``; anything else goes to cffi's parser as before.

This reads two private parts of cffi 1.x and 2.x (the parser's ``_declarations`` and ``cffi.model``); where they are
not as expected, :func:`install` leaves cffi as it is and says so in the log.
"""

from __future__ import annotations

import logging
import re
from typing import Any

log = logging.getLogger(__name__)

_SIMPLE = re.compile(r"\s*(\w+)\s*(?:(\*)|\[\s*(\d*)\s*\])?\s*")
"""``NAME``, ``NAME *``, ``NAME[]`` or ``NAME[N]``."""


def install(ffi: Any) -> None:
    """Make ``ffi`` (wgpu-py's) look up declared and basic type names, their pointers and arrays without parsing C."""
    parser = getattr(ffi, "_parser", None)
    declarations = getattr(parser, "_declarations", None)
    if parser is None or not isinstance(declarations, dict):
        log.info("cffi %s has no parser declarations where expected: its own parser names every C type",
                 getattr(ffi, "__version__", "?"))
        return
    if getattr(parser.parse_type, "from_declarations", False):
        return
    from cffi import model  # type: ignore[import-untyped]

    parse_c = parser.parse_type

    def parse_type(cdecl: str) -> Any:
        match = _SIMPLE.fullmatch(cdecl)
        if match is None:
            return parse_c(cdecl)
        if (declared := declarations.get(f"typedef {match[1]}")) is not None:
            declared_type = declared[0]
        elif match[1] in model.PrimitiveType.ALL_PRIMITIVE_TYPES:
            declared_type = model.PrimitiveType(match[1])
        else:
            return parse_c(cdecl)
        if match[2]:
            return model.PointerType(declared_type)
        if match[3] is not None:  # ("" for NAME[]: an array whose length ffi.new is given)
            return model.ArrayType(declared_type, int(match[3]) if match[3] else None)
        return declared_type

    parse_type.from_declarations = True  # type: ignore[attr-defined]
    parser.parse_type = parse_type
