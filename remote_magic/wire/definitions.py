"""Functions, classes and lambdas defined in a notebook travel as their source.

cloudpickle sends a function defined in ``__main__`` as bytecode, which only loads under the
same Python minor version; the notebook (Colab: 3.13) and the worker (a Mac: 3.12) differ as a
rule. IPython keeps every cell's source in ``linecache``, so a definition's source is usually
known: it is found, checked against the object's own bytecode (compiled again here, it must
match), and on the other side compiled again by that side's Python.

A definition made from source remembers it, so it goes back the same way; the side that sent
it first gets its own object back (identity holds: ``isinstance(m, Model)`` stays true).
"""

from __future__ import annotations
import __future__

import ast
import contextlib
import dataclasses
import functools
import linecache
import operator
import os
import sys
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

from .cellcode import names_read


@dataclass(frozen=True)
class SourceDefinition:
    """Where a definition was written and what it says: enough to compile it again anywhere."""

    kind: str       # "function", "class" or "lambda"
    name: str       # the name the definition binds; "<lambda>" for a lambda
    filename: str   # the notebook cell (or script) it came from, for tracebacks
    lineno: int     # its first line (the first decorator's) in that file
    source: str     # the definition's own lines; for a lambda, the lambda expression
    flags: int = 0  # the __future__ features it was compiled with (`from __future__ import annotations`)
    done: tuple[int, ...] = ()
    """A class's decorators (by position) that are the notebook's own functions: they ran where the class was
    defined (a registry decorator recorded it there), and what they left on the class travels with it
    (``class_data``), so they aren't run again."""

    def code(self) -> types.CodeType:
        """Compile the definition with the line numbers it has in its cell."""
        padding = "\n" * (self.lineno - 1)
        tree: ast.Module | ast.Expression
        if self.kind == "lambda":
            tree = ast.parse(f"{padding}({self.source})", mode="eval")
        else:
            tree = ast.parse(padding + self.source)
            node = tree.body[0]
            if self.kind == "function" and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                # The object that travels is the function its decorators were given (what a wrapper holds,
                # or what a decorator that registers it returned): compiled without them, on its line still.
                node.lineno, node.decorator_list = self.lineno, []
            elif isinstance(node, ast.ClassDef) and self.done:
                node.decorator_list = [d for i, d in enumerate(node.decorator_list) if i not in self.done]
        defined = _defined(tree)
        if isinstance(defined, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef)):
            _defaults_as_placeholders(defined.args)
        code: types.CodeType = compile(tree, self.filename, "eval" if self.kind == "lambda" else "exec", self.flags,
                                       dont_inherit=True)
        return code

    def names_read(self) -> set[str]:
        """The global names the definition reads: the values it needs beside it."""
        return names_read(self.source) - {self.name}

    def names_read_when_defined(self) -> set[str]:
        """The names evaluated by the definition itself (decorators, defaults, annotations, bases,
        a class body): they must exist before it is compiled, not only before it is called."""
        node: ast.AST = (ast.parse(self.source, mode="eval").body if self.kind == "lambda"
                         else ast.parse(self.source).body[0])
        if isinstance(node, ast.ClassDef) and self.done:
            node.decorator_list = [d for i, d in enumerate(node.decorator_list) if i not in self.done]
        return {n.id for part in _evaluated_when_defined(node, decorators=self.kind == "class") for n in ast.walk(part)
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _defined(tree: ast.Module | ast.Expression) -> ast.AST:
    """The definition a parsed SourceDefinition holds: its first statement, or the lambda expression."""
    return tree.body if isinstance(tree, ast.Expression) else tree.body[0]


def _defaults_as_placeholders(arguments: ast.arguments) -> None:
    """A function's default values travel with it, as they were (``restore_state``): compiled, its default
    expressions become None, so none is evaluated again where the names it read may not exist (``k=k``
    for a loop's ``k``; in an inlined comprehension, PEP 709, Python 3.12 and later)."""
    arguments.defaults = [ast.copy_location(ast.Constant(None), d) for d in arguments.defaults]
    arguments.kw_defaults = [None if d is None else ast.copy_location(ast.Constant(None), d)
                             for d in arguments.kw_defaults]


def _evaluated_when_defined(node: ast.AST, decorators: bool = True) -> Iterator[ast.AST]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        if decorators:
            yield from getattr(node, "decorator_list", [])
        arguments = node.args
        yield from (d for d in [*arguments.defaults, *arguments.kw_defaults] if d is not None)
        if not isinstance(node, ast.Lambda):
            parameters = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs,
                          arguments.vararg, arguments.kwarg]
            yield from (p.annotation for p in parameters if p is not None and p.annotation is not None)
            if node.returns is not None:
                yield node.returns
    elif isinstance(node, ast.ClassDef):
        yield from [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]
        for statement in node.body:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield from _evaluated_when_defined(statement)
            else:
                yield statement


