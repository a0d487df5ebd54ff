"""An offloaded cell leaves the notebook's namespace as the same cell run locally would (issue 9):
every namespace edit it makes (star imports, `del`, `global` inside functions it calls,
`import x as y`, names bound through `globals()`; item 3), and every object it changes in place
through a method (`L.sort()`, `d.update()`, `model.fit()`, a random Generator that draws; item 2).

Each case runs twice in a real IPython shell, after the same setup cells: once plain, once with its
cells under %%offload; the namespaces the notebook is left with must be the same.
"""

from __future__ import annotations

import base64
import re
import types
from typing import Any

import numpy as np
import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from support import run

CASES: dict[str, tuple[list[str], str | list[str]]] = {
    "star import": ([], "from math import *"),
    "star import that shadows builtins": ([], "from numpy import *\nbiggest = max(array([3, 1, 2]))"),
    "del": (["x = 1\ny = [1, 2]"], "del x"),
    "del of several, one of them read": (["x = 1\ny = 2\nz = 3"], "total = x + y\ndel x, y"),
    "global in a function the cell calls": (
        ["counter = 0\ndef bump(by=1):\n    global counter\n    counter += by"], "bump()\nbump(5)"),
    "a function's global that didn't exist before": (
        ["def make():\n    global made\n    made = 'here'"], "make()"),
    "import as": ([], "import os.path as osp\nfrom collections import OrderedDict as OD"),
    "globals() in a loop": ([], "for name in ['p', 'qq']:\n    globals()[name] = len(name)"),
    "globals().update": ([], "globals().update({'a1': 1, 'b2': [2]})"),
    "a list sorted in place": (["L = [3, 1, 2]"], "L.sort()"),
    "a dict and a set changed by methods": (["d = {'a': 1}\ns = {1}"], "d.update(b=2)\ns.add(2)"),
    "an array sorted in place": (["import numpy as np\na = np.array([3.0, 1.0, 2.0])"], "a.sort()"),
    "an object fitted through its method": (
        ["class Model:\n    coef = None\n    def fit(self, xs):\n        self.coef = sum(xs) / len(xs)\n"
         "        return self\nm = Model()"], "m.fit([1, 2, 6])"),
    "a function that appends to a global list": (["calls = []\ndef log(x):\n    calls.append(x)"], "log(1)\nlog(2)"),
    "a random Generator that draws, cell after cell": (
        ["import numpy as np\nrng = np.random.default_rng(0)"], ["first = rng.normal()", "second = rng.normal()"]),
}


def _described(value: Any) -> str:
    """A value, comparably across processes: modules by name, functions and classes by qualified name,
    the rest by repr without memory addresses."""
    if isinstance(value, types.ModuleType):
        return f"module {value.__name__}"
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{type(value).__name__} {getattr(value, '__module__', '?')}.{value.__qualname__}"
    if type(value).__module__ == "__main__":  # an instance of a notebook class: by its attributes
        return f"{type(value).__qualname__} {sorted((k, _described(v)) for k, v in vars(value).items())}"
    return f"{type(value).__name__} {re.sub(' at 0x[0-9a-fA-F]+', '', repr(value))}"  # copies live elsewhere


def _namespace_after(ip: InteractiveShell, setup: list[str], cells: list[str], offload: bool) -> dict[str, str]:
    ip.reset(new_session=False)
    for code in setup:
        result, _ = run(ip, code)
        assert result.success, result.error_in_exec
    for cell in cells:
        result, out = run(ip, f"%%offload\n{cell}" if offload else cell)
        assert result.success, f"{result.error_in_exec}\n{out.stdout}\n{out.stderr}"
    hidden = ip.user_ns_hidden
    return {name: _described(value) for name, value in ip.user_ns.items()
            if not name.startswith("_") and name not in hidden}


@pytest.mark.parametrize("case", CASES)
def test_an_offloaded_cell_leaves_the_namespace_as_a_local_one_does(ip: InteractiveShell, case: str) -> None:
    setup, cells = CASES[case]
    cells = [cells] if isinstance(cells, str) else cells
    local = _namespace_after(ip, setup, cells, offload=False)
    offloaded = _namespace_after(ip, setup, cells, offload=True)
    assert offloaded == local


