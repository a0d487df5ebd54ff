"""An offloaded cell's import statements bind in the notebook what they bind in a local cell (issue 32:
"the notebook's `tqdm.auto` becomes the text class").

A module that picks a name for the process it is imported in, as ``tqdm.auto`` does (its widget bar
where an IPython shell runs, its text bar elsewhere), is written where both the notebook and the worker
import it from; the shell here has an IPython shell running, the worker's session hasn't, so the two
picks really differ. Real IPython shells against the shared worker (``ip``, ``worker`` in conftest.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Iterator

import nbformat
import numpy
import pytest
from IPython.core.interactiveshell import InteractiveShell

from support import WorkerProcess, cell_text, notebook_client, run

PICKS_BY_PROCESS = '''\
"""Picks a progress bar for the process it is imported in, as tqdm.auto does."""
import json
import pickle
import sys


class TextBar:
    pass


class ShellBar:
    pass


def text_bar():
    return TextBar()


def shell_bar():
    return ShellBar()


def double(x):
    return 2 * x


_ipython = sys.modules.get("IPython")
IN_A_SHELL = _ipython is not None and _ipython.get_ipython() is not None
Bar = ShellBar if IN_A_SHELL else TextBar
new_bar = shell_bar if IN_A_SHELL else text_bar
backend = json if IN_A_SHELL else pickle
data = [1, 2, 3]
'''


@pytest.fixture
def module_on_both_sides(ip: InteractiveShell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The name of a module (``PICKS_BY_PROCESS``) that the notebook and the worker both import."""
    name = f"picks_by_process_{tmp_path.name.replace('-', '_')}"  # the shared worker's folder may hold others
    (tmp_path / f"{name}.py").write_text(PICKS_BY_PROCESS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    result, out = run(ip, f"%offload_put {name}.py")  # into the worker's folder, where its cells import from
    assert result.success, out.stderr
    yield name
    run(ip, f"%%offload\nimport os\nos.remove('{name}.py')")
    sys.modules.pop(name, None)


def test_a_name_an_offloaded_cell_imports_is_the_notebooks_own(ip: InteractiveShell, module_on_both_sides: str) -> None:
    """Before, `Bar` was the worker's pick (TextBar, sent by reference) and later local cells used it."""
    name = module_on_both_sides
    ip.reset(new_session=False)
    result, out = run(ip, f"%%offload\nfrom {name} import Bar, new_bar, backend as chosen, data, double\n"
                          f"import {name} as picker\nimport numpy as np\nfrom tqdm.auto import tqdm\n"
                          "data.append(4)\nworker_picked = type(new_bar()).__name__, picker.IN_A_SHELL")
    assert result.success, f"{result.error_in_exec}\n{out.stderr}"
    ns, here = ip.user_ns, sys.modules[name]
    assert ns["worker_picked"] == ("TextBar", False)  # the worker's picks really differ from the notebook's
    assert here.IN_A_SHELL is True
    assert ns["Bar"] is here.ShellBar and ns["new_bar"] is here.shell_bar and ns["chosen"] is json
    assert ns["picker"] is here and ns["double"] is here.double and ns["np"] is numpy
    import tqdm.auto

    assert ns["tqdm"] is tqdm.auto.tqdm
    # A value imported is data, and comes back as one: the cell's list, not the notebook's module's.
    assert ns["data"] == [1, 2, 3, 4] and ns["data"] is not here.data and here.data == [1, 2, 3]
    # The same statement in a local cell binds the same objects.
    result, _ = run(ip, f"from {name} import Bar as local_bar, new_bar as local_new_bar")
    assert result.success and ns["local_bar"] is ns["Bar"] and ns["local_new_bar"] is ns["new_bar"]
    assert "stays on the worker" not in out.stderr
    result, out = run(ip, f"%%offload\nfrom {name} import *")  # a star import's names too
    assert result.success, f"{result.error_in_exec}\n{out.stderr}"
    assert ns["Bar"] is here.ShellBar and ns["backend"] is json and ns["IN_A_SHELL"] is False


def test_a_name_imported_from_a_module_only_the_worker_has_is_what_it_was(
        ip: InteractiveShell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The notebook can't import the module: each name is what the worker sent, as before (the module's
    reference with its notice, which later offloaded cells use; data; a function sent by reference to that
    module fails to load here, with what is missing)."""
    name = f"worker_only_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(PICKS_BY_PROCESS)
    monkeypatch.chdir(tmp_path)
    result, out = run(ip, f"%offload_put {name}.py")
    assert result.success, out.stderr
    monkeypatch.chdir(tmp_path.parent)  # the notebook can't import it from here
    ip.reset(new_session=False)
    try:
        result, out = run(ip, f"%%offload\nimport {name} as only\nfrom {name} import data, backend\n"
                              "from collections import OrderedDict")
        assert result.success, f"{result.error_in_exec}\n{out.stderr}"
        ns: dict[str, Any] = ip.user_ns
        assert "on the worker only" in repr(ns["only"])
        assert f"`only` stays on the worker: module {name!r} can't be imported here" in out.stderr
        assert ns["data"] == [1, 2, 3] and ns["backend"].__name__ == "pickle"
        from collections import OrderedDict

        assert ns["OrderedDict"] is OrderedDict
        result, out = run(ip, "%%offload\nvalue = only.double(21)")
        assert result.success and ns["value"] == 42, out.stderr
        # A function the worker sends by reference to that module fails to load here, as it did before.
        result, out = run(ip, f"%%offload\nfrom {name} import double")
        assert f"`double` can't be loaded in the notebook: ModuleNotFoundError: No module named {name!r}" in str(
            result.error_in_exec)
    finally:
        run(ip, f"%%offload\nimport os\nos.remove('{name}.py')")


def test_tqdm_auto_imported_offloaded_is_the_kernels_widget_bar(worker: WorkerProcess, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """In a Jupyter kernel with ipywidgets, `tqdm.auto` picks its widget bar; on the worker, its text bar.
    Before, an offloaded `from tqdm.auto import tqdm` left the text bar in the notebook for later cells."""
    pytest.importorskip("ipywidgets")
    monkeypatch.setenv("REMOTE_MAGIC_TOKEN", worker.token)
    cells = ["%load_ext remote_magic\n%offload_connect",
             "%%offload\nfrom tqdm.auto import tqdm\non_the_worker = tqdm.__mro__[1].__module__",
             "offloaded = tqdm\nfrom tqdm.auto import tqdm\n"
             "print(offloaded is tqdm, tqdm.__mro__[1].__module__, on_the_worker)"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])
    notebook_client(nb, tmp_path).execute()
    connect, _, local = nb.cells
    assert "Connected to tcp://127.0.0.1" in cell_text(connect)
    assert cell_text(local) == "True tqdm.notebook tqdm.std\n"