# Objects compiled here from a SourceDefinition, so they travel back as the same source.
_made_here: "weakref.WeakKeyDictionary[Any, SourceDefinition]" = weakref.WeakKeyDictionary()
# Objects this side sent as source, so the copy that comes back resolves to the original.
_sent: "weakref.WeakValueDictionary[SourceDefinition, Any]" = weakref.WeakValueDictionary()
_originals: "weakref.WeakSet[Any]" = weakref.WeakSet()
_found: "weakref.WeakKeyDictionary[Any, SourceDefinition | None]" = weakref.WeakKeyDictionary()
_namespace: dict[str, Any] | None = None
INSTALLED = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})
"""Where the standard library and installed packages live: no notebook code comes from there."""


def is_notebook_definition(obj: Any) -> bool:
    """A function or class defined in ``__main__``: what cloudpickle would send as bytecode."""
    return isinstance(obj, (types.FunctionType, type)) and getattr(obj, "__module__", None) == "__main__"


def find_definition(obj: Any) -> SourceDefinition | None:
    """The source of a notebook function, class or lambda, when it is known and matches the object.

    A class is checked again each time: one changed since (``Model.extra = 1``) no longer matches
    its source, and travels by value instead.
    """
    made = _made_here.get(obj)
    if made is not None:
        if not _unchanged(obj, made):
            return None
        _sent[made] = obj  # so what comes back is this object again, as for one defined here
        _originals.add(obj)
        return made
    found = _found.get(obj)
    if obj not in _found or (found is not None and not _unchanged(obj, found)):
        found = _found[obj] = _search(obj)
    if found is not None:
        _sent[found] = obj
        _originals.add(obj)
    return found


def _unchanged(obj: Any, definition: SourceDefinition) -> bool:
    if not isinstance(obj, type):
        return True
    methods = _methods_of(obj)
    return methods is not None and _matches(obj, definition, methods)


_COMPREHENSIONS = {"<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>"}
"""Scopes a comprehension had of its own before Python 3.12 inlined them (PEP 709)."""


def _search(obj: Any) -> SourceDefinition | None:
    *scopes, _ = obj.__qualname__.split(".")
    if not set(scopes) <= _COMPREHENSIONS:
        return None  # a closure or a method: its source alone can't rebuild it
    # A function made in a top-level comprehension (`[lambda v, k=k: v + k for k in range(3)]`) that reads
    # no loop variable (no closure) is the same definition on every Python: it travels as source too.
    if isinstance(obj, types.FunctionType):
        if obj.__closure__:
            return None
        code = obj.__code__
        kind = "lambda" if obj.__name__ == "<lambda>" else "function"
        return _from_cell(obj, kind, code.co_filename, {code.co_firstlineno})
    methods = _methods_of(obj)
    if methods is None:
        return None
    first_line = getattr(obj, "__firstlineno__", None)  # Python 3.13 records it; older ones don't
    if methods:
        return _from_cell(obj, "class", methods[0].co_filename,
                          {first_line} if first_line else {m.co_firstlineno for m in methods}, methods)
    if first_line is None:
        return None
    # No code of its own (a dataclass of fields): look in every cell source kept in memory only.
    cells = [name for name, entry in list(linecache.cache.items()) if len(entry) == 4 and not os.path.isfile(name)]
    found = {d.source: d for d in (_from_cell(obj, "class", name, {first_line}) for name in cells) if d}
    return next(iter(found.values())) if len(found) == 1 else None