def test_what_cant_be_pickled_stays_on_the_worker_as_a_handle_later_cells_use_in_place(ip: InteractiveShell) -> None:
    """Before, one such value failed the whole cell's outputs; then it stayed behind unnamed in the
    notebook (issue 9, item 4)."""
    ip.reset(new_session=False)
    result, out = run(ip, "%%offload\nimport threading\ng = (i for i in range(3))\nlock = threading.Lock()\nn = 5")
    assert result.success, result.error_in_exec
    assert ip.user_ns["n"] == 5 and ip.user_ns["threading"].__name__ == "threading"
    assert {name: (ip.user_ns[name].kind, ip.user_ns[name].worker) for name in ("g", "lock")} == {
        "g": ("generator", "shared"), "lock": ("lock", "shared")}  # handles to what stayed there
    assert ("`g` (generator: a generator, which can't be pickled: TypeError: cannot pickle 'generator' object), "
            "`lock` (lock: a lock, which can't be pickled: TypeError: cannot pickle '_thread.lock' object) "
            "stayed on worker 'shared'") in out.stderr
    # Later offloaded cells use them in place, with no transfer; a local cell is told where they are.
    result, _ = run(ip, "%%offload\ntaken = [next(g), next(g)]\nlocked = lock.acquire(blocking=False)")
    assert result.success, result.error_in_exec
    assert ip.user_ns["taken"] == [0, 1] and ip.user_ns["locked"] is True
    result, _ = run(ip, "%%offload\nrest = list(g)\nagain = lock.acquire(blocking=False)")
    assert ip.user_ns["rest"] == [2] and ip.user_ns["again"] is False  # the same generator, the same lock
    result, _ = run(ip, "lock.locked()")
    assert "`lock` is a lock that stayed on worker 'shared'" in str(result.error_in_exec)
    # Alone, too: the worker once compared its own objects by a temporary's id, which the cell's next
    # object reused, and the lock vanished without a word.
    result, out = run(ip, "%%offload\nimport threading\nlock = threading.Lock()")
    assert result.success and ip.user_ns["lock"].kind == "lock"
    assert "`lock` (lock: a lock, which can't be pickled" in out.stderr
    # A cell whose value can't come back shows it as the worker renders it; its handle names no `__value__`,
    # which nothing could use (before: "Offloaded cells use `__value__` in place; %offload_pull __value__").
    result, out = run(ip, "%%offload\n(i for i in range(3))")
    assert result.success and "<generator object <genexpr>" in out.stdout
    handle = result.result
    assert handle.kind == "generator" and "__value__" not in repr(handle) and "__value__" not in handle.describe()
    assert "It was an offloaded cell's value" in repr(handle)
    result, out = run(ip, "%%offload\nimport matplotlib.pyplot as plt\nfig, ax = plt.subplots()\n"
                          "ax.plot([1, 2, 3])\nlines = ax.get_lines()\npoints = 3\n")
    assert result.success, result.error_in_exec
    assert ip.user_ns["points"] == 3
    assert {name: ip.user_ns[name].kind for name in ("fig", "ax", "lines")} == {
        "fig": "Figure", "ax": "Axes", "lines": "silent_list"}
    assert "`fig` (Figure: it holds a matplotlib Figure: a pickled figure loads only under the same" in out.stderr
    images = [o.data["image/png"] for o in out.outputs if "image/png" in o.data]
    assert len(images) == 1 and base64.b64decode(images[0]).startswith(b"\x89PNG")
    result, out = run(ip, "%%offload\nax.set_title('drawn later')\ntitle = ax.get_title()")
    assert result.success, result.error_in_exec
    assert ip.user_ns["title"] == "drawn later"


def test_names_that_shared_an_object_or_memory_still_do_after_the_cell(ip: InteractiveShell) -> None:
    """Item 2: aliases and views hold across the wire, both ways."""
    ip.reset(new_session=False)
    run(ip, "import numpy as np\nx = np.arange(6.0)\nv = x[:2]\na = [1]\nb = a\nclass Box:\n    pass\n"
            "box = Box()\nalso = box")
    result, _ = run(ip, "%%offload\nv[0] = 99\nb.append(2)\nbox.n = 1\ny = x\nw = x[3:]\nsame = v is not None")
    assert result.success, result.error_in_exec
    ns = ip.user_ns
    assert ns["x"][0] == 99 and np.shares_memory(ns["v"], ns["x"])  # written through the view, as locally
    assert ns["a"] == [1, 2] and ns["b"] is ns["a"]  # changed through one name, seen through the other
    assert ns["also"] is ns["box"] and ns["also"].n == 1
    assert ns["y"] is ns["x"]  # bound to the notebook's own object, not a copy
    ns["w"][0] = -1
    assert ns["x"][3] == -1  # a view the cell made stays a view of the notebook's array
    # Both names read by the cell: it sees them as one object on the worker too.
    result, _ = run(ip, "%%offload\na.append(3)\nseen = list(b)\nv[1] = 7\nthrough = float(x[1])")
    assert ns["seen"] == [1, 2, 3] and ns["through"] == 7.0 and ns["b"] is ns["a"]


