"""The module state an offloaded cell shares with the notebook's own process: the global random
generators (the ``random`` module's and numpy's legacy one), numpy's print options, matplotlib's
rcParams and interactive mode, pandas' display options, and the environment variables set since
remote-magic loaded (``%env``).

Locally every cell runs in one process, so ``np.random.seed(0)`` in a local cell decides what the
next cell draws, and ``plt.rcParams["figure.figsize"] = ...`` how it plots, wherever that cell runs.
So each offloaded cell takes the notebook's current state of these along (``capture``), the worker
runs the cell with it (``apply``), and what the cell changed of it comes back (``Synced`` tells) and
is applied in the notebook: local and offloaded cells share them as one process would.

A kind travels from the side that has its module loaded; the worker imports the module to take it,
the notebook takes it only where it has the module; the receiver takes the keys it knows.
"""

from __future__ import annotations

import array
import ctypes
import enum
import importlib
import logging
import os
import sys
from typing import Any, Callable, Mapping, NamedTuple

log = logging.getLogger(__name__)

NAME = "__module_state__"
"""The name the state travels under, beside a cell's inputs and in its results."""


class _Kind(NamedTuple):
    module: str
    get: Callable[[Any], Any]
    set: Callable[[Any, Any], None]
    token: Callable[[Any], Any] | None = None
    """Something cheap to read that changes whenever the state does (reading the state may cost more)."""


def _random_state(random: Any) -> tuple[Any, ...]:
    """The random module's generator's state, its 625 words as bytes: cheap to compare, pickle and send."""
    version, words, gauss = random.getstate()
    packed = array.array(_WORD, words)
    if sys.byteorder == "big":
        packed.byteswap()
    return version, packed.tobytes(), gauss


def _set_random(random: Any, state: tuple[Any, ...]) -> None:
    version, words, gauss = state
    unpacked = array.array(_WORD, words)
    if sys.byteorder == "big":
        unpacked.byteswap()
    random.setstate((version, tuple(unpacked), gauss))


_WORD = next(code for code in "IL" if array.array(code).itemsize == 4)
"""The array type code of 4-byte unsigned words here (little-endian on the wire)."""


def _numpy_rng_state(numpy: Any) -> tuple[Any, ...]:
    """numpy's legacy global generator's state, in plain Python types: a pickled array wouldn't load
    under another major numpy version."""
    name, keys, position, has_gauss, gauss = numpy.random.get_state(legacy=True)
    return str(name), keys.astype("<u4").tobytes(), int(position), int(has_gauss), float(gauss)


def _numpy_rng_token(numpy: Any) -> bytes | None:
    """The legacy global generator's MT19937 words and position, read in place (``get_state`` copies them
    into new arrays): any draw changes them."""
    generator = getattr(numpy.random.mtrand, "_rand", None)
    if generator is None:
        return None
    return ctypes.string_at(generator._bit_generator.ctypes.state_address, _MT19937_BYTES)


_MT19937_BYTES = 624 * 4 + 4  # numpy's mt19937_state: uint32 key[624], int pos


def _set_numpy_rng(numpy: Any, state: tuple[Any, ...]) -> None:
    name, keys, position, has_gauss, gauss = state
    numpy.random.set_state((name, numpy.frombuffer(keys, "<u4"), position, has_gauss, gauss))


def _numpy_print_options(numpy: Any, options: Mapping[str, Any]) -> None:
    known = numpy.get_printoptions()
    numpy.set_printoptions(**{key: value for key, value in options.items() if key in known})


_NOT_SHARED_RC = ("backend", "interactive", "webagg.")
"""rcParams each side keeps its own: how figures are drawn and shown there (interactive mode travels as
its own kind, ``_interactive``)."""


def _rc_changes(matplotlib: Any) -> dict[str, Any]:
    """The rcParams that differ from matplotlib's defaults (a style, a figure size), by key."""
    defaults = matplotlib.rcParamsDefault
    # Read as a dict: reading rcParams["backend"] through RcParams may pick a backend, importing pyplot.
    # A property cycle goes as the text rcParams takes for it: a pickled Cycler needs the cycler package.
    return {key: _plain(value) for key, value in dict.items(matplotlib.rcParams)
            if not key.startswith(_NOT_SHARED_RC) and key in defaults and value != dict.__getitem__(defaults, key)}


def _plain(value: Any) -> Any:
    """The value in builtin types only, so it loads wherever the state goes and is never taken for a
    matplotlib object: a copy of a list (rcParams' may change in place later), an enum's value (a style's
    ``CapStyle.round`` is ``"round"``, which rcParams takes back), a Cycler's text."""
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain(item) for item in value)
    for kind in (bool, int, float, str):  # subclasses (an enum that is also a str) become the plain type
        if isinstance(value, kind):
            return kind(value)
    return None if value is None else repr(value)


