"""Errors on the wire: the one mapping between the exception tree and ERROR headers.

Every process that refuses or fails something (the hub, the worker's supervisor and executor)
sends ``error_header(exception)``; every process that receives an ERROR turns it back with
``error_from_header``. The header carries the exception's type name, its message, and the fields
a user reads from it (an InputError's ``name``, a ShaderError's ``line`` and ``column``, a
RemoteError's remote type and traceback).
"""

from __future__ import annotations

import builtins
import importlib
import sys
import weakref
from typing import Any, Mapping

from .. import errors
from ..errors import RemoteError, RemoteMagicError

_FIELDS: dict[type[RemoteMagicError], tuple[str, ...]] = {
    errors.InputError: ("name",),
    errors.OutputError: ("name",),
    errors.ShaderError: ("line", "column"),
    errors.FileTransferError: ("path",),
    RemoteError: ("remote_type", "remote_message", "remote_traceback"),
}


def _tree(root: type[RemoteMagicError]) -> dict[str, type[RemoteMagicError]]:
    found = {root.__name__: root}
    for child in root.__subclasses__():
        found.update(_tree(child))
    return found


_BY_NAME = _tree(RemoteMagicError)


def _fields(kind: type[RemoteMagicError]) -> tuple[str, ...]:
    return next((fields for cls, fields in _FIELDS.items() if issubclass(kind, cls)), ())


def error_header(error: RemoteMagicError, job: str | None = None, **extra: Any) -> dict[str, Any]:
    """The header of an ERROR message that carries ``error`` (about ``job``, when given)."""
    header: dict[str, Any] = {"error": type(error).__name__, "message": str(error)}
    header.update((field, getattr(error, field)) for field in _fields(type(error)))
    if job is not None:
        header["job"] = job
    header.update(extra)
    return header


def error_from_header(header: Mapping[str, Any], defined: Mapping[str, Any] | None = None) -> RemoteMagicError:
    """The exception an ERROR header stands for (the root type when the name is unknown). ``defined``:
    what the failed cell bound before it raised, where an exception class it defined is found."""
    kind = _BY_NAME.get(str(header.get("error")), RemoteMagicError)
    message = str(header.get("message") or "the peer reported an error without a message")
    fields = [header.get(field) for field in _fields(kind)]
    if kind is RemoteError:
        remote_type, remote_message, remote_traceback = (str(field or "") for field in fields)
        local = _local_type(remote_type or "Exception", defined or {})
        error_type = _as_remote_error(local) if local is not None else RemoteError
        try:
            return error_type(remote_type or "Exception", remote_message, remote_traceback)
        except Exception:  # the local type's own __init__ refused (it takes other arguments)
            return RemoteError(remote_type or "Exception", remote_message, remote_traceback)
    return kind(message, *fields)


def _local_type(remote_type: str, defined: Mapping[str, Any]) -> type[Exception] | None:
    """The exception type named ``remote_type`` here: the notebook's own (a class in ``__main__``, or
    one the failed cell defined), one of a module loaded here or of the standard library; else None."""
    module, _, name = remote_type.rpartition(".")
    local = defined.get(name) if module == "__main__" and name in defined else (
        getattr(_module(module) if module else builtins, name, None))
    if not isinstance(local, type) or not issubclass(local, Exception) or issubclass(local, RemoteMagicError):
        return None
    return local


_AS_REMOTE: "weakref.WeakKeyDictionary[type[Exception], type[RemoteError]]" = weakref.WeakKeyDictionary()


def _as_remote_error(local: type[Exception]) -> type[RemoteError]:
    """A RemoteError that is also ``local`` (a ZeroDivisionError from the worker is caught by
    ``except ZeroDivisionError``, and named so). Kept per class: a notebook that defines its
    exception class again gets the new one."""
    made = _AS_REMOTE.get(local)
    if made is None:
        try:
            made = type(local.__name__, (RemoteError, local), {
                "__module__": RemoteError.__module__, "__qualname__": local.__qualname__,
                "__str__": BaseException.__str__, "shows_type": False,
                "__doc__": f"{local.__name__} raised on the worker."})
        except TypeError:  # a layout RemoteError can't share (OSError's, for one)
            made = RemoteError
        _AS_REMOTE[local] = made
    return made


def _module(name: str) -> Any:
    """The module, if it is loaded here, or part of the standard library (imported then: that's safe,
    and ``except urllib.error.URLError`` works before anything imported it); else None."""
    if name in sys.modules or name.partition(".")[0] not in getattr(sys, "stdlib_module_names", ()):
        return sys.modules.get(name)
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def is_error(header: Mapping[str, Any], kind: type[RemoteMagicError]) -> bool:
    """Does this ERROR header carry ``kind`` (or a subclass of it)?"""
    return issubclass(_BY_NAME.get(str(header.get("error")), RemoteMagicError), kind)