def test_a_dataframe_changed_in_place_is_changed_in_place_here(ip: InteractiveShell) -> None:
    """`inplace=True`, a new column, a renamed Series: every name and container holding the frame sees it."""
    ip.reset(new_session=False)
    run(ip, "import pandas as pd\ndf = pd.DataFrame({'a': [3, 1], 'b': [5, 6]})\nalias = df\nframes = {'main': df}\n"
            "s = df['a'].copy()\nsame_s = s")
    result, out = run(ip, "%%offload\ndf.drop(columns=['b'], inplace=True)\ndf['c'] = df['a'] * 2\n"
                          "df.sort_values('a', inplace=True)\ns.rename('renamed', inplace=True)")
    assert result.success, result.error_in_exec
    ns = ip.user_ns
    assert ns["alias"] is ns["df"] and ns["frames"]["main"] is ns["df"] and ns["same_s"] is ns["s"]
    assert list(ns["df"].columns) == ["a", "c"] and list(ns["df"].index) == [1, 0] and ns["s"].name == "renamed"
    assert "came back as a new object" not in out.stderr


def test_an_object_changed_in_place_that_cant_be_updated_here_says_which_names_kept_the_old_one(
        ip: InteractiveShell) -> None:
    ip.reset(new_session=False)
    run(ip, "import numpy as np\nx = np.arange(6.0)\nalias = x")
    result, out = run(ip, "%%offload\nx.shape = (2, 3)")
    assert result.success, result.error_in_exec
    assert ip.user_ns["x"].shape == (2, 3) and ip.user_ns["alias"].shape == (6,)
    assert ("`x` was changed in place on the worker and came back as a new object (an array whose shape, dtype "
            "or memory changed can't be updated in place here): `alias`, which shared it here, still hold the old "
            "value; bind them again (`alias = x`) where they should follow it") in out.stderr


def test_a_notebook_objects_finalizer_that_runs_here_after_the_cells_output_is_named(ip: InteractiveShell) -> None:
    """Locally `del res` runs `Res.__del__` where the `del` is; offloaded, the notebook's copy goes as the result
    lands, after the cell's output: a notice says so, once the object's last name here let go of it."""
    ip.reset(new_session=False)
    run(ip, "class Res:\n    def __del__(self):\n        print('closed')\n\nres = Res()\nkept = Res()\n"
            "alias = kept\nplain = [1]")
    result, out = run(ip, "%%offload\ndel res, kept, plain\nprint('cell done')")
    assert result.success, result.error_in_exec
    assert out.stdout.splitlines() == ["cell done", "closed"]  # (locally: closed, then cell done)
    assert ("remote-magic: `res` let go of an object whose class has a `__del__`: it runs here now, after the cell's "
            "output (locally it runs where the cell's `del` or assignment ran); where its place matters, call the "
            "cleanup yourself (a `with` block, `close()`)") in out.stderr.splitlines()
    assert "`kept`" not in out.stderr and "`plain`" not in out.stderr  # `alias` holds one; a list has no __del__
    assert "alias" in ip.user_ns and not {"res", "kept", "plain"} & set(ip.user_ns)


_ONE_PROCESS = [
    "import random\nimport numpy as np\nimport pandas as pd\nimport matplotlib\nnp.random.seed(0)\nrandom.seed(1)\n"
    "matplotlib.rcParams['lines.linewidth'] = 3.5\npd.set_option('display.max_rows', 7)",
    "a = np.random.rand(2).tolist()\nr = random.random()\nwidth = matplotlib.rcParams['lines.linewidth']\n"
    "np.random.seed(7)\nmatplotlib.rcParams['figure.figsize'] = [3.0, 2.0]\nnp.set_printoptions(precision=2)\n"
    "rows = pd.get_option('display.max_rows')\npd.set_option('display.precision', 3)",
    "b = np.random.rand(1).tolist()\nr2 = random.random()\nsize = list(matplotlib.rcParams['figure.figsize'])\n"
    "shown = repr(np.array([1 / 3]))\nframe = repr(pd.DataFrame({'x': [1 / 3]}))",
]


def test_random_seeds_print_and_display_options_and_rc_params_are_one_processs_for_local_and_offloaded_cells(
        ip: InteractiveShell) -> None:
    """A local cell's seed decides what the next offloaded cell draws, and an offloaded cell's seed, print
    and display options and rcParams hold in the local cells after it, as when every cell runs locally."""
    import matplotlib
    import pandas as pd

    names = ("a", "r", "width", "b", "r2", "size", "shown", "rows", "frame")
    try:
        runs = []
        for offloaded in (set(), {1}):  # all local; then the middle cell offloaded
            ip.reset(new_session=False)
            for index, cell in enumerate(_ONE_PROCESS):
                result, out = run(ip, f"%%offload\n{cell}" if index in offloaded else cell)
                assert result.success, f"{result.error_in_exec}\n{out.stderr}"
            runs.append({name: ip.user_ns[name] for name in names})
        assert runs[1] == runs[0]
        assert runs[0]["width"] == 3.5 and runs[0]["size"] == [3.0, 2.0] and runs[0]["shown"] == "array([0.33])"
        assert runs[0]["rows"] == 7 and runs[0]["frame"].endswith("0.333")
    finally:
        matplotlib.rcdefaults()
        np.set_printoptions(precision=8)
        pd.reset_option("display.max_rows")
        pd.reset_option("display.precision")


