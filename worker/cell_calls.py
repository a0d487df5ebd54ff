"""Arrays a GPU cell makes reach the GPU too: the numeric ndarrays its calls return become DeviceArrays.

(Here, not in ``worker/gpu/``: rewriting code needs no wgpu, which a worker may lack.)

:func:`wrap_calls` rewrites a GPU cell's code so that the result of each call the cell's own statements
make (``np.zeros(n)``, ``rng.normal(size=n)``, ``np.load(path)``...) passes through
:data:`CALL_RESULT`, the runtime's :meth:`~GpuRuntime.made_by_the_cell`: a plain numeric ndarray
comes back as a DeviceArray viewing it (same memory, dtype and values), anything else as it is. Bodies
of functions, lambdas and classes the cell defines are left as written: they may run in later cells,
where the name isn't bound.
"""

from __future__ import annotations

import ast

CALL_RESULT = "__offload_call_result__"
"""The name the rewritten cell calls with each call's result (a dunder: never one of the cell's names)."""


class _WrapCalls(ast.NodeTransformer):
    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        return ast.copy_location(ast.Call(ast.Name(CALL_RESULT, ast.Load()), [node], []), node)

    def _left_as_written(self, node: ast.AST) -> ast.AST:
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = visit_ClassDef = _left_as_written


def wrap_calls(tree: ast.Module) -> ast.Module:
    """``tree`` with every call its statements make (outside the functions and classes it defines)
    wrapped in :data:`CALL_RESULT`."""
    wrapped = _WrapCalls().visit(tree)
    assert isinstance(wrapped, ast.Module)
    return ast.fix_missing_locations(wrapped)
