"""Same as local, checked on whole notebooks (issue 9): run a notebook twice in real Jupyter kernels
(nbclient), once plain and once with each code cell under %%offload, and compare what each cell
showed and the namespace each run ends with.

Per cell: the stdout text, the value and every display output (their mime types, and text/plain
with memory addresses removed; not remote-magic's own progress bars), and the error type, in order.
At the end: every name in the user namespace, compared by value (arrays, frames, containers and
instances of notebook classes structurally), plus which names share one object and which arrays
share memory.

A cell stays local in the offloaded run when it starts with a cell magic, has a line magic or shell
command or other IPython-only syntax (``len?``), or carries the tag ``local`` (for notebooks that mix
local and offloaded cells).
Differences are returned as sentences, for the test to show.

GPU runs (``gpu=True``: cells under ``%%offload --gpu``) keep the same rule, with one exception the
product promises: a cell that says on stderr that it computed float64 data in float32 (a line starting
``remote-magic: `` with the word ``float32``) may differ from local only in float values within float32
precision (RTOL, ATOL), and so may every later cell and the final namespace (float32-precision values
flow on); never in dtype, shape, type, or in integers, bools and strings. Before such a notice, every
cell must match exactly.
"""

from __future__ import annotations

import ast
import math
import os
import pickle
import re
import reprlib
import shutil
import types
import weakref
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import nbformat

from support import WorkerProcess, notebook_client

CELL_TIMEOUT_S = 180
LOCAL_TAG = "local"

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
RTOL = 1e-5
"""Relative tolerance of float values in the cells (and names) of a GPU run that said they computed in float32."""
ATOL = 1e-6
"""Their absolute tolerance, relative to the magnitude of the values (the largest of an array, or of an output)."""
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?(?![\w.])")

# Appended to both runs, and run locally: pickles the namespace (each value on its own, so one that
# can't be pickled is described instead) with the names that share one object or one array's memory.
_DUMP_CELL = '''
def __conformance_dump(path):
    import pickle, sys, types
    import cloudpickle
    from remote_magic.wire.handles import RemoteValue
    ip = get_ipython()
    skip = {"In", "Out", "exit", "quit", "get_ipython"}
    names = sorted(k for k, v in ip.user_ns.items() if not k.startswith("_") and k not in skip
                   and not (k in ip.user_ns_hidden and ip.user_ns_hidden[k] is v))
    immutable = (int, float, complex, str, bytes, bool, type(None), tuple, frozenset, range,
                 types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type)
    values, groups, views = {}, {}, []
    for name in names:
        value = ip.user_ns[name]
        kind = f"{type(value).__module__}.{type(value).__qualname__}"
        if isinstance(value, RemoteValue):  # it stayed on the worker: its type is what's comparable
            values[name] = ("type", value.type_name, None)
            continue
        try:
            values[name] = ("value", kind, cloudpickle.dumps(value))
        except Exception:
            values[name] = ("type", kind, None)
        if not isinstance(value, immutable):
            groups.setdefault(id(value), []).append(name)
    np = sys.modules.get("numpy")
    arrays = [n for n in names if np is not None and isinstance(ip.user_ns[n], np.ndarray)]
    for i, a in enumerate(arrays):
        for b in arrays[i + 1:]:
            if ip.user_ns[a] is not ip.user_ns[b] and np.shares_memory(ip.user_ns[a], ip.user_ns[b]):
                views.append((a, b))
    shared = sorted(g for g in groups.values() if len(g) > 1)
    with open(path, "wb") as f:
        pickle.dump({"values": values, "shared": shared, "views": views}, f)
__conformance_dump(%r)
del __conformance_dump
'''


@dataclass
class CellRecord:
    """What one code cell showed."""

    index: int
    source: str
    offloaded: bool = False
    outputs: list[tuple[str, str]] = field(default_factory=list)  # (kind, content), streams merged
    float32: bool = False  # it said on stderr that it computed float64 data in float32 (GPU runs)
    stderr: str = ""  # what it wrote to stderr (remote-magic's notices among it), not compared


