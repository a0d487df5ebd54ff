"""Functions, classes and lambdas defined in the notebook travel as source; figures as images.

A real IPython shell (which keeps each cell's source in linecache) against a real worker. Source
travel shows in behaviour, not only in the bytes: a notebook function compiled on the worker sees
the cell's globals, as it would locally, where a pickled copy would see a frozen snapshot.
"""

from __future__ import annotations

import base64
import linecache

import pytest
from IPython.core.interactiveshell import InteractiveShell

from remote_magic import InputError
from remote_magic.wire import definitions
from remote_magic.wire.handles import RemoteValue
from support import run

DEFINITIONS = """\
N = 1

def scaled(x):
    return helper(x) * N

def helper(x):
    return x + 1

class Model:
    def __init__(self, k=2):
        self.k = k

    def predict(self, x):
        return scaled(x) * self.k

square = lambda x: x * x

def shifted(x, by=N):
    return x + by
"""


def test_notebook_functions_see_the_cell_globals_as_they_would_locally(ip: InteractiveShell) -> None:
    cell = "N = 5\na = scaled(1)\nm = Model()\nb = m.predict(1)\nc = square(3)\nd = shifted(1)\n"
    names = ("N", "a", "b", "c", "d")
    run(ip, DEFINITIONS)
    run(ip, cell)  # the same cell, run here
    local = {name: ip.user_ns.pop(name) for name in names}
    run(ip, DEFINITIONS)
    result, out = run(ip, "%%offload\n" + cell)
    assert result.success, result.error_in_exec
    assert {name: ip.user_ns[name] for name in names} == local
    assert (local["a"], local["b"], local["d"]) == (10, 20, 2)  # d: the default was bound when N was 1


def test_objects_of_notebook_classes_come_back_as_instances_of_the_same_class(ip: InteractiveShell) -> None:
    run(ip, DEFINITIONS)
    result, _ = run(ip, "%%offload\nm = Model(3)\nsame_function = scaled\nmodels = [Model(1), Model(2)]\n"
                        "inside = isinstance(m, Model)\n")
    assert result.success, result.error_in_exec
    assert type(ip.user_ns["m"]) is ip.user_ns["Model"] and ip.user_ns["m"].k == 3
    assert ip.user_ns["same_function"] is ip.user_ns["scaled"]
    assert [type(m) for m in ip.user_ns["models"]] == [ip.user_ns["Model"]] * 2
    assert ip.user_ns["inside"] is True


def test_definitions_made_on_the_worker_come_back_as_working_source(ip: InteractiveShell) -> None:
    run(ip, "N = 7")
    result, _ = run(ip, "%%offload\ndef times_n(x):\n    return x * N\n\nclass Counter:\n    start = 3\n"
                        "    def next(self):\n        return self.start + 1\n")
    assert result.success, result.error_in_exec
    run(ip, "N = 10")
    assert ip.user_ns["times_n"](2) == 20  # compiled here, in the notebook's namespace: it sees N = 10
    assert ip.user_ns["Counter"]().next() == 4
    assert definitions.find_definition(ip.user_ns["times_n"]).source.startswith("def times_n(x):")


def test_definitions_come_back_with_their_defaults_whatever_the_names_they_were_made_from(
        ip: InteractiveShell) -> None:
    """A default is a value, made once: compiled again here its expression isn't evaluated again. Before,
    `lambda v, k=k: v + k` made in a comprehension failed to load (NameError: 'k') on Python 3.12 and later,
    which inline comprehensions (PEP 709), and anywhere once `k` was gone."""
    result, out = run(ip, "%%offload\nlambda_list = [lambda v, k=k: v + k for k in range(3)]\n"
                          "k = 10\ndef shifted(v, k=k, *, by=k + 1):\n    return v + k + by\ndel k")
    assert result.success, f"{result.error_in_exec}\n{out.stderr}"
    assert [f(1) for f in ip.user_ns["lambda_list"]] == [1, 2, 3]
    assert ip.user_ns["shifted"](1) == 22 and "k" not in ip.user_ns