def _methods_of(cls: type) -> list[types.CodeType] | None:
    """The code of the methods its class body defined (it names the cell the class came from), or
    None when a function defined elsewhere was set on it since. Dataclasses add methods made from
    "<string>" or wrapped by the standard library: those aren't its own."""
    methods = []
    for function in _functions_in(cls):
        code = function.__code__
        if code.co_filename == "<string>" or code.co_filename.startswith(INSTALLED):
            continue
        if not function.__qualname__.startswith(f"{cls.__qualname__}."):
            return None
        methods.append(code)
    return methods


def _functions_in(cls: type) -> Iterator[types.FunctionType]:
    """The functions a class body defined: methods, and those inside properties, static and class
    methods and decorators that keep ``__wrapped__`` (functools.wraps, lru_cache, cached_property)."""
    for member in vars(cls).values():
        parts = [getattr(member, a, None) for a in ("fget", "fset", "fdel", "__func__", "func")] + [member]
        for part in parts:
            while part is not None and not isinstance(part, types.FunctionType):
                part = getattr(part, "__wrapped__", None)
            if part is not None:
                yield part


def _from_cell(obj: Any, kind: str, filename: str, lines: set[int],
               methods: list[types.CodeType] | None = None) -> SourceDefinition | None:
    text = "".join(linecache.getlines(filename))
    if not text:
        return None
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    candidates = []
    code = obj.__code__ if kind != "class" else methods[0] if methods else None
    flags = code.co_flags & _FUTURE_FLAGS if code is not None else 0
    for node in ast.walk(tree) if kind == "lambda" else tree.body:
        definition = _definition_at(node, text, kind, obj.__name__, filename, lines, flags)
        if definition is not None and isinstance(node, ast.ClassDef) and methods is not None:
            definition = _without_notebook_decorators(definition, node, obj)
        if definition is not None and _matches(obj, definition, methods):
            candidates.append(definition)
    return candidates[0] if len({c.source for c in candidates}) == 1 else None


_FUTURE_FLAGS = functools.reduce(operator.or_, (getattr(__future__, feature).compiler_flag
                                                 for feature in __future__.all_feature_names))


def _without_notebook_decorators(definition: SourceDefinition, node: ast.ClassDef, cls: type) -> SourceDefinition:
    """The class's definition, marking the decorators that are notebook functions as ``done``. Not where the
    class holds functions its decorators made (a notebook decorator that applies ``dataclass``): those
    come only from running them again."""
    if any(function.__code__.co_filename == "<string>" or function.__code__.co_filename.startswith(INSTALLED)
           for function in _functions_in(cls)):
        return definition
    home = next((f.__globals__ for f in _functions_in(cls)), None) or _target()
    done = []
    for index, decorator in enumerate(node.decorator_list):
        root: ast.expr = decorator.func if isinstance(decorator, ast.Call) else decorator
        while isinstance(root, ast.Attribute):
            root = root.value
        value = home.get(root.id) if isinstance(root, ast.Name) else None
        if isinstance(value, types.FunctionType) and value.__module__ == "__main__":
            done.append(index)
    return dataclasses.replace(definition, done=tuple(done)) if done else definition


def _definition_at(node: ast.AST, text: str, kind: str, name: str, filename: str,
                   lines: set[int], flags: int) -> SourceDefinition | None:
    if kind == "lambda":
        if isinstance(node, ast.Lambda) and node.lineno in lines:
            segment = ast.get_source_segment(text, node)
            return SourceDefinition(kind, name, filename, node.lineno, segment, flags) if segment else None
        return None
    types_ = (ast.ClassDef,) if kind == "class" else (ast.FunctionDef, ast.AsyncFunctionDef)
    if not isinstance(node, types_) or node.name != name or node.end_lineno is None:
        return None
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    span = range(first, node.end_lineno + 1)
    if kind == "function" and first not in lines:
        return None
    if kind == "class" and not any(line in span for line in lines):
        return None
    source = "".join(text.splitlines(True)[first - 1:node.end_lineno])
    return SourceDefinition(kind, name, filename, first, source, flags)