@dataclass
class Run:
    cells: list[CellRecord]
    namespace: dict[str, Any]
    gpu: bool = False  # its cells ran under %%offload --gpu


def offloaded_source(cell: Any, magic: str = "%%offload") -> str | None:
    """The cell under ``magic``, or None when it stays local."""
    source: str = cell.source
    if LOCAL_TAG in cell.get("metadata", {}).get("tags", []):
        return None
    lines = [line.strip() for line in source.splitlines()]
    if not any(lines) or source.lstrip().startswith("%%") or any(line.startswith(("%", "!")) for line in lines):
        return None
    try:
        ast.parse(source)
    except SyntaxError:  # IPython's own syntax (`len?`), which %%offload doesn't run; a real syntax error
        return None      # is one in both runs either way
    return f"{magic}\n{source}"


def run_notebook(path: Path, workdir: Path, token: str | None = None, kernel_name: str = "python3",
                 gpu: bool = False, magic: str | None = None) -> Run:
    """Execute the notebook in a fresh kernel (offloading its cells when a token is given: under
    ``%%offload --gpu`` with ``gpu``, or under ``magic``)."""
    magic = magic or ("%%offload --gpu" if gpu else "%%offload")
    nb = nbformat.read(path, as_version=4)
    records = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        record = CellRecord(index, cell.source)
        if token is not None and (offloaded := offloaded_source(cell, magic)) is not None:
            cell.source, record.offloaded = offloaded, True
        records.append(record)
    dump = workdir / "namespace.pickle"
    added = [nbformat.v4.new_code_cell(_DUMP_CELL % str(dump))]
    if token is not None:
        added.insert(0, nbformat.v4.new_code_cell(f"%load_ext remote_magic\n%offload_connect {token}"))
    nb.cells = added[:-1] + nb.cells + added[-1:]
    workdir.mkdir(parents=True, exist_ok=True)
    client = notebook_client(nb, workdir, kernel_name, CELL_TIMEOUT_S, allow_errors=True)
    client.execute()
    if token is not None:
        connect = nb.cells[0]
        assert "Connected to" in _text(connect), f"the offloaded run didn't connect: {connect.outputs}"
    executed = [c for c in nb.cells[len(added) - 1:-1] if c.cell_type == "code"]
    for record, cell in zip(records, executed):
        record.outputs = _outputs(cell)
        record.float32 = record.offloaded and _says_float32(cell)
        record.stderr = "".join(o["text"] for o in cell.outputs
                                if o["output_type"] == "stream" and o["name"] == "stderr")
    dumped = nb.cells[-1]
    assert not any(o["output_type"] == "error" for o in dumped.outputs), f"the dump cell failed: {dumped.outputs}"
    with dump.open("rb") as f:
        namespace = pickle.load(f)
    return Run(records, namespace, gpu=gpu and token is not None)


def _text(cell: Any) -> str:
    return "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in cell.outputs)


def _says_float32(cell: Any) -> bool:
    """Whether the cell's stderr has remote-magic's notice that float64 data was computed in float32."""
    stderr = "".join(o["text"] for o in cell.outputs if o["output_type"] == "stream" and o["name"] == "stderr")
    return any(line.startswith("remote-magic: ") and "float32" in line for line in stderr.splitlines())