def test_environment_variables_set_on_either_side_are_one_processs(ip: InteractiveShell) -> None:
    """``%env N=500`` reaches the next offloaded cell (before: its ``os.environ`` lacked it), and what an
    offloaded cell sets or removes holds in the notebook after it, as when every cell runs locally."""
    import os

    try:
        run(ip, "%env REMOTE_MAGIC_TEST_N=500")  # REMOTE_MAGIC_*: each side's own (a token, a home)
        run(ip, "%env RM_TEST_N=500")
        result, out = run(ip, "%%offload\nimport os\nn = os.environ.get('RM_TEST_N')\n"
                              "own = os.environ.get('REMOTE_MAGIC_TEST_N')\n"
                              "os.environ['RM_TEST_BACK'] = 'from the worker'")
        assert result.success, out.stderr
        assert ip.user_ns["n"] == "500" and ip.user_ns["own"] is None
        assert os.environ["RM_TEST_BACK"] == "from the worker"
        run(ip, "import os; del os.environ['RM_TEST_N']")
        result, _ = run(ip, "%%offload\nimport os\ngone = 'RM_TEST_N' not in os.environ")
        assert result.success and ip.user_ns["gone"] is True
    finally:
        for name in ("RM_TEST_N", "RM_TEST_BACK", "REMOTE_MAGIC_TEST_N"):
            os.environ.pop(name, None)


def test_a_stream_a_cell_hands_to_a_lasting_object_writes_into_later_cells(ip: InteractiveShell) -> None:
    """logging configured in one offloaded cell prints in the later ones (before: nothing, its handler
    kept the first cell's stream), as in a notebook, where sys.stdout is one object for every cell."""
    result, out = run(ip, "%%offload\nimport logging, sys\n"
                          "logging.basicConfig(stream=sys.stdout, level=logging.INFO, format='%(message)s',\n"
                          "                    force=True)\n"
                          "logging.info('first cell')")
    assert result.success and out.stdout == "first cell\n", out.stdout
    result, out = run(ip, "%%offload\nimport logging\nlogging.info('a later cell')")
    assert result.success and out.stdout == "a later cell\n", out.stdout
    run(ip, "%%offload\nimport logging\nlogging.basicConfig(force=True, handlers=[])")


def test_a_display_with_an_id_can_be_updated_there_and_here(ip: InteractiveShell) -> None:
    """``display(x, display_id=True)`` returns a handle whose ``update`` replaces that output, in a later
    offloaded cell or a local one (before: it returned None offloaded, so ``h.update(...)`` raised)."""
    result, out = run(ip, "%%offload\nfrom IPython.display import display\nh = display('one', display_id=True)")
    assert result.success, out.stderr
    handle = ip.user_ns["h"]
    assert type(handle).__name__ == "DisplayHandle" and handle.display_id
    [shown] = out.outputs
    assert shown.data["text/plain"] == "'one'" and shown.transient == {"display_id": handle.display_id}
    result, out = run(ip, "%%offload\nh.update('two')")
    assert result.success, out.stderr
    [updated] = out.outputs
    assert updated.data["text/plain"] == "'two'" and updated.update is True
    assert updated.transient == {"display_id": handle.display_id}
    result, out = run(ip, "h.update('three')")  # the same handle, in the notebook
    assert result.success and out.outputs[0].transient == {"display_id": handle.display_id}


def test_a_matplotlib_style_set_offloaded_holds_in_later_cells_on_both_sides(ip: InteractiveShell) -> None:
    """Styles that set cap or join styles (every seaborn-v0_8-*) put enums in rcParams; before, the shared
    module state holding them stayed on the worker as a handle named `__module_state__` in the user's
    namespace, and the next cell undid the style."""
    import matplotlib

    try:
        for cell in ("import matplotlib.pyplot as plt", "plt.style.use('seaborn-v0_8-whitegrid')"):
            result, out = run(ip, f"%%offload\n{cell}")
            assert result.success, out.stderr
        assert "__module_state__" not in ip.user_ns and "stayed on worker" not in out.stderr
        assert matplotlib.rcParams["axes.grid"] is True  # the style reached the notebook
        result, out = run(ip, "%%offload\nimport matplotlib\ngrid = matplotlib.rcParams['axes.grid']\n"
                              "cap = str(matplotlib.rcParams['lines.solid_capstyle'])")
        assert result.success and ip.user_ns["grid"] is True, out.stderr  # and still holds there
        assert ip.user_ns["cap"] == str(matplotlib.rcParams["lines.solid_capstyle"])
    finally:
        matplotlib.rcdefaults()
        run(ip, "%%offload\nimport matplotlib\nmatplotlib.rcdefaults()")


