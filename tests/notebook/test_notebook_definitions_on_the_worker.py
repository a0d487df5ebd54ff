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


def test_names_a_string_looks_up_at_run_time_go_with_the_cell(ip: InteractiveShell) -> None:
    """Before: NameError on the worker for `eval(expr)`, `df.query(cond)` with `@limit` and `timeit(...,
    globals=globals())`, where the names are in no literal string of the cell."""
    ip.reset(new_session=False)
    run(ip, "import pandas as pd\nlimit = 2\ndf = pd.DataFrame({'a': [1, 2, 3]})\nexpr = 'limit + 1'\n"
            "cond = 'a > @limit'\nscale = 10\ndef f():\n    return scale * 2\nimport threading\n"
            "lock = threading.Lock()")
    result, out = run(ip, "%%offload\nv = eval(expr)\nq = len(df.query(cond))")
    assert result.success, f"{result.error_in_exec}\n{out.stderr}"
    assert ip.user_ns["v"] == 3 and ip.user_ns["q"] == 1 and "looks names up" not in out.stderr
    result, out = run(ip, "%%offload\nimport timeit\nruns = timeit.repeat('f()', number=2, repeat=2, "
                          "globals=globals())\nscaled = eval('sca' + 'le')")
    assert result.success, f"{result.error_in_exec}\n{out.stderr}"
    assert len(ip.user_ns["runs"]) == 2 and ip.user_ns["scaled"] == 10
    assert "remote-magic: `globals()` looks names up as the cell runs, so the notebook's other variables went with " \
           "it (" in out.stderr
    assert "`lock` stayed here" in out.stderr  # it can't be pickled: named, and the cell still runs


def test_abc_classes_and_singledispatch_functions_travel_as_definitions_do(ip: InteractiveShell) -> None:
    """Before: `Base` (ABCMeta) can't be pickled (`_abc_data`), a singledispatch function neither (its cache
    holds weak references), so the cell failed; made on the worker, they came back as handles."""
    ip.reset(new_session=False)
    run(ip, "import abc, functools\nclass Base(abc.ABC):\n    @abc.abstractmethod\n    def go(self): ...\n"
            "class Impl(Base):\n    def go(self):\n        return 'went'\n@functools.singledispatch\n"
            "def describe(x):\n    return 'thing'\n@describe.register\ndef _(x: int):\n    return 'int'")
    ns = ip.user_ns
    notebook_classes = ns["Base"], ns["Impl"]
    result, out = run(ip, "%%offload\nmade = Impl()\nclass Local(Base):\n    def go(self):\n        return 'local'\n"
                          "@functools.singledispatch\ndef kind(x):\n    return 'any'\n@kind.register\n"
                          "def _(x: str):\n    return 'str'\nseen = describe(3), describe('s'), made.go()\n"
                          "abstract = False\ntry:\n    Base()\nexcept TypeError:\n    abstract = True")
    assert result.success, f"{result.error_in_exec}\n{out.stderr}"
    assert "stayed on worker" not in out.stderr, out.stderr
    assert ns["seen"] == ("int", "thing", "went") and ns["abstract"] is True
    assert (ns["Base"], ns["Impl"]) == notebook_classes and type(ns["made"]) is ns["Impl"]
    assert isinstance(ns["made"], ns["Base"]) and issubclass(ns["Local"], ns["Base"]) and ns["Local"]().go() == "local"
    assert ns["kind"]("a") == "str" and ns["kind"](1) == "any" and ns["describe"](2) == "int"
    result, out = run(ip, "%%offload\nagain = kind('b'), kind(2.0)")  # made there, sent back again
    assert result.success and ns["again"] == ("str", "any"), out.stderr


def test_a_class_a_registry_decorator_recorded_loads_on_the_worker_without_registering_again(
        ip: InteractiveShell) -> None:
    """Before: the worker compiled a class with its decorators and ran them again while the message loaded,
    when the globals they write weren't there yet (`NameError: name 'REGISTRY' is not defined`; which names
    came first depended on the cell), or registered it twice (`PLUGINS` held four entries there)."""
    ip.reset(new_session=False)
    run(ip, "import dataclasses\nREGISTRY = {}\nCOUNT = 0\nPLUGINS = []\ndef register(cls):\n    global REGISTRY, "
            "COUNT\n    COUNT += 1\n    REGISTRY = {**REGISTRY, cls.__name__: cls}\n    return cls\n"
            "def plugin(name):\n    def deco(cls):\n        PLUGINS.append((name, cls))\n"
            "        cls.plugin_name = name\n        return cls\n    return deco\n@register\nclass A:\n"
            "    def make(self):\n        return B()\n@register\n@plugin('beta')\nclass B:\n    def run(self):\n"
            "        return self.plugin_name + '!'\ndef frozen(cls):\n"
            "    return dataclasses.dataclass(frozen=True)(cls)\n"
            "@frozen\nclass P:\n    x: int\n    def double(self):\n        return self.x * 2")
    ns = ip.user_ns
    classes = ns["A"], ns["B"]
    for cell in ("made = A().make()\nran = made.run()", "counted = COUNT\nb = B()",
                 "out = [cls().run() for name, cls in PLUGINS]", "doubled = P(3).double()"):
        result, out = run(ip, f"%%offload\n{cell}")
        assert result.success, f"{cell}: {result.error_in_exec}\n{out.stderr}"
    assert type(ns["made"]) is classes[1] and ns["ran"] == "beta!" and type(ns["b"]) is classes[1]
    assert ns["counted"] == 2 and ns["COUNT"] == 2 and ns["REGISTRY"] == {"A": classes[0], "B": classes[1]}
    assert ns["out"] == ["beta!"] and ns["PLUGINS"] == [("beta", classes[1])] and ns["doubled"] == 6
    result, out = run(ip, "%%offload\n@register\nclass C:\n    def hi(self):\n        return 'hi'\n"
                          "names = sorted(REGISTRY)")
    assert result.success, out.stderr
    assert ns["names"] == ["A", "B", "C"] and ns["REGISTRY"]["C"] is ns["C"] and ns["C"]().hi() == "hi"


def test_a_kept_exception_has_its_traceback_and_out_is_the_notebooks_output_history(ip: InteractiveShell) -> None:
    """Before: `err.__traceback__` was None after an offloaded cell caught it, and `Out` was undefined there."""
    import traceback

    ip.reset(new_session=False)
    result, out = run(ip, "%%offload\ndef divide(a, b):\n    return a / b\ntry:\n    divide(1, 0)\n"
                          "except ZeroDivisionError as e:\n    err = e\n    err.note = 'kept'")
    assert result.success, out.stderr
    err = ip.user_ns["err"]
    assert err.__traceback__ is not None and err.note == "kept"
    shown = traceback.format_exception(err)
    assert [line.splitlines()[0].split(", in ")[-1] for line in shown if line.lstrip().startswith("File")] == [
        "<module>", "divide"] and shown[-1] == "ZeroDivisionError: division by zero\n"
    assert "line 4" in shown[1] and "line 2" in shown[2]  # where the cell and its function raised it
    ip.run_cell("21 * 2", store_history=True)
    number = max(ip.user_ns["Out"])
    result, out = run(ip, f"%%offload\nearlier = Out[{number}] + 1\nsource = In[{number}]")
    assert result.success, out.stderr
    assert ip.user_ns["earlier"] == 43 and ip.user_ns["source"] == "21 * 2"