def _outputs(cell: Any) -> list[tuple[str, str]]:
    """The cell's outputs as (kind, content): stdout merged (it may arrive in other pieces), stderr left
    out (warnings name files, and remote-magic's notices go there)."""
    found: list[tuple[str, str]] = []
    for output in cell.outputs:
        kind = output["output_type"]
        if kind == "stream":
            if output["name"] != "stdout":
                continue
            text = _ADDRESS.sub("", output["text"])
            if found and found[-1][0] == "stdout":
                found[-1] = ("stdout", found[-1][1] + text)
            else:
                found.append(("stdout", text))
        elif kind == "execute_result":
            text = _ADDRESS.sub("", output["data"].get("text/plain", ""))
            found.append(("value", f"{', '.join(sorted(output['data']))}: {text}"))
        elif kind == "display_data":
            text = _ADDRESS.sub("", output["data"].get("text/plain", ""))
            found.append(("display", f"{', '.join(sorted(output['data']))}: {text}"))
        elif kind == "error":
            found.append(("error", output["ename"]))
    return found


def compare(local: Run, offloaded: Run) -> list[str]:
    """Every difference between the two runs, in words; empty when they match. In a GPU run, from the first
    cell that said it computed in float32 on, cells and the namespace are compared within RTOL and ATOL: its
    float32-precision values flow on into later cells (a model fitted there, printed later)."""
    differences = []
    close = False
    for plain, remote in zip(local.cells, offloaded.cells):
        close = close or (offloaded.gpu and remote.float32)
        if not _same_outputs(plain.outputs, remote.outputs, close):
            where = "offloaded" if remote.offloaded else "local in both runs"
            where += ", after a float32 notice: compared within float32 precision" if close else ""
            differences.append(f"cell {plain.index} ({where}) {plain.source[:60]!r}:\n"
                               f"  locally:   {plain.outputs}\n  offloaded: {remote.outputs}")
    differences += _compare_namespaces(local.namespace, offloaded.namespace, close)
    return differences


def _same_outputs(plain: list[tuple[str, str]], remote: list[tuple[str, str]], close: bool) -> bool:
    """Equal outputs; with ``close``, texts may differ in their floats within RTOL and ATOL (and in the
    whitespace numpy aligns them with), never in anything else."""
    if not close or plain == remote:
        return plain == remote
    return len(plain) == len(remote) and all(
        a_kind == b_kind and (a == b or a_kind != "error" and _close_text(a, b))
        for (a_kind, a), (b_kind, b) in zip(plain, remote))


def _close_text(plain: str, remote: str) -> bool:
    """The same text but for floats within RTOL and ATOL (ATOL scaled by the largest of them)."""
    def skeleton(text: str) -> str:
        return re.sub(r"\s+", "", _NUMBER.sub("\0", text))

    numbers = list(zip(_NUMBER.findall(plain), _NUMBER.findall(remote)))
    if skeleton(plain) != skeleton(remote) or len(numbers) != len(_NUMBER.findall(plain)):
        return False
    if any(a != b and not (_is_float(a) and _is_float(b)) for a, b in numbers):
        return False  # an integer, printed differently
    floats = [(float(a), float(b)) for a, b in numbers if _is_float(a)]
    return not floats or _close(*zip(*floats))


def _is_float(number: str) -> bool:
    return any(c in number for c in ".eE")


def _close(plain: Any, remote: Any) -> bool:
    """Floats (or arrays of them) within RTOL of the local ones, and ATOL of the largest local one."""
    import numpy as np

    a, b = np.asarray(plain), np.asarray(remote)
    finite = np.abs(a[np.isfinite(a)])
    magnitude = float(finite.max()) if finite.size else 0.0
    return bool(np.allclose(b, a, rtol=RTOL, atol=ATOL * max(1.0, magnitude), equal_nan=True))