def _matches(obj: Any, definition: SourceDefinition, methods: list[types.CodeType] | None) -> bool:
    """Compiled again, does the source give the object's own bytecode? (linecache may be stale.)"""
    try:
        compiled = definition.code()
    except SyntaxError:
        return False
    if definition.kind == "class":
        in_body, in_class = _names_in_body(definition), _names_in_class(obj)
        # A method set on the class after its definition isn't in its source, nor is a name deleted since.
        # Data attributes added since (also by a base's __init_subclass__) travel with it (class_data).
        if in_body - in_class or in_class - in_body - class_data(obj).keys():
            return False
    ours = {(c.co_name, c.co_firstlineno): c for c in _code_objects(compiled)}
    wanted = methods or [] if definition.kind == "class" else [obj.__code__]
    return all((other := ours.get((c.co_name, c.co_firstlineno))) is not None and _same_code(c, other)
               for c in wanted)


def _names_in_body(definition: SourceDefinition) -> set[str]:
    """The names a class statement's body binds: methods, attributes, annotated fields."""
    (node,) = ast.parse(definition.source).body
    names = set()
    for statement in node.body if isinstance(node, ast.ClassDef) else ():
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(statement.name)
        targets = (statement.targets if isinstance(statement, ast.Assign)
                   else [statement.target] if isinstance(statement, (ast.AnnAssign, ast.AugAssign)) else [])
        names |= {n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}
    return {name for name in names if not _dunder(name)}


def _names_in_class(cls: type) -> set[str]:
    """The names a class holds, but the descriptors its ``__slots__`` made (its body doesn't bind them)."""
    slots = vars(cls).get("__slots__", ())
    slots = {slots} if isinstance(slots, str) else set(slots)
    return {name for name in [*vars(cls), *vars(cls).get("__annotations__", {})]
            if not _dunder(name) and name not in slots}


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield const
            yield from _code_objects(const)


def _same_code(a: types.CodeType, b: types.CodeType) -> bool:
    return (a.co_code == b.co_code and a.co_names == b.co_names and a.co_varnames == b.co_varnames
            and [c for c in a.co_consts if not isinstance(c, types.CodeType)]
            == [c for c in b.co_consts if not isinstance(c, types.CodeType)])


def globals_of(obj: Any, definition: SourceDefinition) -> dict[str, Any]:
    """The values of the global names a definition reads, from the namespace it lives in.

    IPython's own names in the user namespace (``get_ipython``, ``In``, ``Out``...) stay behind.
    """
    if isinstance(obj, types.FunctionType):
        namespace = obj.__globals__
    else:  # a class: where its methods, or its notebook bases', were defined (a job's globals, on a worker),
        # else where definitions are made now (that job's, or the notebook's)
        method = next((f for cls in obj.__mro__ if cls.__module__ == "__main__" for f in _functions_in(cls)), None)
        namespace = method.__globals__ if method is not None else _target()
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    hidden = shell.user_ns_hidden if shell is not None else {}
    return {name: namespace[name] for name in sorted(definition.names_read())
            if name in namespace and not (name in hidden and hidden[name] is namespace[name])}


@contextlib.contextmanager
def defining_into(namespace: dict[str, Any]) -> Iterator[None]:
    """Definitions loaded inside this block are compiled in ``namespace`` (a job's globals)."""
    global _namespace
    saved, _namespace = _namespace, namespace
    try:
        yield
    finally:
        _namespace = saved


def _target() -> dict[str, Any]:
    """Where loaded definitions live: a job's namespace, else ``__main__`` (the notebook's user namespace)."""
    return _namespace if _namespace is not None else vars(sys.modules["__main__"])