def test_objects_inside_values_stay_shared_with_the_names_that_hold_them(ip: InteractiveShell) -> None:
    """Item 2, inside values: an object a container, an attribute and a name share is one object on the
    worker too, and what the cell does to it reaches every holder here."""
    ip.reset(new_session=False)
    run(ip, "import numpy as np\nweights = {'w': np.zeros(3)}\nw = weights['w']\nrows = [[0], [1]]\n"
            "first = rows[0]\nclass Layer:\n    def __init__(self):\n        self.params = []\nlayer = Layer()\n"
            "params = layer.params")
    ns = ip.user_ns
    originals = ns["w"], ns["first"], ns["params"]
    result, out = run(ip, "%%offload\nweights['w'][0] = 5\nseen = float(w[0])\nrows.insert(0, [9])\n"
                          "rows[1].append('x')\nlayer.params.append('p')\ninner = rows[2]")
    assert result.success, result.error_in_exec
    assert ns["seen"] == 5.0  # on the worker, w is weights['w']
    assert ns["w"] is originals[0] and ns["w"][0] == 5 and ns["weights"]["w"] is ns["w"]
    assert ns["first"] is originals[1] and ns["first"] == [0, "x"] and ns["rows"][1] is ns["first"]
    assert ns["params"] is originals[2] and ns["params"] == ["p"] and ns["layer"].params is ns["params"]
    assert ns["inner"] is ns["rows"][2]  # bound to the notebook's own object inside `rows`
    # Objects the cell makes keep their sharing when they come back.
    run(ip, "%%offload\nouter = [[1]]\nshared_inner = outer[0]")
    assert ns["shared_inner"] is ns["outer"][0]


def test_dict_views_and_list_iterators_follow_their_dict_and_list(ip: InteractiveShell) -> None:
    """Before, a view or iterator that travelled beside its dict or list arrived as one of a copy: after
    `d['b'] = 2` offloaded, `len(ks)` was 1 there (locally 2), and so was a view made there, here."""
    ip.reset(new_session=False)
    run(ip, "d = {'a': 1}\nks = d.keys()\nL = [1, 2]\nit = iter(L)\nfirst = next(it)")
    result, out = run(ip, "%%offload\nd['b'] = 2\nn = len(ks)\nvalues = d.values()\nL.append(3)\nrest = list(it)")
    assert result.success, out.stderr
    ns = ip.user_ns
    assert ns["n"] == 2 and ns["rest"] == [2, 3] and list(ns["it"]) == []  # as locally
    ns["d"]["c"] = 3
    assert list(ns["values"]) == [1, 2, 3] and len(ns["ks"]) == 3  # a view of the notebook's own d
    run(ip, "%%offload\nd['e'] = 5")
    assert list(ns["values"]) == [1, 2, 3, 5]


def test_a_view_that_cant_cross_as_a_view_is_named_both_ways(ip: InteractiveShell) -> None:
    """A MaskedArray view (or a view of an object array) travels as a copy; the notice says which array
    it views. Views of record arrays and structured dtypes stay views."""
    ip.reset(new_session=False)
    run(ip, "import numpy as np\nx = np.zeros(3, dtype=[('a', 'i4'), ('b', 'f8')])\n"
            "m = np.ma.masked_array(x['b'], mask=[True, False, False])")
    result, out = run(ip, "%%offload\nrec = x.view(np.recarray)\nfield = x['b']\nmasked = np.ma.masked_array(x['a'])\n"
                          "print(float(m[1]))")
    assert result.success, result.error_in_exec
    ns = ip.user_ns
    assert "`m` went to the worker as a copy, not a view of `x`: a view that is a MaskedArray" in out.stderr
    assert "`masked` is a copy here, not a view of `x` as where it was made: a view that is a MaskedArray" in out.stderr
    assert type(ns["rec"]) is np.recarray and ns["rec"].dtype.names == ("a", "b")
    ns["rec"].a[0], ns["field"][1] = 4, 2.5
    assert ns["x"]["a"][0] == 4 and ns["x"]["b"][1] == 2.5  # both still views of the notebook's x