def _compare_namespaces(local: dict[str, Any], offloaded: dict[str, Any], close: bool = False) -> list[str]:
    differences = []
    plain_values, remote_values = local["values"], offloaded["values"]
    for name in sorted(plain_values.keys() - remote_values.keys()):
        differences.append(f"namespace: {name!r} is set locally but not after offloading")
    for name in sorted(remote_values.keys() - plain_values.keys()):
        differences.append(f"namespace: {name!r} is set after offloading but not locally")
    for name in sorted(plain_values.keys() & remote_values.keys()):
        plain_type, plain = _load(*plain_values[name])
        remote_type, remote = _load(*remote_values[name])
        if plain is _UNLOADABLE or remote is _UNLOADABLE:  # can't be pickled, stayed on the worker, or
            if plain_type != remote_type:  # refers to the kernel's own module: compare types
                differences.append(f"namespace: {name!r} is a {plain_type} locally, a {remote_type} after offloading")
            continue
        why = difference(plain, remote, close=close)
        if why:
            within = " (after a float32 notice: beyond float32 precision)" if close else ""
            differences.append(f"namespace: {name!r} differs{within}: {why}")
    for key, what in (("shared", "names sharing one object"), ("views", "arrays sharing memory")):
        if sorted(map(list, local[key])) != sorted(map(list, offloaded[key])):
            differences.append(f"namespace: {what}: locally {local[key]}, after offloading {offloaded[key]}")
    return differences


_UNLOADABLE = object()


def _load(kind: str, type_name: str, pickled: bytes | None) -> tuple[str, Any]:
    """A dumped value's type, and the value (or _UNLOADABLE)."""
    if kind != "value" or pickled is None:
        return type_name, _UNLOADABLE
    try:
        return type_name, pickle.loads(pickled)
    except Exception:  # pickled by reference to the kernel's __main__ (an lru_cache wrapper, say)
        return type_name, _UNLOADABLE


def _type_name(value: Any) -> str:
    kind = type(value)
    return f"{getattr(kind, '__module__', '?')}.{kind.__qualname__}"


MAX_DEPTH = 200
"""How deep ``difference`` follows nested values before comparing what they read as: well below Python's
recursion limit (a figure's state nests deep, and Python 3.12 counts C frames against it too)."""


def _shallow_difference(a: Any, b: Any, where: str) -> str | None:
    try:
        equal = _ADDRESS.sub("", reprlib.repr(a)) == _ADDRESS.sub("", reprlib.repr(b))
    except (RecursionError, ValueError, TypeError):
        return None  # nothing left to compare it by: its type matched
    return None if equal else f"{where}: {_clip(a)} locally, {_clip(b)} after offloading"


def _close_pandas(a: Any, b: Any) -> bool:
    """Two Series or DataFrames alike but for floats within RTOL and ATOL: index, columns and dtypes equal,
    other values equal."""
    import pandas

    check = pandas.testing.assert_frame_equal if isinstance(a, pandas.DataFrame) else pandas.testing.assert_series_equal
    numbers = a.select_dtypes("number") if isinstance(a, pandas.DataFrame) else a
    largest = float(abs(numbers.to_numpy(dtype=float, na_value=0.0)).max(initial=0.0)) if len(numbers) else 0.0
    try:
        check(a, b, check_exact=False, rtol=RTOL, atol=ATOL * max(1.0, largest))
    except (AssertionError, TypeError, ValueError):
        return False
    return True