def _set_rc(matplotlib: Any, changes: Mapping[str, Any]) -> None:
    params, defaults = matplotlib.rcParams, matplotlib.rcParamsDefault
    wanted = {key: value for key, value in changes.items() if key in defaults}
    # What the other side has at its default is at the default here too (a style reset there).
    back = {key: dict.__getitem__(defaults, key) for key in _rc_changes(matplotlib) if key not in wanted}
    for key, value in {**back, **wanted}.items():
        try:
            if _plain(dict.get(params, key)) != value:
                params[key] = value
        except (KeyError, ValueError, TypeError) as exc:  # a key or value this matplotlib doesn't take
            log.info("rcParams[%r] from the other side doesn't apply here: %s", key, exc)


_figures_started = False
"""Has a figure backend started on the other side (or here, as that side last said)? See ``figures_start``."""


def _interactive(matplotlib: Any) -> tuple[bool, bool]:
    """matplotlib's interactive mode (``plt.ion()``/``plt.ioff()``), and whether this session's figure backend
    has started: the notebook's inline backend turns interactive mode on as it starts (at the first figure,
    or ``%matplotlib inline``), once; after that it is what the cells set."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    started = _figures_started or getattr(pyplot, "_backend_mod", None) is not None
    return bool(matplotlib.is_interactive()), started


def _set_interactive(matplotlib: Any, state: tuple[Any, ...]) -> None:
    global _figures_started
    interactive, started = state
    _figures_started = _figures_started or bool(started)
    # Not plt.ion(): that may start a GUI's event loop in a shell; the flag is what decides what shows.
    matplotlib.interactive(bool(interactive))


def figures_start(matplotlib: Any) -> None:
    """A worker's figure backend starts: it turns interactive mode on, as the notebook's inline backend does
    as it starts, unless a figure backend of this session started already (the notebook's, say), whose
    interactive mode holds."""
    global _figures_started
    if not _figures_started:
        matplotlib.interactive(True)
    _figures_started = True


def _pandas_display(pandas: Any) -> dict[str, Any]:
    """pandas' ``display.*`` options (``pd.set_option("display.max_columns", None)``), by name under
    ``display.``; read from pandas' own table of them (reading each through ``get_option`` costs 40 calls)."""
    from pandas._config import config

    options: dict[str, Any] = {}
    for key, value in config._global_config["display"].items():
        if isinstance(value, dict):  # display.html.border, display.unicode...
            options.update((f"{key}.{inner}", value[inner]) for inner in value)
        else:
            options[key] = value
    # Plain values only: a function (display.float_format) may not pickle, and the state must always travel.
    return {key: value for key, value in options.items() if isinstance(value, (str, int, float, bool, type(None)))}


def _set_pandas_display(pandas: Any, options: Mapping[str, Any]) -> None:
    now = _pandas_display(pandas)
    for key, value in options.items():
        if key in now and now[key] != value:
            try:
                pandas.set_option(f"display.{key}", value)
            except (KeyError, ValueError, TypeError) as exc:  # an option this pandas doesn't take
                log.info("pandas' display.%s from the other side doesn't apply here: %s", key, exc)


_OWN_ENVIRONMENT = frozenset({
    "MPLBACKEND", "PWD", "OLDPWD", "_", "SHLVL",  # how figures are shown there, where its shell is
    "PATH", "LD_LIBRARY_PATH", "DYLD_LIBRARY_PATH", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CONDA_PREFIX",
    "HOME", "USER", "TMPDIR", "TEMP", "TMP",  # where that machine keeps its programs, libraries and files
})
"""Variables each side keeps its own, whoever changes them: they describe the machine, not the cell."""


def _own(variable: str) -> bool:
    return variable in _OWN_ENVIRONMENT or variable.startswith("REMOTE_MAGIC_")  # a token, the home


_STARTED_WITH = dict(os.environ)
"""The environment when remote-magic loaded (``%load_ext``; a worker's executor as it starts): what was
set since is what the cell set, so that is what is shared, not what the process inherited."""


def set_at_start(variables: Mapping[str, str]) -> None:
    """Set the environment variables this process gives itself as it starts, where they aren't set already
    (tinygrad's ``DEV`` in a worker's executor), as what it started with: its own, not a cell's to share."""
    for key, value in variables.items():
        _STARTED_WITH[key] = os.environ.setdefault(key, value)


def _environment_changes(os_module: Any) -> dict[str, str | None]:
    """The variables set, changed (their value) or removed (None) since remote-magic loaded here."""
    environ = os_module.environ
    changed: dict[str, str | None] = {key: value for key, value in environ.items()
                                      if _STARTED_WITH.get(key) != value and not _own(key)}
    changed.update((key, None) for key in _STARTED_WITH if key not in environ and not _own(key))
    return changed


def _set_environment(os_module: Any, changes: Mapping[str, str | None]) -> None:
    """Make this process's own changes the other side's: set theirs, and undo those they don't have."""
    environ = os_module.environ
    wanted = {key: value for key, value in changes.items() if isinstance(key, str) and not _own(key)}
    for key in _environment_changes(os_module).keys() - wanted.keys():
        wanted[key] = _STARTED_WITH.get(key)
    for key, value in wanted.items():
        if value is None:
            environ.pop(key, None)
        elif environ.get(key) != value:
            environ[key] = str(value)


KINDS: dict[str, _Kind] = {
    "random": _Kind("random", _random_state, _set_random),
    "numpy.random": _Kind("numpy", _numpy_rng_state, _set_numpy_rng, _numpy_rng_token),
    "numpy.printoptions": _Kind("numpy", lambda numpy: numpy.get_printoptions(), _numpy_print_options),
    "matplotlib.rcParams": _Kind("matplotlib", _rc_changes, _set_rc),
    "matplotlib.interactive": _Kind("matplotlib", _interactive, _set_interactive),
    "pandas.display": _Kind("pandas", _pandas_display, _set_pandas_display),
    "os.environ": _Kind("os", _environment_changes, _set_environment),
}


def capture() -> dict[str, Any]:
    """This process's state of each kind whose module is loaded."""
    state = {name: _read(name) for name in KINDS}
    return {name: value for name, value in state.items() if value is not _NOTHING}


def _read(name: str) -> Any:
    """The state of one kind here; _NOTHING where its module isn't loaded or can't tell it."""
    kind = KINDS[name]
    module = sys.modules.get(kind.module)
    if module is None:
        return _NOTHING
    try:
        return kind.get(module)
    except Exception as exc:  # a version whose API differs: that kind stays each side's own
        log.debug("%s isn't shared: %s", name, exc)
        return _NOTHING


def apply(state: Mapping[str, Any], load: bool = False) -> dict[str, Any]:
    """Take the other side's state, for the kinds whose module is loaded here (``load``: importing it if
    it isn't, so a cell that imports it later starts from that state); returns the kinds taken."""
    taken = {}
    for name, value in state.items():
        kind = KINDS.get(name)
        if kind is None:
            continue
        module = sys.modules.get(kind.module)
        try:
            if module is None and load:
                module = importlib.import_module(kind.module)
            if module is not None:
                kind.set(module, value)
                taken[name] = value
        except Exception as exc:  # not installed here, or a state this version can't take: each side's own
            log.info("%s from the other side doesn't apply here: %s", name, exc)
    return taken


class Synced:
    """What one side last agreed with the other on, by kind; tells what changed since."""

    def __init__(self) -> None:
        self._agreed: dict[str, tuple[Any, Any]] = {}  # kind -> (its state, its token then)
        self._unsettled = False  # taken, and not yet looked at again (a cell cut short may have changed it)

    def take(self, state: Mapping[str, Any], load: bool = False) -> None:
        """Take the other side's state, unless both it and the state here are as agreed on (told by a kind's
        token, or, without one, by ``changes`` having looked since the last take)."""
        wanted = {}
        for name, value in state.items():
            agreed, token = self._agreed.get(name, (_NOTHING, None))
            changed_here = self._unsettled or (token is not None and _token(name) != token)
            if changed_here or not _same(agreed, value):
                wanted[name] = value
        self._unsettled = True
        taken = apply(wanted, load)
        for name, value in state.items():
            if name in taken or name not in wanted:
                self._agreed[name] = (value, _token(name))

    def changes(self) -> dict[str, Any]:
        """The kinds whose state here changed since it was agreed on."""
        self._unsettled = False
        changed = {}
        for name in KINDS:
            agreed, token = self._agreed.get(name, (_NOTHING, None))
            now = _token(name)
            if now is not None and now == token:
                continue  # not even read: nothing changed it
            value = _read(name)
            if value is _NOTHING:
                continue
            self._agreed[name] = (value, now)
            if not _same(agreed, value):
                changed[name] = value
        return changed


_NOTHING = object()


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)  # states are plain values: tuples, bytes, dicts of them
    except Exception:  # a comparison that refuses: taken as changed
        return False


def _token(name: str) -> Any:
    kind = KINDS[name]
    module = sys.modules.get(kind.module)
    if kind.token is None or module is None:
        return None
    try:
        return kind.token(module)
    except Exception:  # read the state itself instead
        return None