def test_a_display_too_large_for_a_header_arrives_whole(ip: InteractiveShell) -> None:
    """A 2 MiB image (a large figure's PNG) crosses as a frame beside its DISPLAY's header, not left out."""
    ip.reset(new_session=False)
    result, out = run(ip, "%%offload\nfrom IPython.display import Image\npicture = bytes(range(256)) * 8192\n"
                          "display(Image(data=picture, format='png'))\nprint('after')")
    assert result.success, result.error_in_exec
    images = [o.data["image/png"] for o in out.outputs if "image/png" in o.data]
    assert len(images) == 1 and base64.b64decode(images[0]) == bytes(range(256)) * 8192
    assert "left out" not in out.stderr and out.stdout == "after\n"


def test_a_module_beside_the_notebook_that_the_worker_lacks_is_named_with_how_to_copy_it(
        ip: InteractiveShell, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "helpers_beside.py").write_text("def double(x):\n    return 2 * x\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    result, out = run(ip, "%%offload\nimport helpers_beside\ny = helpers_beside.double(2)")
    assert isinstance(result.error_in_exec, ModuleNotFoundError)
    assert ("`helpers_beside` is helpers_beside.py here, next to the notebook, not a package installed on the "
            "worker: `%offload_put helpers_beside.py` copies it into the worker's working directory") in out.stderr
    result, out = run(ip, "%offload_put helpers_beside.py --force")
    assert result.success, out.stderr
    result, out = run(ip, "%%offload\nimport helpers_beside\ny = helpers_beside.double(2)")
    assert result.success, result.error_in_exec
    assert ip.user_ns["y"] == 4


def test_a_data_file_beside_the_notebook_that_the_worker_lacks_is_named_with_how_to_copy_it(
        ip: InteractiveShell, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, `np.loadtxt('data.csv')` offloaded failed with FileNotFoundError alone (a module beside the
    notebook got a hint; a data file didn't)."""
    name = f"beside-{tmp_path.name}.csv"  # the shared worker's folder may hold another test's file
    (tmp_path / name).write_text("1,2\n3,4\n")
    monkeypatch.chdir(tmp_path)
    for load in (f"np.loadtxt({name!r}, delimiter=',')", f"open({name!r}).read()"):  # numpy's words, and OSError's
        result, out = run(ip, f"%%offload\nimport numpy as np\ndata = {load}")
        assert isinstance(result.error_in_exec, FileNotFoundError)
        assert (f"`{name}` is a file here, next to the notebook, and not in the worker's working directory, where "
                f"an offloaded cell's relative paths lead: `%offload_put {name}` copies it there") in out.stderr
    result, out = run(ip, f"%offload_put {name}")
    assert result.success, out.stderr
    result, out = run(ip, f"%%offload\nimport numpy as np\ndata = np.loadtxt({name!r}, delimiter=',')")
    assert result.success and ip.user_ns["data"].tolist() == [[1.0, 2.0], [3.0, 4.0]]
    run(ip, f"%%offload\nimport os\nos.remove({name!r})")


def test_a_module_only_the_worker_has_stays_usable_by_later_offloaded_cells(
        ip: InteractiveShell, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """`import torch` on a GPU box the notebook lacks: before, the next offloaded cell got NameError."""
    name = f"only_on_worker_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text("VALUE = 42\n")
    monkeypatch.chdir(tmp_path)
    result, out = run(ip, f"%offload_put {name}.py")  # into the worker's folder; the notebook doesn't import it
    assert result.success, out.stderr
    monkeypatch.chdir(tmp_path.parent)
    result, out = run(ip, f"%%offload\nimport {name}")
    assert result.success and f"module {name!r} can't be imported here" in out.stderr, out.stderr
    assert "on the worker only" in repr(ip.user_ns[name])
    result, out = run(ip, f"%%offload\nvalue = {name}.VALUE")
    assert result.success and ip.user_ns["value"] == 42, out.stderr
    result, _ = run(ip, f"{name}.VALUE")  # a local cell is told where it is
    assert "is imported on the worker only" in str(result.error_in_exec)
    run(ip, f"%%offload\nimport os\nos.remove('{name}.py')")


def test_a_memmap_made_offloaded_stays_on_its_file_for_later_cells(ip: InteractiveShell, tmp_path: Any) -> None:
    """Before, a memmap came back as a plain array, and writes in a later cell never reached its file."""
    path = tmp_path / "mapped.dat"
    result, out = run(ip, f"%%offload\nimport numpy as np\nmm = np.memmap({str(path)!r}, dtype='float64', mode='w+', "
                          "shape=(4,))")
    assert result.success and "memory-mapped file on the worker" in repr(ip.user_ns["mm"]), out.stderr
    result, out = run(ip, "%%offload\nmm[:] = 7.0\nmm.flush()")
    assert result.success, out.stderr
    assert np.fromfile(path, dtype="float64").tolist() == [7.0] * 4  # the worker is this machine here


def test_a_thread_left_running_says_what_it_changes_stays_on_the_worker(ip: InteractiveShell) -> None:
    """Before, `threading.Thread(target=results.append, ...)` started offloaded never filled the notebook's
    `results`, without a word."""
    run(ip, "results = []")
    result, out = run(ip, "%%offload\nimport threading\ngate = threading.Event()\n"
                          "worker_thread = threading.Thread(target=lambda: gate.wait(30) and results.append(1),"
                          " name='filler')\nworker_thread.start()")
    assert result.success, out.stderr
    assert "remote-magic: filler, started by this cell, still runs on the worker" in out.stderr
    assert ip.user_ns["results"] == []
    result, out = run(ip, "%%offload\ngate.set()\nworker_thread.join()")  # handles: used in place there
    assert result.success and "still run" not in out.stderr, out.stderr


def test_identity_past_the_first_thousand_items_says_so_when_it_is_lost(ip: InteractiveShell) -> None:
    """Documented, but silent before: a list of 1,500 changed in place, and a name bound to its last item."""
    ip.reset(new_session=False)
    run(ip, "rows = [[i] for i in range(1500)]\nlast = rows[-1]\nfirst = rows[0]")
    result, out = run(ip, "%%offload\nrows[-1].append('x')\nrows[0].append('y')")
    assert result.success, out.stderr
    ns = ip.user_ns
    assert ns["first"] is ns["rows"][0] and ns["rows"][-1] == [1499, "x"]  # within the limit: as locally
    assert ns["last"] == [1499]  # past it: the old object, and the notice says so
    assert "`rows` holds 1,500 items, and only objects among its first 1,000 keep their identity" in out.stderr
    result, out = run(ip, "%%offload\nn = len(rows)")
    assert "keep their identity" not in out.stderr  # not changed: nothing to say


def test_input_in_an_offloaded_cell_says_nobody_can_answer_it_there(ip: InteractiveShell) -> None:
    result, _ = run(ip, "%%offload\ntry:\n    input('name? ')\nexcept EOFError as e:\n    said = str(e)")
    assert result.success, result.error_in_exec
    assert ip.user_ns["said"].startswith("input('name? ') asks the notebook's user, and an offloaded cell runs on "
                                         "the worker, where nobody can answer")


def test_a_closed_file_says_nothing_and_a_value_that_cant_be_pickled_offers_no_pull(ip: InteractiveShell,
                                                                                     tmp_path: Any) -> None:
    """Before: `with open(...) as f` said `f` was left on the worker; a lock's handle said `%offload_pull lock`
    brings it here, and that pull then failed."""
    run(ip, f"PATH = {str(tmp_path / 'closed.txt')!r}")
    result, out = run(ip, "%%offload\nwith open(PATH, 'w') as f:\n    f.write('hi')")
    assert result.success, out.stderr
    assert "stayed on worker" not in out.stderr and "`f`" not in out.stderr, out.stderr
    assert (tmp_path / "closed.txt").read_text() == "hi"

    result, out = run(ip, "%%offload\nimport threading\nlock = threading.Lock()")
    assert result.success and "`lock` (lock: a lock, which can't be pickled" in out.stderr, out.stderr
    assert "%offload_pull" not in repr(ip.user_ns["lock"]) and "it can't come here" in repr(ip.user_ns["lock"])
    with pytest.raises(UsageError, match="`lock` can't come here: a lock, which can't be pickled.*offloaded cells "
                                         "use it in place"):
        ip.run_line_magic("offload_pull", "lock")
    result, out = run(ip, "%%offload\nwith lock:\n    held = lock.locked()")  # in place there, as the notice says
    assert result.success and ip.user_ns["held"] is True, out.stderr


def test_a_library_object_changed_through_a_container_or_another_name_stays_the_object_every_name_holds(
        ip: InteractiveShell) -> None:
    """Issue 32: a deque or array.array appended to, a random.Random drawn from, a library object whose
    method set its attributes, read through a container or another name, came back as a new object,
    and the other names that held it kept the old one, without a word."""
    ip.reset(new_session=False)
    run(ip, "import argparse, array, collections, random\ndq = collections.deque([1], maxlen=5)\n"
            "arr = array.array('i', [1])\nrnd = random.Random(0)\nopts = argparse.Namespace(seen=[])\n"
            "counts = collections.defaultdict(list)\nordered = collections.OrderedDict(a=1)\n"
            "held = {'dq': dq, 'arr': arr, 'rnd': rnd, 'opts': opts, 'counts': counts, 'ordered': ordered}\n"
            "seen = opts.seen\nexpected = random.Random(0)\nexpected.random()")
    ns = ip.user_ns
    originals = {name: ns[name] for name in ("dq", "arr", "rnd", "opts", "counts", "ordered", "seen")}
    result, out = run(ip, "%%offload\nheld['dq'].append(2)\nheld['arr'].append(2)\ndrawn = held['rnd'].random()\n"
                          "held['opts'].seen.append('x')\nheld['opts'].verbose = True\nheld['counts']['k'].append(1)\n"
                          "held['ordered']['b'] = 2\nheld['ordered'].move_to_end('a')")
    assert result.success, result.error_in_exec
    assert all(ns[name] is value and ns["held"].get(name, value) is value for name, value in originals.items())
    assert list(ns["dq"]) == [1, 2] and ns["dq"].maxlen == 5 and ns["arr"].tolist() == [1, 2]
    assert ns["opts"].verbose is True and ns["seen"] == ["x"] and ns["opts"].seen is ns["seen"]
    assert ns["counts"] == {"k": [1]} and ns["counts"]["new"] == [] and list(ns["ordered"]) == ["b", "a"]
    assert ns["rnd"].random() == ns["expected"].random()  # drawn once there: the next draw here is the second
    assert "came back as a new object" not in out.stderr and "can't be here" not in out.stderr, out.stderr
    # Read by another name than the container's, too.
    result, out = run(ip, "%%offload\ndq.append(3)\nrnd.random()")
    assert result.success and ns["held"]["dq"] is ns["dq"] and list(ns["held"]["dq"]) == [1, 2, 3]
    assert ns["held"]["rnd"].random() == (ns["expected"].random(), ns["expected"].random())[1]


def test_a_scikit_learn_model_fitted_through_a_dict_of_models_is_the_model_every_name_holds(
        ip: InteractiveShell) -> None:
    pytest.importorskip("sklearn")
    ip.reset(new_session=False)
    run(ip, "import numpy as np\nfrom sklearn.linear_model import LinearRegression\nfrom sklearn.pipeline import "
            "make_pipeline\nfrom sklearn.preprocessing import StandardScaler\nlr = LinearRegression()\n"
            "pipe = make_pipeline(StandardScaler(), LinearRegression())\nmodels = {'lr': lr, 'pipe': pipe}\n"
            "scaler = pipe[0]\nX = np.arange(8.0).reshape(-1, 2)\ny = X @ [1.0, 2.0]")
    ns = ip.user_ns
    result, out = run(ip, "%%offload\nfor model in models.values():\n    model.fit(X, y)")
    assert result.success, result.error_in_exec
    assert ns["models"]["lr"] is ns["lr"] and ns["models"]["pipe"] is ns["pipe"] and ns["pipe"][0] is ns["scaler"]
    assert np.allclose(ns["lr"].coef_, ns["models"]["lr"].coef_) and hasattr(ns["scaler"], "mean_")
    assert "came back as a new object" not in out.stderr, out.stderr


def test_an_object_inside_a_container_that_came_back_as_a_copy_names_the_names_that_kept_the_old_one(
        ip: InteractiveShell) -> None:
    """A BytesIO pickles in a form that can't be set on the notebook's own object: before, the names that
    held it kept the old one without a word."""
    ip.reset(new_session=False)
    run(ip, "import io\nbuf = io.BytesIO()\nstreams = {'log': buf}\ncount = {'n': 1}")
    result, out = run(ip, "%%offload\nstreams['log'].write(b'line')")
    assert result.success, out.stderr
    ns = ip.user_ns
    assert ns["streams"]["log"].getvalue() == b"line" and ns["buf"].getvalue() == b""
    assert ("`buf` no longer holds the object `streams['log']` holds: the cell changed `streams` on the worker, and "
            "its BytesIO came back as a copy (a BytesIO can't be updated in place here); bind them again "
            "(`buf = streams['log']`) where they should follow it") in out.stderr
    result, out = run(ip, "%%offload\ncount['n'] += 1")  # nothing else changed: nothing to say
    assert result.success and "no longer" not in out.stderr, out.stderr


def test_a_library_object_inside_a_container_that_cant_be_pickled_back_leaves_the_container_on_the_worker(
        ip: InteractiveShell) -> None:
    """Numbered objects that no longer pickle (a lock set on one) stay inside their container, which stays on
    the worker as a handle, as before they were numbered; the cell's other results come back."""
    ip.reset(new_session=False)
    run(ip, "import argparse\nopts = argparse.Namespace(a=1)\nbox = {'opts': opts}")
    result, out = run(ip, "%%offload\nimport threading\nbox['opts'].lock = threading.Lock()\nbox['n'] = 1\ndone = True")
    assert result.success, out.stderr
    assert ip.user_ns["done"] is True and ip.user_ns["box"].kind == "dict"
    assert "`box` (dict 2 items: a dict, which can't be pickled: TypeError: cannot pickle '_thread.lock'" in out.stderr