def difference(a: Any, b: Any, path: str = "", seen: set[tuple[int, int]] | None = None, depth: int = 0,
               close: bool = False) -> str | None:
    """Why two values (one from each run) differ, or None. Structural: classes match by name, since
    each run's notebook classes are distinct objects once unpickled. With ``close``, floats (numpy's
    and Python's, also inside containers) need only be within RTOL and ATOL."""
    seen = set() if seen is None else seen
    if (id(a), id(b)) in seen:
        return None
    if depth > MAX_DEPTH:  # deeper than any value a test means to compare: by what it reads as, if anything
        return _shallow_difference(a, b, path or "value")
    seen.add((id(a), id(b)))
    where = path or "value"

    def deeper(x: Any, y: Any, at: str) -> str | None:
        return difference(x, y, at, seen, depth + 1, close)

    if _type_name(a) != _type_name(b):
        return f"{where} is a {_type_name(a)} locally, a {_type_name(b)} after offloading"
    if isinstance(a, weakref.ref):  # (a figure's callbacks hold some) by what they refer to
        return deeper(a(), b(), f"{where}()")
    if isinstance(a, types.ModuleType):
        return None if a.__name__ == b.__name__ else f"{where}: module {a.__name__} vs {b.__name__}"
    if isinstance(a, type) or callable(a) and hasattr(a, "__qualname__"):
        if a.__qualname__ != b.__qualname__:
            return f"{where}: {a.__qualname__} vs {b.__qualname__}"
        if isinstance(a, type) and a.__module__ == "__main__":  # a notebook class: its data attributes too
            return deeper(_class_data(a), _class_data(b), f"{where}'s attributes")
        return None
    module = str(type(a).__module__).partition(".")[0]
    if module == "numpy":
        import numpy as np

        if isinstance(a, np.random.Generator):
            return deeper(a.bit_generator.state, b.bit_generator.state, f"{where}'s state")
        if isinstance(a, np.random.RandomState):
            return deeper(a.get_state(legacy=False), b.get_state(legacy=False), f"{where}'s state")
        if isinstance(a, np.ndarray) and (a.dtype != b.dtype or a.shape != b.shape):
            return f"{where}: {a.dtype}{list(a.shape)} locally, {b.dtype}{list(b.shape)} after offloading"
        if isinstance(a, (np.ndarray, np.generic)) and close and a.dtype.kind in "fc":
            equal = _close(a, b)
            return None if equal else f"{where}: {_clip(a)} locally, {_clip(b)} after offloading"
        if isinstance(a, (np.ndarray, np.generic)):
            equal = np.array_equal(a, b, equal_nan=a.dtype.kind in "fc") if isinstance(a, np.ndarray) else (
                a == b or (a != a and b != b))
            return None if equal else f"{where}: {_clip(a)} locally, {_clip(b)} after offloading"
        # numpy's other objects (np.c_, np.vectorize(f)) compare as any object below
    if module == "matplotlib":  # figures, axes, artists: their internals hold ids and callbacks; by what they show
        equal = _ADDRESS.sub("", repr(a)) == _ADDRESS.sub("", repr(b))
        return None if equal else f"{where}: {_clip(a)} locally, {_clip(b)} after offloading"
    if module == "pandas" and hasattr(a, "equals"):
        equal = a.equals(b) or close and _close_pandas(a, b)
        return None if equal else f"{where}:\n{_clip(a)}\nlocally, and\n{_clip(b)}\nafter offloading"
    if isinstance(a, (float, complex)) and close:
        return None if _close(a, b) else f"{where}: {a!r} vs {b!r}"
    if isinstance(a, float):
        return None if a == b or (math.isnan(a) and math.isnan(b)) else f"{where}: {a!r} vs {b!r}"
    if isinstance(a, dict):  # keys compared as values too (instances of each run's own notebook class)
        keys = list(zip(a, b))
        if len(a) != len(b) or any(difference(x, y, seen=set(seen), depth=depth + 1, close=close) for x, y in keys):
            return f"{where} has keys {_clip(list(a))} locally, {_clip(list(b))} after offloading"
        return next((d for x, y in keys if (d := deeper(a[x], b[y], f"{where}[{x!r}]"))), None)
    if isinstance(a, (set, frozenset)) and not a == b:  # its items may be instances of each run's own class
        unmatched = list(b)
        for x in a:
            match = next((i for i, y in enumerate(unmatched)
                          if difference(x, y, seen=set(seen), depth=depth + 1, close=close) is None), None)
            if match is None:
                return f"{where}: {_clip(a)} locally, {_clip(b)} after offloading"
            del unmatched[match]
        return None if not unmatched else f"{where}: {_clip(a)} locally, {_clip(b)} after offloading"
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{where} has {len(a)} items locally, {len(b)} after offloading"
        return next((d for i, (x, y) in enumerate(zip(a, b))
                     if (d := deeper(x, y, f"{where}[{i}]"))),
                    None)
    if type(a).__eq__ is object.__eq__ or type(a).__module__ == "__main__":
        # Compared by identity, or a notebook class (each run's is its own): by state, else by repr.
        if hasattr(a, "__dict__"):
            return deeper(vars(a), vars(b), f"{where}.__dict__")
        slots = [name for cls in type(a).__mro__ for name in getattr(cls, "__slots__", ())]
        if slots:
            state = [(getattr(a, n, None), getattr(b, n, None)) for n in slots]
            return next((d for n, (x, y) in zip(slots, state)
                         if (d := deeper(x, y, f"{where}.{n}"))), None)
        equal = _ADDRESS.sub("", repr(a)) == _ADDRESS.sub("", repr(b))
    else:
        try:
            equal = bool(a == b)
        except Exception:
            equal = _ADDRESS.sub("", repr(a)) == _ADDRESS.sub("", repr(b))
    return None if equal else f"{where}: {_clip(a)} locally, {_clip(b)} after offloading"