def single_dispatch(obj: Any) -> tuple[Any, ...] | None:
    """How a ``functools.singledispatch`` function the notebook defined travels (pickle's reduction): its
    default function and those registered for each type, which travel as definitions, registered again on
    the other side. None for anything else. (The wrapper singledispatch makes is functools' own code, with
    a cache of weak references: it has no source of its own, and can't be pickled as it is.)"""
    if not (isinstance(obj, types.FunctionType) and obj.__module__ == "__main__" and hasattr(obj, "__wrapped__")
            and callable(getattr(obj, "dispatch", None)) and isinstance(getattr(obj, "registry", None),
                                                                        types.MappingProxyType)):
        return None
    registered = {cls: function for cls, function in getattr(obj, "registry").items() if cls is not object}
    attributes = {name: value for name, value in vars(obj).items() if name not in _SINGLE_DISPATCH_OWN}
    return _single_dispatch, (obj.__wrapped__, registered, attributes)


_SINGLE_DISPATCH_OWN = {"register", "dispatch", "registry", "_clear_cache", "__wrapped__"}


def _single_dispatch(default: Any, registered: Mapping[Any, Any], attributes: Mapping[str, Any]) -> Any:
    """A ``functools.singledispatch`` function made again from what ``single_dispatch`` sent."""
    function = functools.singledispatch(default)
    for cls, implementation in registered.items():
        function.register(cls, implementation)
    vars(function).update(attributes)
    return function


def made_here(qualname: str, namespace: Mapping[str, Any]) -> Any:
    """A definition compiled on this side that answers to ``qualname`` (what pickle looks up in
    ``__main__`` to send a notebook function, class or Enum member by reference): the one that lives in
    ``namespace``, a job's globals, else the latest made; None if there is none."""
    candidates = [obj for obj in list(_made_here.keys()) if getattr(obj, "__qualname__", None) == qualname]
    for obj in reversed(candidates):
        homes = [obj] if isinstance(obj, types.FunctionType) else list(_functions_in(obj)) if isinstance(
            obj, type) else []
        if any(function.__globals__ is namespace for function in homes):
            return obj
    return candidates[-1] if candidates else None


def reduction(obj: Any, definition: SourceDefinition) -> tuple[Any, ...]:
    """How pickle sends a definition: its source and the globals its definition evaluates (compiled
    before it), then, as state, the globals its body reads and a function's defaults."""
    needed = globals_of(obj, definition)
    when_defined = definition.names_read_when_defined()
    state: dict[str, Any] = {"globals": {k: v for k, v in needed.items() if k not in when_defined}}
    if isinstance(obj, types.FunctionType):
        state.update(defaults=obj.__defaults__, kwdefaults=obj.__kwdefaults__, attributes=dict(obj.__dict__),
                     qualname=obj.__qualname__)  # `<listcomp>.<lambda>` where it was made: its source can't say
    else:  # what the class holds now (`Registry.items`, appended to since), not what its source starts with
        state.update(class_data=class_data(obj))
    return (load, (definition, {k: v for k, v in needed.items() if k in when_defined}), state, None, None,
            restore_state)


def load(definition: SourceDefinition, needed: dict[str, Any] | None = None) -> Any:
    """The object a SourceDefinition stands for: the original if this side sent it, else compiled here
    with the ``needed`` globals its definition evaluates."""
    # This side's own object, back again: in the notebook, which keeps its definitions. A job's
    # namespace is new each time, so there the definition is compiled again, into that namespace.
    original = _sent.get(definition) if _namespace is None else None
    if original is not None:
        return original
    namespace = _target()
    for name, value in (needed or {}).items():
        namespace.setdefault(name, value)
    _remember_lines(definition)
    code = definition.code()
    if definition.kind == "lambda":
        obj = eval(code, namespace)
    else:
        previous = namespace.get(definition.name, _UNBOUND)
        exec(code, namespace)
        obj = namespace[definition.name]
        # The name is bound by whoever asked for the value, not as a side effect; but only once the whole
        # message is loaded: until then other definitions may need it (a subclass's __init_subclass__).
        if _loaded is not None:
            _loaded.rebinds.append((namespace, definition.name, previous))
        else:
            _rebind(namespace, definition.name, previous)
    _made_here[obj] = definition
    return obj