def test_a_notebook_function_that_raises_shows_its_own_source_line(ip: InteractiveShell) -> None:
    run(ip, "def fails(x):\n    raise ValueError(f'bad input {x}')\n")
    result, out = run(ip, "%%offload\nfails(3)\n")
    assert not result.success
    assert "raise ValueError(f'bad input {x}')" in out.stdout + out.stderr
    assert "ValueError: bad input 3" in out.stdout + out.stderr


def test_a_function_whose_cell_source_changed_travels_by_value(ip: InteractiveShell) -> None:
    run(ip, "def original():\n    return 'from the notebook'\n")
    fn = ip.user_ns["original"]
    filename = fn.__code__.co_filename
    size, mtime, lines, name = linecache.cache[filename]
    linecache.cache[filename] = (size, mtime, ["def original():\n", "    return 'edited'\n"], name)
    try:
        assert definitions._search(fn) is None  # the source no longer compiles to its bytecode
        result, _ = run(ip, "%%offload\nr = original()\n")
    finally:
        linecache.cache[filename] = (size, mtime, lines, name)
    assert result.success, result.error_in_exec
    assert ip.user_ns["r"] == "from the notebook"


def test_closures_and_methods_have_no_source_definition(ip: InteractiveShell) -> None:
    run(ip, DEFINITIONS + "def make():\n    k = 3\n    def inner():\n        return k\n    return inner\n"
                          "closure = make()\n")
    assert definitions.find_definition(ip.user_ns["closure"]) is None
    assert definitions.find_definition(ip.user_ns["Model"].predict) is None
    assert definitions.find_definition(ip.user_ns["Model"]).source.startswith("class Model:")
    assert definitions.find_definition(ip.user_ns["square"]).source == "lambda x: x * x"


def test_each_plt_show_appears_in_order_and_figures_close_after_every_cell(ip: InteractiveShell) -> None:
    """As with IPython's inline backend (issue 9, item 5): plt.show() shows the open figures then and
    there; what is still open at the end shows after the cell, also after an error, and never again."""
    result, out = run(ip, "%%offload\nimport matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()\n"
                          "print('between')\nplt.plot([2, 1])\nplt.show()\nprint('after')")
    assert result.success, result.error_in_exec
    kinds = [("image" if "image/png" in o.data else "other") for o in out.outputs]
    assert kinds == ["image", "image"]  # two figures, not one with both lines
    assert out.stdout == "between\nafter\n"
    first, second = (base64.b64decode(o.data["image/png"]) for o in out.outputs)
    assert first != second and all(image.startswith(b"\x89PNG") for image in (first, second))
    result, out = run(ip, "%%offload\nimport matplotlib.pyplot as plt\nplt.plot([3, 1])\nraise ValueError('late')")
    assert isinstance(result.error_in_exec, ValueError)
    assert len([o for o in out.outputs if "image/png" in o.data]) == 1  # shown with the failing cell
    result, out = run(ip, "%%offload\nimport matplotlib.pyplot as plt\nopen_figures = len(plt.get_fignums())")
    assert ip.user_ns["open_figures"] == 0 and not out.outputs


@pytest.mark.parametrize("formats, mime", [(["svg"], "image/svg+xml"), (["pdf"], "application/pdf")])
def test_figures_follow_the_notebook_figure_formats(ip: InteractiveShell, formats: list[str], mime: str) -> None:
    ip.config.InlineBackend.figure_formats = formats
    try:
        result, out = run(ip, "%%offload\nimport matplotlib.pyplot as plt\nplt.plot([3, 1, 2])\nplt.gcf()\n")
    finally:
        del ip.config.InlineBackend["figure_formats"]
    assert result.success, result.error_in_exec
    figures = [o.data for o in out.outputs if mime in o.data]
    assert len(figures) == 1, out.outputs  # the open figure, after the cell (its value goes to the displayhook)
    assert "image/png" not in figures[0]
    assert isinstance(result.result, RemoteValue) and result.result.kind == "Figure"  # the figure stays there