def _class_data(cls: type) -> dict[str, Any]:
    """A class's own data attributes (`registry = []`), not its methods, properties or members."""
    return {name: value for name, value in vars(cls).items() if not (name.startswith("__") and name.endswith("__"))
            and not callable(value) and not hasattr(type(value), "__get__") and not isinstance(value, cls)}


def _clip(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 300 else text[:300] + "…"


def notebooks(folder: Path) -> list[Path]:
    """The notebooks to check: those in ``folder`` and any named by REMOTE_MAGIC_CONFORMANCE_NOTEBOOKS
    (files or folders, separated by os.pathsep)."""
    found = sorted(folder.glob("*.ipynb"))
    for entry in filter(None, os.environ.get("REMOTE_MAGIC_CONFORMANCE_NOTEBOOKS", "").split(os.pathsep)):
        extra = Path(entry)
        found += sorted(extra.glob("*.ipynb")) if extra.is_dir() else [extra]
    return found


@contextmanager
def notebook_worker(folder: Path, *, gpu: bool = False) -> Iterator[WorkerProcess]:
    """A worker for a test module's notebooks, offloaded one after another by :func:`offloaded_differences`
    (``--gpu on`` with ``gpu``; skips without an adapter). Each run connects anew, so its cells get an executor of
    their own as a fresh worker's would; sets of strings are ordered as in the runs (PYTHONHASHSEED=0)."""
    from support import require_a_gpu, start_worker

    (folder / "cwd").mkdir(parents=True)
    worker = start_worker(folder, "--listen", "127.0.0.1:0", "--gpu", "on" if gpu else "off", cwd=folder / "cwd",
                          env={"PYTHONHASHSEED": "0"})
    try:
        if gpu:
            require_a_gpu(worker)
        yield worker
    finally:
        worker.stop()


def offloaded_differences(notebook: Path, workdir: Path, worker: WorkerProcess, *, gpu: bool = False) -> list[str]:
    """Run ``notebook`` locally and offloaded to ``worker`` (a :func:`notebook_worker`: its cells under
    ``%%offload --gpu`` with ``gpu``), and return how they differ. Set PYTHONHASHSEED=0 first, as the worker has
    it, so both runs order sets of strings alike."""
    # What an earlier notebook's cells wrote is gone, as on a new worker. (The folder stays: the worker's spare
    # executor already runs in it.)
    for written in worker.cwd.iterdir():
        if written.is_dir() and not written.is_symlink():
            shutil.rmtree(written)
        else:
            written.unlink()
    # The two runs in parallel: each spends most of its time waiting on its kernel (and the worker).
    with ThreadPoolExecutor(1, thread_name_prefix="local-run") as pool:
        local = pool.submit(run_notebook, notebook, workdir / "local")
        offloaded = run_notebook(notebook, workdir / "offloaded", token=worker.token, gpu=gpu)
        return compare(local.result(), offloaded)
