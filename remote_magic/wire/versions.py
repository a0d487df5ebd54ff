"""The versions each side runs, and what a difference between them means, in words.

The notebook and the worker run different Python and library versions as a rule (Colab's
Python 3.13 and pinned libraries; a Mac or GPU box with whatever it has). Peers announce their
versions in HELLO; a difference that matters is said once at connect, and a value that fails
to load is explained by the library that differs.
"""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import sys
import traceback
from typing import Any, Mapping

from .._version import __version__

# Libraries whose differences change what crosses: said at connect, in this order.
WATCHED_LIBRARIES = ("cloudpickle", "numpy", "pandas", "matplotlib")


def local_versions(fresh: bool = False) -> dict[str, str]:
    """The versions a peer announces in its HELLO (a library not installed is left out). ``fresh``: read the
    libraries' again, for one installed or upgraded since (a worker's heartbeats say so)."""
    if fresh:
        _local_versions.cache_clear()
    return dict(_local_versions())


def with_libraries(versions: Mapping[str, str], announced: Mapping[str, Any]) -> dict[str, str]:
    """``versions`` with the watched libraries as ``announced`` now (in a worker's heartbeat): one installed
    on a running worker shows; the protocol, link and Python versions stay as its HELLO said."""
    kept = {name: version for name, version in versions.items() if name not in WATCHED_LIBRARIES}
    return kept | {name: str(announced[name]) for name in WATCHED_LIBRARIES if name in announced}


@functools.lru_cache(maxsize=1)
def _local_versions() -> dict[str, str]:
    from .link import LINK_VERSION
    from .protocol import PROTOCOL_VERSION

    versions = {"protocol": PROTOCOL_VERSION.decode(), "link": LINK_VERSION, "remote_magic": __version__,
                "python": platform.python_version()}
    for name in WATCHED_LIBRARIES:
        version = installed_version(name)
        if version is not None:
            versions[name] = version
    return versions


def installed_version(module: str) -> str | None:
    """The version of a library here: from the module when it is loaded, else from its distribution."""
    loaded = getattr(sys.modules.get(module), "__version__", None)
    if isinstance(loaded, str):
        return loaded
    try:
        return importlib.metadata.version(module)
    except importlib.metadata.PackageNotFoundError:
        pass
    distribution = distribution_of(module)  # reads every installed distribution's files: only when needed
    try:
        return importlib.metadata.version(distribution) if distribution != module else None
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=None)
def _distributions() -> Mapping[str, list[str]]:
    return importlib.metadata.packages_distributions()


def distribution_of(module: str) -> str:
    """The name pip installs a module by (``sklearn`` -> ``scikit-learn``); the module's own name if unknown."""
    return (_distributions().get(module) or [module])[0]


def _minor(version: str | None) -> str:
    return ".".join((version or "").split(".")[:2])


def _major(version: str | None) -> str:
    return (version or "").split(".")[0]


def describe_differences(ours: Mapping[str, str], theirs: Mapping[str, str], where: str) -> list[str]:
    """Say in words which versions differ between this side and a peer, and what it means."""
    notes = []
    if ours.get("remote_magic") != theirs.get("remote_magic"):
        notes.append(f"remote-magic is {ours.get('remote_magic')} here and {theirs.get('remote_magic')} on "
                     f"{where}: install the same version on both sides. A notebook installs the worker's with the "
                     "`%pip install` line remote-worker prints above its token, then restarts its kernel (Colab: "
                     "Runtime > Restart session) and connects again")
    if _minor(ours.get("python")) != _minor(theirs.get("python")):
        notes.append(f"Python is {ours.get('python')} here and {theirs.get('python')} on {where}: cells and the "
                     "functions and classes defined in notebook cells travel as source and work; a closure, a "
                     "method or a function made by exec travels as bytecode and can't load there")
    mine, other = ours.get("numpy"), theirs.get("numpy")
    if mine and other and _major(mine) != _major(other):
        notes.append(f"numpy is {mine} here and {other} on {where}: arrays cross, but other numpy objects "
                     f"pickled by numpy {_major(mine)} may not load under numpy {_major(other)}")
    # Said without advice to change a version: in Colab that would mean changing a pinned package. A value
    # that fails to load names the library and the install that fixes it, when it happens.
    for name, meaning, missing_here in (
            ("cloudpickle", "most values load either way; one that doesn't says which and why when it arrives",
             ""),
            ("pandas", "DataFrames, Series and Index cross, rebuilt from their arrays by the receiver's pandas; "
                       "other pandas objects may not load",
             f"pandas objects {where} makes can't load here: `pip install pandas` here"),
            ("matplotlib", "figures come back as images, so plots work; matplotlib objects stay on the worker",
             "figures come back as images, so plots work; matplotlib objects stay on the worker")):
        mine, other = ours.get(name), theirs.get(name)
        if mine and not other:
            notes.append(f"{name} is {mine} here and not installed on {where}: code that imports it fails there. "
                         f"Install it there: `pip install {name}` in the Python environment it runs in")
        elif other and not mine:
            notes.append(f"{name} is not installed here and is {other} on {where}: {missing_here or meaning}")
        elif _minor(mine) != _minor(other):  # a patch release changes none of this
            notes.append(f"{name} is {mine} here and {other} on {where}: {meaning}")
    return notes