_UNBOUND = object()


@dataclass
class _Loading:
    """What waits for one message to be loaded whole."""

    rebinds: list[tuple[dict[str, Any], str, Any]] = field(default_factory=list)  # namespace, name, previous
    class_data: list[tuple[Any, Mapping[str, Any]]] = field(default_factory=list)
    kept: set[str] = field(default_factory=set)  # names bound as the globals a definition reads: they stay


_loaded: _Loading | None = None


def _rebind(namespace: dict[str, Any], name: str, previous: Any) -> None:
    if previous is _UNBOUND:
        namespace.pop(name, None)
    else:
        namespace[name] = previous


@contextlib.contextmanager
def loading() -> Iterator[None]:
    """While one message loads, the definitions it holds stay bound under their names, so later ones in it
    find them; once it is loaded, classes take the data attributes they came with and each name is as
    before."""
    global _loaded
    saved, _loaded = _loaded, _Loading()
    try:
        yield
    finally:
        done, _loaded = _loaded, saved
        for cls, data in done.class_data:
            _set_class_data(cls, data)
        for namespace, name, previous in reversed(done.rebinds):
            if name not in done.kept:
                _rebind(namespace, name, previous)


def class_data(cls: type) -> dict[str, Any]:
    """A class's own data attributes (not what it calls or binds: methods, properties, decorated
    functions, nested classes; nor Python's ``__dunders__``), by name."""
    return {name: value for name, value in sorted(vars(cls).items()) if not _dunder(name)
            and not callable(value) and not hasattr(type(value), "__get__") and name not in _PYTHONS_OWN}


_PYTHONS_OWN = {"_abc_impl"}
"""What Python keeps in a class for itself (``abc.ABC``'s registry and caches): made again with the class."""


def restore_state(obj: Any, state: dict[str, Any]) -> None:
    """Give a definition the state it came with (pickle's state): a function its defaults and
    attributes, a class its data attributes, also back on the side that sent it (a cell may have changed
    them: a default list appended to, ``Registry.items.append(x)``); and one compiled here the globals
    it reads."""
    data = state.get("class_data") or {}
    if _loaded is not None:  # once the message is loaded: classes made after it (a subclass whose
        _loaded.class_data.append((obj, data))  # __init_subclass__ appends to a registry) change it again
    else:
        _set_class_data(obj, data)
    if isinstance(obj, types.FunctionType):
        obj.__defaults__ = state.get("defaults")
        obj.__kwdefaults__ = state.get("kwdefaults")
        obj.__dict__.update(state.get("attributes") or {})
        if isinstance(state.get("qualname"), str):
            obj.__qualname__ = state["qualname"]
    if obj in _originals:
        return  # this side's own object came back: its globals are this side's
    namespace = _target()
    for name, value in state.get("globals", {}).items():
        namespace.setdefault(name, value)
        if _loaded is not None:
            _loaded.kept.add(name)


def _set_class_data(cls: Any, data: Mapping[str, Any]) -> None:
    for name, value in data.items():
        try:
            setattr(cls, name, value)
        except (AttributeError, TypeError):  # a class that guards its attributes (an Enum's members)
            continue


def _remember_lines(definition: SourceDefinition) -> None:
    """Put the definition's lines into linecache at their line numbers, for tracebacks and to send it on."""
    if definition.kind == "lambda":
        return  # an expression inside a line: the rest of the line isn't known here
    entry = linecache.cache.get(definition.filename)
    lines = list(entry[2]) if entry and len(entry) == 4 else []  # a lazy entry (1-tuple) has no lines yet
    new = definition.source.splitlines(True)
    end = definition.lineno - 1 + len(new)
    lines += ["\n"] * (end - len(lines))
    lines[definition.lineno - 1:end] = new
    linecache.cache[definition.filename] = (sum(map(len, lines)), None, lines, definition.filename)
