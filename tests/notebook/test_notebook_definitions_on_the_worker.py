"""Notebook functions, classes and Enum members on the worker as in the notebook's own process (issue 32):
pickled by reference (``pickle.dumps``, a process pool handed a notebook function), and classes that
derive from ``abc.ABC``, ``functools.singledispatch`` functions and classes a registry decorator
records, used by later cells on either side.

Real IPython shells against a real worker (``ip``, ``worker`` in conftest.py).
"""

from __future__ import annotations

from IPython.core.interactiveshell import InteractiveShell

from support import run

_DEFINITIONS = ("import enum\ndef square(x):\n    return x * x\nclass Point:\n    def __init__(self, x):\n"
                "        self.x = x\nclass Color(enum.Enum):\n    RED = 1\np = Point(3)\nfuncs = [square]")


def test_a_process_pool_runs_notebook_functions_and_pickle_sends_notebook_objects_by_reference(
        ip: InteractiveShell) -> None:
    """Before: `PicklingError: Can't pickle <function square>: attribute lookup square on __main__ failed`,
    and an executor the cell was done with stayed behind with a notice that it can't be pickled."""
    ip.reset(new_session=False)
    run(ip, _DEFINITIONS)
    result, out = run(ip, "%%offload\nimport multiprocessing, pickle\nfrom concurrent.futures import "
                          "ProcessPoolExecutor\nwith ProcessPoolExecutor(2) as ex:\n"
                          "    squares = list(ex.map(funcs[0], [1, 2, 3]))\n"
                          "with multiprocessing.get_context('fork').Pool(2) as pool:\n"
                          "    pooled = pool.map(square, [4, 5])\n"
                          "back = pickle.loads(pickle.dumps(p)).x\nred = pickle.loads(pickle.dumps(Color.RED))\n"
                          "blob = pickle.dumps([p, Color.RED])")
    assert result.success, f"{result.error_in_exec}\n{out.stderr}"
    ns = ip.user_ns
    assert ns["squares"] == [1, 4, 9] and ns["pooled"] == [16, 25] and ns["back"] == 3 and ns["red"] is ns["Color"].RED
    import pickle

    point, red = pickle.loads(ns["blob"])  # what the worker pickled by reference loads here, as the notebook's own
    assert type(point) is ns["Point"] and point.x == 3 and red is ns["Color"].RED
    assert "stayed on worker" not in out.stderr, out.stderr  # the pools were shut down: nothing is lost there
