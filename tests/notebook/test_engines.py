"""Identity, views and shared objects hold alike on every engine: each test runs twice in a real IPython
shell, once through a real remote-worker's hub (``%offload_connect TOKEN``) and once on a real Dask cluster
(``%offload_connect dask://...``, a ``distributed.LocalCluster`` on 127.0.0.1). Both send the one SUBMIT
``JobRequest.submit`` makes (remote_magic/job_request.py); only how it travels differs."""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import numpy as np
import pytest
from dask_cluster import dask_address, local_cluster
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from remote_magic.engine import Engine
from remote_magic.engines import ENGINES, engine_class, parse
from remote_magic.errors import EngineError, TokenError
from remote_magic.job_request import JobRequest, MapRequest
from remote_magic.results import JobResult
from support import connected_shell, run

BOTH = ("hub", "dask")


@pytest.fixture(scope="module")
def dask_scheduler() -> Iterator[str]:
    """A Dask scheduler with one worker process; ``dask://HOST:PORT``."""
    cluster = local_cluster(1)
    try:
        yield dask_address(cluster)
    finally:
        cluster.close()


@pytest.fixture(params=BOTH)
def shell(request: pytest.FixtureRequest) -> Iterator[InteractiveShell]:
    """A real IPython shell with the extension loaded, connected through the engine the test is for."""
    address = request.getfixturevalue("worker").token if request.param == "hub" else (
        request.getfixturevalue("dask_scheduler"))
    with connected_shell(address) as (ip, printed):  # each engine says what it reached, in its own words
        said = "— workers: shared" if request.param == "hub" else f"Connected to {address} — Dask workers: 0"
        assert said in printed, printed
        ip.reset(new_session=False)
        yield ip


def test_an_object_inside_a_container_stays_the_object_other_names_hold(shell: InteractiveShell) -> None:
    """The issue's case: ``w = weights["w"]``; a cell sets ``weights["w"][0] = 5``; ``w`` is still
    ``weights["w"]`` and reads 5 (on Dask it used to be a different array that read 0)."""
    ns = shell.user_ns
    ns["weights"] = {"w": np.zeros(3), "b": [1, 2]}
    ns["w"], ns["b"] = ns["weights"]["w"], ns["weights"]["b"]
    result, _ = run(shell, "%%offload\nweights['w'][0] = 5\nweights['b'].append(3)\nweights['new'] = 1\n"
                           "seen = float(w[0])")
    assert result.success, result.error_in_exec
    assert ns["seen"] == 5.0  # on the worker too, w is weights['w']
    assert ns["w"] is ns["weights"]["w"] and ns["w"].tolist() == [5.0, 0.0, 0.0]
    assert ns["b"] is ns["weights"]["b"] and ns["b"] == [1, 2, 3] and ns["weights"]["new"] == 1


def test_objects_inside_values_stay_shared_with_the_names_that_hold_them(shell: InteractiveShell) -> None:
    run(shell, "rows = [[0], [1]]\nfirst = rows[0]\nclass Layer:\n    def __init__(self):\n        self.params = []\n"
               "layer = Layer()\nparams = layer.params")
    ns = shell.user_ns
    first, params = ns["first"], ns["params"]
    result, _ = run(shell, "%%offload\nrows.insert(0, [9])\nrows[1].append('x')\nlayer.params.append('p')\n"
                           "inner = rows[2]\nouter = [[1]]\nshared_inner = outer[0]")
    assert result.success, result.error_in_exec
    assert ns["first"] is first and first == [0, "x"] and ns["rows"][1] is first
    assert ns["params"] is params and params == ["p"] and ns["layer"].params is params
    assert ns["inner"] is ns["rows"][2]  # bound to the notebook's own object inside `rows`
    assert ns["shared_inner"] is ns["outer"][0]  # objects the cell made keep their sharing


def test_names_that_share_an_object_or_memory_still_do_after_the_cell(shell: InteractiveShell) -> None:
    run(shell, "import numpy as np\nx = np.arange(6.0)\nv = x[:2]\na = [1]\nb = a")
    result, _ = run(shell, "%%offload\nv[0] = 99\nb.append(2)\ny = x\nw = x[3:]")
    assert result.success, result.error_in_exec
    ns = shell.user_ns
    assert ns["x"][0] == 99 and np.shares_memory(ns["v"], ns["x"])  # written through the view, as locally
    assert ns["a"] == [1, 2] and ns["b"] is ns["a"]
    assert ns["y"] is ns["x"]  # the notebook's own object, not a copy
    ns["w"][0] = -1
    assert ns["x"][3] == -1  # a view the cell made stays a view of the notebook's array


def test_dict_views_and_list_iterators_follow_their_dict_and_list(shell: InteractiveShell) -> None:
    run(shell, "d = {'a': 1}\nks = d.keys()\nL = [1, 2]\nit = iter(L)\nfirst = next(it)")
    result, out = run(shell, "%%offload\nd['b'] = 2\nn = len(ks)\nvalues = d.values()\nL.append(3)\nrest = list(it)")
    assert result.success, out.stderr
    ns = shell.user_ns
    assert ns["n"] == 2 and ns["rest"] == [2, 3] and list(ns["it"]) == []  # as locally
    ns["d"]["c"] = 3
    assert list(ns["values"]) == [1, 2, 3] and len(ns["ks"]) == 3  # a view of the notebook's own d


