"""Every namespace edit an offloaded cell makes shows up, as if the cell ran locally (issue 9, item 3):
star imports, `del`, `global` inside functions the cell calls, `import x as y`, and names bound
through `globals()`.

Each case runs twice in a real IPython shell, after the same setup cells: once plain, once under
%%offload; the namespaces the notebook is left with must be the same.
"""

from __future__ import annotations

import re
import types
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell

from support import run

CASES = {
    "star import": ([], "from math import *"),
    "star import that shadows builtins": ([], "from numpy import *\nbiggest = max(array([3, 1, 2]))"),
    "del": (["x = 1\ny = [1, 2]"], "del x"),
    "del of several, one of them read": (["x = 1\ny = 2\nz = 3"], "total = x + y\ndel x, y"),
    "global in a function the cell calls": (
        ["counter = 0\ndef bump(by=1):\n    global counter\n    counter += by"], "bump()\nbump(5)"),
    "a function's global that didn't exist before": (
        ["def make():\n    global made\n    made = 'here'"], "make()"),
    "import as": ([], "import os.path as osp\nfrom collections import OrderedDict as OD"),
    "globals() in a loop": ([], "for name in ['p', 'qq']:\n    globals()[name] = len(name)"),
    "globals().update": ([], "globals().update({'a1': 1, 'b2': [2]})"),
}


def _described(value: Any) -> str:
    """A value, comparably across processes: modules by name, functions and classes by qualified name,
    the rest by repr without memory addresses."""
    if isinstance(value, types.ModuleType):
        return f"module {value.__name__}"
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{type(value).__name__} {getattr(value, '__module__', '?')}.{value.__qualname__}"
    return f"{type(value).__name__} {re.sub(' at 0x[0-9a-f]+', '', repr(value))}"  # copies live elsewhere


def _namespace_after(ip: InteractiveShell, setup: list[str], cell: str) -> dict[str, str]:
    ip.reset(new_session=False)
    for code in setup:
        result, _ = run(ip, code)
        assert result.success, result.error_in_exec
    result, out = run(ip, cell)
    assert result.success, f"{result.error_in_exec}\n{out.stdout}\n{out.stderr}"
    hidden = ip.user_ns_hidden
    return {name: _described(value) for name, value in ip.user_ns.items()
            if not name.startswith("_") and name not in hidden}


@pytest.mark.parametrize("case", CASES)
def test_an_offloaded_cell_edits_the_namespace_as_a_local_one_does(ip: InteractiveShell, case: str) -> None:
    setup, cell = CASES[case]
    local = _namespace_after(ip, setup, cell)
    offloaded = _namespace_after(ip, setup, "%%offload\n" + cell)
    assert offloaded == local