def test_a_dataclass_of_fields_travels_as_source_where_python_records_its_line(ip: InteractiveShell) -> None:
    run(ip, "from dataclasses import dataclass, field\n\n@dataclass\nclass Config:\n    lr: float = 0.1\n"
            "    layers: list = field(default_factory=list)\n    name: str = 'base'\n")
    config = ip.user_ns["Config"]
    found = definitions.find_definition(config)
    if not hasattr(config, "__firstlineno__"):  # Python < 3.13: nothing says which cell it came from
        assert found is None
        return
    assert found is not None and found.source.startswith("@dataclass\nclass Config:")
    result, _ = run(ip, "%%offload\nc = Config(lr=0.5)\nc.layers.append(3)\n")
    assert result.success, result.error_in_exec
    assert type(ip.user_ns["c"]) is config and ip.user_ns["c"] == config(0.5, [3], "base")


def test_a_class_changed_after_its_definition_does_not_travel_as_its_source(ip: InteractiveShell) -> None:
    run(ip, "class Tuned:\n    def rate(self):\n        return 1\n")
    assert definitions.find_definition(ip.user_ns["Tuned"]) is not None
    run(ip, "class Patched:\n    def rate(self):\n        return 1\n\nPatched.extra = 2\n")
    assert definitions.find_definition(ip.user_ns["Patched"]) is not None  # `extra` travels beside its source
    result, _ = run(ip, "%%offload\nseen = Patched.extra\n")
    assert result.success and ip.user_ns["seen"] == 2
    run(ip, "class Swapped:\n    def rate(self):\n        return 1\n\nSwapped.other = lambda self: 3\n")
    assert definitions.find_definition(ip.user_ns["Swapped"]) is None  # its source would lose a method
    run(ip, "Tuned.rate = lambda self: 2")  # changed after it was found once
    assert definitions.find_definition(ip.user_ns["Tuned"]) is None
    result, _ = run(ip, "%%offload\nr = Tuned().rate()\n")  # same Python here: its bytecode crosses
    assert result.success and ip.user_ns["r"] == 2


def test_names_a_definition_evaluates_are_there_before_it_is_compiled(ip: InteractiveShell) -> None:
    run(ip, "import functools\nLIMIT = 3\n\nclass Base:\n    unit = 2\n\n"
            "class Derived(Base):\n    scale = LIMIT * 10\n\n    @functools.lru_cache(maxsize=LIMIT)\n"
            "    def area(self, side: int = LIMIT) -> int:\n        return side * self.unit\n")
    result, _ = run(ip, "%%offload\nd = Derived()\nvalues = (d.area(), d.scale, isinstance(d, Base))\n")
    assert result.success, result.error_in_exec
    assert ip.user_ns["values"] == (6, 30, True) and type(ip.user_ns["d"]) is ip.user_ns["Derived"]


def test_a_cell_that_raises_shows_its_figure_there_and_not_in_the_next_cell(ip: InteractiveShell) -> None:
    result, out = run(ip, "%%offload\nimport matplotlib.pyplot as plt\nplt.plot([1, 2])\n"
                          "raise ValueError('after plotting')")
    assert not result.success
    assert len([o for o in out.outputs if "image/png" in o.data]) == 1  # as the inline backend shows it locally
    result, out = run(ip, "%%offload\nnothing = None")
    assert result.success and [o for o in out.outputs if "image/png" in o.data] == []


def test_a_remote_magic_error_the_cell_raises_keeps_what_the_cell_did_before_as_locally(ip: InteractiveShell) -> None:
    # (a cell may use remote-magic itself: a client of another hub, say; before, such an error came back alone)
    result, _ = run(ip, "%%offload\nimport remote_magic\nkept = 1\n"
                        "raise remote_magic.InputError('the cell refused `x`', 'x')\nafter = 2")
    assert isinstance(result.error_in_exec, InputError), result.error_in_exec  # `except InputError` catches it
    assert "the cell refused `x`" in str(result.error_in_exec)
    assert ip.user_ns["kept"] == 1 and "after" not in ip.user_ns