def _bytecode_names(about: Mapping[str, Any]) -> list[str]:
    return [n for n in about.get("by_value") or [] if isinstance(n, str)]


def bytecode_loads_here(about: Mapping[str, Any], sender: Mapping[str, str]) -> bool:
    """Can this Python run the bytecode a value carries? Only the same minor version can: another
    one may refuse it, run it wrongly, or crash the process, so it is never tried."""
    return not _bytecode_names(about) or _minor(sender.get("python")) == _minor(platform.python_version())


def explain_load_failure(name: str, exc: BaseException | None, about: Mapping[str, Any],
                         sender: Mapping[str, str], here: str, there: str) -> str:
    """Why the value ``name`` made ``there`` can't be loaded ``here``, naming what differs and the fix.

    ``about`` is what the sender recorded while pickling it: the libraries its objects come from
    (with their versions there) and the notebook definitions it had to send as bytecode.
    """
    reasons = []
    libraries = about.get("libraries") or {}
    differing = {str(library): str(theirs) for library, theirs in
                 (libraries.items() if isinstance(libraries, dict) else ())
                 if installed_version(str(library)) != theirs}
    # The library whose code raised is the one to name; when none did (pickle's own lookup failed), all.
    raised_in = {frame.f_globals.get("__name__", "").partition(".")[0]
                 for frame, _ in traceback.walk_tb(exc.__traceback__ if exc else None)}
    differing = {k: v for k, v in differing.items() if k in raised_in} or differing
    if exc is None:
        differing = {}
    for library, theirs in sorted(differing.items()):
        ours = installed_version(library)
        dist = distribution_of(library)
        if ours is None:
            reasons.append(f"it was pickled {there} with {library} {theirs}, which isn't installed {here}: "
                           f"`pip install {dist}=={theirs}` {here}")
        else:
            reasons.append(f"it was pickled {there} with {library} {theirs}, and {here} {library} is {ours}: install "
                           f"one version on both sides (`pip install {dist}=={theirs}` {here}, or "
                           f"`pip install {dist}=={ours}` {there})")
    by_value = _bytecode_names(about)
    their_python, our_python = sender.get("python"), platform.python_version()
    if not bytecode_loads_here(about, sender):
        reasons.append(
            f"it holds {', '.join(f'`{n}`' for n in by_value)}, defined {there} where no source could be "
            f"found for it (a closure, a method, or code run by exec or a cell magic), so it travels as Python "
            f"{their_python} bytecode, which Python {our_python} {here} can't load: define it at the top level of a "
            f"plain cell, or use Python {_minor(their_python)} on both sides")
    if exc is None:
        return f"`{name}` can't be loaded {here}: {'; and '.join(reasons)}."
    cause = f"{type(exc).__name__}: {exc}"
    if not reasons:
        return f"`{name}` can't be loaded {here}: {cause}"
    return f"`{name}` can't be loaded {here} ({cause}): {'; and '.join(reasons)}."