def test_a_view_that_cant_cross_as_a_view_is_named_both_ways(shell: InteractiveShell) -> None:
    run(shell, "import numpy as np\nx = np.zeros(3, dtype=[('a', 'i4'), ('b', 'f8')])\n"
               "m = np.ma.masked_array(x['b'], mask=[True, False, False])")
    result, out = run(shell, "%%offload\nrec = x.view(np.recarray)\nfield = x['b']\n"
                             "masked = np.ma.masked_array(x['a'])\nprint(float(m[1]))")
    assert result.success, result.error_in_exec
    ns = shell.user_ns
    assert "`m` went to the worker as a copy, not a view of `x`: a view that is a MaskedArray" in out.stderr
    assert "`masked` is a copy here, not a view of `x` as where it was made: a view that is a MaskedArray" in out.stderr
    ns["rec"].a[0], ns["field"][1] = 4, 2.5
    assert ns["x"]["a"][0] == 4 and ns["x"]["b"][1] == 2.5  # both still views of the notebook's x


def test_stats_count_the_bytes_over_the_engines_own_link_and_only_there(shell: InteractiveShell) -> None:
    result, out = run(shell, "%%offload --stats\nx = 1")
    assert result.success, result.error_in_exec
    over_the_link = "over the link: sent" in out.stderr
    assert "ran on " in out.stderr and over_the_link == (shell.run_line_magic("offload_workers", "").traffic
                                                          is not None)


class _Recording(Engine):
    """An engine of the seam's defaults only: it keeps each request and answers with an empty result."""

    address = "recording://here"

    def __init__(self) -> None:
        self.version_notes: list[str] = []
        self.hub_cache: dict[str, int] = {}
        self.requests: list[JobRequest] = []

    def run_job(self, request: JobRequest) -> JobResult:
        self.requests.append(request)
        return JobResult({}, worker="box")

    def run_each(self, requests: Sequence[JobRequest]) -> list[Callable[[], JobResult]]:
        return [lambda request=request: self.run_job(request) for request in requests]

    def run_map(self, request: MapRequest) -> list[Any]:
        return [request.fn(item) for item in request.items]

    def workers(self, timeout: float = 10.0) -> list[dict[str, Any]]:
        return [{"name": "box", "state": "idle"}]

    def close(self) -> None:
        pass


def test_an_engine_without_a_hub_says_what_it_lacks_and_counts_no_link() -> None:
    engine = _Recording()
    assert engine.traffic() is None and engine.workers_called == "workers"
    engine.limit_link()  # nothing asked, nothing refused
    with pytest.raises(EngineError, match="--max-transfer and --outage-grace bound the link.*recording://here"):
        engine.limit_link(max_transfer=1)
    for call in (lambda: engine.get_file("out.csv"), lambda: engine.reset(), lambda: engine.jobs(),
                 lambda: engine.attach("j1"), lambda: engine.scatter([1])):
        with pytest.raises(EngineError, match="needs a remote-worker hub.*recording://here has none"):
            call()


def test_gpu_kernels_former_name_is_still_taken_with_a_deprecation_warning() -> None:
    engine = _Recording()
    engine.execute("y = gpu.twice(x)", gpu=["twice"], gpu_kernels={"twice": "wgsl"})
    with pytest.warns(DeprecationWarning, match="kernels= is now gpu_kernels="):
        engine.execute("y = gpu.twice(x)", gpu=["twice"], kernels={"twice": "wgsl"})
    assert [dict(r.gpu_kernels or {}) for r in engine.requests] == [{"twice": "wgsl"}] * 2
    assert [r.submit().header["kernels"] for r in engine.requests] == [{"twice": "wgsl"}] * 2  # the wire's name


def test_the_address_scheme_is_read_once_and_names_the_engine() -> None:
    assert (parse("dask://10.0.0.5:8786").scheme, parse("dask://10.0.0.5:8786").location) == ("dask", "10.0.0.5:8786")
    assert parse("rmc1.abc").scheme == "tcp" and parse("rmc1.abc").text == "a token"  # a token is never echoed
    assert sorted(ENGINES) == ["dask", "tcp"]
    assert engine_class(parse("rmc1.abc")).__name__ == "Client"
    assert engine_class(parse("dask://h:1")).__name__ == "DaskClient"
    with pytest.raises(TokenError, match="ucx:// is not something connect opens"):
        engine_class(parse("ucx://h:1"))


def test_lan_discovery_is_refused_for_the_address_of_another_engine() -> None:
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "remote_magic")
    try:
        with pytest.raises(UsageError, match="--lan finds remote-worker hubs; dask:// is reached by its address alone"):
            shell.run_line_magic("offload_connect", "--lan dask://127.0.0.1:1")
    finally:
        shell.run_line_magic("unload_ext", "remote_magic")
