"""What a cell reads and what it assigns, found by static analysis of its source.

The notebook sends only the names a cell reads, and takes back every name it assigns at the
top level, including objects changed in place through ``x[...] =``, ``x.attr =`` and ``x +=``.
"""

from __future__ import annotations

import ast
import re
import symtable
from types import CodeType
from typing import Callable, Iterator, NamedTuple


def _walk_tables(table: symtable.SymbolTable) -> Iterator[symtable.SymbolTable]:
    yield table
    for child in table.get_children():
        yield from _walk_tables(child)


def names_read(code: str) -> set[str]:
    """Global names the code reads: at the top level, or from inside its functions and classes."""
    top = symtable.symtable(code, "<cell>", "exec")
    read = {s.get_name() for s in top.get_symbols() if s.is_referenced()}
    for table in _walk_tables(top):
        if table is top:
            continue
        read |= {s.get_name() for s in table.get_symbols()
                 if s.is_global() and (s.is_referenced() or s.is_declared_global())}
    # `x += 1` and `x[0] = 1` read x, but only `x[0] = 1` marks it referenced in every version; and
    # `del x` needs x there to delete it.
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            read.add(node.target.id)
        elif isinstance(node, ast.Delete):
            read |= {part.id for target in node.targets for part in ast.walk(target) if isinstance(part, ast.Name)}
        elif isinstance(node, ast.Call) and _called_name(node.func) in _LOOKS_UP_BY_STRING:
            read |= {name for arg in [*node.args, *(k.value for k in node.keywords)]
                     if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                     for name in _IDENTIFIER.findall(arg.value)}
    return read


_LOOKS_UP_BY_STRING = {"eval", "exec", "query", "evaluate", "timeit", "Timer"}
"""Calls that read the caller's globals by the names in a string: ``eval("a + b")``, pandas'
``df.query("x > @limit")`` and ``pd.eval(...)``, numexpr's ``evaluate``, ``timeit.timeit("f()")``. The names
in such a string are read too (those the notebook doesn't have are left out, as for any name)."""

_IDENTIFIER = re.compile(r"[^\W\d]\w*")


def identifiers(text: str) -> set[str]:
    """The names a string handed to ``eval`` or ``df.query`` may look up (``@limit`` included)."""
    return set(_IDENTIFIER.findall(text))


def runtime_lookups(code: str) -> tuple[set[str], str | None]:
    """What the cell looks up by strings it makes or is given at run time, which ``names_read`` can't see.

    The variables whose string value it hands to ``eval``, ``exec``, pandas' ``query``/``eval`` or
    numexpr (``eval(expr)``: the names in ``expr``'s value are read); and, where the string can't be known
    before the cell runs (one the cell builds or binds itself) or the cell reads its globals as a mapping
    (``globals()``, ``timeit(..., globals=globals())``, ``vars()``), the source of the first such call,
    else None.
    """
    tree = ast.parse(code)
    assigned = set(names_assigned(code))
    variables: set[str] = set()
    opaque: list[ast.AST] = []
    top = {id(node) for node in _walk_top_scope(tree)}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        called = _called_name(node.func)
        bare = isinstance(node.func, ast.Name)
        if bare and not node.args and (called == "globals" or called in ("vars", "locals") and id(node) in top):
            opaque.append(node)
        elif called in _LOOKS_UP_BY_STRING and node.args:
            first = node.args[0]
            if isinstance(first, ast.Name):
                if first.id in assigned:  # made by the cell: its value here says nothing
                    opaque.append(node)
                else:
                    variables.add(first.id)
            elif not isinstance(first, ast.Constant) and (bare or isinstance(first, (ast.JoinedStr, ast.BinOp))):
                opaque.append(node)
    first_call = min(opaque, key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0)), default=None)
    return variables, None if first_call is None else (ast.get_source_segment(code, first_call) or "globals()")


def _called_name(func: ast.expr) -> str | None:
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _walk_top_scope(node: ast.AST) -> Iterator[ast.AST]:
    """ast.walk that doesn't enter function, lambda or class bodies."""
    for child in ast.iter_child_nodes(node):
        yield child
        if not isinstance(child, _SCOPES):
            yield from _walk_top_scope(child)


def _mutated_base(target: ast.expr) -> str | None:
    while isinstance(target, (ast.Subscript, ast.Attribute)):
        target = target.value
    return target.id if isinstance(target, ast.Name) else None


def names_assigned(code: str) -> list[str]:
    """Names the code binds at the top level, and names whose objects it changes in place.

    Ordered by first appearance in the source, so results come back predictably.
    """
    tree = ast.parse(code)
    top = symtable.symtable(code, "<cell>", "exec")
    names = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    for table in _walk_tables(top):
        if table is not top:  # `global x` then `x = ...` inside a function defined here
            names |= {s.get_name() for s in table.get_symbols() if s.is_declared_global() and s.is_assigned()}
    for node in _walk_top_scope(tree):
        targets = (node.targets if isinstance(node, (ast.Assign, ast.Delete))
                   else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for target in targets:
            for part in ast.walk(target):
                if isinstance(part, (ast.Subscript, ast.Attribute)) and (base := _mutated_base(part)):
                    names.add(base)
    first: dict[str, tuple[int, int]] = {}
    for node in ast.walk(tree):
        name = (node.id if isinstance(node, ast.Name) else node.name if isinstance(node, _SCOPES[:2] + _SCOPES[3:])
                else (node.asname or node.name).split(".")[0] if isinstance(node, ast.alias) else None)
        if name in names:
            where = (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))
            first[name] = min(first.get(name, where), where)
    return sorted(names, key=lambda n: first.get(n, (0, 0)))


class Imported(NamedTuple):
    """Where an import statement takes a name from: ``from module import attribute``; or, with ``attribute``
    None, ``import module``, which binds the module itself with ``as``, and without it (``top``) its
    top-level package (``import a.b`` binds ``a``)."""

    module: str
    attribute: str | None = None
    top: bool = False


def names_imported(code: str) -> dict[str, list[Imported]]:
    """Names the code's top-level import statements bind, each with where from, in source order (one name
    may be imported more than once). Star imports are under ``"*"`` (``Imported(module, "*")``): their names
    are known only once they run. Relative imports are left out: a notebook has no package to be relative to."""
    imported: dict[str, list[Imported]] = {}
    for node in _walk_top_scope(ast.parse(code)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.asname or alias.name.partition(".")[0]
                imported.setdefault(name, []).append(Imported(alias.name, None, top=alias.asname is None))
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                imported.setdefault(alias.asname or alias.name, []).append(Imported(node.module, alias.name))
    return imported


def split_last_expression(code: str, filename: str, transform: Callable[[ast.Module], ast.Module] | None = None,
                          ) -> tuple[CodeType, CodeType | None]:
    """Compile code into (body, last expression): the value of a trailing expression is shown.

    As in IPython, ``await`` may appear at the top level: then the code object is a coroutine's
    (``CO_COROUTINE`` in its flags), which evaluating returns for an event loop to run. ``transform``
    rewrites the parsed cell first (a GPU cell's calls, ``worker/cell_calls.py``)."""
    tree = ast.parse(code, filename)
    if transform is not None:
        tree = transform(tree)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body[-1].value)
        tree.body.pop()
    body = compile(tree, filename, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    return body, (compile(last, filename, "eval", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT) if last is not None else None)
