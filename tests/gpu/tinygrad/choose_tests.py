"""Chooses the tests of tinygrad's ``test_ops.py`` that the default suite runs (``default_tests.txt``): the cheapest
set that between them call every operation the whole file calls, with every string or boolean argument value it
passes (``pad``'s ``mode='reflect'``, ``sort``'s ``descending=True``, ``scatter_reduce``'s ``reduce='amax'``), and
every test that takes under :data:`CHEAP_S` besides. Run again after changing the pinned tinygrad::

    python tests/gpu/tinygrad/choose_tests.py    # all of test_ops.py on the worker's device (about 5 minutes)

It runs the whole file once with itself loaded as a pytest plugin too (``-p choose_tests``), which notes, for each
test, how long it took and which ``Tensor`` methods the test's own code called with which such arguments; then a
greedy weighted set cover picks the tests. An operation is a ``Tensor`` method called from ``test_ops.py`` itself:
what a method calls inside tinygrad is that method's business, and its own tests cover it."""

from __future__ import annotations

import functools
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
CHOSEN = HERE / "default_tests.txt"
CHEAP_S = 0.05
"""A test this quick on lavapipe runs whether it adds an operation or not."""
OUT_VARIABLE = "REMOTE_MAGIC_CHOOSE_TESTS_OUT"

_called: set[str] = set()
_noted: dict[str, dict[str, Any]] = {}
_started = [0.0]


def _noting(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def noted(*args: Any, **kwargs: Any) -> Any:
        if sys._getframe(1).f_code.co_filename.endswith(f"{os.sep}test_ops.py"):
            _called.add(name)
            _called.update(f"{name}:{v}" for v in args[1:] if isinstance(v, str))
            _called.update(f"{name}:{k}={v}" for k, v in kwargs.items() if isinstance(v, (str, bool)))
        return method(*args, **kwargs)
    return noted


def _note_tensor_methods() -> None:
    from tinygrad import Tensor

    for name, value in list(vars(Tensor).items()):
        if name.startswith("_") and not (name.startswith("__") and name.endswith("__")) or name in (
                "__init__", "__new__", "__repr__", "__hash__", "__del__", "__getattribute__"):
            continue
        if isinstance(value, (staticmethod, classmethod)):
            setattr(Tensor, name, type(value)(_noting(name, value.__func__)))
        elif inspect.isfunction(value):
            setattr(Tensor, name, _noting(name, value))


def pytest_configure(config: Any) -> None:
    _note_tensor_methods()


def pytest_runtest_setup(item: Any) -> None:
    _called.clear()
    _started[0] = time.perf_counter()


def pytest_runtest_teardown(item: Any) -> None:
    _noted[item.name] = {"seconds": time.perf_counter() - _started[0], "operations": sorted(_called)}


def pytest_sessionfinish(session: Any) -> None:
    Path(os.environ[OUT_VARIABLE]).write_text(json.dumps(_noted))


def choose(noted: dict[str, dict[str, Any]]) -> list[str]:
    """The tests to run: a cheap set calling every operation ``noted`` names, and every test under CHEAP_S."""
    operations = {test: set(n["operations"]) for test, n in noted.items()}
    seconds = {test: max(n["seconds"], 1e-3) for test, n in noted.items()}
    wanted = set().union(*operations.values())
    chosen: list[str] = []
    covered: set[str] = set()
    while covered != wanted:
        best = max(operations, key=lambda test: len(operations[test] - covered) / seconds[test])
        chosen.append(best)
        covered |= operations[best]
    for test in sorted(chosen, key=seconds.__getitem__, reverse=True):  # (drop what the later picks made redundant)
        if set().union(*(operations[other] for other in chosen if other != test)) == wanted:
            chosen.remove(test)
    return sorted(set(chosen) | {test for test in noted if seconds[test] < CHEAP_S})


def default_tests() -> frozenset[str]:
    """The tests the default suite runs, as ``default_tests.txt`` lists them."""
    return frozenset(line for line in CHOSEN.read_text().splitlines() if line and not line.startswith("#"))


def ops_command(*plugins: str) -> list[str]:
    """pytest on ``test_ops.py`` (run in this folder, with :func:`ops_environment`) with ``plugins`` loaded (one
    chooses the device) and none of the suite's own settings."""
    loaded = [argument for plugin in plugins for argument in ("-p", plugin)]
    return [sys.executable, "-m", "pytest", "test_ops.py", "--noconftest", *loaded, "-q", "-p", "no:cacheprovider",
            "-o", "addopts=", "--rootdir", str(HERE)]


def ops_environment(**variables: str) -> dict[str, str]:
    """This process's environment and ``variables``, this folder's plugins importable, tinygrad's ``DEV`` unset."""
    env = {**os.environ, **variables, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    env.pop("DEV", None)
    return env


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "noted.json"
        env = ops_environment(**{OUT_VARIABLE: str(out), "REMOTE_MAGIC_TINYGRAD_ALL_OPS": "1"})
        subprocess.run(ops_command("on_worker_gpu", "choose_tests"), cwd=HERE, env=env, check=True)
        noted = json.loads(out.read_text())
    chosen = choose(noted)
    total = sum(n["seconds"] for n in noted.values())
    kept = sum(noted[test]["seconds"] for test in chosen)
    CHOSEN.write_text(f"# Written by choose_tests.py: {len(chosen)} of test_ops.py's {len(noted)} tests, {kept:.0f} s "
                      f"of the {total:.0f} s all take here.\n" + "".join(f"{test}\n" for test in chosen))
    print(f"{CHOSEN}: {len(chosen)} of {len(noted)} tests, {kept:.0f} s of {total:.0f} s")


if __name__ == "__main__":
    main()
